"""How right each estimator's credit is, against the exact oracle of :mod:`mpo_viz.envs`.

The environments' generated files carry the oracle's token advantage ``a*_t`` and the decisive
tokens (:data:`ORACLE_FIELDS`); :func:`credit_accuracy` compares every estimator with them
(:data:`ACCURACY_COLUMNS`, the definitions of ``experiments/credit_accuracy.py``). Streaming:
:func:`accuracy_stats` per chunk, :func:`merge_accuracy_stats`, :func:`finish_accuracy`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mpo_viz.analysis.arrays import adv_tensors, as_2d, batch_turn_index
from mpo_viz.analysis.token_truth import mc_token_accuracy
from mpo_viz.analysis.truth import mc_accuracy
from mpo_viz.data.moments import correlation, pair_sums, slope
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = [
    "ORACLE_FIELDS",
    "ACCURACY_COLUMNS",
    "has_oracle",
    "accuracy_stats",
    "merge_accuracy_stats",
    "finish_accuracy",
    "credit_accuracy",
]

ORACLE_FIELDS = ("oracle_token_adv", "decisive")
"""Per-token columns an accuracy check needs: the oracle's token advantage ``a*_t`` (the change of
the exact value across token t; it sums over a turn to the turn's exact advantage ``A*_k``) and
``decisive`` (1 on the tokens that decide the action). ``mpo-viz generate`` writes both."""

ACCURACY_COLUMNS = {
    "turn_corr": "Pearson correlation of the turn advantage (mean over the turn's tokens) with the oracle's A*_k",
    "turn_sign": "share of turns with A*_k ≠ 0 whose sign the estimator gets right",
    "tok_corr": "Pearson correlation of token advantages with the oracle's a*_t",
    "within_corr": "the same after centring both inside each turn (the micro scale only; — when the estimator "
    "is constant within turns)",
    "dec_sign": "sign agreement on decisive tokens with a*_t ≠ 0",
    "dec_mass": "share of Σ|A_t| on decisive tokens (the oracle: 1; an estimator constant in a turn: the share "
    "of decisive tokens)",
    "tok_slope": "calibration: least-squares slope (with intercept) of token advantages on the oracle's a*_t over "
    "action tokens (1 = a unit of true credit gets a unit; > 1 over-credits; whitened or "
    "group-normalized estimators have no absolute scale)",
    "dec_slope": "the same slope over decisive tokens only (where the within-turn credit matters)",
    "turn_slope": "the same slope of the turn advantage (mean over the turn's tokens) on A*_k over turns",
}
"""The accuracy columns and what each means (the same as ``experiments/credit_accuracy.py``)."""


def has_oracle(batch: TrajectoryBatch) -> bool:
    """Whether ``batch`` carries the oracle columns of :data:`ORACLE_FIELDS`."""
    return all(batch.has(f) for f in ORACLE_FIELDS)


def accuracy_stats(batch: TrajectoryBatch, advantages) -> dict:
    """Mergeable sufficient statistics of :func:`credit_accuracy` for one batch (or chunk):
    ``{name: {moment arrays and counts}}``. ``advantages``: ``{name: (B, L) tensor or result}``."""
    if not has_oracle(batch):
        raise ValueError(
            f"batch: accuracy needs the oracle columns {', '.join(ORACLE_FIELDS)}; this batch lacks "
            f"{', '.join(f for f in ORACLE_FIELDS if not batch.has(f))}"
        )
    _, idx = batch_turn_index(batch)
    o = np.nan_to_num(as_2d(batch.padded("oracle_token_adv"), "oracle_token_adv"))
    d = as_2d(batch.padded("decisive"), "decisive") > 0.5
    ot = o[idx.rows, idx.cols]
    dt = d[idx.rows, idx.cols]
    keep = idx.count > 0
    o_turn = np.bincount(idx.slot, weights=ot, minlength=idx.n_slots)[keep]  # A*_k = Σ_t∈k a*_t
    o_c = ot - (np.bincount(idx.slot, weights=ot, minlength=idx.n_slots) / np.maximum(idx.count, 1))[idx.slot]
    out = {}
    for name, a in adv_tensors(advantages).items():
        at = a[idx.rows, idx.cols]
        a_mean = np.bincount(idx.slot, weights=at, minlength=idx.n_slots) / np.maximum(idx.count, 1)
        a_c = at - a_mean[idx.slot]
        a_turn = a_mean[keep]
        nz_t = np.abs(o_turn) > 1e-6
        nz_d = dt & (np.abs(ot) > 1e-6)
        out[name] = {
            "turn": pair_sums(a_turn, o_turn),
            "turn_sign": np.array(
                [np.sum(np.sign(a_turn[nz_t]) == np.sign(o_turn[nz_t])), nz_t.sum()], dtype=np.float64
            ),
            "tok": pair_sums(at, ot),
            "dec": pair_sums(at[dt], ot[dt]),
            "within": pair_sums(a_c, o_c),
            "within_max": float(np.abs(a_c).max()) if a_c.size else 0.0,
            "dec_sign": np.array([np.sum(np.sign(at[nz_d]) == np.sign(ot[nz_d])), nz_d.sum()], dtype=np.float64),
            "mass": np.array([np.abs(at[dt]).sum(), np.abs(at).sum()], dtype=np.float64),
        }
    return out


def merge_accuracy_stats(acc: dict | None, new: dict) -> dict:
    """Add the statistics of one chunk to ``acc`` (None: start)."""
    if acc is None:
        return {k: dict(v) for k, v in new.items()}
    for k, v in new.items():
        a = acc.setdefault(k, dict(v))
        if a is v:
            continue
        for f, x in v.items():
            a[f] = max(a[f], x) if f == "within_max" else a[f] + x
    return acc


def finish_accuracy(stats: dict) -> pd.DataFrame:
    """One row per estimator with the :data:`ACCURACY_COLUMNS` from merged statistics."""
    rows = []
    for name, s in stats.items():
        rows.append(
            {
                "estimator": name,
                "turn_corr": correlation(s["turn"]),
                "turn_sign": s["turn_sign"][0] / s["turn_sign"][1] if s["turn_sign"][1] else math.nan,
                "tok_corr": correlation(s["tok"]),
                "within_corr": correlation(s["within"]) if s["within_max"] > 1e-9 else math.nan,
                "dec_sign": s["dec_sign"][0] / s["dec_sign"][1] if s["dec_sign"][1] else math.nan,
                "dec_mass": s["mass"][0] / s["mass"][1] if s["mass"][1] > 0 else math.nan,
                "tok_slope": slope(s["tok"]),
                "dec_slope": slope(s["dec"]),
                "turn_slope": slope(s["turn"]),
            }
        )
    return pd.DataFrame(rows, columns=["estimator", *ACCURACY_COLUMNS])


def credit_accuracy(batch: TrajectoryBatch, advantages, *, truth: str = "expert") -> pd.DataFrame:
    """How right each estimator's credit is on ``batch``: one row per entry of ``advantages``
    (``{name: (B, L)}``).

    ``truth="expert"``: against the oracle columns (the scripted expert's exact values), with the
    :data:`ACCURACY_COLUMNS`, over all turns and action tokens of the batch (the definitions of
    ``experiments/credit_accuracy.py``) — the truth for expert data, biased for any other policy.
    ``truth="mc"``: against the policy's own Monte-Carlo truth (``mpo-viz truth``), per turn, raw
    and disattenuated by the truth's reliability, with intervals
    (:func:`mpo_viz.analysis.truth.mc_accuracy`, :data:`~mpo_viz.analysis.truth.MC_ACCURACY_COLUMNS`).
    ``truth="mc-token"``: inside turns, at the tokens the policy's token truth measured
    (``mpo-viz truth --tokens``): the token credit and its within-turn part against ``Â_t``
    (:func:`mpo_viz.analysis.token_truth.mc_token_accuracy`,
    :data:`~mpo_viz.analysis.token_truth.MC_TOKEN_COLUMNS`).
    """
    if truth == "mc":
        return mc_accuracy(batch, advantages)
    if truth == "mc-token":
        return mc_token_accuracy(batch, advantages)
    if truth != "expert":
        raise ValueError(
            f"truth: expected 'expert' (the scripted expert's oracle), 'mc' (the policy's Monte-Carlo "
            f"truth per turn) or 'mc-token' (its token truth), found {truth!r}"
        )
    return finish_accuracy(accuracy_stats(batch, advantages))
