"""Turn ids: the one definition of "what a turn is", shared by the batch, estimators and losses.

docs/concepts.md §1: ``turn_ids[t]`` is the turn of response token ``t``. Observation tokens carry the id
of the turn they follow (observation tokens before the first action token carry 0), so ids never
decrease. When turn ids are absent, turns are the maximal runs of ``mask == 1``.

Both helpers accept numpy arrays or torch tensors of shape ``(B, L)`` (or ``(L,)``) and return the
same kind of object, so estimators (numpy/numba) and losses (torch, autograd) share one definition.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["turn_ids_from_mask", "check_turn_ids", "num_turns"]


def turn_ids_from_mask(mask):
    """Turn ids derived from mask runs: a new turn starts at every 0 → 1 edge after the first run.

    ``ids[t] = max(0, (number of run starts at or before t) − 1)``; padding and observation tokens
    after a run carry that run's id, tokens before the first run carry 0.

    Shapes: ``mask`` (B, L) or (L,) of 0/1 (any numeric or bool dtype); returns int64 of the same
    shape, numpy in → numpy out, torch in → torch out (same device).
    """
    if isinstance(mask, torch.Tensor):
        m = mask.ne(0).to(torch.int64)
        prev = torch.nn.functional.pad(m[..., :-1], (1, 0))
        starts = (m > prev).to(torch.int64)
        return (starts.cumsum(-1) - 1).clamp_min(0)
    m = (np.asarray(mask) != 0).astype(np.int64)
    prev = np.zeros_like(m)
    prev[..., 1:] = m[..., :-1]
    starts = (m > prev).astype(np.int64)
    return np.maximum(np.cumsum(starts, axis=-1) - 1, 0)


def num_turns(mask, turn_ids):
    """K per row: the number of distinct turn ids on action tokens (0 for a row without any).

    Valid turn ids (see :func:`check_turn_ids`) make this ``max(turn_ids[mask == 1]) + 1``.
    Returns int64 ``(B,)`` (numpy or torch, following ``mask``).
    """
    if isinstance(mask, torch.Tensor):
        t = torch.as_tensor(turn_ids, device=mask.device).to(torch.int64)
        k = torch.where(mask.ne(0), t + 1, torch.zeros_like(t))
        return k.amax(-1) if k.shape[-1] else torch.zeros(k.shape[:-1], dtype=torch.int64)
    t = np.asarray(turn_ids).astype(np.int64)
    k = np.where(np.asarray(mask) != 0, t + 1, 0)
    return k.max(-1) if k.shape[-1] else np.zeros(k.shape[:-1], dtype=np.int64)


def check_turn_ids(turn_ids, mask, *, name: str = "turn_ids") -> None:
    """Raise ``ValueError`` naming ``name`` and the first offending row unless, in every row:

    * ids are integers ≥ 0 and never decrease along the row (padding included), and
    * the ids on action tokens (mask == 1) are exactly 0..K−1 with none skipped, i.e. every id
      from 0 to the largest one on an action token has at least one action token.

    Observation tokens may carry any id that keeps the row non-decreasing (the rule: the id of the
    turn they follow); only action tokens define turns.
    """
    t = turn_ids.detach().cpu().numpy() if isinstance(turn_ids, torch.Tensor) else np.asarray(turn_ids)
    m = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    if t.shape != m.shape:
        raise ValueError(f"{name}: expected shape {tuple(m.shape)} (the mask's), found {tuple(t.shape)}")
    if t.ndim == 1:
        t, m = t[None], m[None]
    if t.size == 0:
        return
    if not np.issubdtype(t.dtype, np.integer):
        if not np.all(np.isfinite(t)) or not np.all(t == np.round(t)):
            raise ValueError(f"{name}: expected integer turn ids, found dtype {t.dtype} with non-integers")
        t = t.astype(np.int64)
    neg = (t < 0).any(-1)
    if neg.any():
        r = int(np.argmax(neg))
        raise ValueError(f"{name}: row {r}: expected ids >= 0, found {int(t[r].min())}")
    dec = (np.diff(t, axis=-1) < 0).any(-1)
    if dec.any():
        r = int(np.argmax(dec))
        p = int(np.argmax(np.diff(t[r]) < 0))
        raise ValueError(
            f"{name}: row {r}: expected non-decreasing ids, found {int(t[r, p])} then {int(t[r, p + 1])} "
            f"at position {p + 1}"
        )
    act = m != 0
    # On action tokens of a non-decreasing row, ids are 0..K-1 with no gap iff the first action id is
    # 0 and consecutive action ids differ by 0 or 1.
    for r in np.flatnonzero(act.any(-1)):
        ids = t[r][act[r]]
        if ids[0] != 0:
            raise ValueError(
                f"{name}: row {int(r)}: expected the first action token in turn 0, found turn {int(ids[0])} "
                f"(turn ids 0..{int(ids[0]) - 1} have no action token)"
            )
        gap = np.diff(ids) > 1
        if gap.any():
            g = int(np.argmax(gap))
            raise ValueError(
                f"{name}: row {int(r)}: expected consecutive turn ids on action tokens, found {int(ids[g])} "
                f"then {int(ids[g + 1])} (a turn id with no action token)"
            )
