"""turn_ppo's options (token_clip, dual_clip, ratio) from a verl run's configuration.

The route is verl's own: ``actor_rollout_ref.actor.policy_loss._target_`` names
``mpo_viz.integrations.verl.config.TurnPPOLossConfig``, verl's ``omega_conf_to_dataclass`` (what
its engine workers call on the actor config) instantiates it, and the loss verl's registry returns
for ``loss_mode`` reads it. Each case is checked against ``mpo_viz.losses.policy_loss`` and the
per-token reference loop ``policy_loss_reference``; the default against the toolkit's own
declaration of turn_ppo.
"""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException
from verl.trainer.ppo import core_algos
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import PolicyLossConfig

from mpo_viz.integrations.verl.config import TurnPPOLossConfig, core_default, loss_options
from mpo_viz.losses import policy as P
from mpo_viz.losses import policy_loss, policy_loss_reference

TARGET = "actor_rollout_ref.actor.policy_loss._target_=mpo_viz.integrations.verl.config.TurnPPOLossConfig"
BASE = [
    "algorithm.adv_estimator=mpo",
    "critic.enable=True",
    "actor_rollout_ref.actor.policy_loss.loss_mode=turn_ppo",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
]


def actor(extra=()):
    """verl's ppo_trainer.yaml with the overrides, the actor config built as verl's workers build it."""
    d = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=d, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[*BASE, *extra])
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def tensors(seed=0, B=6, L=40, spread=0.6):
    """Turns of 2-7 tokens between tool spans, log-probs moved far enough (spread) that tokens sit
    past a band of 1.5 and of 2 on both sides, advantages of both signs; float64."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, L, dtype=torch.bool)
    for i in range(B):
        pos = 0
        while pos < L - 3:
            n = int(torch.randint(2, 8, (1,), generator=g))
            mask[i, pos : pos + n] = True
            pos += n + int(torch.randint(1, 4, (1,), generator=g))
    old = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3
    logp = (old + torch.randn(B, L, generator=g, dtype=torch.float64) * spread).requires_grad_(True)
    adv = torch.randn(B, L, generator=g, dtype=torch.float64)
    return old, logp, adv, mask


def through_verl(cfg, old, logp, adv, mask):
    fn = core_algos.get_policy_loss_fn(cfg.policy_loss.loss_mode)
    loss, metrics = fn(
        old_log_prob=old,
        log_prob=logp,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=cfg.loss_agg_mode,
        config=cfg,
        rollout_is_weights=None,
    )
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad, metrics


def ours(old, logp, adv, mask, **kw):
    loss, metrics = policy_loss("turn_ppo", logp, old, adv, mask, clip_low=0.2, clip_high=0.2, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad, metrics


def reference_grad(old, logp, adv, mask, **kw):
    """The per-token loop's gradient of the token-mean loss."""
    _, grad = policy_loss_reference(
        "turn_ppo", logp.detach().numpy(), old.numpy(), adv.numpy(), mask.numpy(), clip_low=0.2, clip_high=0.2, **kw
    )
    return grad / mask.sum().item()


def band_tokens(old, logp, adv, mask, c):
    """Action tokens the band [1/c, c] holds: A > 0 and r > c, or A < 0 and r < 1/c."""
    r = torch.exp(logp.detach() - old)
    return int((mask & (((adv > 0) & (r > c)) | ((adv < 0) & (r < 1 / c)))).sum())


def test_the_default_is_the_toolkits_declaration():
    declared = inspect.signature(P.get_loss("turn_ppo").fn).parameters["token_clip"].default
    assert core_default("turn_ppo", "token_clip") == declared
    assert TurnPPOLossConfig().token_clip == declared == P.TURN_PPO_TOKEN_CLIP == 2.0
    assert TurnPPOLossConfig().dual_clip == "clip_ratio_c" and TurnPPOLossConfig().ratio is None


@pytest.mark.parametrize("target", [False, True])
def test_without_options_verl_runs_turn_ppo_with_the_toolkits_defaults(target):
    """verl's own PolicyLossConfig (no _target_ override) and ours with nothing set give the loss
    of policy_loss("turn_ppo") called with no token_clip, verl's clip_ratio_c as the dual clip."""
    cfg = actor([TARGET] if target else [])
    assert type(cfg.policy_loss) is (TurnPPOLossConfig if target else PolicyLossConfig)
    old, logp, adv, mask = tensors(seed=1)
    loss, grad, _ = through_verl(cfg, old, logp, adv, mask)
    want, want_grad, _ = ours(old, logp, adv, mask, dual_clip=3.0)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad.numpy(), reference_grad(old, logp, adv, mask, dual_clip=3.0), atol=1e-12)


