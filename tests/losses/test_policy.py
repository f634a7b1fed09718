"""Policy losses: hand-computed loss matrices and gradients, the MAE regression, metrics, checks."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from mpo_viz.data.turns import turn_ids_from_mask
from mpo_viz.losses import (
    METRIC_NAMES,
    available_losses,
    clip_flags,
    get_loss,
    policy_loss,
    policy_loss_reference,
    register_loss,
)
from mpo_viz.losses.policy import PolicyTerms

ln = math.log
KINDS = ["token_ppo", "turn_ppo", "gspo", "sao", "cispo", "sapo"]


def _logp_pair(logr, seed=0):
    """old_logp (negative numbers) and logp = old + logr, float64; logr may hold NaN for masked."""
    logr = np.asarray(logr, dtype=np.float64)
    old = -1.0 - 0.25 * np.arange(logr.size).reshape(logr.shape)
    lp = torch.tensor(
        np.where(np.isnan(logr), -7.0, old + np.nan_to_num(logr)), dtype=torch.float64, requires_grad=True
    )
    return lp, torch.tensor(old)


def _run(kind, lp, old, adv, mask, **kw):
    loss, metrics = policy_loss(kind, lp, old, adv, mask, agg="none", **kw)
    loss.sum().backward()
    g = lp.grad.clone()
    lp.grad = None
    return loss.detach(), g, metrics


# --------------------------------------------------------------------------------------------
# Hand-computed cases, one per kind
# --------------------------------------------------------------------------------------------


def test_token_ppo_by_hand():
    nan = float("nan")
    logr = [[ln(1.5), ln(0.5), ln(1.1), ln(0.7), nan], [ln(1.5), ln(4.0), ln(0.5), nan, nan]]
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    adv = torch.tensor([[1.0, -1.0, -2.0, 2.0, 0.0], [-1.0, -1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    lp, old = _logp_pair(logr)
    loss, g, met = _run("token_ppo", lp, old, adv, mask)
    # r=1.5,A=+1: clipped high (-1.2); r=.5,A=-1: clipped low (0.8); r=1.1,A=-2: unclipped 2.2;
    # r=.7,A=+2: unclipped -1.4 (no clip for A>0 below the band); r=1.5,A=-1: unclipped 1.5;
    # r=4,A=-1: unclipped 4; r=.5,A=+1: unclipped -0.5.
    exp_loss = [[-1.2, 0.8, 2.2, -1.4, 0], [1.5, 4.0, -0.5, 0, 0]]
    exp_grad = [[0, 0, 2.2, -1.4, 0], [1.5, 4.0, -0.5, 0, 0]]  # −A·r where unclipped
    np.testing.assert_allclose(loss.numpy(), exp_loss, atol=1e-12)
    np.testing.assert_allclose(g.numpy(), exp_grad, atol=1e-12)
    assert met["clipfrac_low"] == pytest.approx(1 / 7)
    assert met["clipfrac_high"] == pytest.approx(1 / 7)
    assert met["clipfrac"] == pytest.approx(2 / 7)
    assert met["dual_clipfrac"] == 0.0
    assert met["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.7 + 1.5 + 4.0 + 0.5) / 7)
    assert met["ratio_min"] == pytest.approx(0.5)
    assert met["ratio_max"] == pytest.approx(4.0)

    # dual clip c=3: r=4, A=-1 → min(4, 3) = 3 and no gradient
    loss, g, met = _run("token_ppo", lp, old, adv, mask, dual_clip=3.0)
    exp_loss[1][1], exp_grad[1][1] = 3.0, 0.0
    np.testing.assert_allclose(loss.numpy(), exp_loss, atol=1e-12)
    np.testing.assert_allclose(g.numpy(), exp_grad, atol=1e-12)
    assert met["dual_clipfrac"] == pytest.approx(1 / 7)

    # token-mean over the 7 action tokens; gradient divided by 7
    lm, _ = policy_loss("token_ppo", lp, old, adv, mask)
    lm.backward()
    assert lm.item() == pytest.approx((-1.2 + 0.8 + 2.2 - 1.4 + 1.5 + 4.0 - 0.5) / 7)
    np.testing.assert_allclose(
        lp.grad.numpy(), np.array([[0, 0, 2.2, -1.4, 0], [1.5, 4.0, -0.5, 0, 0]]) / 7, atol=1e-12
    )


@pytest.mark.parametrize("ratio", ["geo_mean", "product"])
def test_turn_ppo_by_hand(ratio):
    nan = float("nan")
    # turn 0 = positions 0,1 (token ratios 2 and 0.5: ρ = 1 either way); obs at 2;
    # turn 1 = positions 3,4,5 (token ratios 3, 1, 1.125: geometric mean 1.5, product 3.375).
    logr = [[ln(2.0), ln(0.5), nan, ln(3.0), 0.0, ln(1.125), nan]]
    mask = torch.tensor([[1, 1, 0, 1, 1, 1, 0]])
    adv = torch.tensor([[2.0, -3.0, 0.0, 1.0, -1.0, 0.5, 0.0]], dtype=torch.float64)
    lp, old = _logp_pair(logr)
    loss, g, met = _run("turn_ppo", lp, old, adv, mask, ratio=ratio, token_clip=None)  # the bare form
    rho1 = 1.5 if ratio == "geo_mean" else 3.375
    # turn 0: ρ=1 in band, loss −A, grad −A (token_ppo would have clipped both tokens).
    # turn 1: ρ1 > 1.2: A=+1 clipped at −1.2; A=−1 unclipped ρ1 (grad ρ1); A=+.5 clipped at −0.6.
    exp_loss = [[-2.0, 3.0, 0, -1.2, rho1, -0.6, 0]]
    exp_grad = [[-2.0, 3.0, 0, 0, rho1, 0, 0]]
    np.testing.assert_allclose(loss.numpy(), exp_loss, atol=1e-12)
    np.testing.assert_allclose(g.numpy(), exp_grad, atol=1e-12)
    assert met["clipfrac_high"] == pytest.approx(2 / 5)
    assert met["clipfrac_low"] == 0.0
    assert met["turn_clipfrac"] == pytest.approx(1 / 2)
    assert met["turn_ratio_mean"] == pytest.approx((1 + rho1) / 2)
    assert met["turn_ratio_min"] == pytest.approx(1.0)
    assert met["turn_ratio_max"] == pytest.approx(rho1)
    # within-turn shift: Σ (logr − turn mean)² / 5
    lr0, lr1 = [ln(2), ln(0.5)], [ln(3), 0.0, ln(1.125)]
    shift = sum((v - np.mean(lr0)) ** 2 for v in lr0) + sum((v - np.mean(lr1)) ** 2 for v in lr1)
    assert met["within_turn_shift"] == pytest.approx(shift / 5)
    # surrogate gap: token-mean of A·r minus token-mean of A·ρ_k
    tok = 2 * 2.0 + -3 * 0.5 + 1 * 3.0 + -1 * 1.0 + 0.5 * 1.125
    trn = 2 * 1 + -3 * 1 + (1 - 1 + 0.5) * rho1
    assert met["surrogate_gap"] == pytest.approx((tok - trn) / 5)
    # approx_kl = mean(r − 1 − log r), r = π_new/π_old = 2, .5, 3, 1, 1.125 (KL(π_old ‖ π_new), samples of π_old)
    kl = [1 - ln(2), -0.5 + ln(2), 2 - ln(3), 0.0, 0.125 - ln(1.125)]
    assert met["approx_kl"] == pytest.approx(np.mean(kl))


def test_turn_ppo_dual_clip_and_low_side():
    # one turn, ρ = 0.5 < 0.8: A<0 clipped low at 0.8·|A|; A>0 unclipped −0.5·A with gradient.
    # with ρ = 5 and dual clip 3: A<0 → min(5·|A|, 3·|A|) = 3·|A|, no gradient.
    logr = [[ln(0.5), ln(0.5)], [ln(5.0), ln(5.0)]]
    mask = torch.ones(2, 2)
    adv = torch.tensor([[-1.0, 2.0], [-1.0, 2.0]], dtype=torch.float64)
    lp, old = _logp_pair(logr)
    loss, g, met = _run("turn_ppo", lp, old, adv, mask, dual_clip=3.0, token_clip=None)
    np.testing.assert_allclose(loss.numpy(), [[0.8, -1.0], [3.0, -2.4]], atol=1e-12)
    np.testing.assert_allclose(g.numpy(), [[0.0, -1.0], [0.0, 0.0]], atol=1e-12)
    assert met["clipfrac_low"] == pytest.approx(1 / 4)
    assert met["clipfrac_high"] == pytest.approx(1 / 4)
    assert met["dual_clipfrac"] == pytest.approx(1 / 4)


@pytest.mark.parametrize("kind", ["turn_ppo", "gspo"])
def test_token_clip_holds_tokens_past_their_own_band(kind):
    # row 0, one turn: token ratios 3, 0.4, 1 (geometric mean 1.2^(1/3) ≈ 1.063, inside the turn's
    # band); A = +1, −1, +2. With token_clip = 2: the first token (A > 0, r = 3 > 2) and the second
    # (A < 0, r = 0.4 < 1/2) keep their loss −A·ρ and lose their gradient; the third is untouched.
    # row 1: ratios 0.4 (A = +1) and 3 (A = −1) are past the band on the side their advantage does
    # not push, so nothing is held (geometric mean √1.2). gspo: one unit per row, the same numbers.
    logr = [[ln(3.0), ln(0.4), 0.0], [ln(0.4), ln(3.0), float("nan")]]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([[1.0, -1.0, 2.0], [1.0, -1.0, 0.0]], dtype=torch.float64)
    lp, old = _logp_pair(logr)
    r0, r1 = 1.2 ** (1 / 3), 1.2**0.5
    kw = {"clip_low": 0.2, "clip_high": 0.2} if kind == "gspo" else {}
    loss, g, met = _run(kind, lp, old, adv, mask, token_clip=None, **kw)
    exp_loss = [[-r0, r0, -2 * r0], [-r1, r1, 0.0]]
    np.testing.assert_allclose(loss.numpy(), exp_loss, atol=1e-12)
    np.testing.assert_allclose(g.numpy(), exp_loss, atol=1e-12)  # unclipped: gradient −A·ρ
    assert met["clipfrac"] == 0.0
    held = [[0.0, 0.0, -2 * r0], [-r1, r1, 0.0]]
    loss, g, met = _run(kind, lp, old, adv, mask, token_clip=2.0, **kw)
    np.testing.assert_allclose(loss.numpy(), exp_loss, atol=1e-12)
    np.testing.assert_allclose(g.numpy(), held, atol=1e-12)
    assert met["clipfrac_high"] == pytest.approx(1 / 5)
    assert met["clipfrac_low"] == pytest.approx(1 / 5)
    assert met["clipfrac"] == pytest.approx(2 / 5)
    assert met["turn_clipfrac"] == 0.0
    # no option given: turn_ppo holds the band c = 2 by default, gspo holds none
    loss, g, met = _run(kind, lp, old, adv, mask, **kw)
    np.testing.assert_allclose(loss.numpy(), exp_loss, atol=1e-12)
    np.testing.assert_allclose(g.numpy(), held if kind == "turn_ppo" else exp_loss, atol=1e-12)
    assert met["clipfrac"] == pytest.approx(2 / 5 if kind == "turn_ppo" else 0.0)
    # a wide band holds nothing
    _, g, _ = _run(kind, lp, old, adv, mask, token_clip=4.0, **kw)
    np.testing.assert_allclose(g.numpy(), exp_loss, atol=1e-12)


def test_gspo_by_hand():
    nan = float("nan")
    # row 0: all action tokens of the row form one unit: ratios 2, .5, 1 → ρ = 1 (in band)
    # row 1: every token ratio 1.001 → ρ = 1.001 > 1 + 4e-4: A>0 clipped, A<0 unclipped
    logr = [[ln(2.0), ln(0.5), nan, 0.0], [ln(1.001), ln(1.001), ln(1.001), nan]]
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]])
    adv = torch.tensor([[1.0, -2.0, 0.0, 3.0], [1.0, -1.0, 2.0, 0.0]], dtype=torch.float64)
    lp, old = _logp_pair(logr)
    loss, g, met = _run("gspo", lp, old, adv, mask)
    exp_loss = [[-1.0, 2.0, 0, -3.0], [-1.0004, 1.001, -2.0008, 0]]
    exp_grad = [[-1.0, 2.0, 0, -3.0], [0, 1.001, 0, 0]]
    np.testing.assert_allclose(loss.numpy(), exp_loss, atol=1e-9)
    np.testing.assert_allclose(g.numpy(), exp_grad, atol=1e-9)
    # default agg = seq-mean-token-mean: ½ (mean row 0 + mean row 1)
    agg, _ = policy_loss("gspo", lp, old, adv, mask)
    assert agg.item() == pytest.approx(0.5 * ((-1 + 2 - 3) / 3 + (-1.0004 + 1.001 - 2.0008) / 3), abs=1e-9)
    assert met["clipfrac_high"] == pytest.approx(2 / 6)


def test_sao_by_hand_uses_rollout_logp():
    # band (1 − 0.3, 1 + 5) = (0.7, 6): ratios .6 and 6.5 are outside (0, no gradient, either sign)
    rl = [[ln(0.6), ln(0.8), ln(5.5), ln(6.5), ln(0.6)]]
    mask = torch.ones(1, 5)
    adv = torch.tensor([[1.0, -2.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    lp, roll = _logp_pair(rl)
    old = roll + 0.5  # a different old_logp: the ratio must not use it
    loss, g, met = _run("sao", lp, old, adv, mask, rollout_logp=roll)
    np.testing.assert_allclose(loss.numpy(), [[0.0, 1.6, -5.5, 0.0, 0.0]], atol=1e-12)
    np.testing.assert_allclose(g.numpy(), [[0.0, 1.6, -5.5, 0.0, 0.0]], atol=1e-12)
    assert met["clipfrac_low"] == pytest.approx(2 / 5)
    assert met["clipfrac_high"] == pytest.approx(1 / 5)
    assert met["ratio_max"] == pytest.approx(6.5)
    # approx_kl is between old and new: log r = log(π_new/π_old) = logr − 0.5
    d = np.array([ln(0.6), ln(0.8), ln(5.5), ln(6.5), ln(0.6)]) - 0.5
    assert met["approx_kl"] == pytest.approx(np.mean(np.exp(d) - 1 - d))
    # defaults for sao come from the registry
    assert (get_loss("sao").clip_low, get_loss("sao").clip_high) == (0.3, 5.0)
    # old_logp is optional for sao: the loss is unchanged, approx_kl is then against rollout_logp
    loss2, met2 = policy_loss("sao", lp, None, adv, mask, rollout_logp=roll, agg="none")
    assert torch.equal(loss2.detach(), loss)
    r = np.array([0.6, 0.8, 5.5, 6.5, 0.6])
    assert met2["approx_kl"] == pytest.approx(np.mean(r - 1 - np.log(r)))


@pytest.mark.parametrize(
    "band, kept", [("math", [0, 1, 1, 1, 0, 0]), ("code", [1, 1, 1, 0, 0, 0]), (None, [0, 1, 1, 1, 0, 0])]
)
def test_sao_named_bands(band, kept):
    # ratios .3 .8 1.5 5 6.5 .1: math keeps (0.7, 6.0), code (0.2, 4.0); kept tokens: value and gradient -A·r
    r = np.array([0.3, 0.8, 1.5, 5.0, 6.5, 0.1])
    lp, roll = _logp_pair([[ln(x) for x in r]])
    adv = torch.tensor([[1.0, -2.0, 1.0, -1.0, 2.0, 1.0]], dtype=torch.float64)
    loss, g, met = _run("sao", lp, roll, adv, torch.ones(1, 6), rollout_logp=roll, band=band)
    want = np.where(np.array(kept) == 1, -adv.numpy()[0] * r, 0.0)
    np.testing.assert_allclose(loss.numpy()[0], want, atol=1e-12)
    np.testing.assert_allclose(g.numpy()[0], want, atol=1e-12)
    lo, hi = {"math": (0.7, 6.0), "code": (0.2, 4.0), None: (0.7, 6.0)}[band]
    assert met["clipfrac_low"] == pytest.approx(np.mean(r <= lo)) and met["clipfrac_high"] == pytest.approx(
        np.mean(r >= hi)
    )
    ref_loss, ref_grad = policy_loss_reference(
        "sao", lp.detach().numpy(), None, adv.numpy(), np.ones((1, 6)), rollout_logp=roll.numpy(), band=band
    )
    np.testing.assert_allclose(ref_loss[0], want, atol=1e-12)
    np.testing.assert_allclose(ref_grad[0], want, atol=1e-12)


def test_sao_band_and_an_explicit_clip_disagree_clearly():
    z = torch.zeros(1, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"band: band='code' sets clip_low=0.8, found clip_low=0.3"):
        policy_loss("sao", z, z, z, torch.ones(1, 3), rollout_logp=z, band="code", clip_low=0.3)
    # the same value is no conflict; the band is a declared choice
    policy_loss("sao", z, z, z, torch.ones(1, 3), rollout_logp=z, band="code", clip_low=0.8)
    with pytest.raises(ValueError, match=r"band: expected one of math, code"):
        policy_loss("sao", z, z, z, torch.ones(1, 3), rollout_logp=z, band="chess")


# --------------------------------------------------------------------------------------------
# The regression test: MAE's within-turn centering must reach the gradient
# --------------------------------------------------------------------------------------------


def test_mae_centering_reaches_gradient_naive_turn_ratio_cancels_it():
    """Keep the token-gradient form. A differentiable per-turn ratio cancels MAE's centered part."""
    n = 4
    a_turn = 0.5
    u = torch.tensor([0.3, 0.1, -0.1, -0.3], dtype=torch.float64)  # centered within-turn signal
    old = torch.full((1, n), -2.0, dtype=torch.float64)
    drift = torch.tensor([[0.05, -0.02, 0.03, 0.02]], dtype=torch.float64)  # ρ = exp(0.02), in band
    mask = torch.ones(1, n)
    rho = math.exp(drift.mean().item())

    def ours(beta):
        lp = (old + drift).clone().requires_grad_(True)
        adv = (a_turn + beta * u)[None]
        loss, _ = policy_loss("turn_ppo", lp, old, adv, mask, agg="none")
        loss.sum().backward()
        return lp.grad[0]

    def naive(beta):  # ρ_k differentiable, every token −A_{k,j}·ρ_k
        lp = (old + drift).clone().requires_grad_(True)
        adv = (a_turn + beta * u)[None]
        rho_k = torch.exp((lp - old).mean())
        (-adv * rho_k).sum().backward()
        return lp.grad[0]

    # token-gradient form: ∂/∂logπ_j = −A_{k,j}·ρ_k — the centered part is there
    np.testing.assert_allclose(ours(1.0).numpy(), (-(a_turn + u) * rho).numpy(), atol=1e-12)
    assert not torch.allclose(ours(1.0), ours(0.0))
    # naive: every token gets −ρ_k·mean_j A_{k,j} = −ρ_k·A^T_k whatever β is
    np.testing.assert_allclose(naive(1.0).numpy(), np.full(n, -rho * a_turn), atol=1e-12)
    np.testing.assert_allclose(naive(1.0).numpy(), naive(0.0).numpy(), atol=1e-12)


