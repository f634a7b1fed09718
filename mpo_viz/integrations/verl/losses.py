"""Our policy losses in verl's policy-loss interface (``register_policy_loss``).

verl (``verl/workers/utils/losses.py: ppo_loss``) calls the loss chosen by
``actor_rollout_ref.actor.policy_loss.loss_mode`` as::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
        -> (loss, metrics)

with (B, R) tensors, ``response_mask`` bool, ``config`` the ``ActorConfig``. No turn ids are passed:
the turns are the maximal runs of ``response_mask`` (LLM-generated spans between tool replies).

Each of our losses forms the per-token loss matrix with :func:`mpo_viz.losses.policy_loss`
(``agg="none"``; clip ε_low/ε_high = ``clip_ratio_low``/``clip_ratio_high``, falling back to
``clip_ratio``; dual clip ``c`` = ``clip_ratio_c`` for the PPO-style kinds, as verl's ``vanilla``),
multiplies it by ``rollout_is_weights`` when verl passes them, and aggregates it with verl's own
``core_algos.agg_loss(loss_mat, response_mask, loss_agg_mode, **config.global_batch_info)`` so the
normalisation across micro-batches and data-parallel ranks is verl's.

Registered names:

* ``turn_ppo`` — MPO's turn-level ratio ``ρ_k = exp(mean_{j∈k} logr_j)`` in the token-gradient form
  ``sg(ρ_k)·exp(logπ − sg(logπ))`` (turn-level trust region, token-level credit);
* ``turn_ppo_product`` — the same with ``ρ_k = exp(clamp(Σ_{j∈k} logr_j, ±20))``;
* ``mpo_<kind>`` for the kinds ``gspo``, ``sao``, ``cispo`` and ``sapo`` of
  :mod:`mpo_viz.losses.policy`, each registered only when verl has no loss ``<kind>`` of its own
  (:data:`ONLY_IF_MISSING`, derived from the names: verl's loss of the same formula is kept, ours
  never shadows it). verl 0.9.1 ships ``gspo``, ``cispo`` and ``sapo``, so there only ``mpo_sao``
  is registered. verl passes no rollout log-probs to a policy loss, so ``mpo_sao``'s ratio is
  against ``old_log_prob`` — the rollout's log-probs when verl runs in rollout-correction bypass
  mode (``algorithm.rollout_correction.bypass_mode=True``), which is SAO's setting. ``mpo_cispo``
  takes its clip from ``clip_ratio_low``/``clip_ratio_high`` like the others (CISPO's 1.0 / 4.0 to
  be set there); ``mpo_sapo`` its temperatures from verl's own ``actor.tau_pos``/``actor.tau_neg``
  (:func:`mpo_viz.integrations.verl.config.actor_options`) and aggregates with ``loss_agg_mode``
  (SAPO's ``seq-mean-token-mean`` to be set there; verl's own ``sapo`` always uses it).

turn_ppo's own options (``token_clip``, ``dual_clip``, ``ratio``) come from
``actor_rollout_ref.actor.policy_loss`` (:mod:`mpo_viz.integrations.verl.config`): with verl's own
``PolicyLossConfig`` there, the toolkit's defaults (``token_clip`` as :mod:`mpo_viz.losses.policy`
declares it, ``dual_clip`` = ``clip_ratio_c``, the ratio of the loss_mode).

Metrics: verl's names (``actor/pg_clipfrac``, ``actor/ppo_kl`` = mean(logπ_old − logπ),
``actor/pg_clipfrac_lower`` = share of dual-clipped tokens) plus ours with an ``actor/`` prefix
(``actor/turn_clipfrac``, ``actor/within_turn_shift``, ``actor/approx_kl`` (k3), ratio statistics,
``actor/surrogate_gap``, ``actor/clipfrac_low``/``_high``).
"""

from __future__ import annotations

import torch

from mpo_viz.integrations.verl.config import FROM_VERL, RATIO_OF, actor_options, loss_options
from mpo_viz.losses import policy as P

__all__ = ["LOSSES", "read_clip", "verl_loss", "metrics_for_verl"]

#: name registered with verl -> (our loss kind, turn-ratio mode)
LOSSES = {
    "turn_ppo": ("turn_ppo", "geo_mean"),
    "turn_ppo_product": ("turn_ppo", "product"),
    "mpo_gspo": ("gspo", "geo_mean"),
    "mpo_sao": ("sao", "geo_mean"),
    "mpo_cispo": ("cispo", "geo_mean"),
    "mpo_sapo": ("sapo", "geo_mean"),
}

