"""Rows without a reward, for the estimators that compare a group's scores.

A trajectory's score is the sum of the rewards an estimator sees (docs/concepts.md §3): the outcome
``reward`` (NaN counts 0), ``turn_rewards`` and ``token_rewards``. A row with none of them — a log
that never recorded how the episode ended — silently scores 0: GRPO then ranks it as a failure, and a
group where no row has a reward gets advantage 0 everywhere. :func:`warn_unrewarded` says so, naming
the groups and trajectories, instead of returning those numbers silently. (A ±inf ``reward`` is an
error of the estimators' input check, naming its row.)
"""

from __future__ import annotations

import numpy as np

from mpo_viz.checks import warn_once

__all__ = ["unrewarded", "warn_unrewarded"]

_NAMED = 5


def unrewarded(batch) -> np.ndarray:
    """``(B,)`` bool: rows with a NaN ``reward`` and neither ``turn_rewards`` nor ``token_rewards``."""
    r = batch.outcome_reward
    has_other = np.zeros(len(batch), dtype=bool)
    for name in ("turn_rewards", "token_rewards"):
        if batch.has(name):
            has_other |= np.array([x is not None for x in batch.field(name)], dtype=bool)
    return np.isnan(r) & ~has_other


def warn_unrewarded(batch, estimator: str) -> None:
    """Warn (once per process, estimator and set of rows) when groups of ``batch`` hold rows without a
    reward: how many, which groups and trajectories (the first few), and what the estimator makes of
    them."""
    bad = unrewarded(batch)
    if not bad.any():
        return
    gids = np.asarray(batch.group_ids, dtype=object)
    tids = batch.traj_ids
    groups = list(dict.fromkeys(gids[bad]))
    whole = [g for g in groups if bad[gids == g].all()]
    rows = [repr(tids[i]) for i in np.flatnonzero(bad)[:_NAMED]]
    more = f" and {int(bad.sum()) - _NAMED} more" if bad.sum() > _NAMED else ""
    warn_once(
        f"unrewarded:{estimator}:{int(bad.sum())}:{tids[int(np.flatnonzero(bad)[0])]}",
        f"{estimator}: {int(bad.sum())} of {len(batch)} trajectories have no reward (a NaN reward and no turn_rewards "
        f"or token_rewards): {', '.join(rows)}{more}, in {len(groups)} group(s) "
        f"({', '.join(repr(g) for g in groups[:_NAMED])}{' ...' if len(groups) > _NAMED else ''}). Their score "
        "counts as 0, so the group's baseline compares real scores with a made-up 0"
        + (
            f"; {len(whole)} group(s) hold no reward at all and get advantage 0 on every token (before any whitening)"
            if whole
            else ""
        )
        + ". Give every trajectory its reward (mpo-viz convert names the ones without), or leave them out "
        "(batch.select(traj_ids=...)).",
    )
