"""The clipped critic loss."""

from __future__ import annotations

import torch

from mpo_viz.checks import TensorLike, number
from mpo_viz.data.moments import ExplainedVariance
from mpo_viz.losses._common import (
    as_tensor,
    check_finite,
    check_mask,
    check_same_shape,
    result_dtype,
)
from mpo_viz.losses.aggregate import aggregate

__all__ = ["value_loss"]


def value_loss(
    values: TensorLike,
    old_values: TensorLike | None,
    returns: TensorLike,
    mask: TensorLike,
    *,
    clip: float | None = 0.5,
    agg: str = "token-mean",
    turn_ids: TensorLike | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``½ · agg(max((V − G)², (clip(V, V_old − ε, V_old + ε) − G)²))`` with ε = ``clip``.

    Shapes: ``values`` V (B, L) (the critic's output, differentiable), ``old_values`` V_old (B, L)
    (the values at rollout time; may be None when ``clip`` is None), ``returns`` G (B, L),
    ``mask`` (B, L) 0/1. ``clip=None`` is the plain ``½·agg((V − G)²)``. ``agg``/``turn_ids``/
    ``scale`` as in :func:`mpo_viz.losses.aggregate` (``agg="none"`` returns the ½-scaled matrix).
    ``values``, ``returns`` and ``old_values`` must be finite on action tokens (``ValueError``
    naming the first row and position otherwise); masked positions are never read.

    Returns ``(loss, metrics)``; the dtype is float64 when ``values`` is float64, else float32.
    Metrics (plain floats): ``vf_clipfrac`` — share of action tokens whose clipped branch is strictly
    larger (so the gradient is cut); ``vf_explained_var`` — ``1 − Var(G − V)/Var(G)`` over action
    tokens (NaN when Var(G) = 0 or there are no action tokens; :class:`mpo_viz.data.moments.ExplainedVariance`,
    the one definition); ``vf_mse`` — mean (V − G)² (float64).
    """
    v = as_tensor(values, "values")
    dt = result_dtype(v)
    v = v.to(dt)
    m = check_mask(mask, device=v.device)
    check_same_shape(v, "values", m)
    check_finite(v.detach(), "values", m)
    g = as_tensor(returns, "returns", dtype=dt, device=v.device)
    check_same_shape(g, "returns", m)
    check_finite(g, "returns", m)
    zero = torch.zeros((), dtype=dt, device=v.device)
    v = torch.where(m, v, zero)
    g = torch.where(m, g, zero)
    unclipped = (v - g) ** 2
    if clip is None:
        loss_mat = unclipped
        clipped_active = torch.zeros_like(m)
    else:
        clip = number(clip, "clip")
        if not clip > 0:
            raise ValueError(f"clip: expected a positive number or None, found {clip}")
        if old_values is None:
            raise ValueError("old_values: expected a (B, L) array when clip is set, found None")
        vo = as_tensor(old_values, "old_values", dtype=dt, device=v.device)
        check_same_shape(vo, "old_values", m)
        check_finite(vo, "old_values", m)
        vo = torch.where(m, vo, zero)
        v_clip = vo + (v - vo).clamp(-clip, clip)
        clipped = (v_clip - g) ** 2
        clipped_active = m & (clipped > unclipped)
        loss_mat = torch.where(clipped_active, clipped, unclipped)
    loss = 0.5 * aggregate(loss_mat, m, agg, turn_ids=turn_ids, scale=scale)
    with torch.no_grad():
        ev = ExplainedVariance.of(g, v, m)  # the one definition, float64
        clipfrac = float(clipped_active.sum()) / max(int(m.sum()), 1)
    metrics = {"vf_clipfrac": clipfrac, "vf_explained_var": ev.value, "vf_mse": ev.mse}
    return loss, metrics
