"""Ragged columns: the storage layout of a TrajectoryBatch and the few numpy helpers on it.

Every per-token field is one flat numpy array over all response tokens of the batch plus the shared
``offsets`` ``(B+1,)``; row ``i`` is ``flat[offsets[i]:offsets[i+1]]`` (like Arrow list arrays).
Per-turn fields and the prompt have their own offsets. :class:`BatchColumns` is that storage, as
``TrajectoryBatch.columns`` returns it and as the io writers read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BatchColumns", "row_index", "take", "offsets_from_lengths", "turn_ids_from_mask_flat"]


@dataclass(frozen=True)
class BatchColumns:
    """The aligned, validated columns of a batch of B rows (arrays are shared, not copied: read only).

    Attributes:
        offsets: int64 ``(B+1,)``, row i's response tokens are ``offsets[i]:offsets[i+1]``.
        tokens: per-token field -> flat array aligned with ``offsets`` (v1 dtypes; extras float32).
        present: optional per-token field -> bool ``(B,)``: does the row carry it (rows without it
            hold zeros there). ``response_ids`` and ``loss_mask`` are always present and not listed.
        prompt: ``(flat int64, offsets)`` of ``prompt_ids``.
        turn: per-turn field -> ``(flat, offsets, present (B,))``.
        scalars: scalar field -> ``(B,)`` array (object for optional or string fields; ``reward``
            float64 with NaN = none).
        extras: unknown non-numeric field -> ``(B,)`` object array of opaque per-row values.
    """

    offsets: np.ndarray
    tokens: dict
    present: dict
    prompt: tuple
    turn: dict
    scalars: dict
    extras: dict


def row_index(offsets: np.ndarray) -> np.ndarray:
    """Row of every flat element: ``seg[t] = i`` for ``offsets[i] <= t < offsets[i+1]``."""
    lengths = np.diff(offsets)
    return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)


def take(flat: np.ndarray, offsets: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gather rows ``idx`` of a ragged column: returns ``(flat, offsets)`` of the selection."""
    n = len(offsets) - 1
    if len(idx) == n and (n == 0 or (idx[0] == 0 and idx[-1] == n - 1 and np.all(np.diff(idx) == 1))):
        return flat[offsets[0] : offsets[-1]], offsets - offsets[0]  # all rows, in order
    lengths = np.diff(offsets)[idx]
    new_off = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_off[1:])
    gather = np.repeat(offsets[:-1][idx] - new_off[:-1], lengths) + np.arange(new_off[-1], dtype=np.int64)
    return flat[gather], new_off


def offsets_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """``(B+1,)`` offsets of rows of these lengths."""
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def turn_ids_from_mask_flat(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Turn ids from mask runs on a flat ragged mask (the ragged twin of
    :func:`mpo_viz.data.turns.turn_ids_from_mask`): each maximal run of 1s is a turn, observation tokens
    carry the id of the turn they follow (0 before the first action token)."""
    m = mask != 0
    n = len(m)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    prev = np.zeros(n, dtype=bool)
    prev[1:] = m[:-1]
    starts_at = offsets[:-1][np.diff(offsets) > 0]
    prev[starts_at] = False  # a row's first token has no predecessor
    cs = np.cumsum(m & ~prev)
    before = np.where(offsets[:-1] > 0, cs[np.maximum(offsets[:-1] - 1, 0)], 0)
    return np.maximum(cs - np.repeat(before, np.diff(offsets)) - 1, 0).astype(np.int64)
