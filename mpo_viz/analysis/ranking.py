"""Episodes and turns ranked by a score: what to read first in an iteration's saved episodes.

A :class:`Ranking` turns one per-token quantity ``q`` (``(B, L)``, read on action tokens only) into
an episode score ``(B,)`` and a turn score ``(T,)`` by a reduction (``max`` or ``mean`` over the
action tokens of the episode / turn), then orders them (``descending`` or not; ties keep the batch
order). The rankings, by name (:data:`RANKINGS`):

* ``abs_advantage`` — the largest ``|A_t|`` of the episode / turn (needs ``advantages``);
* ``reward`` — the lowest episode score ``sum_t r_t`` first; its turns by their mean advantage,
  most negative first (the turns the update pushed down hardest; needs ``advantages`` for turns);
* ``ratio`` — the largest saved per-token importance ratio ``ratio`` (an optional field);
* ``logprob_gap`` — the largest ``|old_logprobs_t - rollout_logprobs_t|``, the gap between the
  trainer's and the sampler's log-probability of a token (0 when they are one computation);
* ``entropy`` — the lowest mean saved per-token ``entropy``;
* ``surprisal`` — the lowest mean ``-old_logprobs_t`` (else ``-rollout_logprobs_t``): the sampled
  token's surprisal, a one-sample estimate of the policy's per-token entropy at temperature 1.

:func:`rank_episodes` and :func:`rank_turns` return the ordered tables; :func:`available` names the
rankings a batch has the fields for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mpo_viz.analysis.arrays import batch_turn_index, scores, to_numpy
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = ["Ranking", "RANKINGS", "available", "episode_scores", "turn_scores", "rank_episodes", "rank_turns"]


@dataclass(frozen=True)
class Ranking:
    """One way to rank episodes and turns: ``short`` (a menu entry), ``label`` (what the text says
    was ranked by, episodes), ``turn_label`` (turns), ``quantity(batch) -> (B, L) float64``, ``reduce`` (``"max"`` or
    ``"mean"`` over action tokens), ``descending``, ``fields`` (the per-token fields it needs, any
    one of each inner tuple) and ``column`` (its column name in a picker)."""

    name: str
    short: str
    label: str
    turn_label: str
    quantity: Callable[[TrajectoryBatch], np.ndarray]
    reduce: str
    descending: bool
    fields: tuple[tuple[str, ...], ...]
    column: str


def _padded(batch: TrajectoryBatch, field: str) -> np.ndarray:
    return to_numpy(batch.padded(field))


def _abs_adv(batch: TrajectoryBatch) -> np.ndarray:
    return np.abs(_padded(batch, "advantages"))


def _gap(batch: TrajectoryBatch) -> np.ndarray:
    return np.abs(_padded(batch, "old_logprobs") - _padded(batch, "rollout_logprobs"))


def _surprisal(batch: TrajectoryBatch) -> np.ndarray:
    return -_padded(batch, "old_logprobs" if batch.has("old_logprobs") else "rollout_logprobs")


RANKINGS: dict[str, Ranking] = {
    r.name: r
    for r in (
        Ranking(
            "abs_advantage",
            "largest |advantage|",
            "largest |advantage| (max over the episode's action tokens)",
            "largest |advantage| (max over the turn's action tokens)",
            _abs_adv,
            "max",
            True,
            (("advantages",),),
            "max|adv|",
        ),
        Ranking(
            "reward",
            "lowest reward",
            "lowest reward",
            "most negative mean advantage (turns of every episode)",
            lambda b: _padded(b, "advantages"),
            "mean",
            False,
            (),
            "reward",
        ),
        Ranking(
            "ratio",
            "largest token ratio",
            "largest token importance ratio (the saved per-token `ratio`, max over the episode)",
            "largest token importance ratio (max over the turn)",
            lambda b: _padded(b, "ratio"),
            "max",
            True,
            (("ratio",),),
            "ratio",
        ),
        Ranking(
            "logprob_gap",
            "largest old - rollout log-prob gap",
            "largest |old - rollout log-prob| gap of a token (max over the episode)",
            "largest |old - rollout log-prob| gap (max over the turn)",
            _gap,
            "max",
            True,
            (("old_logprobs",), ("rollout_logprobs",)),
            "lp_gap",
        ),
        Ranking(
            "entropy",
            "lowest entropy",
            "lowest mean per-token entropy (the saved `entropy`)",
            "lowest mean per-token entropy",
            lambda b: _padded(b, "entropy"),
            "mean",
            False,
            (("entropy",),),
            "entropy",
        ),
        Ranking(
            "surprisal",
            "lowest surprisal -log pi(a)",
            "lowest mean surprisal -log pi(a) of the sampled tokens (a one-sample estimate of the per-token entropy)",
            "lowest mean surprisal -log pi(a)",
            _surprisal,
            "mean",
            False,
            (("old_logprobs", "rollout_logprobs"),),
            "surprisal",
        ),
    )
}


def _get(by: str) -> Ranking:
    if by not in RANKINGS:
        raise ValueError(f"by: expected one of {', '.join(RANKINGS)}, found {by!r}")
    return RANKINGS[by]


def _has_fields(batch: TrajectoryBatch, r: Ranking) -> bool:
    return all(any(batch.has(f) for f in alts) for alts in r.fields)


def available(batch: TrajectoryBatch) -> list[str]:
    """The names of :data:`RANKINGS` whose fields ``batch`` carries, in that order."""
    return [name for name, r in RANKINGS.items() if _has_fields(batch, r)]


def _check(batch: TrajectoryBatch, r: Ranking, turns: bool = False) -> None:
    need = r.fields if not (turns and r.name == "reward") else (("advantages",),)
    missing = [" or ".join(alts) for alts in need if not any(batch.has(f) for f in alts)]
    if missing:
        raise ValueError(
            f"by: {r.name!r} needs the per-token field {', '.join(missing)}; the batch carries "
            f"{', '.join(batch.token_fields)}"
        )


def _reduce(q: np.ndarray, slot: np.ndarray, rows: np.ndarray, cols: np.ndarray, n: int, how: str) -> np.ndarray:
    """``how`` (``max`` / ``mean``) of ``q[rows, cols]`` grouped by ``slot`` into ``n`` groups
    (NaN for an empty group)."""
    x = q[rows, cols]
    count = np.bincount(slot, minlength=n)
    if how == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.bincount(slot, weights=x, minlength=n) / count
    out = np.full(n, -np.inf)
    np.maximum.at(out, slot, x)
    out[count == 0] = np.nan
    return out


def episode_scores(batch: TrajectoryBatch, by: str) -> np.ndarray:
    """Score of each episode under ranking ``by``, ``(B,)`` float64 (NaN: no action token)."""
    r = _get(by)
    _check(batch, r)
    if r.name == "reward":
        return scores(batch).astype(np.float64)
    m, idx = batch_turn_index(batch)
    return _reduce(r.quantity(batch), idx.rows, idx.rows, idx.cols, len(batch), r.reduce)


def turn_scores(batch: TrajectoryBatch, by: str) -> pd.DataFrame:
    """One row per turn (batch then turn order): ``row``, ``traj_id``, ``turn``, ``n_tokens``,
    ``score`` (ranking ``by`` reduced over the turn's action tokens)."""
    r = _get(by)
    _check(batch, r, turns=True)
    m, idx = batch_turn_index(batch)
    s = _reduce(r.quantity(batch), idx.slot, idx.rows, idx.cols, idx.n_slots, r.reduce)
    ids = np.asarray(batch.traj_ids, dtype=object)
    return pd.DataFrame(
        {"row": idx.turn_row, "traj_id": ids[idx.turn_row], "turn": idx.turn_k, "n_tokens": idx.count, "score": s}
    )


def _order(s: np.ndarray, descending: bool) -> np.ndarray:
    """Positions of ``s`` best first (NaN last, ties in the given order)."""
    key = np.where(np.isnan(s), np.inf, -s if descending else s)
    return np.argsort(key, kind="stable")


def rank_episodes(batch: TrajectoryBatch, by: str, top: int | None = None) -> pd.DataFrame:
    """The episodes ordered by ranking ``by`` (best first; ``top``: only the first ``top``):
    ``rank`` (1-based), ``row``, ``traj_id``, ``score``, ``reward``, ``turns``."""
    s = episode_scores(batch, by)
    o = _order(s, _get(by).descending)[:top]
    return pd.DataFrame(
        {
            "rank": np.arange(1, len(o) + 1),
            "row": o,
            "traj_id": np.asarray(batch.traj_ids, dtype=object)[o],
            "score": s[o],
            "reward": scores(batch).astype(np.float64)[o],
            "turns": np.asarray(batch.num_turns, dtype=np.int64)[o],
        }
    )


def rank_turns(batch: TrajectoryBatch, by: str, top: int | None = None) -> pd.DataFrame:
    """The turns ordered by ranking ``by`` (best first; ``top``: only the first ``top``): ``rank``,
    then the columns of :func:`turn_scores`."""
    t = turn_scores(batch, by)
    o = _order(t["score"].to_numpy(), _get(by).descending)[:top]
    out = t.iloc[o].reset_index(drop=True)
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    return out
