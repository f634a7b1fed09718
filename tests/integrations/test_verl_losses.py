"""turn_ppo through verl's policy-loss interface equals mpo_viz.losses.policy_loss on the same tensors,
gradients included; with one-token turns it equals verl's own vanilla PPO loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

from mpo_viz.losses import policy_loss, policy_loss_reference

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def actor_config(**kw) -> ActorConfig:
    base = dict(
        strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1, use_dynamic_bsz=False, rollout_n=1
    )
    return ActorConfig(**{**base, **kw})


def tensors(seed=0, B=5, L=23, dtype=torch.float64, one_token_turns=False):
    """A response mask with tool spans (or alternating 1/0: every turn one token), log-probs that
    moved enough for every clip branch to be active somewhere, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    if one_token_turns:
        mask = torch.zeros(B, L, dtype=torch.bool)
        mask[:, ::2] = True
    else:
        mask = torch.zeros(B, L, dtype=torch.bool)
        for i in range(B):
            pos = 0
            while pos < L - 2:
                n = int(torch.randint(1, 6, (1,), generator=g))
                mask[i, pos : pos + n] = True
                pos += n + int(torch.randint(1, 4, (1,), generator=g))
    mask[-1, L // 2 :] = False  # padding
    old = -torch.rand(B, L, generator=g, dtype=dtype) * 3
    logp = (old + torch.randn(B, L, generator=g, dtype=dtype) * 0.35).requires_grad_(True)
    adv = torch.randn(B, L, generator=g, dtype=dtype)
    return old, logp, adv, mask


def _verl_scale(mode, mask):
    """verl 0.9.1's agg_loss divides seq-mean-token-sum-norm by the number of non-empty rows B' *and*
    the horizon L (core_algos.agg_loss: seq-mean, then ``loss /= loss_scale_factor``); mpo_viz's
    mode divides by L only. Its ``scale`` argument (the outer denominator) expresses verl's: L·B'."""
    if mode != "seq-mean-token-sum-norm":
        return None
    return mask.shape[1] * int(mask.any(1).sum())


def ours_through_verl(name, old, logp, adv, mask, mode, cfg, w=None):
    fn = core_algos.get_policy_loss_fn(name)
    return fn(
        old_log_prob=old,
        log_prob=logp,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=mode,
        config=cfg,
        rollout_is_weights=w,
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("clip", [(0.2, 0.2, 3.0), (0.2, 0.28, 1.2)])
@pytest.mark.parametrize("name, ratio", [("turn_ppo", "geo_mean"), ("turn_ppo_product", "product")])
def test_turn_ppo_through_verl_equals_policy_loss(mode, clip, name, ratio):
    lo, hi, c = clip
    cfg = actor_config(clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_c=c, loss_agg_mode=mode)
    old, logp, adv, mask = tensors(seed=1)
    loss, metrics = ours_through_verl(name, old, logp, adv, mask, mode, cfg)
    (g_verl,) = torch.autograd.grad(loss, logp)
    want, ours = policy_loss(
        "turn_ppo",
        logp,
        old,
        adv,
        mask,
        clip_low=lo,
        clip_high=hi,
        ratio=ratio,
        agg=mode,
        dual_clip=c,
        scale=_verl_scale(mode, mask),
    )
    (g_ours,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_verl, g_ours, rtol=1e-12, atol=1e-12)
    assert g_verl[~mask].abs().max() == 0
    assert metrics["actor/turn_clipfrac"] == ours["turn_clipfrac"]
    assert metrics["actor/within_turn_shift"] == ours["within_turn_shift"]
    assert metrics["actor/pg_clipfrac"] == ours["clipfrac"] > 0
    assert metrics["actor/pg_clipfrac_lower"] == ours["dual_clipfrac"]
    if c < 2:
        assert ours["dual_clipfrac"] > 0  # the dual clip is exercised, not just configured
    lr = (logp - old).detach()[mask]
    assert metrics["actor/ppo_kl"] == pytest.approx(float((-lr).mean()), abs=1e-12)


def test_turn_ppo_gradient_equals_the_reference_loop():
    """The independent per-token loop: token-mean of its matrix, and its diagonal gradient."""
    cfg = actor_config(clip_ratio_c=3.0)
    old, logp, adv, mask = tensors(seed=2)
    loss, _ = ours_through_verl("turn_ppo", old, logp, adv, mask, "token-mean", cfg)
    (g,) = torch.autograd.grad(loss, logp)
    mat, grad = policy_loss_reference(
        "turn_ppo",
        logp.detach().numpy(),
        old.numpy(),
        adv.numpy(),
        mask.numpy(),
        clip_low=0.2,
        clip_high=0.2,
        dual_clip=3.0,
    )
    n = mask.sum().item()
    assert loss.item() == pytest.approx(mat.sum() / n, abs=1e-12)
    np.testing.assert_allclose(g.numpy(), grad / n, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_one_token_turns_equal_verl_vanilla(mode):
    """Every turn one token: the turn ratio is the token ratio, so turn_ppo is PPO — and must equal
    verl's compute_policy_loss_vanilla (dual clip c included), loss, gradient and verl's metrics."""
    cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1.5, loss_agg_mode=mode)
    old, logp, adv, mask = tensors(seed=4, one_token_turns=True)
    ours, m1 = ours_through_verl("turn_ppo", old, logp, adv, mask, mode, cfg)
    (g1,) = torch.autograd.grad(ours, logp)
    theirs, m2 = core_algos.compute_policy_loss_vanilla(old, logp, adv, mask, loss_agg_mode=mode, config=cfg)
    (g2,) = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-12)
    for k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert m1[k] == pytest.approx(m2[k], abs=1e-7), k  # verl averages its 0/1 flags in float32
    assert m1["actor/within_turn_shift"] == 0.0
    assert m2["actor/pg_clipfrac"] > 0 and m2["actor/pg_clipfrac_lower"] > 0  # both clips active somewhere


def test_rollout_is_weights_and_global_batch_info_are_verls():
    """verl's rollout-correction weights multiply the loss matrix; global_batch_info (dp size, global
    token count) goes to verl's agg_loss exactly as in compute_policy_loss_vanilla."""
    cfg = actor_config(clip_ratio_c=3.0)
    old, logp, adv, mask = tensors(seed=5, one_token_turns=True)
    w = torch.rand(old.shape, generator=torch.Generator().manual_seed(0), dtype=old.dtype)
    cfg.global_batch_info.update({"dp_size": 2, "batch_num_tokens": 1000})
    ours, _ = ours_through_verl("turn_ppo", old, logp, adv, mask, "token-mean", cfg, w)
    theirs, _ = core_algos.compute_policy_loss_vanilla(
        old, logp, adv, mask, loss_agg_mode="token-mean", config=cfg, rollout_is_weights=w
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_mpo_sao_against_old_log_prob():
    cfg = actor_config(clip_ratio_low=0.3, clip_ratio_high=5.0)
    old, logp, adv, mask = tensors(seed=6)
    loss, metrics = ours_through_verl("mpo_sao", old, logp, adv, mask, "token-mean", cfg)
    want, _ = policy_loss("sao", logp, None, adv, mask, rollout_logp=old, clip_low=0.3, clip_high=5.0)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    assert "actor/turn_clipfrac" in metrics


def test_float32_and_bool_mask_as_verl_passes_them():
    cfg = actor_config()
    old, logp, adv, mask = tensors(seed=7, dtype=torch.float32)
    loss, _ = ours_through_verl("turn_ppo", old, logp, adv, mask, "token-mean", cfg)
    assert loss.dtype == torch.float32 and loss.requires_grad


@pytest.mark.parametrize(
    "kw, key", [({"clip_ratio_c": 1.0}, "clip_ratio_c"), ({"clip_ratio_low": 1.2}, "clip_ratio_low")]
)
def test_bad_clip_settings_name_the_key(kw, key):
    cfg = actor_config(**kw)
    old, logp, adv, mask = tensors()
    with pytest.raises(ValueError, match=rf"actor_rollout_ref\.actor\.{key}"):
        ours_through_verl("turn_ppo", old, logp, adv, mask, "token-mean", cfg)


def test_mpo_gspo_is_registered_where_verl_has_no_gspo(monkeypatch):
    """verl 0.9.1 ships gspo, so mpo_gspo stays out; a verl without it gets ours (GSPO defaults
    3e-4/4e-4 come from the actor config's clip_ratio_low/high, as for every loss here)."""
    import mpo_viz.integrations.verl as plugin

    # a copy of verl's registry without gspo, and a fresh record of ours; both restored afterwards
    monkeypatch.setattr(
        core_algos, "POLICY_LOSS_REGISTRY", {k: v for k, v in core_algos.POLICY_LOSS_REGISTRY.items() if k != "gspo"}
    )
    monkeypatch.setattr(plugin, "_registered", {"estimators": [], "losses": []})
    assert "mpo_gspo" in plugin.register()["losses"]
    cfg = actor_config(clip_ratio_low=3e-4, clip_ratio_high=4e-4, loss_agg_mode="seq-mean-token-mean")
    old, logp, adv, mask = tensors(seed=8)
    loss, _ = ours_through_verl("mpo_gspo", old, logp, adv, mask, "seq-mean-token-mean", cfg)
    want, _ = policy_loss(
        "gspo", logp, old, adv, mask, clip_low=3e-4, clip_high=4e-4, dual_clip=3.0, agg="seq-mean-token-mean"
    )
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)


def test_mpo_cispo_and_mpo_sapo_stay_out_where_verl_has_its_own():
    """verl 0.9.1 ships cispo and sapo: the plugin keeps them and registers no mpo_cispo/mpo_sapo."""
    import mpo_viz.integrations.verl as plugin

    assert core_algos.get_policy_loss_fn("cispo").__module__ == "verl.trainer.ppo.core_algos"
    assert core_algos.get_policy_loss_fn("sapo").__module__ == "verl.trainer.ppo.core_algos"
    assert "mpo_cispo" not in core_algos.POLICY_LOSS_REGISTRY and "mpo_sapo" not in core_algos.POLICY_LOSS_REGISTRY
    assert not {"mpo_cispo", "mpo_sapo"} & set(plugin.registered()["losses"])
    assert plugin.ONLY_IF_MISSING == {"mpo_gspo": "gspo", "mpo_sao": "sao", "mpo_cispo": "cispo", "mpo_sapo": "sapo"}


@pytest.fixture
def without_verls_cispo_sapo(monkeypatch):
    """verl's registry without cispo and sapo (a verl that lacks them), and a fresh record of ours;
    both restored afterwards. Returns what register() registered."""
    import mpo_viz.integrations.verl as plugin

    monkeypatch.setattr(
        core_algos,
        "POLICY_LOSS_REGISTRY",
        {k: v for k, v in core_algos.POLICY_LOSS_REGISTRY.items() if k not in ("cispo", "sapo")},
    )
    monkeypatch.setattr(plugin, "_registered", {"estimators": [], "losses": []})
    return plugin.register()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lo, hi", [(1.0, 4.0), (0.2, 0.28)])
def test_mpo_cispo_equals_verls_cispo_and_policy_loss(without_verls_cispo_sapo, mode, lo, hi):
    """Where registered, mpo_cispo is verl's own compute_policy_loss_cispo (loss, gradient, clip
    fraction) on the same config — and mpo_viz's cispo with the clip of clip_ratio_low/high."""
    assert "mpo_cispo" in without_verls_cispo_sapo["losses"]
    cfg = actor_config(clip_ratio_low=lo, clip_ratio_high=hi, loss_agg_mode=mode)
    old, logp, adv, mask = tensors(seed=9, dtype=torch.float64)
    loss, metrics = ours_through_verl("mpo_cispo", old, logp, adv, mask, mode, cfg)
    (g,) = torch.autograd.grad(loss, logp)
    theirs, m2 = core_algos.compute_policy_loss_cispo(old, logp, adv, mask, loss_agg_mode=mode, config=cfg)
    (g2,) = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(loss, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, g2, rtol=1e-12, atol=1e-12)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(m2["actor/pg_clipfrac"], abs=1e-7)
    want, _ = policy_loss(
        "cispo", logp, old, adv, mask, clip_low=lo, clip_high=hi, agg=mode, scale=_verl_scale(mode, mask)
    )
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    if hi < 1:
        assert m2["actor/pg_clipfrac"] > 0  # the clipped weight is exercised


@pytest.mark.parametrize("taus", [(1.0, 1.05), (2.0, 3.0)])
def test_mpo_sapo_takes_verls_tau_keys_and_equals_verls_sapo(without_verls_cispo_sapo, taus):
    """mpo_sapo reads actor.tau_pos/tau_neg (verl's own keys); with loss_agg_mode=seq-mean-token-mean
    (what verl's sapo always uses) it is verl's compute_policy_loss_sapo, loss and gradient, and the
    per-token reference loop's gradient."""
    assert "mpo_sapo" in without_verls_cispo_sapo["losses"]
    tp, tn = taus
    mode = "seq-mean-token-mean"
    cfg = actor_config(tau_pos=tp, tau_neg=tn, loss_agg_mode=mode)
    old, logp, adv, mask = tensors(seed=10)
    loss, metrics = ours_through_verl("mpo_sapo", old, logp, adv, mask, mode, cfg)
    (g,) = torch.autograd.grad(loss, logp)
    theirs, _ = core_algos.compute_policy_loss_sapo(old, logp, adv, mask, loss_agg_mode=mode, config=cfg)
    (g2,) = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(loss, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, g2, rtol=1e-12, atol=1e-12)
    want, _ = policy_loss("sapo", logp, old, adv, mask, tau_pos=tp, tau_neg=tn, agg=mode)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    _, ref_grad = policy_loss_reference(
        "sapo", logp.detach().numpy(), old.numpy(), adv.numpy(), mask.numpy(), tau_pos=tp, tau_neg=tn
    )
    n = mask.sum(1, keepdim=True).clamp_min(1).numpy()
    rows = int(mask.any(1).sum())
    np.testing.assert_allclose(g.numpy(), ref_grad / n / rows, atol=1e-12)
    assert "actor/turn_clipfrac" in metrics
    # the temperatures reach the loss: the default pair gives another value on this data
    if taus != (1.0, 1.05):
        other, _ = policy_loss("sapo", logp, old, adv, mask, agg=mode)
        assert abs(other.item() - loss.item()) > 1e-6


def test_bad_tau_names_verls_key(without_verls_cispo_sapo):
    cfg = actor_config(tau_pos=-1.0)
    old, logp, adv, mask = tensors()
    with pytest.raises(
        ValueError, match=r"actor_rollout_ref\.actor\.tau_pos: expected a value in \(0, inf\), found -1\.0"
    ):
        ours_through_verl("mpo_sapo", old, logp, adv, mask, "token-mean", cfg)


def test_clip_ratio_low_of_one_is_cispos_no_lower_bound():
    """ε_low = 1 (the ratio's band from 0) is a valid setting, as the toolkit's clip_low declares."""
    from mpo_viz.integrations.verl.losses import read_clip

    assert read_clip(actor_config(clip_ratio_low=1.0, clip_ratio_high=4.0)) == (1.0, 4.0, 3.0)
