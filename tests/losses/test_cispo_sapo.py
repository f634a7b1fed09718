"""CISPO and SAPO: our kernels against SkyRL's own functions (fixtures/skyrl_cispo_sapo.json, with its
provenance), and hand-derived values: the clipped weight that keeps every token, the soft gate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mpo_viz.losses import get_loss, loss_options, policy_loss

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "skyrl_cispo_sapo.json").read_text(encoding="utf-8"))


def _inputs():
    x = FIXTURE["inputs"]
    return (
        torch.tensor(x["logp"], dtype=torch.float64),
        torch.tensor(x["old_logp"], dtype=torch.float64),
        torch.tensor(x["advantages"], dtype=torch.float64),
        np.asarray(x["mask"]),
    )


def _loss_and_grad(kind, lp, old, adv, mask, **kw):
    t = lp.clone().requires_grad_(True)
    loss, metrics = policy_loss(kind, t, old, adv, mask, agg="none", **kw)
    loss.sum().backward()
    return loss.detach().numpy(), t.grad.numpy(), metrics


@pytest.mark.parametrize(
    "case", FIXTURE["cases"], ids=lambda c: f"{c['kind']}-{'-'.join(map(str, c['options'].values()))}"
)
def test_matches_skyrl_on_action_tokens(case):
    lp, old, adv, mask = _inputs()
    loss, grad, _ = _loss_and_grad(case["kind"], lp, old, adv, mask, **case["options"])
    on = mask == 1
    np.testing.assert_allclose(loss[on], np.asarray(case["loss"])[on], rtol=0, atol=1e-6)
    np.testing.assert_allclose(grad[on], np.asarray(case["grad"])[on], rtol=0, atol=1e-6)
    assert (loss[~on] == 0).all() and (grad[~on] == 0).all()


def test_fixture_says_where_it_came_from():
    p = FIXTURE["provenance"]
    assert p["repository"] == "NovaSky-AI/SkyRL" and len(p["commit"]) == 40
    assert "ppo_utils.py:" in p["functions"]["cispo"] and "ppo_utils.py:" in p["functions"]["sapo"]


def test_cispo_by_hand_clips_the_weight_keeps_the_token():
    # r = e^{±1.2} = 3.32 / 0.301; at ε 0.2/0.28 both clip: weights 1.28 and 0.8, gradient -A·w, loss -A·w·logπ
    lp = torch.tensor([[-0.5, -1.0, -2.0]], dtype=torch.float64)
    old = lp - torch.tensor([[1.2, -1.2, 0.1]], dtype=torch.float64)
    adv = torch.tensor([[2.0, -1.0, 0.5]], dtype=torch.float64)
    loss, grad, met = _loss_and_grad("cispo", lp, old, adv, [[1, 1, 1]], clip_low=0.2, clip_high=0.28)
    w = np.array([1.28, 0.8, math.exp(0.1)])
    np.testing.assert_allclose(grad[0], -adv.numpy()[0] * w, rtol=1e-12)
    np.testing.assert_allclose(loss[0], -adv.numpy()[0] * w * lp.numpy()[0], rtol=1e-12)
    assert (grad != 0).all()  # PPO would give the first two tokens no gradient
    assert met["clipfrac_high"] == pytest.approx(1 / 3) and met["clipfrac_low"] == pytest.approx(1 / 3)
    # defaults 1.0 / 4.0: no lower bound, weight at most 5
    loss, grad, met = _loss_and_grad(
        "cispo", lp, lp - torch.tensor([[2.0, -3.0, 0.0]], dtype=torch.float64), adv, [[1, 1, 1]]
    )
    np.testing.assert_allclose(grad[0], -adv.numpy()[0] * np.array([5.0, math.exp(-3.0), 1.0]), rtol=1e-12)
    assert met["clipfrac_low"] == 0 and met["clipfrac_high"] == pytest.approx(1 / 3)
    assert get_loss("cispo").clip_low == 1.0 and get_loss("cispo").clip_high == 4.0


def test_sapo_by_hand_soft_gate():
    # r = 1: gate 4/τ·½ = 2/τ, gradient -A·4·¼·1 = -A (the policy gradient) whatever τ
    lp = torch.tensor([[-0.5, -1.0, -2.0, -0.3]], dtype=torch.float64)
    adv = torch.tensor([[2.0, -1.0, 0.0, 0.7]], dtype=torch.float64)
    loss, grad, met = _loss_and_grad("sapo", lp, lp.clone(), adv, [[1, 1, 1, 1]])
    np.testing.assert_allclose(grad[0], -adv.numpy()[0], rtol=1e-12)
    np.testing.assert_allclose(loss[0], -adv.numpy()[0] * 2 / np.array([1.0, 1.05, 1.05, 1.0]), rtol=1e-12)
    # r = e^{0.5}, τ+ = 2: σ = 1/(1+e^{-2(r-1)}), loss -A·2σ, gradient -A·4σ(1-σ)·r
    r = math.exp(0.5)
    sig = 1 / (1 + math.exp(-2 * (r - 1)))
    loss, grad, met = _loss_and_grad("sapo", lp[:, :1], lp[:, :1] - 0.5, adv[:, :1], [[1]], tau_pos=2.0)
    assert loss[0, 0] == pytest.approx(-2.0 * 2 * sig, rel=1e-12)
    assert grad[0, 0] == pytest.approx(-2.0 * 4 * sig * (1 - sig) * r, rel=1e-12)
    assert met["clipfrac"] == 0.0
    assert get_loss("sapo").agg == "seq-mean-token-mean"
    assert {o.name: o.default for o in loss_options("sapo")}["tau_neg"] == 1.05


@pytest.mark.parametrize("kind", ["cispo", "sapo"])
def test_all_masked_and_one_token_turns(kind):
    lp = torch.tensor([[-0.5, -1.0, -2.0, -0.3], [-0.1, -0.2, -0.3, -0.4]], dtype=torch.float64)
    old = lp - 0.4
    adv = torch.tensor([[1.0, -2.0, 0.5, 1.5], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = [[1, 0, 1, 0], [0, 0, 0, 0]]  # one-token turns; an all-masked row
    t = lp.clone().requires_grad_(True)
    loss, met = policy_loss(kind, t, old, adv, mask)
    loss.backward()
    assert torch.isfinite(loss) and (t.grad[1] == 0).all() and (t.grad[0, [1, 3]] == 0).all()
    assert (t.grad[0, [0, 2]] != 0).all()
    t = lp.clone().requires_grad_(True)
    none, _ = policy_loss(kind, t, old, adv, [[0] * 4, [0] * 4])
    none.backward()
    assert none.item() == 0.0 and (t.grad == 0).all()


def test_sapo_temperatures_are_checked():
    lp = torch.zeros(1, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="tau_pos"):
        policy_loss("sapo", lp, lp, lp, [[1, 1]], tau_pos=0.0)
    with pytest.raises(ValueError, match="tau_neg"):
        policy_loss("token_ppo", lp, lp, lp, [[1, 1]], tau_neg=1.0)
