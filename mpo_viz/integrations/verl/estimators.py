"""Our critic-based estimators in verl's estimator interface.

verl calls a registered estimator (``verl.trainer.ppo.core_algos.register_adv_est``) from the
generic branch of ``compute_advantage`` as ``fn(token_level_rewards=, response_mask=, config=,
index=, [reward_baselines=])`` — without ``values``. The plugin's ``compute_advantage`` wrapper
(:mod:`mpo_viz.integrations.verl.patch`) calls the same function with ``values=`` the critic's
values. Called without them (critic off, or a trainer path the wrapper does not cover), it raises
an error saying what to set.

For a batch with rewards ``r`` (B, R) (observation rewards moved, :mod:`.batch`), values ``V``
(B, R) and ``response_mask`` ``m`` (B, R) whose maximal runs of 1 are the assistant turns:

* ``mpo``: MAE, ``A_{k,j} = A^T_k + β·(u_{k,j} − mean_j u_{k,j})``
  (:func:`mpo_viz.advantages.mae`);
* ``turn_gae``: ``A^T_k`` broadcast over turn k's tokens (:func:`mpo_viz.advantages.turn_gae`);
* ``vapo``: token GAE with the length-adaptive ``λ = 1 − 1/(α·ℓ)`` (:func:`mpo_viz.advantages.vapo`);
* any estimator registered later that the rule of :mod:`.options` accepts, called the same way:
  ``fn(rewards, values, mask, **options)``.

Each returns ``(advantages, returns)`` (B, R) in the rewards' dtype and device, 0 off the mask;
options come from ``algorithm.<name>.*`` (:mod:`.options`).
"""

from __future__ import annotations

import torch

from mpo_viz.advantages import registry as adv_registry
from mpo_viz.checks import OptionError
from mpo_viz.integrations.verl.batch import move_observation_rewards
from mpo_viz.integrations.verl.options import ESTIMATORS, estimator_options

__all__ = ["ESTIMATORS", "MissingCriticError", "estimate", "verl_estimator"]


class MissingCriticError(ValueError):
    """An mpo_viz estimator was chosen but the batch carries no critic values."""


def _no_critic(name: str, reason: str) -> MissingCriticError:
    return MissingCriticError(
        f"algorithm.adv_estimator={name}: expected critic values per response token (data.batch['values']), "
        f"found none ({reason}). Set critic.enable=True and configure critic.* (verl starts a critic by "
        f"default only for adv_estimator=gae); {name} is a critic-based estimator (MPO's turn-level GAE "
        f"needs V(s_k) at every turn)."
    )


def estimate(
    name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, values: torch.Tensor, config=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Our estimator ``name`` on verl tensors (B, R); observation rewards are moved first."""
    if values is None:
        raise _no_critic(name, "the batch has no 'values'")
    if name not in ESTIMATORS:
        raise ValueError(f"algorithm.adv_estimator: expected one of {', '.join(ESTIMATORS)}, found {name!r}")
    options = estimator_options(config, name)
    dt = token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32
    mask = response_mask.to(dt)
    rewards, _, _ = move_observation_rewards(token_level_rewards.to(dt), mask)
    fn = adv_registry.get_estimator(ESTIMATORS[name]).fn
    try:
        adv, ret = fn(rewards, values.detach().to(dt), mask, **options)
    except OptionError as exc:  # a combination the declarations cannot see
        raise ValueError(f"algorithm.{name}.{exc.option}: {exc.detail}") from exc
    dev = token_level_rewards.device
    return adv.to(dev, dt), ret.to(dev, dt)


def verl_estimator(name: str):
    """The function registered with verl as estimator ``name``."""

    def fn(token_level_rewards, response_mask, config=None, index=None, reward_baselines=None, values=None, **kwargs):
        if values is None:
            raise _no_critic(
                name,
                "verl called the estimator without values: the critic is off, or this "
                "trainer path does not go through the mpo_viz compute_advantage wrapper",
            )
        return estimate(name, token_level_rewards, response_mask, values, config)

    fn.__name__ = f"mpo_viz_{name}"
    fn.__qualname__ = fn.__name__
    fn.__doc__ = (
        f"mpo_viz estimator {name!r} for verl: (token_level_rewards, response_mask, values) "
        f"(B, R) -> (advantages, returns); options from algorithm.{name}.*"
    )
    return fn
