"""MPO inside verl: estimators, turn-level losses and live run-folder logging, as a verl plugin.

Importing this module registers, in verl (``verl.trainer.ppo.core_algos``):

* advantage estimators (``register_adv_est``): every estimator of :mod:`mpo_viz.advantages` that
  runs on critic values and turns alone — ``mpo`` (MAE), ``turn_gae``, ``vapo`` today,
  and any registered later (the rule: :mod:`.options`) — except names verl has itself (``gae``);
  options from ``algorithm.<name>.*``, critic values required (:mod:`.estimators`);
* policy losses ``turn_ppo``, ``turn_ppo_product`` and ``mpo_<kind>`` for our gspo, sao, cispo
  and sapo, each only where verl has no loss ``<kind>`` of its own (``register_policy_loss``,
  :mod:`.losses`);
* the ``compute_advantage`` wrapper in verl's trainer modules, installed when they are imported
  (:mod:`.patch`), which feeds our estimators the critic values and logs each step to a run folder
  when ``algorithm.mpo_viz.run_dir`` / ``MPO_VIZ_RUN_DIR`` is set (:mod:`.runlog`).

verl loads it in three ways: the ``verl.plugins`` entry point in mpo_viz's package metadata (found
when ``import verl`` runs, in the driver and in every worker), ``actor_rollout_ref.model.external_lib
=mpo_viz.integrations.verl``, or ``VERL_USE_EXTERNAL_MODULES=mpo_viz.integrations.verl``. Importing
``mpo_viz`` itself never imports verl; only importing this module does. Recipe: ``docs/verl.md``.
"""

from __future__ import annotations

from mpo_viz.integrations.verl import patch
from mpo_viz.integrations.verl.estimators import ESTIMATORS, MissingCriticError, verl_estimator
from mpo_viz.integrations.verl.losses import LOSSES, ONLY_IF_MISSING, verl_loss
from mpo_viz.integrations.verl.options import refresh_estimators

__all__ = ["ESTIMATORS", "LOSSES", "MissingCriticError", "register", "registered"]

_registered: dict[str, list[str]] = {"estimators": [], "losses": []}


def register() -> dict[str, list[str]]:
    """Register our estimators and losses with verl and install the ``compute_advantage`` wrapper.

    Idempotent. Returns the names registered: ``{"estimators": [...], "losses": [...]}``.
    """
    from verl.trainer.ppo import core_algos

    theirs_est = [
        n
        for n, fn in core_algos.ADV_ESTIMATOR_REGISTRY.items()
        if getattr(fn, "__module__", "") != verl_estimator.__module__
    ]
    for name in refresh_estimators(skip=theirs_est):  # verl's own names (gae) stay verl's
        if name not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(name)(verl_estimator(name))
        if name not in _registered["estimators"]:
            _registered["estimators"].append(name)
    for name in LOSSES:
        theirs = ONLY_IF_MISSING.get(name)
        if theirs is not None and theirs in core_algos.POLICY_LOSS_REGISTRY:
            continue
        current = core_algos.POLICY_LOSS_REGISTRY.get(name)
        if current is not None and getattr(current, "__module__", "") != verl_loss.__module__:
            raise ValueError(
                f"actor_rollout_ref.actor.policy_loss.loss_mode={name}: expected the name to be free "
                f"for mpo_viz, found it registered by {current.__module__}.{current.__qualname__}"
            )
        if current is None:
            core_algos.register_policy_loss(name)(verl_loss(name))
        if name not in _registered["losses"]:
            _registered["losses"].append(name)
    patch.install()
    return {k: list(v) for k, v in _registered.items()}


def registered() -> dict[str, list[str]]:
    """What :func:`register` has registered in this process."""
    return {k: list(v) for k, v in _registered.items()}


register()
