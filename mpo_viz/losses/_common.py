"""Input handling shared by the losses: tensor conversion, shape checks, turn segments.

Every public loss takes ``(B, L)`` torch tensors or numpy arrays. This module turns them into
tensors of one floating dtype on one device (float64 when the leading argument is float64, else
float32), checks shapes against the mask, and builds the flat "segment" index that
turns per-turn reductions into one ``index_add_``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpo_viz.data.turns import check_turn_ids, num_turns, turn_ids_from_mask

__all__ = ["as_tensor", "result_dtype", "check_mask", "check_same_shape", "check_finite", "Segments", "segments"]


def as_tensor(x, name: str, *, dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """``x`` (torch tensor, numpy array or nested list) as a torch tensor, gradient kept.

    Numpy arrays are wrapped without a copy where possible; ``dtype``/``device`` convert (the
    conversion is differentiable, so a float32 ``logp`` cast to float64 still backpropagates).
    """
    if isinstance(x, torch.Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name}: expected a torch tensor or numpy array, found {type(x).__name__}") from e
    if dtype is not None or device is not None:
        t = t.to(dtype=dtype if dtype is not None else t.dtype, device=device if device is not None else t.device)
    return t


def result_dtype(x) -> torch.dtype:
    """float64 when ``x`` is float64 (torch or numpy), else float32."""
    dt = x.dtype
    if dt in (torch.float64, np.float64) or (isinstance(dt, np.dtype) and dt == np.float64):
        return torch.float64
    return torch.float32


def check_mask(mask, name: str = "mask", *, device=None) -> torch.Tensor:
    """The mask as a bool ``(B, L)`` tensor; raises ValueError unless it is 2-D and 0/1."""
    m = as_tensor(mask, name, device=device)
    if m.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D (B, L) array, found shape {tuple(m.shape)}")
    if m.dtype == torch.bool:
        return m
    bad = (m != 0) & (m != 1)
    if bool(bad.any()):
        r = int(bad.any(-1).nonzero()[0, 0])
        c = int(bad[r].nonzero()[0, 0])
        raise ValueError(f"{name}: row {r}: expected 0/1 values, found {m[r, c].item()!r} at position {c}")
    return m != 0


def check_same_shape(x: torch.Tensor, name: str, mask: torch.Tensor) -> None:
    if tuple(x.shape) != tuple(mask.shape):
        raise ValueError(f"{name}: expected shape {tuple(mask.shape)} (the mask's), found {tuple(x.shape)}")


def check_finite(x: torch.Tensor, name: str, mask: torch.Tensor) -> None:
    """Raise ValueError naming the first row/position where ``x`` is NaN/inf on an action token."""
    bad = mask & ~torch.isfinite(x)
    if bool(bad.any()):
        r = int(bad.any(-1).nonzero()[0, 0])
        c = int(bad[r].nonzero()[0, 0])
        raise ValueError(
            f"{name}: row {r}: expected finite values on action tokens, found {x[r, c].item()} at position {c}"
        )


@dataclass(frozen=True)
class Segments:
    """A flat numbering of the turns (or any units) of a batch.

    ``seg[i, t]`` is the global index of the unit of token ``t`` of row ``i`` (0..S−1) for action
    tokens, and ``S`` (a dummy bucket) for masked tokens, so per-unit sums are one ``index_add_``
    into ``S + 1`` slots. ``counts`` (S,) is the number of action tokens of each unit, ``row`` (S,)
    the row it belongs to.
    """

    seg: torch.Tensor  # int64 (B, L)
    num: int  # S
    counts: torch.Tensor  # (S,) float, >= 1
    row: torch.Tensor  # int64 (S,)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Per-unit sums of ``x`` (B, L) over action tokens → (S,). Differentiable."""
        out = torch.zeros(self.num + 1, dtype=x.dtype, device=x.device)
        out = out.index_add(0, self.seg.reshape(-1), x.reshape(-1))
        return out[: self.num]

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """Per-unit means over action tokens → (S,); ``x`` must be zero (or finite) off the mask."""
        return self.sum(x) / self.counts.to(x.dtype)

    def broadcast(self, per_unit: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(S,) → (B, L): each action token gets its unit's value, masked tokens ``fill``."""
        ext = torch.cat([per_unit, per_unit.new_full((1,), fill)])
        return ext[self.seg]


def segments(mask: torch.Tensor, turn_ids=None, *, name: str = "turn_ids", check: bool = True) -> Segments:
    """Segments of the turns of ``mask`` (bool (B, L)).

    ``turn_ids=None`` derives turns from mask runs (:func:`mpo_viz.data.turns.turn_ids_from_mask`);
    given ids are validated with :func:`mpo_viz.data.turns.check_turn_ids` (ValueError naming the row)
    on action tokens only: any id on a masked position (−1 padding included) is accepted.
    """
    if turn_ids is None:
        tid = turn_ids_from_mask(mask)
    else:
        tid = as_tensor(turn_ids, name, device=mask.device)
        if check:
            check_turn_ids(tid, mask, name=name)
        # ids on masked positions are never read (−1 padding, NaN): zero them before the int cast
        tid = torch.where(mask, tid, torch.zeros((), dtype=tid.dtype, device=tid.device)).to(torch.int64)
    k = num_turns(mask, tid)  # (B,)
    offsets = torch.cumsum(k, 0) - k
    total = int(k.sum())
    seg = torch.where(mask, tid + offsets[:, None], torch.full_like(tid, total))
    counts = torch.zeros(total + 1, dtype=torch.float64, device=mask.device)
    counts = counts.index_add(0, seg.reshape(-1), mask.reshape(-1).to(torch.float64))[:total]
    row = torch.repeat_interleave(torch.arange(mask.shape[0], device=mask.device), k)
    return Segments(seg=seg, num=total, counts=counts, row=row)


def row_segments(mask: torch.Tensor) -> Segments:
    """Segments with one unit per row that has at least one action token (GSPO's sequence unit)."""
    return segments(mask, torch.zeros(mask.shape, dtype=torch.int64, device=mask.device), check=False)
