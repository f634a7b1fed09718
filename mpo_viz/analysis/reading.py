"""The analysis in words: one line that reads a table, and what to look at when a measure is missing.

A verdict (an estimator "closest to the oracle", "best across turns") is written only when the data
can carry one (:func:`data_shortfall`): at least :data:`MIN_TRAJECTORIES` trajectories, some
variance in their scores, and at least one trajectory with two turns or more; otherwise the reading
says "too little data for a verdict" and why. No estimator is called best on a correlation that is
not positive, and estimators whose credit rests on values that are noise
(:func:`mpo_viz.analysis.critic.values_are_noise`) are left out of the ranking, with the reason.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = [
    "accuracy_reading",
    "NO_ORACLE_TEXT",
    "data_shortfall",
    "batch_shortfall",
    "MIN_TRAJECTORIES",
    "mc_accuracy_reading",
    "ranked_column",
]

#: fewer trajectories than this carry no verdict (correlations of a handful of episodes are noise)
MIN_TRAJECTORIES = 16

NO_ORACLE_TEXT = (
    "No oracle columns (oracle_token_adv, decisive: written by mpo-viz generate for its environments), so how "
    "right each estimator is cannot be measured here, only how they agree. What would tell: the explained "
    "variance of the values against the returns (a critic near 0 gives value-based estimators little to work "
    "with), and the across/within split of the values (a critic flat inside turns gives MPO's within-turn "
    "signal nothing to redistribute). To measure accuracy, compute your policy's own Monte-Carlo truth on a "
    "file the toolkit wrote (mpo-viz truth FILE -o OUT --model DIR), generate trajectories with an oracle "
    "(mpo-viz generate), or see experiments/credit_accuracy.py."
)


def data_shortfall(n_traj: int, scores, max_turns: int) -> str | None:
    """Why a batch of ``n_traj`` trajectories with these ``scores`` (one per trajectory, or a
    ``{score: count}`` mapping; NaN ignored) and at most ``max_turns`` turns is too little data for
    a verdict — the reasons joined by ``"; "`` — or None when it is enough."""
    if isinstance(scores, dict):
        distinct = {float(s) for s, c in scores.items() if c and not math.isnan(float(s))}
    else:
        distinct = {float(s) for s in np.asarray(scores, dtype=np.float64).ravel() if not math.isnan(s)}
    reasons = []
    if n_traj < MIN_TRAJECTORIES:
        reasons.append(f"{n_traj} trajectories (a verdict needs at least {MIN_TRAJECTORIES})")
    if len(distinct) < 2:
        reasons.append(
            "no reward variance (every trajectory scores "
            + (f"{distinct.pop():.4g})" if distinct else "nothing: no reward)")
        )
    if max_turns < 2:
        reasons.append("no trajectory has 2 turns or more (nothing to compare across turns)")
    return "; ".join(reasons) or None


def batch_shortfall(batch: TrajectoryBatch) -> str | None:
    """:func:`data_shortfall` of a batch (scores: the sum of each trajectory's rewards)."""
    scores = batch.token_rewards.sum(dim=1).double().numpy() if len(batch) else np.zeros(0)
    turns = int(batch.num_turns.max()) if len(batch) else 0
    return data_shortfall(len(batch), scores, turns)


def accuracy_reading(
    df: pd.DataFrame, values: str = "critic", *, shortfall: str | None = None, noise: str | None = None, unranked=()
) -> str:
    """One line that reads an accuracy table: which estimator's token credit is closest to the
    oracle and which is farthest, with the turn-level picture when it differs.

    ``shortfall``: why the data carries no verdict (:func:`data_shortfall`): then the line says so
    and ranks nothing. ``noise``: why the critic values are noise (``values_are_noise``); the
    estimators in ``unranked`` (the critic-based ones) are then left out of the ranking. Only a
    positive correlation makes an estimator "closest" or "best"."""
    if shortfall:
        return f"Too little data for a verdict: {shortfall}. The table is descriptive only."
    left_out = [n for n in unranked if n in set(df["estimator"])] if noise else []
    ranked = df[~df["estimator"].isin(left_out)]
    text, best = _token_reading(ranked.dropna(subset=["tok_corr"]))
    text += _turn_reading(ranked.dropna(subset=["turn_corr"]), best)
    if left_out:
        text += (
            f". Not ranked: {', '.join(left_out)} ({noise}; their credit is the returns' noise, whatever the "
            "table shows)"
        )
    if values == "oracle":
        text += (
            ". Values here are the oracle's own (values_source: oracle), so this is the best case for "
            "value-based estimators"
        )
    return text + "."


def _token_reading(d: pd.DataFrame) -> tuple[str, str | None]:
    """The token-level sentence and the estimator it names closest (None when none is)."""
    if d.empty:
        return "No estimator's token credit varies enough to correlate with the oracle", None
    best = d.loc[d["tok_corr"].idxmax()]
    if not best["tok_corr"] > 0:
        return (
            f"No estimator's token credit correlates positively with the oracle (the highest: {best['estimator']}, "
            f"{best['tok_corr']:.2f}), so none is closest"
        ), None
    worst = d.loc[d["tok_corr"].idxmin()]
    text = (
        f"Token credit closest to the oracle: {best['estimator']} (correlation {best['tok_corr']:.2f}, "
        f"{best['dec_mass']:.0%} of its |A| on decisive tokens)"
    )
    if worst["estimator"] != best["estimator"]:
        text += f"; farthest: {worst['estimator']} ({worst['tok_corr']:.2f})"
    return text, str(best["estimator"])


def _turn_reading(dt: pd.DataFrame, token_best: str | None) -> str:
    if dt.empty:
        return ""
    bt = dt.loc[dt["turn_corr"].idxmax()]
    if not bt["turn_corr"] > 0:
        return (
            f". Across turns no estimator correlates positively with the oracle (the highest: {bt['estimator']}, "
            f"{bt['turn_corr']:.2f})"
        )
    if bt["estimator"] == token_best:
        return f". {bt['estimator']} is also best across turns (turn correlation {bt['turn_corr']:.2f})"
    return (
        f". Across turns {bt['estimator']} is best (turn correlation {bt['turn_corr']:.2f}, "
        f"{bt['turn_sign']:.0%} of turn signs right)"
    )


def ranked_column(df: pd.DataFrame, *, noise: str | None = None, unranked=()) -> list[str]:
    """Per row of an accuracy table against the policy's truth, why it is not ranked — ``"NOISE: not
    ranked"`` for the estimators in ``unranked`` when the critic values are ``noise``; ``"too little data
    for a verdict"`` when the table's ``note`` says so — or ``""``: the table's ``verdict`` column."""
    out = []
    for _, r in df.iterrows():
        if noise and r["estimator"] in set(unranked):
            out.append("NOISE: not ranked (its credit rests on critic values that are noise)")
        elif str(r.get("note") or ""):
            out.append("too little data for a verdict")
        else:
            out.append("")
    return out


def mc_accuracy_reading(
    df: pd.DataFrame, column: str, what: str, *, noise: str | None = None, unranked=(), shortfall: str | None = None
) -> str:
    """One line that reads a table against the policy's Monte-Carlo truth (``mc_accuracy``'s, by
    ``column`` = ``"turn_corr_dis"``; ``mc_token_accuracy``'s, by ``"tok_corr_dis"`` or
    ``"within_corr_dis"``): which estimator is closest, noise-corrected. No verdict when the truth is
    too noisy (the table's ``note``: its reliability below the minimum) or the data too few
    (``shortfall``); the estimators in ``unranked`` are left out when the critic values are ``noise``;
    flat estimators (a ``within_note``) are not ranked on the within-turn part; only a positive
    correlation makes an estimator "closest". ``what`` names the measure ("turn credit")."""
    note = next((str(n) for n in df.get("note", pd.Series(dtype=object)) if str(n or "")), "")
    if shortfall:
        return f"Too little data for a verdict: {shortfall}. The table is descriptive only."
    if note:
        return f"{note[0].upper()}{note[1:]}. The table is descriptive only."
    left_out = [n for n in unranked if n in set(df["estimator"])] if noise else []
    d = df[~df["estimator"].isin(left_out)]
    if "within_note" in d and column.startswith("within"):
        flat = d[d["within_note"].astype(str) != ""]["estimator"].tolist()
        d = d[d["within_note"].astype(str) == ""]
    else:
        flat = []
    d = d.dropna(subset=[column])
    if d.empty:
        text = f"No estimator's {what} can be scored against the truth"
    else:
        best = d.loc[d[column].idxmax()]
        if not best[column] > 0:
            text = (
                f"No estimator's {what} correlates positively with the truth (the highest: {best['estimator']}, "
                f"{best[column]:.2f}), so none is closest"
            )
        else:
            text = (
                f"{what[0].upper()}{what[1:]} closest to this policy's truth: {best['estimator']} "
                f"({best[column]:.2f} noise-corrected)"
            )
            worst = d.loc[d[column].idxmin()]
            if worst["estimator"] != best["estimator"]:
                text += f"; farthest: {worst['estimator']} ({worst[column]:.2f})"
    if flat:
        text += f". {', '.join(flat)}: flat inside turns, 0 by construction (no within-turn credit to score)"
    if left_out:
        text += (
            f". Not ranked: {', '.join(left_out)} ({noise}; their credit is the returns' noise, whatever the table "
            "shows)"
        )
    return text + "."
