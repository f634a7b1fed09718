"""Estimators run on a batch, and what they give per turn: the per-turn table and the TD error.

:func:`compute_advantages` runs several estimators with shared options (each takes the ones it
accepts); :func:`turn_table` is :meth:`TrajectoryBatch.turns` with estimators' advantages and
returns as columns (computed here when given by name); :func:`td_error` the one-step TD error, the
strip's ``td`` channel. :func:`turn_table_reference` is the readable loop the table is tested
against.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mpo_viz.advantages import registry
from mpo_viz.advantages.token import gae
from mpo_viz.analysis.arrays import adv_tensors, as_2d
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = ["compute_advantages", "td_error", "turn_table", "turn_table_reference"]


def compute_advantages(batch: TrajectoryBatch, estimators, **options) -> dict:
    """Run each named estimator on ``batch``: ``{name: result}`` (``result.advantages``, ``.returns``).

    ``options`` are shared (e.g. ``gamma=``, ``lam=``, ``beta=``); each estimator receives only the
    options it accepts (:func:`mpo_viz.advantages.split_options`, which refuses an option none of
    them takes), so ``-e mpo,grpo --beta 0.5`` works.
    """
    names = registry.parse_names(estimators)
    return {name: registry.compute(batch, name, **o) for name, o in registry.split_options(names, options).items()}


def td_error(batch: TrajectoryBatch, *, gamma: float = 1.0):
    """The one-step TD error ``δ_t = r_t + γ·V_{t+1} − V_t`` over action tokens (``V_{t+1}``: the
    value at the next action token; after the last, the bootstrap value or 0), ``(B, L)`` float32,
    0 on masked positions: token GAE with λ = 0. None when the batch has no values. The strip's
    ``td`` channel."""
    if batch.values is None:
        return None
    # float32 inputs, like compute(): the same compiled kernel, no second JIT specialization
    adv, _ = gae(
        batch.token_rewards, batch.values, batch.mask, gamma=gamma, lam=0.0, bootstrap_value=batch.bootstrap_value
    )
    return adv


def turn_table(batch: TrajectoryBatch, advantages=None, *, returns=None, **options) -> pd.DataFrame:
    """The per-turn table of ``batch`` (:meth:`TrajectoryBatch.turns`, columns in docs/concepts.md).

    ``advantages``: ``{name: (B, L) tensor or result}`` -> ``adv_<name>`` columns (mean over the
    turn's action tokens); or estimator names (``"mpo,gae"`` or a list) to compute here with the
    shared ``options`` (see :func:`compute_advantages`), which also fill ``ret_<name>``.
    ``returns``: ``{name: (B, L) tensor or result}`` -> ``ret_<name>`` columns (the return at the
    turn's first action token).
    """
    if isinstance(advantages, str) or (
        isinstance(advantages, (list, tuple)) and all(isinstance(a, str) for a in advantages)
    ):
        advantages = compute_advantages(batch, advantages, **options)
        if returns is None:
            returns = advantages
    elif options:
        raise ValueError(f"options: only used with estimator names, found {sorted(options)}")
    return batch.turns(advantages=advantages, returns=returns)


def turn_table_reference(batch: TrajectoryBatch, advantages=None) -> pd.DataFrame:
    """Reference loop for :func:`turn_table` (core columns + advantages)."""
    m = as_2d(batch.mask, "mask") != 0
    t = as_2d(batch.turn_ids, "turn_ids", np.int64)
    r = as_2d(batch.token_rewards, "rewards")
    adv = adv_tensors(advantages or {})
    rows = []
    for b in range(m.shape[0]):
        turns: dict[int, list[int]] = {}
        for j in range(m.shape[1]):
            if m[b, j]:
                turns.setdefault(int(t[b, j]), []).append(j)
        for k in sorted(turns):
            pos = turns[k]
            row = {
                "traj_id": batch.traj_ids[b],
                "row": b,
                "turn": k,
                "start": pos[0],
                "end": pos[-1],
                "n_tokens": len(pos),
                "reward": sum(r[b, j] for j in pos),
            }
            for name, a in adv.items():
                row[f"adv_{name}"] = sum(a[b, j] for j in pos) / len(pos)
            rows.append(row)
    return pd.DataFrame(rows)
