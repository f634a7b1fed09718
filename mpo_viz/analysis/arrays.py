"""Arrays in, turns indexed: what every statistic of :mod:`mpo_viz.analysis` starts from.

Tensors (torch or numpy, ``(B, L)``) become float64 / bool / int64 numpy arrays; :func:`turn_index`
numbers the turns of a batch once (action tokens only), so per-turn means are one ``bincount``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.data.turns import turn_ids_from_mask

__all__ = [
    "to_numpy",
    "as_2d",
    "prepare",
    "TurnIndex",
    "turn_index",
    "batch_turn_index",
    "turn_means",
    "adv_tensors",
    "scores",
]


def to_numpy(x, dtype=np.float64) -> np.ndarray:
    """A torch tensor or array-like as a numpy array of ``dtype`` (a copy only when needed)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def as_2d(x, name: str, dtype=np.float64) -> np.ndarray:
    """``x`` as a ``(B, L)`` numpy array (a 1-D one is one row); ``ValueError`` naming ``name``."""
    a = to_numpy(x, dtype)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2:
        raise ValueError(f"{name}: expected a (B, L) tensor, found shape {tuple(a.shape)}")
    return a


def prepare(x, mask, turn_ids, name: str = "x"):
    """Validate shapes and return float64 ``x``, bool ``mask``, int64 ``turn_ids`` (all (B, L)).
    ``x`` must be finite on action tokens (``ValueError`` naming row and token)."""
    x = as_2d(x, name)
    m = as_2d(mask, "mask") != 0
    if x.shape != m.shape:
        raise ValueError(f"{name}: expected shape {m.shape} (the mask's), found {x.shape}")
    if turn_ids is None:
        t = turn_ids_from_mask(m.astype(np.int64))
    else:
        t = as_2d(turn_ids, "turn_ids", np.int64)
        if t.shape != m.shape:
            raise ValueError(f"turn_ids: expected shape {m.shape} (the mask's), found {t.shape}")
    bad = m & ~np.isfinite(x)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise ValueError(f"{name}: row {r}, token {c}: expected a finite number on action tokens, found {x[r, c]}")
    return x, m, t


@dataclass
class TurnIndex:
    """Flat index of the turns of a batch: action token ``(rows[i], cols[i])`` is in turn slot
    ``slot[i]``; slot ``s`` belongs to row ``turn_row[s]`` and has turn number ``turn_k[s]``."""

    rows: np.ndarray  # (N,) int64, action tokens in row-major order
    cols: np.ndarray  # (N,)
    slot: np.ndarray  # (N,) flat turn index
    n_turns: np.ndarray  # (B,) K per row
    offsets: np.ndarray  # (B + 1,) first slot of each row
    turn_row: np.ndarray  # (T,)
    turn_k: np.ndarray  # (T,)
    count: np.ndarray  # (T,) action tokens per turn

    @property
    def n_slots(self) -> int:
        return int(self.offsets[-1])


def turn_index(m: np.ndarray, t: np.ndarray) -> TurnIndex:
    """The :class:`TurnIndex` of a bool mask and int turn ids, both ``(B, L)``."""
    rows, cols = np.nonzero(m)
    k = t[rows, cols]
    B = m.shape[0]
    n_turns = np.zeros(B, dtype=np.int64)
    if rows.size:
        np.maximum.at(n_turns, rows, k + 1)
    offsets = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(n_turns, out=offsets[1:])
    slot = offsets[rows] + k
    T = int(offsets[-1])
    turn_row = np.repeat(np.arange(B), n_turns)
    turn_k = np.arange(T) - offsets[turn_row]
    count = np.bincount(slot, minlength=T).astype(np.int64)
    return TurnIndex(rows, cols, slot, n_turns, offsets, turn_row, turn_k, count)


def batch_turn_index(batch: TrajectoryBatch) -> tuple[np.ndarray, TurnIndex]:
    """The batch's bool mask and the :class:`TurnIndex` of its turns."""
    m = as_2d(batch.mask, "mask") != 0
    return m, turn_index(m, as_2d(batch.turn_ids, "turn_ids", np.int64))


def turn_means(x: np.ndarray, idx: TurnIndex) -> np.ndarray:
    """Mean of ``x`` over each turn's action tokens, ``(T,)`` (NaN for an empty slot)."""
    s = np.bincount(idx.slot, weights=x[idx.rows, idx.cols], minlength=idx.n_slots)
    with np.errstate(invalid="ignore", divide="ignore"):
        return s / idx.count


def adv_tensors(advantages) -> dict[str, np.ndarray]:
    """Accept ``{name: tensor}`` or ``{name: result}`` (anything with ``.advantages``)."""
    return {k: to_numpy(getattr(v, "advantages", v)) for k, v in advantages.items()}


def scores(batch: TrajectoryBatch) -> np.ndarray:
    """The trajectory score (docs/concepts.md §3): the sum of the rewards an estimator sees, ``(B,)``."""
    r = to_numpy(batch.token_rewards)
    return r.sum(axis=1) if r.ndim == 2 else r
