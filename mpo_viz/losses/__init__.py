"""Policy and value losses, aggregation, KL penalties and logprob/entropy helpers.

``from mpo_viz.losses import policy_loss, value_loss, aggregate, kl_penalty, token_logprobs
token_entropy``; ``clip_flags`` says which tokens and turns a loss kind clips. Loss kinds live in a string registry
(``available_losses()``, ``register_loss()``,
``get_loss()``, ``loss_options()``); each declares what it needs (``turns``, ``rollout_logp``) and its default clip
range
and aggregation.

Modules: ``policy`` (kinds, registry, metrics, reference loop), ``aggregate`` (the six modes),
``kl``, ``value``, ``logprobs`` (chunked helpers), ``_common`` (input checks, turn segments).
"""

from mpo_viz.losses.aggregate import AGG_MODES, aggregate
from mpo_viz.losses.kl import KL_KINDS, kl_penalty
from mpo_viz.losses.logprobs import (
    token_entropy,
    token_entropy_reference,
    token_logprobs,
    token_logprobs_reference,
)
from mpo_viz.losses.policy import (
    LOGPROB_FIELDS,
    LOGPROB_WHAT,
    METRIC_NAMES,
    RATIO_MODES,
    ClipFlags,
    LossKind,
    PolicyInputs,
    PolicyTerms,
    available_losses,
    clip_flags,
    get_loss,
    loss_options,
    policy_loss,
    policy_loss_reference,
    register_loss,
)
from mpo_viz.losses.value import value_loss

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "METRIC_NAMES",
    "RATIO_MODES",
    "LOGPROB_FIELDS",
    "LOGPROB_WHAT",
    "ClipFlags",
    "LossKind",
    "PolicyInputs",
    "PolicyTerms",
    "aggregate",
    "available_losses",
    "clip_flags",
    "get_loss",
    "kl_penalty",
    "loss_options",
    "policy_loss",
    "policy_loss_reference",
    "register_loss",
    "token_entropy",
    "token_entropy_reference",
    "token_logprobs",
    "token_logprobs_reference",
    "value_loss",
]
