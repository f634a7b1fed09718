"""kl_penalty against closed forms; value_loss by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mpo_viz.losses import kl_penalty, value_loss


def test_kl_elementwise_by_hand():
    d = torch.tensor([0.0, 0.5, -1.0, 30.0, -30.0], dtype=torch.float64)
    ref = torch.full_like(d, -2.0)
    lp = (ref + d).requires_grad_(True)
    np.testing.assert_allclose(kl_penalty(lp, ref, "k1").detach().numpy(), d.numpy(), atol=1e-12)
    np.testing.assert_allclose(kl_penalty(lp, ref, "k2").detach().numpy(), 0.5 * d.numpy() ** 2, atol=1e-12)
    k3 = kl_penalty(lp, ref, "k3")
    # e^-Δ + Δ − 1; Δ = ±30 is clamped to ±20 first, then the result to 10
    exp = [0.0, math.exp(-0.5) - 0.5, math.e - 2, 10.0, 10.0]
    np.testing.assert_allclose(k3.detach().numpy(), exp, atol=1e-12)
    k3.sum().backward()
    # ∂k3/∂Δ = 1 − e^-Δ inside the clamps, 0 outside
    np.testing.assert_allclose(lp.grad.numpy(), [0.0, 1 - math.exp(-0.5), 1 - math.e, 0.0, 0.0], atol=1e-12)
    assert kl_penalty(lp, ref, "low_var_kl").detach().equal(k3.detach())  # verl's name


def test_kl_expectations_equal_the_closed_form():
    # Over a categorical π, E_π[k1] = E_π[k3] = KL(π ‖ π_ref) exactly; E_π[k2] = ½ E_π[Δ²].
    g = torch.Generator().manual_seed(0)
    # mild distributions: k3 stays below its clamp at 10 (which would bias it)
    logits = 0.5 * torch.randn(4, 9, generator=g, dtype=torch.float64)
    ref_logits = 0.5 * torch.randn(4, 9, generator=g, dtype=torch.float64)
    lp, lr = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
    p = lp.exp()
    kl = (p * (lp - lr)).sum(-1)  # closed form
    assert torch.allclose((p * kl_penalty(lp, lr, "k1")).sum(-1), kl)
    assert kl_penalty(lp, lr, "k3").max() < 10
    assert torch.allclose((p * kl_penalty(lp, lr, "k3")).sum(-1), kl)
    assert torch.allclose((p * kl_penalty(lp, lr, "k2")).sum(-1), 0.5 * (p * (lp - lr) ** 2).sum(-1))
    # the on-policy gradient of E_π[k2] is the gradient of KL: E_π[∇ ½Δ²] = E_π[Δ ∇logπ] = ∇KL
    th = logits.clone().requires_grad_(True)
    lpt = torch.log_softmax(th, -1)
    (lpt.exp() * (lpt - lr)).sum().backward()
    grad_kl = th.grad.clone()
    th.grad = None
    lpt = torch.log_softmax(th, -1)
    (lpt.exp().detach() * kl_penalty(lpt, lr, "k2")).sum().backward()
    assert torch.allclose(th.grad, grad_kl)


def test_kl_as_a_loss_term_values_unbiased_gradients_only_k2():
    # π = softmax(θ) = [.5, .25, .25], π_ref = [.25, .25, .5]; tokens x ~ π. Δ = [ln 2, 0, −ln 2].
    # KL(π‖π_ref) = .5·ln 2 + .25·(−ln 2) = .25·ln 2. With ∇_θ logπ(x) = e_x − π:
    #   ∇KL = Σ π Δ (e_x − π) = π ⊙ (Δ − KL) = ln 2 · [.375, −.0625, −.3125]
    #   E[∇k1] = Σ π (e_x − π) = 0
    #   E[∇k2] = Σ π Δ (e_x − π) = ∇KL                       (exact)
    #   E[∇k3] = Σ π (1 − e^{−Δ}) (e_x − π) = π − π_ref = [.25, 0, −.25] = ∇KL(π_ref‖π)   (biased)
    ln2 = math.log(2.0)
    th = torch.tensor([ln2, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    ref = torch.log(torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64))
    kl = 0.25 * ln2
    want_value = {"k1": kl, "k2": 0.5 * (0.5 * ln2**2 + 0.25 * ln2**2), "k3": kl}
    want_grad = {"k1": [0.0, 0.0, 0.0], "k2": [0.375 * ln2, -0.0625 * ln2, -0.3125 * ln2], "k3": [0.25, 0.0, -0.25]}
    for kind in ("k1", "k2", "k3"):
        lp = torch.log_softmax(th, -1)
        np.testing.assert_allclose(lp.exp().detach().numpy(), [0.5, 0.25, 0.25])
        expected = (lp.exp().detach() * kl_penalty(lp, ref, kind)).sum()  # E_{x~π}[k(x)], π not differentiated
        assert expected.item() == pytest.approx(want_value[kind], abs=1e-12), kind
        expected.backward()
        np.testing.assert_allclose(th.grad.numpy(), want_grad[kind], atol=1e-12, err_msg=kind)
        th.grad = None
    assert want_value["k2"] != pytest.approx(kl)  # k2's value is biased
    assert want_grad["k3"] != pytest.approx(want_grad["k2"])  # k3's gradient is biased


def test_kl_mask_and_errors():
    lp = torch.tensor([[0.0, float("nan")]], requires_grad=True)
    out = kl_penalty(lp, torch.tensor([[1.0, 0.0]]), "k3", mask=torch.tensor([[1, 0]]))
    assert out[0, 1] == 0.0
    out.sum().backward()
    assert lp.grad[0, 1] == 0.0 and torch.isfinite(lp.grad).all()
    with pytest.raises(ValueError, match=r"kind: expected one of k1"):
        kl_penalty(lp, lp, "k4")
    with pytest.raises(ValueError, match=r"ref_logp: expected shape \(1, 2\)"):
        kl_penalty(lp, torch.zeros(1, 3), "k1")


def test_value_loss_by_hand():
    v = torch.tensor([[1.0, 2.0, 0.3, 3.0, 3.0, 99.0]], dtype=torch.float64, requires_grad=True)
    vo = torch.tensor([[0.0, 2.2, 0.0, 2.0, 2.0, float("nan")]], dtype=torch.float64)
    g = torch.tensor([[2.0, 1.0, -1.0, 4.0, 0.0, float("nan")]], dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 1, 1, 0]])
    loss, met = value_loss(v, vo, g, m, clip=0.5)
    # per token max((V−G)², (clip(V, Vo±.5) − G)²): 2.25 (clipped), 1, 1.69, 2.25 (clipped), 9
    assert loss.item() == pytest.approx(0.5 * (2.25 + 1 + 1.69 + 2.25 + 9) / 5)
    loss.backward()
    np.testing.assert_allclose(v.grad.numpy(), [[0.0, 2.0 / 10, 2.6 / 10, 0.0, 6.0 / 10, 0.0]], atol=1e-12)
    assert met["vf_clipfrac"] == pytest.approx(2 / 5)
    assert met["vf_mse"] == pytest.approx((1 + 1 + 1.69 + 1 + 9) / 5)
    err = np.array([1.0, -1.0, -1.3, 1.0, -3.0])
    ret = np.array([2.0, 1.0, -1.0, 4.0, 0.0])
    assert met["vf_explained_var"] == pytest.approx(1 - err.var() / ret.var())
    # without clipping: ½ mean (V − G)²
    loss, _ = value_loss(v, None, g, m, clip=None)
    assert loss.item() == pytest.approx(0.5 * (1 + 1 + 1.69 + 1 + 9) / 5)
    # another aggregation passes through
    loss, _ = value_loss(v, vo, g, m, agg="seq-mean-token-sum")
    assert loss.item() == pytest.approx(0.5 * (2.25 + 1 + 1.69 + 2.25 + 9))


def test_value_loss_errors():
    z = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="old_values: expected a \\(B, L\\) array when clip is set"):
        value_loss(z, None, z, torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"returns: expected shape \(1, 3\)"):
        value_loss(z, z, torch.zeros(1, 2), torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"clip: expected a number, found '0.5'"):
        value_loss(z, z, z, torch.ones(1, 3), clip="0.5")


@pytest.mark.parametrize("which", ["values", "returns", "old_values"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_value_loss_refuses_non_finite_on_action_tokens(which, bad):
    m = torch.tensor([[1, 1, 0], [0, 1, 1]])
    x = {k: torch.zeros(2, 3, dtype=torch.float64) for k in ("values", "returns", "old_values")}
    for k in x:
        x[k][0, 2] = bad  # masked position: never read
    value_loss(x["values"], x["old_values"], x["returns"], m)
    x[which][1, 2] = bad
    with pytest.raises(
        ValueError,
        match=rf"^{which}: row 1: expected finite values on action tokens, found "
        rf"{bad} at position 2",
    ):
        value_loss(x["values"], x["old_values"], x["returns"], m)
