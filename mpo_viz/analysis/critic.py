"""How well the critic's values predict the returns: explained variance, error, bias, per turn.

:func:`explained_variance` is the one definition (finished from
:class:`mpo_viz.data.moments.ExplainedVariance`, which the value loss, the trainer and the report's
streaming pass merge chunk by chunk); :func:`critic_quality` adds the per-turn error;
:func:`values_source` says where a batch's values come from, :func:`fitted_critic` and
:func:`fitted_critic_label` what a critic fitted by ``mpo-viz fit-critic`` recorded about itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from mpo_viz.advantages import registry
from mpo_viz.analysis.arrays import as_2d
from mpo_viz.analysis.tables import compute_advantages
from mpo_viz.data.moments import ExplainedVariance
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = [
    "explained_variance",
    "ExplainedVariance",
    "critic_quality",
    "CriticQuality",
    "values_source",
    "fitted_critic",
    "fitted_critic_label",
    "values_are_noise",
    "NOISE_EV",
    "critic_based",
]

#: a fitted critic whose held-out explained variance is at most this knows (almost) nothing beyond the
#: mean: the credit of the estimators that use its values is the returns' noise
NOISE_EV = 0.05
#: ``values_source`` of values from a critic whose value head was never updated
#: (:func:`mpo_viz.models.critic.values_source_of`; the same string, kept here to keep analysis torch-model free)
UNTRAINED = "untrained_critic"


def explained_variance(returns, values, mask) -> float:
    """``1 − Var(G − V) / Var(G)`` over the action tokens (``mask`` = 1) of ``(B, L)`` returns G and
    values V (population variances, float64): the share of the returns' variance the values
    explain (1 perfect, 0 no better than the mean, < 0 worse). NaN when Var(G) = 0 or there are
    no action tokens. Chunk by chunk: merge :class:`~mpo_viz.data.moments.ExplainedVariance` s."""
    return ExplainedVariance.of(returns, values, mask).value


@dataclass
class CriticQuality:
    """How well the critic's values predict returns (over action tokens)."""

    explained_variance: float
    """``1 − Var(G − V) / Var(G)`` (population variances; NaN when Var(G) = 0) — verl's metric."""
    mse: float
    """``mean (V − G)²``."""
    bias: float
    """``mean (V − G)``: positive = the critic is optimistic."""
    n_tokens: int
    per_turn: pd.DataFrame = field(repr=False)
    """One row per turn: ``traj_id``, ``row``, ``turn``, ``value_first`` (``V(s_k)``),
    ``return_first`` (the return at the turn's first action token), ``error`` = value − return,
    ``abs_error``."""


def critic_quality(batch: TrajectoryBatch, returns=None, *, estimator: str = "mpo", **options) -> CriticQuality:
    """Explained variance of ``batch.values`` against ``returns`` and the per-turn value error.

    ``returns``: ``(B, L)`` tensor or an estimator result; ``None`` uses the returns of
    ``estimator`` (default ``"mpo"``, whose default critic target is the Monte-Carlo return).
    """
    if batch.values is None:
        raise ValueError("values: the batch has no 'values' field; critic quality needs a critic")
    if returns is None:
        returns = compute_advantages(batch, [estimator], **options)[estimator]
    g = as_2d(getattr(returns, "returns", returns), "returns")
    m = as_2d(batch.mask, "mask") != 0
    if g.shape != m.shape:
        raise ValueError(f"returns: expected shape {m.shape}, found {g.shape}")
    ev = ExplainedVariance.of(g, as_2d(batch.values, "values"), m)
    tt = batch.turns(returns={"target": g})
    per_turn = tt[["traj_id", "row", "turn"]].copy()
    if "value_first" in tt:
        per_turn["value_first"] = tt["value_first"]
        per_turn["return_first"] = tt["ret_target"]
        per_turn["error"] = per_turn["value_first"] - per_turn["return_first"]
        per_turn["abs_error"] = per_turn["error"].abs()
    return CriticQuality(explained_variance=ev.value, mse=ev.mse, bias=ev.bias, n_tokens=ev.n, per_turn=per_turn)


def values_source(batch: TrajectoryBatch) -> str:
    """Where ``values`` come from, from the file metadata (``values_source``: ``critic``,
    ``oracle``, …), else ``"critic"`` — as the label a view should use (an oracle is no critic)."""
    src = (getattr(batch, "meta", None) or {}).get("values_source")
    return str(src) if src else "critic"


def fitted_critic(batch: TrajectoryBatch) -> dict | None:
    """The ``critic_fit`` record of a batch whose values come from a critic fitted to its own
    returns (metadata ``values_source == "fitted_critic"``, written by
    :func:`mpo_viz.train.fitted_critic.fit_critic` / ``mpo-viz fit-critic``: target, steps, held-out
    and training explained variance, ...), else None."""
    meta = getattr(batch, "meta", None) or {}
    if meta.get("values_source") != "fitted_critic":
        return None
    info = meta.get("critic_fit")
    return dict(info) if isinstance(info, dict) else {}


def values_are_noise(batch: TrajectoryBatch) -> str | None:
    """Why ``batch``'s values are noise for credit assignment, or None when nothing says so.

    Three cases, all from the file metadata: values of an untrained critic (``values_source ==
    "untrained_critic"``: its value head as initialized); a fitted critic (``mpo-viz
    fit-critic``) whose held-out explained variance is at most :data:`NOISE_EV` (or was not
    recorded); and a training run's critic (``values_source == "critic"``) whose values explained at
    most :data:`NOISE_EV` of the iteration's returns (``critic_explained_var``, which the trainer
    writes into each saved iteration, measured before the critic's update on those episodes, so
    out of sample). Views say the returned text beside critic-based credit and do not rank those
    estimators."""
    meta = getattr(batch, "meta", None) or {}
    if meta.get("values_source") == UNTRAINED:
        return "values from an untrained critic (its value head as initialized): no estimate of the return"
    run_ev = meta.get("critic_explained_var")
    if meta.get("values_source") == "critic" and isinstance(run_ev, (int, float)) and run_ev <= NOISE_EV:
        return (
            f"values from the run's critic, which explained {float(run_ev):.2f} of this iteration's returns "
            f"(≤ {NOISE_EV}, before its update on them): no better than their mean"
        )
    info = fitted_critic(batch)
    if info is None:
        return None
    ev = info.get("heldout_explained_variance")
    if not isinstance(ev, (int, float)) or not ev == ev:
        return "values from a fitted critic whose held-out explained variance was not recorded"
    if ev <= NOISE_EV:
        return (
            f"values from a fitted critic with held-out explained variance {float(ev):.2f} "
            f"(≤ {NOISE_EV}): it predicts returns it was not fitted to no better than their mean"
        )
    return None


def critic_based(names) -> list[str]:
    """The estimators of ``names`` that use critic values (registry ``needs`` holds ``values``)."""
    known = set(registry.available_estimators())
    return [n for n in names if n in known and "values" in registry.get_estimator(n).needs]


def fitted_critic_label(batch: TrajectoryBatch) -> str | None:
    """``"fitted critic (held-out EV 0.12)"`` (two decimals) for a batch of :func:`fitted_critic` (the held-out
    explained variance of the values against the fit's target, ``"?"`` when not recorded), else
    None: the label views put beside values and critic-based estimators, so the reader knows how
    far to trust them."""
    info = fitted_critic(batch)
    if info is None:
        return None
    ev = info.get("heldout_explained_variance")
    ev_txt = f"{float(ev):.2f}" if isinstance(ev, (int, float)) else "?"
    return f"fitted critic (held-out EV {ev_txt})"
