"""Advantage estimators (explained in docs/concepts.md): fast numba/numpy implementations, a string
registry and ``compute(batch, name, **options)``; every estimator's options are declared once in
:mod:`mpo_viz.advantages.registry` (:func:`estimator_options`, :class:`Option`).

Tensor functions take ``(B, L)`` torch tensors or numpy arrays and keyword-only options, and return
``(advantages, returns)`` torch tensors (float64 in → float64 out, else float32), 0 on masked
positions. :mod:`mpo_viz.advantages.reference` holds the readable per-trajectory loops they are
tested against. :func:`mc_returns` is the one definition of a batch's Monte-Carlo returns, on an
estimator's clock with :func:`estimator_clock` (:mod:`mpo_viz.advantages.returns`).
"""

from mpo_viz.advantages.group import (
    drgrpo,
    empg,
    gigpo,
    grpo,
    mt_grpo,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)
from mpo_viz.advantages.registry import (
    DEFAULT_ESTIMATORS,
    AdvantageResult,
    Bound,
    Estimator,
    Option,
    accepted_options,
    available_estimators,
    bind,
    compute,
    default_estimators,
    estimator_options,
    get_estimator,
    is_group_estimator,
    missing,
    multiscale_estimator,
    parse_names,
    register_estimator,
    returns_source,
    split_options,
    vocabulary,
)
from mpo_viz.advantages.returns import estimator_clock, mc_returns
from mpo_viz.advantages.token import bilevel_gae, gae, mae, mae_with_turns, turn_gae, vapo

__all__ = [
    "DEFAULT_ESTIMATORS",
    "AdvantageResult",
    "Bound",
    "Estimator",
    "Option",
    "available_estimators",
    "bilevel_gae",
    "bind",
    "compute",
    "default_estimators",
    "accepted_options",
    "drgrpo",
    "empg",
    "estimator_clock",
    "gae",
    "get_estimator",
    "gigpo",
    "grpo",
    "is_group_estimator",
    "mae",
    "mae_with_turns",
    "mc_returns",
    "missing",
    "mt_grpo",
    "multiscale_estimator",
    "estimator_options",
    "parse_names",
    "register_estimator",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "returns_source",
    "rloo",
    "split_options",
    "turn_gae",
    "vapo",
    "vocabulary",
]