# --------------------------------------------------------------------------------------------
# Masks, extremes, equivalence with the reference loop
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "turn-mean", "none"]
)
def test_masked_positions_get_exactly_zero_gradient(kind, agg):
    g = torch.Generator().manual_seed(3)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    base = -torch.rand(3, 6, generator=g, dtype=torch.float64)
    lp = (base + 0.3 * torch.randn(3, 6, generator=g, dtype=torch.float64)).masked_fill(mask == 0, float("-inf"))
    lp.requires_grad_(True)
    old = base.masked_fill(mask == 0, float("nan"))
    adv = torch.randn(3, 6, generator=g, dtype=torch.float64).masked_fill(mask == 0, float("inf"))
    loss, metrics = policy_loss(kind, lp, old, adv, mask, agg=agg, rollout_logp=old)
    loss.sum().backward()
    assert torch.isfinite(lp.grad).all()
    assert (lp.grad[mask == 0] == 0).all()
    assert torch.isfinite(loss).all()
    assert set(metrics) == set(METRIC_NAMES)
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("drift", [3.0, -3.0])
def test_product_ratio_on_long_turns_stays_finite(dtype, drift):
    # two turns of 500 tokens, log-ratio drift of ±3 per token: Σ = ±1500 → clamped at ±20
    L = 1000
    mask = torch.ones(2, L)
    old = torch.full((2, L), -5.0, dtype=dtype)
    lp = (
        old + drift + 0.5 * torch.randn(2, L, dtype=dtype, generator=torch.Generator().manual_seed(0))
    ).requires_grad_(True)
    adv = torch.randn(2, L, dtype=dtype, generator=torch.Generator().manual_seed(1))
    tid = torch.cat([torch.zeros(500), torch.ones(500)]).long().expand(2, L)
    for agg in ["token-mean", "turn-mean", "none"]:
        loss, met = policy_loss("turn_ppo", lp, old, adv, mask, turn_ids=tid, ratio="product", agg=agg, dual_clip=3.0)
        loss.sum().backward()
        assert torch.isfinite(loss).all() and torch.isfinite(lp.grad).all()
        lp.grad = None
        assert all(math.isfinite(v) for v in met.values())
        assert met["turn_ratio_max"] == pytest.approx(math.exp(20 if drift > 0 else -20), rel=1e-5)
    # without dual clip, A<0 tokens keep the unclipped gradient ρ·|A| — large but finite
    loss, _ = policy_loss("turn_ppo", lp, old, adv, mask, turn_ids=tid, ratio="product")
    loss.backward()
    assert torch.isfinite(lp.grad).all()


