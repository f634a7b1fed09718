"""The overrides of docs/verl.md compose with verl's own Hydra config (ppo_trainer.yaml), and the
resulting config objects drive our estimator and loss exactly as verl's trainer passes them."""

from __future__ import annotations

import os

import pytest
import torch
import verl
import verl.trainer.ppo.ray_trainer as rt
from hydra import compose, initialize_config_dir
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.utils import need_critic
from verl.utils.config import omega_conf_to_dataclass

import mpo_viz.advantages as A
from mpo_viz.integrations.verl.batch import move_observation_rewards
from mpo_viz.losses import policy_loss
from tests.integrations.verl_batches import copy, multi_turn_batch

RECIPE = [
    "algorithm.adv_estimator=mpo",
    "critic.enable=True",
    "actor_rollout_ref.actor.policy_loss.loss_mode=turn_ppo",
    "actor_rollout_ref.model.external_lib=mpo_viz.integrations.verl",
    "+algorithm.mpo.beta=0.5",
    "+algorithm.mpo.turn_lam=0.95",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
]


def composed(extra=()):
    d = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=d, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[*RECIPE, *extra])


def test_recipe_overrides_compose_and_drive_the_estimator(tmp_path):
    cfg = composed([f"+algorithm.mpo_viz.run_dir={tmp_path / 'run'}"])
    assert need_critic(cfg) is True
    data = multi_turn_batch(seed=21)
    out = rt.compute_advantage(
        copy(data),
        adv_estimator=cfg.algorithm.adv_estimator,
        gamma=cfg.algorithm.gamma,
        lam=cfg.algorithm.lam,
        num_repeat=1,
        norm_adv_by_std_in_grpo=True,
        config=cfg.algorithm,
    )
    r, _, _ = move_observation_rewards(data.batch["token_level_rewards"], data.batch["response_mask"])
    want, _ = A.mae(r, data.batch["values"], data.batch["response_mask"].float(), beta=0.5, turn_lam=0.95)
    torch.testing.assert_close(out.batch["advantages"], want, rtol=0, atol=0)
    assert (tmp_path / "run" / "trajectories" / "iter=000000.parquet").exists()


def test_without_critic_enable_the_critic_is_off_and_mpo_is_refused():
    cfg = composed(["critic.enable=null"])
    with pytest.warns(UserWarning, match="critic.enable=True"):
        assert need_critic(cfg) is False  # verl starts a critic by default only for gae
    data = multi_turn_batch(seed=0, with_values=False)
    with pytest.raises(ValueError, match=r"critic\.enable=True"):
        rt.compute_advantage(data, adv_estimator="mpo", config=cfg.algorithm)


def test_recipe_actor_config_drives_the_loss():
    cfg = composed(["actor_rollout_ref.actor.clip_ratio_high=0.28"])
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == "turn_ppo"
    fn = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(3, 12, dtype=torch.bool)
    mask[:, :4] = mask[:, 6:10] = True
    old = -torch.rand(3, 12, generator=g)
    logp = (old + 0.3 * torch.randn(3, 12, generator=g)).requires_grad_(True)
    adv = torch.randn(3, 12, generator=g)
    loss, _ = fn(old, logp, adv, mask, actor.loss_agg_mode, actor, None)
    want, _ = policy_loss(
        "turn_ppo", logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg=actor.loss_agg_mode
    )
    torch.testing.assert_close(loss, want)