#: ``mpo_<kind>`` -> ``<kind>``: registered only when verl lacks a loss named ``<kind>``
ONLY_IF_MISSING = {name: kind for name, (kind, _) in LOSSES.items() if name == f"mpo_{kind}"}


def _get(config, key, default=None):
    try:
        v = config.get(key, default)
    except AttributeError:
        v = getattr(config, key, default)
    return default if v is None else v


def read_clip(config) -> tuple[float, float, float]:
    """``(ε_low, ε_high, c)`` from verl's actor config: ``clip_ratio_low``/``clip_ratio_high``
    (None → ``clip_ratio``, default 0.2; ε_low in [0, 1]) and ``clip_ratio_c`` (default 3.0, must be > 1)."""
    if config is None:
        raise ValueError("config: expected verl's actor config (actor_rollout_ref.actor), found None")
    base = _get(config, "clip_ratio", 0.2)
    lo = _get(config, "clip_ratio_low", base)
    hi = _get(config, "clip_ratio_high", base)
    c = _get(config, "clip_ratio_c", 3.0)
    for key, v in (("clip_ratio_low", lo), ("clip_ratio_high", hi), ("clip_ratio_c", c)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"actor_rollout_ref.actor.{key}: expected a number, found {v!r}")
    if not 0 <= lo <= 1:  # 1: no lower bound (CISPO's setting), as the toolkit's clip_low declares
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_low: expected 0 <= value <= 1, found {lo!r}")
    if hi < 0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_high: expected a value >= 0, found {hi!r}")
    if not c > 1:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c: expected a value > 1 (dual-clip bound), found {c!r}")
    return float(lo), float(hi), float(c)


def metrics_for_verl(ours: dict, log_prob, old_log_prob, mask) -> dict:
    """verl-style metric names from :func:`mpo_viz.losses.policy_loss` metrics, plus ours."""
    with torch.no_grad():
        m = mask.to(torch.bool)
        logr = (log_prob.detach() - old_log_prob.detach()).clamp(-P.LOGR_CLAMP, P.LOGR_CLAMP)
        n = m.sum().clamp_min(1)
        ppo_kl = float(torch.where(m, -logr, torch.zeros_like(logr)).sum() / n)
    out = {
        "actor/pg_clipfrac": ours["clipfrac"],
        "actor/ppo_kl": ppo_kl,
        "actor/pg_clipfrac_lower": ours["dual_clipfrac"],
    }
    for k in P.METRIC_NAMES:
        if k not in ("clipfrac", "dual_clipfrac"):
            out[f"actor/{k}"] = ours[k]
    return out


def verl_loss(name: str):
    """The function registered with verl as policy loss ``name`` (see the module docstring)."""
    kind, ratio = LOSSES[name]
    spec = P.get_loss(kind)

    def fn(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        from verl.trainer.ppo.core_algos import agg_loss

        lo, hi, c = read_clip(config)
        extra = {"dual_clip": c} if "dual_clip" in spec.options else {}
        extra.update(actor_options(config, kind))  # sapo's tau_pos/tau_neg: verl's own actor keys
        turn_ratio = ratio
        if name in RATIO_OF:  # turn_ppo's options from actor.policy_loss (mpo_viz.integrations.verl.config)
            opts = loss_options(_get(config, "policy_loss"), name)
            turn_ratio = opts["ratio"]
            extra = {
                "dual_clip": c if opts["dual_clip"] == FROM_VERL else opts["dual_clip"],
                "token_clip": opts["token_clip"],
            }
        base = {"rollout_logp": old_log_prob} if spec.ratio_against == "rollout_logp" else {}
        mat, ours = P.policy_loss(
            kind,
            log_prob,
            old_log_prob,
            advantages,
            response_mask,
            clip_low=lo,
            clip_high=hi,
            ratio=turn_ratio,
            agg="none",
            **base,
            **extra,
        )
        if rollout_is_weights is not None:
            mat = mat * rollout_is_weights
        info = _get(config, "global_batch_info", {}) or {}
        loss = agg_loss(loss_mat=mat, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **info)
        return loss, metrics_for_verl(ours, log_prob, old_log_prob, response_mask)

    fn.__name__ = f"mpo_viz_{name}"
    fn.__qualname__ = fn.__name__
    fn.__doc__ = (
        f"mpo_viz policy loss {kind!r} (ratio={ratio}) in verl's interface; see mpo_viz.integrations.verl.losses"
    )
    return fn