@pytest.mark.parametrize("kind", KINDS)
def test_turn_ids_on_masked_positions_change_nothing(kind):
    # only action tokens define turns: −1 padding, garbage, NaN (float ids) on masked positions are
    # accepted and give the same loss, gradient and metrics as clean ids
    from mpo_viz.losses import aggregate, value_loss

    rng = np.random.default_rng(7)
    mask = torch.tensor([[1, 1, 0, 1, 1, 0, 0], [0, 1, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0]])
    clean = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0]])
    odd = clean.clone()
    odd[mask == 0] = torch.tensor([-1, 5, -1, -1, 9, -1, 3, -1, -1, -1, -1, -1, -1, -1])[: int((mask == 0).sum())]
    oddf = odd.double()
    oddf[0, 6] = float("nan")
    old = torch.tensor(-rng.random((3, 7)))
    base = old + torch.tensor(rng.normal(0, 0.3, (3, 7)))
    adv = torch.tensor(rng.normal(0, 1, (3, 7)))
    results = []
    for tid in (clean, odd, oddf):
        lp = base.clone().requires_grad_(True)
        loss, met = policy_loss(kind, lp, old, adv, mask, turn_ids=tid, rollout_logp=old, agg="turn-mean")
        loss.backward()
        vl, _ = value_loss(base, old, adv, mask, agg="turn-mean", turn_ids=tid)
        results.append(
            (loss.item(), lp.grad.clone(), met, aggregate(adv, mask, "turn-mean", turn_ids=tid).item(), vl.item())
        )
    for got in results[1:]:
        assert got[0] == results[0][0] and got[3] == results[0][3] and got[4] == results[0][4]
        assert torch.equal(got[1], results[0][1])
        assert got[2] == pytest.approx(results[0][2], nan_ok=True)


