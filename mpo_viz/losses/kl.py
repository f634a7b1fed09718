"""KL penalties between the policy and a reference, per token (DESIGN §3.8)."""

from __future__ import annotations

import torch

from mpo_viz.losses._common import as_tensor, check_mask, check_same_shape, result_dtype

__all__ = ["KL_KINDS", "kl_penalty"]

# verl's names for the same estimators are accepted as aliases.
KL_KINDS = {"k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}

LOG_DIFF_CLAMP = 20.0
K3_CLAMP = 10.0


def kl_penalty(logp, ref_logp, kind: str = "k3", *, mask=None) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference, ``Δ = logπ − logπ_ref``.

    * ``k1 = Δ`` (unbiased for KL(π‖π_ref) under samples of π; high variance, can be negative);
    * ``k2 = ½ Δ²`` (biased, low variance; its gradient is the KL gradient on-policy);
    * ``k3 = exp(−Δ) + Δ − 1`` (unbiased, ≥ 0), with Δ clamped to ±20 before ``exp`` (so the value
      and the gradient stay finite, as verl) and the result clamped to [−10, 10].

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
