"""Monte-Carlo returns of a batch: the one definition that the trainer's value target, the critic
warm-up, ``fit_critic`` and the doctor read.

Invariant: one clock, one default. ``G_t = r_t + d_t·G_{t'}`` over action tokens (observation
tokens skipped; ``t'`` the next action token), ``d_t = γ`` inside a turn and ``γ_T`` from a turn's
last action token to the next turn's first; 0 after the last action token, or the row's
``bootstrap_value`` where it was cut. ``γ_T`` left out is ``γ``: plain γ-discounted returns, the
returns of an estimator without turns. :func:`estimator_clock` gives an estimator's own ``(γ,
γ_T)``, its defaults filled in, so that a critic fitted before RL and the critic trained during
it read the same returns.
"""

from __future__ import annotations

import torch

from mpo_viz.advantages.registry import get_estimator
from mpo_viz.advantages.token import mae
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = ["mc_returns", "estimator_clock"]


def mc_returns(batch: TrajectoryBatch, *, gamma: float = 1.0, turn_gamma: float | None = None) -> torch.Tensor:
    """``(B, L)`` float64 Monte-Carlo returns of ``batch`` (the module docstring's clock): ``γ``
    inside turns, ``turn_gamma`` (default ``γ``) across turn boundaries, the ``bootstrap_value``
    where a row was cut; 0 on masked positions. MAE's ``critic_target="mc"`` returns."""
    tg = float(gamma) if turn_gamma is None else float(turn_gamma)
    values = torch.zeros(batch.mask.shape, dtype=torch.float64)
    _, ret = mae(
        batch.padded("rewards", torch.float64),
        values,
        batch.mask,
        turn_ids=batch.turn_ids,
        gamma=float(gamma),
        turn_gamma=tg,
        critic_target="mc",
        bootstrap_value=batch.bootstrap_value,
    )
    return ret


def estimator_clock(name: str, options: dict | None = None) -> dict[str, float]:
    """``{"gamma": γ, "turn_gamma": γ_T}`` of estimator ``name`` run with ``options``: the given
    values, else the estimator's defaults; ``γ_T = γ`` for an estimator without a turn discount
    (gae, vapo, the group estimators), ``γ = 1`` for one without a discount at all. The keywords
    of :func:`mc_returns` that give the returns on that estimator's clock."""
    used = {**get_estimator(name).options, **(options or {})}
    gamma = float(used.get("gamma", 1.0))
    return {"gamma": gamma, "turn_gamma": float(used.get("turn_gamma", gamma))}