@pytest.mark.parametrize("value, c", [("1.5", 1.5), ("2.0", 2.0), ("3", 3.0), ("null", None)])
def test_token_clip_from_the_command_line(value, c):
    cfg = actor([TARGET, f"+actor_rollout_ref.actor.policy_loss.token_clip={value}"])
    assert cfg.policy_loss.token_clip == c
    old, logp, adv, mask = tensors(seed=2)
    loss, grad, metrics = through_verl(cfg, old, logp, adv, mask)
    want, want_grad, want_metrics = ours(old, logp, adv, mask, dual_clip=3.0, token_clip=c)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        grad.numpy(), reference_grad(old, logp, adv, mask, dual_clip=3.0, token_clip=c), atol=1e-12
    )
    assert metrics["actor/pg_clipfrac"] == want_metrics["clipfrac"]
    # the band is not just configured: tokens past it get no gradient, the bare form moves them
    _, bare_grad, _ = ours(old, logp, adv, mask, dual_clip=3.0, token_clip=None)
    if c is None:
        torch.testing.assert_close(grad, bare_grad, rtol=0, atol=0)
    else:
        held = mask & (
            ((adv > 0) & (torch.exp(logp.detach() - old) > c)) | ((adv < 0) & (torch.exp(logp.detach() - old) < 1 / c))
        )
        assert band_tokens(old, logp, adv, mask, c) > 0
        assert grad[held].abs().max() == 0
        assert (bare_grad[held] != 0).any()
        torch.testing.assert_close(grad[~held], bare_grad[~held], rtol=0, atol=0)


def test_dual_clip_and_ratio_from_the_command_line():
    old, logp, adv, mask = tensors(seed=3)
    set_ = "+actor_rollout_ref.actor.policy_loss."
    cases = [
        (
            [f"{set_}dual_clip=null", "actor_rollout_ref.actor.clip_ratio_c=1.3", f"{set_}token_clip=2.0"],
            dict(token_clip=2.0),
        ),
        (
            [f"{set_}dual_clip=1.3", "actor_rollout_ref.actor.clip_ratio_c=10", f"{set_}token_clip=2.0"],
            dict(dual_clip=1.3, token_clip=2.0),
        ),
        ([f"{set_}ratio=product", f"{set_}token_clip=null"], dict(ratio="product", dual_clip=3.0, token_clip=None)),
    ]
    for extra, kw in cases:
        cfg = actor([TARGET, *extra])
        loss, grad, _ = through_verl(cfg, old, logp, adv, mask)
        want, want_grad, _ = ours(old, logp, adv, mask, **kw)
        torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
    # the dual clip acts on this data: off and c = 1.3 give different losses
    assert ours(old, logp, adv, mask, dual_clip=None)[0] != ours(old, logp, adv, mask, dual_clip=1.3)[0]


def test_turn_ppo_product_takes_the_options_too():
    cfg = actor(
        [
            TARGET,
            "actor_rollout_ref.actor.policy_loss.loss_mode=turn_ppo_product",
            "+actor_rollout_ref.actor.policy_loss.token_clip=1.5",
        ]
    )
    old, logp, adv, mask = tensors(seed=4)
    loss, grad, _ = through_verl(cfg, old, logp, adv, mask)
    want, want_grad, _ = ours(old, logp, adv, mask, ratio="product", dual_clip=3.0, token_clip=1.5)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)


def test_a_plain_dict_policy_loss_is_read_too():
    """verl's legacy workers pass a DictConfig actor; a mapping with the keys works the same."""
    assert loss_options({"loss_mode": "turn_ppo", "token_clip": None}, "turn_ppo")["token_clip"] is None
    assert loss_options({"loss_mode": "turn_ppo"}, "turn_ppo")["token_clip"] == core_default("turn_ppo", "token_clip")
    assert loss_options(None, "turn_ppo_product")["ratio"] == "product"


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["+actor_rollout_ref.actor.policy_loss.token_clip=0.5"],
            r"actor_rollout_ref\.actor\.policy_loss\.token_clip: expected a number > 1 or null, found 0\.5",
        ),
        (
            ["+actor_rollout_ref.actor.policy_loss.token_clip=wide"],
            r"actor_rollout_ref\.actor\.policy_loss\.token_clip: expected a number > 1 or null, found 'wide'",
        ),
        (
            ["+actor_rollout_ref.actor.policy_loss.dual_clip=1"],
            r"actor_rollout_ref\.actor\.policy_loss\.dual_clip: expected a number > 1 or null, found 1",
        ),
        (
            ["+actor_rollout_ref.actor.policy_loss.ratio=mean"],
            r"actor_rollout_ref\.actor\.policy_loss\.ratio: expected one of geo_mean, product or null, found 'mean'",
        ),
        (
            [
                "actor_rollout_ref.actor.policy_loss.loss_mode=turn_ppo_product",
                "+actor_rollout_ref.actor.policy_loss.ratio=geo_mean",
            ],
            r"actor_rollout_ref\.actor\.policy_loss\.ratio: loss_mode turn_ppo_product is the product ratio",
        ),
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"],
            r"actor_rollout_ref\.actor\.policy_loss\.loss_mode: TurnPPOLossConfig configures "
            r"turn_ppo, turn_ppo_product; "
            r"found 'vanilla'",
        ),
    ],
)
def test_bad_values_stop_where_verl_builds_the_actor_config(extra, message):
    with pytest.raises(InstantiationException, match=message):
        actor([TARGET, *extra])


