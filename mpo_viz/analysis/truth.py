"""Credit accuracy against the policy's own Monte-Carlo truth (``mpo-viz truth``'s ``mc_*`` fields).

The truth is per turn. With ``mc_q`` (continuations after the recorded turn) the turn's true
advantage is estimated directly, ``Â_k = Q̂(s_k, a_k) − V̂(s_k)``; otherwise from neighbouring
values, ``Â_k = R_k + γ_T·V̂(s_{k+1}) − V̂(s_k)`` with ``V̂(s_K) = 0`` (the continuations' returns
already count a truncation as the end). Both are unbiased and noisy. The noise lowers every
correlation with them by the square root of the truth's *reliability* ρ (the share of ``Var(Â)``
that is signal), so :func:`mc_accuracy` reports the raw correlation and the disattenuated one,
``r / √ρ``:

* from neighbouring values, ρ is the split-half reliability: ``Â^a``, ``Â^b`` from the two
  independent halves of the continuations (``mc_value_a``, ``mc_value_b``), ``r_ab = corr(Â^a,
  Â^b)`` and, for the full set, Spearman–Brown ``ρ = 2·r_ab / (1 + r_ab)``;
* from ``Q̂ − V̂``, ρ = ``1 − mean(se_Q² + se_V²) / Var(Â)`` (the two estimates' own errors).

Intervals: Fisher's z on the raw correlation over ``n`` turns (95%), divided by ``√ρ`` for the
disattenuated one (ρ taken as known) and clipped to [−1, 1], as is the disattenuated correlation
itself. **Below** :data:`MIN_RELIABILITY` the correction is withheld (the disattenuated columns are
NaN and ``note`` says why): at ρ < 0.3 it would multiply the raw correlation and its interval by more
than 1.8, and the verdict would rest on the truth's noise — too little data for a verdict.

Two regression slopes, named by their direction:

* ``slope_credit_on_truth`` — the credit regressed on ``Â`` (``Cov/Var(Â)``): 1 = the credit neither
  shrinks nor inflates the true signal. The truth's noise is in the regressor and attenuates it by
  ρ: ``slope_credit_on_truth_dis = slope_credit_on_truth / ρ`` corrects it.
* ``slope_truth_on_credit`` — ``Â`` regressed on the credit (``Cov/Var(credit)``): 1 = calibrated as a
  forecast (a credit of x means a true advantage of x on average). The truth's noise is in the
  regressand and does not bias it: its noise correction is none (the number is already unbiased).

These were ``turn_slope`` and ``turn_slope_dis`` before; :func:`renamed_columns` reads tables saved
with the old names (for one release).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mpo_viz.analysis.arrays import adv_tensors, as_2d, batch_turn_index
from mpo_viz.data.moments import pair_sums, slope
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.data.turns import mc_turn_advantage

__all__ = [
    "MC_ACCURACY_COLUMNS",
    "has_mc_truth",
    "mc_turn_truth",
    "reliability",
    "mc_accuracy",
    "mc_accuracy_parts",
    "finish_mc_accuracy",
    "fisher_interval",
    "MIN_RELIABILITY",
    "disattenuate",
    "renamed_columns",
    "RENAMED_COLUMNS",
    "reliability_note",
    "corr",
]

#: below this reliability of the truth, the disattenuated columns are withheld (module docstring)
MIN_RELIABILITY = 0.3

MC_ACCURACY_COLUMNS = {
    "turn_corr": "Pearson correlation of the turn advantage (mean over the turn's tokens) with the policy's "
    "Monte-Carlo turn advantage Â_k",
    "turn_corr_lo": "95% interval of turn_corr (Fisher's z over the turns)",
    "turn_corr_hi": "",
    "turn_corr_dis": "turn_corr / √ρ, clipped to [−1, 1]: the correlation with the noise-free truth (withheld, "
    f"NaN, when ρ < {MIN_RELIABILITY})",
    "dis_lo": "95% interval of turn_corr_dis (clipped to [−1, 1])",
    "dis_hi": "",
    "slope_credit_on_truth": "least-squares slope of the turn credit on Â_k (with intercept): 1 = the credit neither "
    "shrinks nor inflates the true signal (attenuated by the truth's noise)",
    "slope_credit_on_truth_dis": "slope_credit_on_truth / ρ: corrected for the truth's noise",
    "slope_truth_on_credit": "least-squares slope of Â_k on the turn credit: 1 = calibrated as a forecast (a credit of "
    "x means a true advantage of x on average); the truth's noise does not bias it",
    "turn_sign": "share of turns with Â_k ≠ 0 whose sign the estimator gets right",
    "reliability": "ρ, the share of Var(Â) that is signal (split-half, or from the standard errors)",
    "n_turns": "turns compared",
    "truth": "'q-v' (Q̂ − V̂) or 'values' (R_k + V̂(s_{k+1}) − V̂(s_k))",
    "note": "why a number is withheld (the truth too noisy for a verdict), or empty",
}

#: old column names of the accuracy tables -> their names now (:func:`renamed_columns`)
RENAMED_COLUMNS = {"turn_slope": "slope_credit_on_truth", "turn_slope_dis": "slope_credit_on_truth_dis"}


def renamed_columns(df: pd.DataFrame, *, warn: bool = True) -> pd.DataFrame:
    """A saved accuracy table (``mc_accuracy``'s, as in ``experiments/records``) with the column names of
    this release: ``turn_slope`` -> ``slope_credit_on_truth``, ``turn_slope_dis`` ->
    ``slope_credit_on_truth_dis``, and ``slope_truth_on_credit`` added where missing (``turn_corr² /
    turn_slope``: the product of the two slopes is r²). A table already in the new names is returned as
    it is. The old names are read for one release; a ``FutureWarning`` says so (``warn``)."""
    old = [c for c in RENAMED_COLUMNS if c in df.columns and RENAMED_COLUMNS[c] not in df.columns]
    if not old:
        return df
    if warn:
        import warnings

        warnings.warn(
            f"accuracy table with the old column names {', '.join(old)}: read as "
            f"{', '.join(RENAMED_COLUMNS[c] for c in old)} (the old names are read until the next release; "
            "see CHANGELOG.md)",
            FutureWarning,
            stacklevel=2,
        )
    out = df.rename(columns={c: RENAMED_COLUMNS[c] for c in old})
    if "slope_truth_on_credit" not in out.columns and {"turn_corr", "slope_credit_on_truth"} <= set(out.columns):
        with np.errstate(divide="ignore", invalid="ignore"):
            out["slope_truth_on_credit"] = out["turn_corr"] ** 2 / out["slope_credit_on_truth"]
    return out


def disattenuate(r: float, lo: float, hi: float, rel: float) -> tuple[float, float, float]:
    """``(r/√ρ, lo/√ρ, hi/√ρ)`` clipped to [−1, 1]; NaN when ``ρ`` is below :data:`MIN_RELIABILITY` (or not
    a number)."""
    if not (isinstance(rel, float) and math.isfinite(rel) and rel >= MIN_RELIABILITY):
        return math.nan, math.nan, math.nan
    root = math.sqrt(rel)

    def clip(x):
        return max(-1.0, min(1.0, x / root)) if math.isfinite(x) else math.nan

    return clip(r), clip(lo), clip(hi)


def reliability_note(rel: float, what: str = "the truth") -> str:
    """The ``note`` of a table whose truth is too noisy for a verdict (``rel`` below
    :data:`MIN_RELIABILITY`), else ``""``."""
    if isinstance(rel, float) and math.isfinite(rel) and rel >= MIN_RELIABILITY:
        return ""
    shown = f"{rel:.2f}" if isinstance(rel, float) and math.isfinite(rel) else "undefined"
    return (
        f"too little data for a verdict: the reliability of {what} is {shown} (< {MIN_RELIABILITY}), so the "
        "noise-corrected columns are withheld; raise M or the number of episodes"
    )


def has_mc_truth(batch: TrajectoryBatch) -> bool:
    """Whether ``batch`` carries the Monte-Carlo truth of ``mpo-viz truth``."""
    return all(batch.has(f) for f in ("mc_value", "mc_value_a", "mc_value_b"))


def _flat(batch: TrajectoryBatch, name: str) -> np.ndarray:
    vals = batch.field(name)
    k = batch.num_turns
    for i, v in enumerate(vals):
        if v is None:
            raise ValueError(f"trajectory {batch.traj_ids[i]!r}: no {name} (run mpo-viz truth on the whole file)")
        if len(v) != k[i]:
            raise ValueError(f"trajectory {batch.traj_ids[i]!r}: {name}: expected {k[i]} entries, found {len(v)}")
    return np.concatenate([np.asarray(v, dtype=np.float64) for v in vals]) if len(vals) else np.zeros(0)


def mc_turn_truth(batch: TrajectoryBatch, *, use_q: bool | None = None, turn_gamma: float = 1.0) -> dict:
    """The policy's Monte-Carlo turn advantage, flat over the batch's turns (row then turn order):
    ``{"adv", "adv_a", "adv_b", "err_var", "truth"}`` — the estimate, its two split halves (from
    neighbouring values) or the per-turn error variance ``se_Q² + se_V²`` (from ``Q̂ − V̂``), and which
    (module docstring). ``use_q``: Q̂ − V̂ (None: when the batch has ``mc_q``)."""
    if not has_mc_truth(batch):
        raise ValueError(
            "batch: accuracy against the policy's truth needs the mc_value, mc_value_a and mc_value_b "
            "fields of mpo-viz truth; this batch lacks "
            f"{', '.join(f for f in ('mc_value', 'mc_value_a', 'mc_value_b') if not batch.has(f))}"
        )
    use_q = batch.has("mc_q") if use_q is None else use_q
    _, idx = batch_turn_index(batch)
    r = np.nan_to_num(as_2d(batch.token_rewards, "rewards"))
    rk = np.bincount(idx.slot, weights=r[idx.rows, idx.cols], minlength=idx.n_slots)
    v = _flat(batch, "mc_value")
    if use_q:
        q, se_q, se_v = _flat(batch, "mc_q"), _flat(batch, "mc_q_se"), _flat(batch, "mc_value_se")
        return {"adv": q - v, "adv_a": None, "adv_b": None, "err_var": se_q**2 + se_v**2, "truth": "q-v"}

    def from_values(x):
        return mc_turn_advantage(x, rk, idx.turn_row, turn_gamma=turn_gamma)

    return {
        "adv": from_values(v),
        "adv_a": from_values(_flat(batch, "mc_value_a")),
        "adv_b": from_values(_flat(batch, "mc_value_b")),
        "err_var": None,
        "truth": "values",
    }


def reliability(truth: dict) -> float:
    """ρ of a (pooled) :func:`mc_turn_truth`: Spearman–Brown of the split halves' correlation, or
    ``1 − mean(err_var)/Var(Â)`` (module docstring)."""
    if truth["truth"] == "q-v":
        var = float(np.var(truth["adv"], ddof=1)) if len(truth["adv"]) > 1 else math.nan
        return 1.0 - float(np.mean(truth["err_var"])) / var if var > 0 else math.nan
    r_ab = corr(truth["adv_a"], truth["adv_b"])
    return 2 * r_ab / (1 + r_ab) if r_ab > -1 else math.nan


def corr(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of two series; NaN for fewer than 2 points or a constant one."""
    if len(x) < 2 or np.std(x) == 0 or np.std(y) == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def fisher_interval(r: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """The ``level`` interval of a Pearson correlation ``r`` over ``n`` pairs (Fisher's z)."""
    if not math.isfinite(r) or n < 4:
        return math.nan, math.nan
    from scipy.stats import norm

    z = math.atanh(max(-0.999999, min(0.999999, r)))
    h = float(norm.ppf(0.5 + level / 2)) / math.sqrt(n - 3)
    return math.tanh(z - h), math.tanh(z + h)


def mc_accuracy_parts(batch: TrajectoryBatch, advantages, *, use_q: bool | None = None) -> dict:
    """One chunk's per-turn arrays for :func:`finish_mc_accuracy`: the truth (:func:`mc_turn_truth`)
    and each estimator's turn advantage (the mean over the turn's action tokens)."""
    _, idx = batch_turn_index(batch)
    turns = {}
    for name, a in adv_tensors(advantages).items():
        at = a[idx.rows, idx.cols]
        turns[name] = np.bincount(idx.slot, weights=at, minlength=idx.n_slots) / np.maximum(idx.count, 1)
    return {"truth": mc_turn_truth(batch, use_q=use_q), "turns": turns}


def finish_mc_accuracy(parts: list[dict]) -> pd.DataFrame:
    """The :data:`MC_ACCURACY_COLUMNS` table from the parts of one or more chunks (pooled)."""
    kinds = {p["truth"]["truth"] for p in parts}
    if len(kinds) != 1:
        raise ValueError(f"chunks with different truths ({', '.join(sorted(kinds))}): pass use_q to choose one")

    def cat(key):
        xs = [p["truth"][key] for p in parts]
        return None if xs[0] is None else np.concatenate(xs)

    truth = {k: cat(k) for k in ("adv", "adv_a", "adv_b", "err_var")} | {"truth": kinds.pop()}
    A, rel = truth["adv"], reliability(truth)
    note = reliability_note(rel, "the turn truth")
    rows = []
    for name in parts[0]["turns"]:
        a_turn = np.concatenate([p["turns"][name] for p in parts])
        r = corr(a_turn, A)
        lo, hi = fisher_interval(r, len(A))
        r_dis, lo_dis, hi_dis = disattenuate(r, lo, hi, rel)
        sums = pair_sums(a_turn, A)
        b = slope(sums)  # the credit on the truth (Cov / Var(Â))
        nz = np.abs(A) > 1e-9
        rows.append(
            {
                "estimator": name,
                "turn_corr": r,
                "turn_corr_lo": lo,
                "turn_corr_hi": hi,
                "turn_corr_dis": r_dis,
                "dis_lo": lo_dis,
                "dis_hi": hi_dis,
                "slope_credit_on_truth": b,
                "slope_credit_on_truth_dis": b / rel if not note else math.nan,
                "slope_truth_on_credit": slope(sums[[0, 2, 1, 4, 3, 5]]),  # the truth on the credit (Cov / Var(credit))
                "turn_sign": float(np.mean(np.sign(a_turn[nz]) == np.sign(A[nz]))) if nz.any() else math.nan,
                "reliability": rel,
                "n_turns": len(A),
                "truth": truth["truth"],
                "note": note,
            }
        )
    return pd.DataFrame(rows, columns=["estimator", *MC_ACCURACY_COLUMNS])


def mc_accuracy(batch: TrajectoryBatch, advantages, *, use_q: bool | None = None) -> pd.DataFrame:
    """One row per estimator of ``advantages`` (``{name: (B, L)}`` or results) with the
    :data:`MC_ACCURACY_COLUMNS`: its turn credit against the policy's Monte-Carlo truth."""
    return finish_mc_accuracy([mc_accuracy_parts(batch, advantages, use_q=use_q)])
