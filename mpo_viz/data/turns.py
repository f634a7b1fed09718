"""Turn ids: the one definition of "what a turn is", shared by the batch, estimators and losses.

``turn_ids[t]`` is the turn of response token ``t``. Observation tokens carry the id
of the turn they follow (observation tokens before the first action token carry 0), so ids never
decrease. When turn ids are absent, turns are the maximal runs of ``mask == 1``. Only the ids on
action tokens define turns: the tensor API reads no id where ``mask == 0``.

Both helpers accept numpy arrays or torch tensors of shape ``(B, L)`` (or ``(L,)``) and return the
same kind of object, so estimators (numpy/numba) and losses (torch, autograd) share one definition.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["turn_ids_from_mask", "check_turn_ids", "num_turns", "mc_turn_advantage"]


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
    """Raise ``ValueError`` naming ``name``, the first offending row and position unless, in every
    row, the ids on action tokens (``mask != 0``) are integers numbered 0..K−1 in order: the first
    action token is in turn 0, and from one action token to the next the id stays or grows by 1
    (so ids are ≥ 0, never decrease and no id lacks an action token).

    Only action tokens define turns: ids on masked positions are never read (−1 padding, NaN in a
    float array, anything). This is the rule of the tensor API (estimators and losses); the v1 file
    loader is stricter about what is stored (ids ≥ 0 and non-decreasing on every token).
    """
    t = turn_ids.detach().cpu().numpy() if isinstance(turn_ids, torch.Tensor) else np.asarray(turn_ids)
    m = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    if t.shape != m.shape:
        raise ValueError(f"{name}: expected shape {tuple(m.shape)} (the mask's), found {tuple(t.shape)}")
    if t.ndim == 1:
        t, m = t[None], m[None]
    if t.size == 0:
        return
    act = m != 0

    def first_bad(bad):
        r = int(np.argmax(bad.any(-1)))
        return r, int(np.argmax(bad[r]))

    if t.dtype.kind not in "iub":
        if t.dtype.kind != "f":
            raise ValueError(f"{name}: expected integer turn ids, found dtype {t.dtype}")
        bad = act & (~np.isfinite(t) | (t != np.round(t)))
        if bad.any():
            r, p = first_bad(bad)
            raise ValueError(
                f"{name}: row {r}, position {p}: expected an integer id on an action token, found {t[r, p].item()!r}"
            )
    t = np.where(act, t, 0).astype(np.int64)
    neg = act & (t < 0)
    if neg.any():
        r, p = first_bad(neg)
        raise ValueError(f"{name}: row {r}, position {p}: expected ids >= 0 on action tokens, found {int(t[r, p])}")
    for r in np.flatnonzero(act.any(-1)):
        pos = np.flatnonzero(act[r])
        ids = t[r, pos]
        if ids[0] != 0:
            raise ValueError(
                f"{name}: row {int(r)}, position {int(pos[0])}: expected the first action token in turn 0, "
                f"found turn {int(ids[0])} (turn ids 0..{int(ids[0]) - 1} have no action token)"
            )
        step = np.diff(ids)
        if (step < 0).any():
            g = int(np.argmax(step < 0))
            raise ValueError(
                f"{name}: row {int(r)}, position {int(pos[g + 1])}: expected non-decreasing ids on action "
                f"tokens, found {int(ids[g])} (position {int(pos[g])}) then {int(ids[g + 1])}"
            )
        if (step > 1).any():
            g = int(np.argmax(step > 1))
            raise ValueError(
                f"{name}: row {int(r)}, position {int(pos[g + 1])}: expected consecutive turn ids on action "
                f"tokens, found {int(ids[g])} then {int(ids[g + 1])} (a turn id with no action token)"
            )


def mc_turn_advantage(
    value: np.ndarray, reward: np.ndarray, row: np.ndarray, *, q: np.ndarray | None = None, turn_gamma: float = 1.0
) -> np.ndarray:
    """The true turn advantage from Monte-Carlo values, flat over turns in row then turn order
    (``(T,)`` each): ``Q̂_k − V̂_k`` when ``q`` is given, else ``R_k + γ_T·V̂_{k+1} − V̂_k`` with
    ``V̂ = 0`` after a row's last turn (``row``: each turn's row, to find the next turn of the same
    row). ``value``: ``mc_value``; ``reward``: ``R_k``, the rewards on the turn's tokens."""
    value = np.asarray(value, dtype=np.float64)
    if q is not None:
        return np.asarray(q, dtype=np.float64) - value
    nxt = np.zeros_like(value)
    if len(value) > 1:
        nxt[:-1] = np.where(row[1:] == row[:-1], value[1:], 0.0)
    return np.asarray(reward, dtype=np.float64) + turn_gamma * nxt - value
