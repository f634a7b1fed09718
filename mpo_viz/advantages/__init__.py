"""Advantage estimators (explained in docs/concepts.md): fast numba/numpy implementations, a string
registry and ``compute(batch, name, **options)``.

Tensor functions take ``(B, L)`` torch tensors or numpy arrays and keyword-only options, and return
``(advantages, returns)`` torch tensors (float64 in → float64 out, else float32), 0 on masked
positions. :mod:`mpo_viz.advantages.reference` holds the readable per-trajectory loops they are
tested against.
"""

from mpo_viz.advantages.group import drgrpo, gigpo, grpo, reinforce_pp, reinforce_pp_baseline, rloo
from mpo_viz.advantages.registry import (
    AdvantageResult,
    Estimator,
    available,
    compute,
    get,
    missing,
    register,
    turn_table,
)
from mpo_viz.advantages.token import gae, mae, mae_with_turns, turn_gae, vapo

__all__ = [
    "AdvantageResult",
    "Estimator",
    "available",
    "compute",
    "drgrpo",
    "gae",
    "get",
    "gigpo",
    "grpo",
    "mae",
    "mae_with_turns",
    "missing",
    "register",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
    "turn_gae",
    "turn_table",
    "vapo",
]
