"""KL penalties between the policy and a reference, per token."""

from __future__ import annotations

import torch

from mpo_viz.checks import TensorLike
from mpo_viz.losses._common import as_tensor, check_mask, check_same_shape, result_dtype

__all__ = ["KL_KINDS", "kl_penalty"]

# verl's names for the same estimators are accepted as aliases.
KL_KINDS = {"k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}

LOG_DIFF_CLAMP = 20.0
K3_CLAMP = 10.0


def kl_penalty(
    logp: TensorLike, ref_logp: TensorLike, kind: str = "k3", *, mask: TensorLike | None = None
) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference, ``Δ = logπ − logπ_ref``.

    For tokens sampled from π (on-policy), estimates of KL(π ‖ π_ref) = E_π[Δ]:

    * ``k1 = Δ`` (verl ``kl``): unbiased *value*, high variance, can be negative;
    * ``k2 = ½ Δ²`` (``mse``): biased value, low variance;
    * ``k3 = exp(−Δ) + Δ − 1`` (``low_var_kl``): unbiased value, ≥ 0, low variance; Δ clamped to
      ±20 before ``exp`` (value and gradient stay finite, as verl) and the result to [−10, 10].

    **Values, not gradients.** k1 and k3 are unbiased estimates of the KL's *value* only. Used as
    a loss term (differentiated through ``logπ`` at the sampled tokens), their expected gradients
    are not the KL's: ``E_π[∇k1] = E_π[∇logπ] = 0`` (k1 as a penalty does nothing in expectation)
    and ``E_π[∇k3] = ∇KL(π_ref ‖ π)`` (the reverse direction: biased). ``k2``'s expected gradient
    ``E_π[Δ·∇logπ]`` is exactly ``∇KL(π ‖ π_ref)``. So: log k1/k3 as a metric; put k2 in the loss
    when you want the true KL gradient. The tests check all three on a small categorical example.

    Shapes: ``logp``, ``ref_logp`` (B, L) (any shape, in fact, when no mask is given) → the same
    shape, float64 if ``logp`` is float64 else float32. With ``mask`` (B, L 0/1) masked entries are
    exact zeros with zero gradient. Aggregate with :func:`mpo_viz.losses.aggregate`.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KL_KINDS)}, found {kind!r}")
    lp = as_tensor(logp, "logp")
    dt = result_dtype(lp)
    lp = lp.to(dt)
    ref = as_tensor(ref_logp, "ref_logp", dtype=dt, device=lp.device)
    if tuple(ref.shape) != tuple(lp.shape):
        raise ValueError(f"ref_logp: expected shape {tuple(lp.shape)} (logp's), found {tuple(ref.shape)}")
    zero = torch.zeros((), dtype=dt, device=lp.device)
    if mask is not None:
        m = check_mask(mask, device=lp.device)
        check_same_shape(lp, "logp", m)
        # Sanitize before any arithmetic so garbage on masked tokens cannot reach the gradient.
        lp = torch.where(m, lp, zero)
        ref = torch.where(m, ref, zero)
    d = lp - ref
    k = KL_KINDS[kind]
    if k == "k1":
        out = d
    elif k == "k2":
        out = 0.5 * d * d
    else:
        dc = d.clamp(-LOG_DIFF_CLAMP, LOG_DIFF_CLAMP)
        out = (torch.exp(-dc) + dc - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
    if mask is not None:
        out = torch.where(m, out, zero)
    return out
