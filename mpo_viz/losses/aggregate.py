"""Loss aggregation: a per-token loss matrix → a scalar, in six modes."""

from __future__ import annotations

import torch

from mpo_viz.checks import TensorLike, number
from mpo_viz.losses._common import as_tensor, check_mask, check_same_shape, segments

__all__ = ["AGG_MODES", "aggregate", "check_scale", "reduce_checked"]

AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "turn-mean",
    "none",
)


def aggregate(
    loss_matrix: TensorLike,
    mask: TensorLike,
    mode: str = "token-mean",
    *,
    turn_ids: TensorLike | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``L`` (B, L) over the action tokens of ``mask`` (B, L, 0/1).

    With ``m`` the mask and B' the number of rows with at least one action token:

    * ``token-mean``: ``Σ m·L / Σ m`` — or ``Σ m·L / scale`` with ``scale`` given (the global token
      count under gradient accumulation);
    * ``seq-mean-token-sum``: ``(1/B') Σ_i Σ_t m·L``;
    * ``seq-mean-token-mean``: ``(1/B') Σ_i (Σ_t m·L / Σ_t m)``;
    * ``seq-mean-token-sum-norm``: ``Σ_i Σ_t m·L / C`` with ``C = scale`` (default the padded length
      L; no 1/B, as verl);
    * ``turn-mean``: the mean over all turns of the batch (each turn weighs 1) of the token-mean
      inside the turn; turns from ``turn_ids`` (read on action tokens only: any id on a masked
      position, −1 padding included, is ignored) or, when None, from mask runs;
    * ``none``: the matrix itself with exact zeros where masked.

    ``scale`` (a positive number) replaces the outer denominator in every mode — the token count
    (token-mean), B' (seq-mean-*), C (token-sum-norm) or the turn count (turn-mean) — so a caller
    who splits a batch into micro-batches can pass the global count; it is an error with ``none``.
    An empty denominator (no action token, no row, no turn) gives 0, still attached to the graph.

    Masked entries of ``L`` are never read (NaN there is harmless) and get exactly zero gradient.
    Returns a 0-d tensor (``none``: (B, L)) of ``L``'s dtype (float64 stays float64, else float32).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"mode: expected one of {', '.join(AGG_MODES)}, found {mode!r}")
    loss = as_tensor(loss_matrix, "loss_matrix")
    m = check_mask(mask, device=loss.device)
    if loss.dim() != 2:
        raise ValueError(f"loss_matrix: expected a 2-D (B, L) array, found shape {tuple(loss.shape)}")
    check_same_shape(loss, "loss_matrix", m)
    if not loss.is_floating_point() or loss.dtype not in (torch.float32, torch.float64):
        loss = loss.to(torch.float32)
    scale = check_scale(scale, mode)
    segs = segments(m, turn_ids) if mode == "turn-mean" else None
    return reduce_checked(loss, m, mode, scale=scale, turn_segments=segs)


def check_scale(scale, mode: str, *, mode_arg: str = "mode") -> float | None:
    """``scale`` as a positive float (or None); ValueError with ``mode='none'``, where nothing is
    divided (``mode_arg`` names the mode argument in the message: ``mode`` or ``agg``)."""
    if scale is None:
        return None
    if mode == "none":
        raise ValueError(f"scale: expected None with {mode_arg}='none' (nothing is divided), found a value")
    scale = number(scale, "scale")
    if not scale > 0:
        raise ValueError(f"scale: expected a positive number, found {scale}")
    return scale


def reduce_checked(loss: torch.Tensor, m: torch.Tensor, mode: str, *, scale: float | None, turn_segments=None):
    """:func:`aggregate` on already checked inputs: ``loss`` float (B, L), ``m`` bool (B, L),
    ``turn_segments`` (a :class:`~mpo_viz.losses._common.Segments`) needed for ``turn-mean``."""
    lm = torch.where(m, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    mf = m.to(loss.dtype)
    if mode == "none":
        return lm
    if mode == "token-mean":
        den = mf.sum().clamp_min(1) if scale is None else scale
        return lm.sum() / den
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        n_tok = mf.sum(-1)
        per_row = lm.sum(-1)
        if mode == "seq-mean-token-mean":
            per_row = per_row / n_tok.clamp_min(1)
        den = (n_tok > 0).sum().clamp_min(1).to(loss.dtype) if scale is None else scale
        return per_row.sum() / den
    if mode == "seq-mean-token-sum-norm":
        den = float(loss.shape[-1]) if scale is None else scale
        if den == 0:  # L == 0: nothing to sum
            return lm.sum()
        return lm.sum() / den
    if mode == "turn-mean":
        segs = turn_segments
        per_turn = segs.sum(lm) / segs.counts.to(loss.dtype)
        den = max(segs.num, 1) if scale is None else scale
        return per_turn.sum() / den
    raise ValueError(f"mode: expected one of {', '.join(AGG_MODES)}, found {mode!r}")