def _random_case(rng, B, L, edge):
    mask = (rng.random((B, L)) < 0.6).astype(np.int64)
    if edge == "one_token_turns":
        mask = np.tile(np.array([1, 0] * L)[:L], (B, 1))
    elif edge == "empty_rows":
        mask[0] = 0
    elif edge == "all_masked":
        mask[:] = 0
    old = -rng.random((B, L)) * 3
    scale = 25.0 if edge == "huge_drift" else 0.4
    lp = old + rng.normal(0, scale, (B, L))
    adv = rng.normal(0, 1, (B, L))
    roll = old + rng.normal(0, 0.5, (B, L))
    tid = None
    if edge == "given_turn_ids":  # merge every pair of runs into one turn (obs inside a turn)
        from mpo_viz.data.turns import turn_ids_from_mask

        tid = turn_ids_from_mask(mask) // 2
    return lp, old, adv, mask, roll, tid


@pytest.mark.parametrize("kind", KINDS + ["turn_ppo+token_clip", "gspo+token_clip", "turn_ppo+bare"])
@pytest.mark.parametrize("ratio", ["geo_mean", "product"])
@pytest.mark.parametrize(
    "edge", ["random", "one_token_turns", "empty_rows", "all_masked", "huge_drift", "given_turn_ids"]
)
def test_matches_reference_loop(kind, ratio, edge):
    rng = np.random.default_rng(zlib.crc32(f"{kind}/{ratio}/{edge}".encode()))
    lp, old, adv, mask, roll, tid = _random_case(rng, 4, 23, edge)
    kind, _, variant = kind.partition("+")
    dual = 3.0 if kind in ("token_ppo", "turn_ppo", "gspo") else None
    kw = {"dual_clip": dual} if dual else {}
    band = "default"  # neither side is told: each takes the kind's own default (turn_ppo: 2.0)
    if variant == "token_clip":
        band = kw["token_clip"] = 1.3  # token ratios of the random case spread well past 1.3
    elif variant == "bare":
        band = kw["token_clip"] = None
    t = torch.tensor(lp, requires_grad=True)
    loss, _ = policy_loss(kind, t, old, adv, mask, turn_ids=tid, ratio=ratio, rollout_logp=roll, agg="none", **kw)
    loss.sum().backward()
    ref_loss, ref_grad = policy_loss_reference(
        kind, lp, old, adv, mask, turn_ids=tid, ratio=ratio, rollout_logp=roll, dual_clip=dual, token_clip=band
    )
    np.testing.assert_allclose(loss.detach().numpy(), ref_loss, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(t.grad.numpy(), ref_grad, rtol=1e-10, atol=1e-10)


def test_numpy_in_float32_out_and_float64_kept():
    mask = np.ones((2, 3))
    lp32 = np.full((2, 3), -1.0, dtype=np.float32)
    loss, _ = policy_loss("token_ppo", lp32, lp32, np.ones((2, 3)), mask)
    assert loss.dtype == torch.float32
    loss, _ = policy_loss("token_ppo", lp32.astype(np.float64), lp32, np.ones((2, 3), dtype=np.float32), mask)
    assert loss.dtype == torch.float64
    assert loss.item() == pytest.approx(-1.0)
    bf = torch.full((2, 3), -1.0, dtype=torch.bfloat16, requires_grad=True)
    loss, _ = policy_loss("turn_ppo", bf, lp32, np.ones((2, 3)), mask)
    loss.backward()
    assert loss.dtype == torch.float32 and bf.grad.dtype == torch.bfloat16


def test_no_action_token_metrics():
    mask = torch.zeros(2, 3)
    lp = torch.zeros(2, 3, requires_grad=True)
    loss, met = policy_loss("turn_ppo", lp, torch.zeros(2, 3), torch.ones(2, 3), mask)
    loss.backward()
    assert loss.item() == 0.0 and (lp.grad == 0).all()
    assert met["clipfrac"] == 0.0 and met["turn_clipfrac"] == 0.0
    assert math.isnan(met["ratio_mean"]) and math.isnan(met["turn_ratio_max"]) and math.isnan(met["approx_kl"])


# --------------------------------------------------------------------------------------------
# Registry and bad input
# --------------------------------------------------------------------------------------------


def test_registry_declares_needs_and_refuses_duplicates():
    assert set(KINDS) <= set(available_losses())
    assert get_loss("turn_ppo").needs == frozenset({"turns"})
    assert get_loss("sao").needs == frozenset({"rollout_logp"}) and get_loss("sao").ratio_against == "rollout_logp"
    assert get_loss("token_ppo").needs == frozenset()
    assert (get_loss("gspo").clip_low, get_loss("gspo").clip_high, get_loss("gspo").agg) == (
        3e-4,
        4e-4,
        "seq-mean-token-mean",
    )
    assert (get_loss("token_ppo").clip_low, get_loss("turn_ppo").clip_high) == (0.2, 0.2)
    with pytest.raises(ValueError, match="already registered"):
        register_loss("turn_ppo", lambda x: None)
    with pytest.raises(ValueError, match="needs"):
        register_loss("new_kind_bad_needs", lambda x: None, needs=("values",))


def test_register_refuses_presets_outside_the_kinds_options():
    def f(x, *, level=None):
        return None

    with pytest.raises(ValueError, match="presets: expected presets of the kind's own options"):
        register_loss("preset_probe", f, options=("level",), presets={"other": {"a": {"clip_low": 0.1}}})
    with pytest.raises(ValueError, match="presets: expected presets of the kind's own options"):
        register_loss("preset_probe", f, options=("level",), presets={"level": {"a": {"tau_pos": 2.0}}})
    assert "preset_probe" not in available_losses()


def test_register_custom_kind():
    name = "test_zero_loss_kind"
    if name not in available_losses():

        @register_loss(name)
        def _zero(x):
            z = torch.zeros_like(x.mask)
            return PolicyTerms(loss=x.logp * 0, clipped_low=z, clipped_high=z, dual_clipped=z)

    loss, met = policy_loss(name, torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    assert loss.item() == 0.0 and met["ratio_mean"] == 1.0


def test_bad_input_raises_clearly():
    m = torch.ones(2, 5)
    z = torch.zeros(2, 5)
    with pytest.raises(ValueError, match=r"advantages: expected shape \(2, 5\).*found \(2, 4\)"):
        policy_loss("token_ppo", z, z, torch.zeros(2, 4), m)
    with pytest.raises(ValueError, match=r"old_logp: expected shape"):
        policy_loss("token_ppo", z, torch.zeros(5), z, m)
    with pytest.raises(ValueError, match=r"logp: expected a 2-D"):
        policy_loss("token_ppo", torch.zeros(5), torch.zeros(5), torch.zeros(5), torch.ones(5))
    with pytest.raises(ValueError, match=r"turn_ids: row 1, position 2: expected non-decreasing ids on action tokens"):
        policy_loss("turn_ppo", z, z, z, m, turn_ids=torch.tensor([[0, 0, 1, 1, 1], [0, 1, 0, 1, 1]]))
    with pytest.raises(ValueError, match=r"turn_ids: row 0, position 2: expected consecutive"):
        policy_loss("turn_ppo", z, z, z, m, turn_ids=torch.tensor([[0, 0, 2, 2, 2], [0, 0, 0, 0, 0]]))
    with pytest.raises(ValueError, match=r"turn_ids: row 1, position 0: expected the first action token in turn 0"):
        policy_loss("turn_ppo", z, z, z, m, turn_ids=torch.tensor([[0, 0, 0, 0, 0], [1, 1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=r"turn_ids: expected shape"):
        policy_loss("turn_ppo", z, z, z, m, turn_ids=torch.zeros(2, 4, dtype=torch.long))
    # strings and flags are not numbers, even where float() would take them
    with pytest.raises(ValueError, match=r"clip_low: expected a number, found '0.2'"):
        policy_loss("token_ppo", z, z, z, m, clip_low="0.2")
    with pytest.raises(ValueError, match=r"clip_high: expected a number, found True"):
        policy_loss("token_ppo", z, z, z, m, clip_high=True)
    with pytest.raises(ValueError, match=r"dual_clip: expected a number, found '3'"):
        policy_loss("token_ppo", z, z, z, m, dual_clip="3")
    with pytest.raises(ValueError, match=r"scale: expected a number, found '8'"):
        policy_loss("token_ppo", z, z, z, m, scale="8")
    with pytest.raises(ValueError, match=r"mask: row 0: expected 0/1"):
        policy_loss("token_ppo", z, z, z, torch.tensor([[1, 2, 1, 1, 1], [1, 1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=r"advantages: row 1: expected finite.*position 3"):
        policy_loss("token_ppo", z, z, torch.tensor([[0.0] * 5, [0, 0, 0, float("nan"), 0]]), m)
    with pytest.raises(ValueError, match=r"rollout_logp: the 'sao' loss needs rollout_logp"):
        policy_loss("sao", z, z, z, m)
    with pytest.raises(ValueError, match=r"kind: expected one of .*turn_ppo.*found 'ppo'"):
        policy_loss("ppo", z, z, z, m)
    with pytest.raises(ValueError, match=r"options: sao accepts band; found unknown option\(s\) dual_clip"):
        policy_loss("sao", z, z, z, m, rollout_logp=z, dual_clip=3.0)
    with pytest.raises(
        ValueError,
        match=r"options: turn_ppo accepts dual_clip, token_clip; found unknown option\(s\) clip "
        r"\(keywords of every kind: turn_ids, clip_low, clip_high, ratio, agg, scale, rollout_logp\)",
    ):
        policy_loss("turn_ppo", z, z, z, m, clip=0.2)
    with pytest.raises(ValueError, match=r"ratio: expected one of geo_mean, product, found 'arith'"):
        policy_loss("turn_ppo", z, z, z, m, ratio="arith")
    with pytest.raises(ValueError, match=r"agg: expected one of"):
        policy_loss("turn_ppo", z, z, z, m, agg="mean")
    with pytest.raises(ValueError, match=r"dual_clip: expected a number > 1"):
        policy_loss("token_ppo", z, z, z, m, dual_clip=0.5)
    with pytest.raises(
        ValueError,
        match=r"token_clip: expected a number > 1 \(a band \[1/c, c\] on each token's own "
        r"ratio\) or None, found 1.0",
    ):
        policy_loss("turn_ppo", z, z, z, m, token_clip=1.0)
    with pytest.raises(ValueError, match=r"options: token_ppo accepts dual_clip; found unknown option\(s\) token_clip"):
        policy_loss("token_ppo", z, z, z, m, token_clip=2.0)


@pytest.mark.parametrize(
    "agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "turn-mean"]
)
def test_agg_equals_aggregate_of_the_matrix(agg):
    from mpo_viz.losses import aggregate

    rng = np.random.default_rng(7)
    lp, old, adv, mask, roll, _ = _random_case(rng, 3, 11, "random")
    tid = np.array([[0] * 11, [0] * 11, [0] * 11])  # one turn per row, given as numpy
    mat, _ = policy_loss("turn_ppo", lp, old, adv, mask, turn_ids=tid, agg="none")
    out, _ = policy_loss("turn_ppo", lp, old, adv, mask, turn_ids=tid, agg=agg, scale=None)
    assert out.item() == pytest.approx(aggregate(mat, mask, agg, turn_ids=tid).item())
    out, _ = policy_loss("turn_ppo", lp, old, adv, mask, turn_ids=tid, agg=agg, scale=5.0)
    assert out.item() == pytest.approx(aggregate(mat, mask, agg, turn_ids=tid, scale=5.0).item())


@pytest.mark.parametrize("kind", ["turn_ppo", "gspo"])
def test_product_ratio_warns_once_with_what_the_clip_does(kind):
    from mpo_viz import checks

    checks._WARNED.clear()
    mask = torch.ones(2, 20)
    lp = torch.zeros(2, 20, requires_grad=True)
    adv = torch.ones(2, 20)
    # ε = 0.2: log(1.2) = 0.1823, −log(0.8) = 0.2231; per token at n = 20: 0.00912 (0.91%)
    with pytest.warns(
        UserWarning,
        match=rf"{kind}: ratio='product' clips .* \[0.8, 1.2\].*"
        r"\[-0.223/n, \+0.182/n\]: at n = 20 that is a 0.91% move per token",
    ) as rec:
        policy_loss(kind, lp, torch.zeros(2, 20), adv, mask, ratio="product", clip_low=0.2, clip_high=0.2)
    assert "median unit of this batch has 20 tokens" in str(rec[0].message)
    assert rec[0].filename == __file__  # points at the caller
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: no second warning, none for geo_mean
        policy_loss(kind, lp, torch.zeros(2, 20), adv, mask, ratio="product", clip_low=0.2, clip_high=0.2)
        policy_loss(kind, lp, torch.zeros(2, 20), adv, mask)
    checks._WARNED.clear()


# --------------------------------------------------------------------------------------------
# clip_flags: which tokens and turns each kind clips


@pytest.mark.filterwarnings("ignore:turn_ppo. ratio='product'")
def test_clip_flags_by_hand():
    """Token ratios [5/3, 1, 0.4, 1.8] in turns [0, 0, 1, 1], advantages [+, −, −, +]."""
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.2, 0.9]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.3, 0.5, 0.5, 0.5]], dtype=torch.float64))
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    mask, tid = torch.ones(1, 4), torch.tensor([[0, 0, 1, 1]])

    def flags(kind, **kw):
        f = clip_flags(kind, lp, old, adv, mask, turn_ids=tid, rollout_logp=old, **kw)
        return f.clipped[0].tolist(), f.turn_clipped.tolist(), f

    # token_ppo, band [0.8, 1.2]: 5/3 with A > 0 and 0.4 with A < 0 and 1.8 with A > 0 are clipped
    tok, turns, f = flags("token_ppo")
    assert tok == [True, False, True, True]
    np.testing.assert_allclose(f.ratio[0].numpy(), [5 / 3, 1.0, 0.4, 1.8], rtol=1e-12)
    # ρ_0 = sqrt(5/3) = 1.291 (out), ρ_1 = sqrt(0.72) = 0.849 (in): for every kind
    np.testing.assert_allclose(f.turn_ratio.numpy(), [math.sqrt(5 / 3), math.sqrt(0.72)], rtol=1e-12)
    assert turns == [True, False] and f.turn_row.tolist() == [0, 0]
    # turn_ppo: turn 0 is out of the band above — its A > 0 token is clipped, its A < 0 token is not;
    # turn 1 is inside, but token 2's own ratio 0.4 < 1/2 with A < 0: the token band holds it
    assert flags("turn_ppo")[0] == [True, False, True, False]
    assert flags("turn_ppo", token_clip=None)[0] == [True, False, False, False]
    assert flags("turn_ppo", agg="turn-mean")[0] == [True, False, True, False]  # agg changes no flag
    # product ratio: ρ_0 = 5/3 (out), ρ_1 = 0.72 (out below): token 2 (A < 0) clipped by the turn too
    tok, turns, _ = flags("turn_ppo", ratio="product", token_clip=None)
    assert tok == [True, False, True, False] and turns == [True, True]
    # sao against the rollout log-probs (here the old ones), band (0.7, 6.0): only 0.4 is dropped
    assert flags("sao")[0] == [False, False, True, False]
    # cispo ε 1.0 / 4.0: the weight is clipped past 5 only; with ε_high 0.5 at 5/3 and 1.8
    assert flags("cispo")[0] == [False, False, False, False]
    assert flags("cispo", clip_high=0.5)[0] == [True, False, False, True]
    # sapo clips nothing; gspo (3e-4 / 4e-4): ρ = exp(mean of all four) = 1.0466, out above: A > 0 tokens
    assert flags("sapo")[0] == [False] * 4
    assert flags("gspo")[0] == [True, False, False, True]


@pytest.mark.parametrize("kind", ["token_ppo", "turn_ppo", "gspo", "sao", "turn_ppo+bare"])
@pytest.mark.parametrize("edge", ["random", "one_token_turns", "empty_rows", "all_masked", "given_turn_ids"])
def test_clip_flags_are_the_tokens_without_gradient_in_the_reference_loop(kind, edge):
    """For the clipping kinds a token with A ≠ 0 gets no gradient exactly when it is clipped; the turn
    flags' mean is the ``turn_clipfrac`` metric; the ratio is exp(logπ − base)."""
    rng = np.random.default_rng(zlib.crc32(f"flags/{kind}/{edge}".encode()))
    lp, old, adv, mask, roll, tid = _random_case(rng, 4, 23, edge)
    kind, _, variant = kind.partition("+")
    kw = {"dual_clip": 3.0} if kind != "sao" else {}
    if variant == "bare":
        kw["token_clip"] = None
    f = clip_flags(kind, torch.tensor(lp), old, adv, mask, turn_ids=tid, rollout_logp=roll, **kw)
    _, grad = policy_loss_reference(
        kind,
        lp,
        old,
        adv,
        mask,
        turn_ids=tid,
        rollout_logp=roll,
        token_clip=kw.get("token_clip", "default"),
        dual_clip=kw.get("dual_clip"),
    )
    act = mask != 0
    np.testing.assert_array_equal(f.clipped.numpy(), act & (grad == 0))
    base = roll if kind == "sao" else old
    np.testing.assert_allclose(f.ratio.numpy(), np.where(act, np.exp(lp - base), 1.0), rtol=1e-12)
    _, met = policy_loss(kind, torch.tensor(lp), old, adv, mask, turn_ids=tid, rollout_logp=roll, **kw)
    assert met["turn_clipfrac"] == pytest.approx(
        float(f.turn_clipped.double().mean()) if f.turn_clipped.numel() else 0.0
    )
    ids = turn_ids_from_mask(mask) if tid is None else np.asarray(tid)
    assert f.turn_row.tolist() == [i for i in range(mask.shape[0]) for _ in np.unique(ids[i][act[i]])]
