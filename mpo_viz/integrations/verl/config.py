"""turn_ppo's options in a verl run's configuration: ``actor_rollout_ref.actor.policy_loss.*``.

verl 0.9.1 builds the actor config with ``hydra.utils.instantiate`` from the ``_target_`` of each
node (``verl/utils/config.py: omega_conf_to_dataclass``, called in
``verl/workers/engine_workers.py`` for the actor); the ``policy_loss`` node's target is
``verl.workers.config.PolicyLossConfig``, a dataclass that refuses a key it does not declare
(``PolicyLossConfig.__init__() got an unexpected keyword argument 'token_clip'``). The route it
offers is that target: :class:`TurnPPOLossConfig` is ``PolicyLossConfig`` plus turn_ppo's options,
selected on the command line with::

    actor_rollout_ref.actor.policy_loss._target_=mpo_viz.integrations.verl.config.TurnPPOLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=turn_ppo
    +actor_rollout_ref.actor.policy_loss.token_clip=1.5        # or null: the bare turn clip

Options (each a keyword of ``mpo_viz.losses.policy_loss``; the defaults are the toolkit's):

* ``token_clip`` — the token band ``[1/c, c]`` on each token's own ratio (c > 1) or None (off).
  Default: the keyword default of turn_ppo in :mod:`mpo_viz.losses.policy`, read from its
  declaration (:func:`core_default`), so the toolkit and the plugin have one default.
* ``dual_clip`` — the dual-clip bound c > 1 for negative advantages, None (off), or
  ``"clip_ratio_c"`` (default): verl's ``actor.clip_ratio_c``, as verl's own ``vanilla`` loss.
* ``ratio`` — the turn ratio, ``geo_mean`` or ``product``; None (default): as the loss_mode says
  (``turn_ppo`` → ``geo_mean``, ``turn_ppo_product`` → ``product``).

The clip ε_low/ε_high and the aggregation stay verl's own actor keys (``clip_ratio_low``,
``clip_ratio_high``, ``loss_agg_mode``). Without the ``_target_`` override the loss uses the
defaults above (:func:`loss_options` reads whatever ``policy_loss`` holds: this dataclass, verl's,
a DictConfig or a dict).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from verl.workers.config import PolicyLossConfig

from mpo_viz.checks import OptionError
from mpo_viz.losses import policy as P

__all__ = ["KEY", "ACTOR", "TurnPPOLossConfig", "core_default", "check_options", "loss_options", "actor_options"]

#: where the options live in verl's config
KEY = "actor_rollout_ref.actor.policy_loss"
#: verl's actor config, where verl itself declares some loss kinds' options (sapo's tau_pos, tau_neg)
ACTOR = "actor_rollout_ref.actor"

#: loss_mode -> the turn ratio it implies
RATIO_OF = {"turn_ppo": "geo_mean", "turn_ppo_product": "product"}

#: ``dual_clip``'s default: take verl's ``actor.clip_ratio_c``
FROM_VERL = "clip_ratio_c"


def core_default(kind: str, option: str):
    """The default of ``option`` of loss kind ``kind``: its keyword default in the kind's function
    in :mod:`mpo_viz.losses.policy` (the toolkit's declaration, not a copy of it)."""
    param = inspect.signature(P.get_loss(kind).fn).parameters.get(option)
    if param is None or param.default is inspect.Parameter.empty:
        raise ValueError(f"option: loss kind {kind!r} declares no default for {option!r}")
    return param.default


def _band(value, key: str):
    if value is None:
        return None
    if isinstance(value, (bool, str)) or not isinstance(value, (int, float)):
        raise ValueError(f"{KEY}.{key}: expected a number > 1 or null, found {value!r}")
    if not value > 1:
        raise ValueError(f"{KEY}.{key}: expected a number > 1 or null, found {value!r}")
    return float(value)


def check_options(loss_mode: str, token_clip, dual_clip, ratio) -> dict:
    """The options validated, each error naming ``actor_rollout_ref.actor.policy_loss.<key>``.

    Returns ``{"token_clip": float | None, "dual_clip": float | None | "clip_ratio_c",
    "ratio": "geo_mean" | "product"}``.
    """
    if loss_mode not in RATIO_OF:
        raise ValueError(f"{KEY}.loss_mode: TurnPPOLossConfig configures {', '.join(RATIO_OF)}; found {loss_mode!r}")
    if ratio is None:
        ratio = RATIO_OF[loss_mode]
    elif ratio not in P.RATIO_MODES:
        raise ValueError(f"{KEY}.ratio: expected one of {', '.join(P.RATIO_MODES)} or null, found {ratio!r}")
    elif loss_mode == "turn_ppo_product" and ratio != "product":
        raise ValueError(
            f"{KEY}.ratio: loss_mode turn_ppo_product is the product ratio; found ratio={ratio!r} "
            "(use loss_mode=turn_ppo for geo_mean)"
        )
    dc = FROM_VERL if dual_clip == FROM_VERL else _band(dual_clip, "dual_clip")
    return {"token_clip": _band(token_clip, "token_clip"), "dual_clip": dc, "ratio": ratio}


@dataclass
class TurnPPOLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` with turn_ppo's options (see the module docstring); checked on
    construction, so a bad value stops the run where verl builds the actor config."""

    loss_mode: str = "turn_ppo"
    token_clip: float | None = core_default("turn_ppo", "token_clip")
    dual_clip: Any = FROM_VERL
    ratio: str | None = None

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        check_options(self.loss_mode, self.token_clip, self.dual_clip, self.ratio)


def loss_options(policy_loss, loss_mode: str) -> dict:
    """turn_ppo's options for a run of ``loss_mode`` from verl's ``actor.policy_loss`` node (our
    dataclass, verl's ``PolicyLossConfig``, a DictConfig, a dict or None): a key it holds wins, a
    key it lacks takes the default (:class:`TurnPPOLossConfig`'s)."""

    def given(key, default):
        if policy_loss is None:
            return default
        if hasattr(policy_loss, "keys") and hasattr(policy_loss, "__getitem__"):  # dict, DictConfig, verl's BaseConfig
            return policy_loss[key] if key in list(policy_loss) else default
        return getattr(policy_loss, key, default)

    return check_options(
        loss_mode,
        given("token_clip", core_default("turn_ppo", "token_clip")),
        given("dual_clip", FROM_VERL),
        given("ratio", None),
    )


def actor_options(config, kind: str) -> dict:
    """The own options of loss kind ``kind`` (:mod:`mpo_viz.losses.policy`) that verl's actor config
    declares under the same name — verl 0.9.1: ``tau_pos`` and ``tau_neg`` (``ActorConfig``, for its
    own ``sapo``) — with the config's values, each checked against the toolkit's declaration
    (ValueError naming ``actor_rollout_ref.actor.<key>``). A key the config lacks, or holds as None,
    is left out: the kind's own default applies. ``dual_clip`` is not read here (verl's
    ``clip_ratio_c`` is, by the loss)."""
    if config is None:
        return {}
    out = {}
    for o in P.get_loss(kind).spec:
        if o.name == "dual_clip":
            continue
        try:
            v = config.get(o.name, None) if hasattr(config, "get") else getattr(config, o.name, None)
        except Exception:  # a struct config without the key
            v = None
        if v is None:
            continue
        try:
            out[o.name] = o.check(v)
        except OptionError as exc:
            raise ValueError(f"{ACTOR}.{o.name}: {exc.detail}") from None
    return out