def test_without_the_target_verl_refuses_the_key():
    """Why the _target_ override: verl's PolicyLossConfig takes no key it does not declare."""
    with pytest.raises(InstantiationException, match="unexpected keyword argument 'token_clip'"):
        actor(["+actor_rollout_ref.actor.policy_loss.token_clip=1.5"])


def test_the_engine_workers_actor_loss_reads_the_options():
    """verl's engine workers train the actor with ``verl.workers.utils.losses.ppo_loss`` bound to the
    actor config they build (``engine_workers.py``: ``partial(ppo_loss, config=actor_config)``).
    Fed a batch in the workers' layout (unpadded model log-probs, left-padded prompts, the global
    token count), it computes turn_ppo with the band from the command line."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    cfg = actor([TARGET, "+actor_rollout_ref.actor.policy_loss.token_clip=1.5"])
    old, logp, adv, mask = tensors(seed=5)
    B, R = mask.shape
    g = torch.Generator().manual_seed(5)
    prompt_lens = torch.randint(2, 6, (B,), generator=g)
    P = int(prompt_lens.max())
    resp_lens = torch.tensor([int(torch.nonzero(mask[i]).max()) + 1 for i in range(B)])
    attention = torch.zeros(B, P + R, dtype=torch.int64)
    chunks = []
    for i in range(B):
        attention[i, P - prompt_lens[i] : P] = 1
        attention[i, P : P + resp_lens[i]] = 1
        # the model's log-prob of token t+1 sits at position t (verl left-shifts by one)
        seq = torch.randn(int(prompt_lens[i] + resp_lens[i]), generator=g, dtype=torch.float64)
        seq[prompt_lens[i] - 1 : prompt_lens[i] - 1 + resp_lens[i]] = logp.detach()[i, : resp_lens[i]]
        chunks.append(seq)
    flat = torch.cat(chunks).requires_grad_(True)
    td = tu.get_tensordict(
        {
            "prompts": torch.zeros(B, P, dtype=torch.int64),
            "responses": torch.zeros(B, R, dtype=torch.int64),
            "attention_mask": attention,
            "response_mask": mask.to(torch.int64),
            "old_log_probs": old,
            "advantages": adv,
        },
        non_tensor_dict={"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": B},
    )
    loss, metrics = ppo_loss(cfg, {"log_probs": flat}, td)
    (grad,) = torch.autograd.grad(loss, flat)

    padded = no_padding_2_padding(flat, td)  # verl's own slicing of the model output
    torch.testing.assert_close(padded.detach()[mask], logp.detach()[mask], rtol=0, atol=0)
    want, ours_metrics = policy_loss(
        "turn_ppo", padded, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=3.0, token_clip=1.5
    )
    (want_grad,) = torch.autograd.grad(want, flat)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
    assert band_tokens(old, logp, adv, mask, 1.5) > 0
    bare, _ = policy_loss("turn_ppo", padded, old, adv, mask, dual_clip=3.0, token_clip=None)
    (bare_grad,) = torch.autograd.grad(bare, flat)
    assert not torch.equal(grad, bare_grad)
    assert metrics["actor/clipfrac_high"].values == [pytest.approx(ours_metrics["clipfrac_high"])]


def test_sapo_temperatures_from_the_command_line():
    """mpo_sapo's options are verl's own actor keys (ActorConfig declares tau_pos/tau_neg for verl's
    sapo): set on the command line, composed and instantiated as verl's workers do, they reach the
    loss. (verl 0.9.1 has its own sapo, so mpo_sapo is called here as the function the plugin would
    register.)"""
    from mpo_viz.integrations.verl.losses import verl_loss

    cfg = actor(
        [
            "actor_rollout_ref.actor.tau_pos=2.0",
            "actor_rollout_ref.actor.tau_neg=3.0",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        ]
    )
    assert (cfg.tau_pos, cfg.tau_neg) == (2.0, 3.0)
    old, logp, adv, mask = tensors(seed=6)
    loss, _ = verl_loss("mpo_sapo")(old, logp, adv, mask, loss_agg_mode=cfg.loss_agg_mode, config=cfg)
    want, _ = policy_loss("sapo", logp, old, adv, mask, tau_pos=2.0, tau_neg=3.0, agg="seq-mean-token-mean")
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    default, _ = policy_loss("sapo", logp, old, adv, mask, agg="seq-mean-token-mean")
    assert abs(default.item() - loss.item()) > 1e-6
