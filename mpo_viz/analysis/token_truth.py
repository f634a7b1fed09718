"""Within-turn credit accuracy: each estimator's token credit against the policy's token truth.

The token truth (``mc_tok_*`` fields of ``mpo-viz truth --tokens``,
:func:`mpo_viz.rollout.token_truth.mc_token_truth`) gives, at the measured tokens, ``Â_t`` — an
unbiased, noisy estimate of ``A(h_t, a_t)`` — with split halves ``Â^a_t``, ``Â^b_t``. At those tokens,
per estimator with credit ``c_t`` (:data:`MC_TOKEN_COLUMNS`):

(a) ``tok_corr``: Pearson ``corr(c_t, Â_t)``, with Fisher's 95% interval and disattenuated by the
    token truth's split-half reliability ``ρ = 2·r_ab/(1 + r_ab)``, ``r_ab = corr(Â^a_t, Â^b_t)``
    (Spearman–Brown; as :mod:`mpo_viz.analysis.truth` does per turn, with the same withholding below
    :data:`~mpo_viz.analysis.truth.MIN_RELIABILITY` and clipping to [−1, 1]);
(b) ``within_corr``: the same for the within-turn parts, ``c_t − c̄_k`` (the credit minus its turn's
    mean over the turn's ``n_k`` action tokens) against ``Â_t − Â_k/n_k``. The true token advantages of
    a turn sum to its true advantage ``A_k``, so their mean is ``A_k/n_k``; ``Â_k`` is the turn-level
    truth (``mc_q − mc_value``, else neighbouring values; without one, ``Σ_t Â_t`` when every token of
    the turn is measured). This isolates what a redistribution inside the turn (MPO's centred
    within-turn signal) adds over flat turn credit: an estimator constant within each turn has a
    within part of 0 on every token and scores **0 by construction** (``within_note`` says so). Its
    reliability comes from the halves ``Â^{a,b}_t − Â_k/n_k`` (the shared ``Â_k/n_k`` is small: ``n_k``
    is tens of tokens);
(c) ``unc_share``: per turn, the share of its absolute credit ``Σ_{t∈U_k}|c_t| / Σ_{t∈k}|c_t|`` on its
    uncertain tokens ``U_k`` (those the positions rule measured, controls excluded; under
    ``positions="all"``, those with ``1 − π > threshold``), averaged over turns — beside
    ``unc_share_truth``, the same share of the truth's ``|Â_t|``, where the other tokens of the turn
    count the mean ``|Â|`` of the measured non-uncertain ones (the controls) each. ``|Â|`` carries the
    truth's noise (``E|Â| ≥ |A|``), which pulls the truth's share toward the count share;
(d) ``sign_agreement``: over the measured tokens whose truth has a clear sign (``|Â_t| > 1.96·se_t``),
    the share where ``sign(c_t) = sign(Â_t)`` (``n_sign`` of them);
(e) ``slope_credit_on_truth`` (``Cov(c, Â)/Var(Â)``: 1 = the credit neither shrinks nor inflates the
    true signal; attenuated by ρ, ``_dis`` divides by ρ) and ``slope_truth_on_credit``
    (``Cov(c, Â)/Var(c)``: 1 = calibrated as a forecast; the truth's noise does not bias it).

Streaming: :func:`mc_token_accuracy_parts` per chunk (a row is never split across chunks),
:func:`finish_mc_token_accuracy` on the list. :func:`mc_token_accuracy_reference` computes the same
table with plain loops (the tests hold them together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from mpo_viz.analysis.arrays import adv_tensors, as_2d, batch_turn_index
from mpo_viz.analysis.truth import (
    corr,
    disattenuate,
    fisher_interval,
    has_mc_truth,
    mc_turn_truth,
    reliability_note,
)
from mpo_viz.data.moments import pair_sums, slope
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = [
    "MC_TOKEN_COLUMNS",
    "has_mc_token_truth",
    "mc_token_accuracy",
    "mc_token_accuracy_parts",
    "finish_mc_token_accuracy",
    "mc_token_accuracy_reference",
    "FLAT_NOTE",
    "NO_TURN_NOTE",
    "token_truth_text",
    "token_truth_table",
]

MC_TOKEN_COLUMNS = {
    "tok_corr": "(a) Pearson correlation of the token credit with the token truth Â_t over the measured tokens",
    "tok_corr_lo": "95% interval of tok_corr (Fisher's z over the measured tokens)",
    "tok_corr_hi": "",
    "tok_corr_dis": "tok_corr / √ρ (ρ: the token truth's split-half reliability), clipped to [−1, 1]; withheld "
    "below the minimum reliability",
    "tok_dis_lo": "95% interval of tok_corr_dis",
    "tok_dis_hi": "",
    "within_corr": "(b) the same for the within-turn parts: c_t − (turn mean of c) against Â_t − Â_k/n_k — what "
    "redistribution inside the turn adds over flat turn credit (flat credit: 0 by construction)",
    "within_corr_lo": "95% interval of within_corr",
    "within_corr_hi": "",
    "within_corr_dis": "within_corr / √ρ_within",
    "within_dis_lo": "95% interval of within_corr_dis",
    "within_dis_hi": "",
    "unc_share": "(c) share of a turn's absolute credit on its uncertain tokens (mean over turns)",
    "unc_share_truth": "the same share of the truth's |Â| (the other tokens counted at the controls' mean |Â|)",
    "sign_agreement": "(d) share of the measured tokens with a clear true sign (|Â| > 1.96 se) whose credit has it",
    "n_sign": "tokens with a clear true sign",
    "slope_credit_on_truth": "(e) least-squares slope of the credit on Â_t: 1 = neither shrinks nor inflates the "
    "true signal (attenuated by the truth's noise)",
    "slope_credit_on_truth_dis": "slope_credit_on_truth / ρ: corrected for the truth's noise",
    "slope_truth_on_credit": "least-squares slope of Â_t on the credit: 1 = calibrated as a forecast (a credit of x "
    "means a true advantage of x on average); the truth's noise does not bias it",
    "reliability": "ρ, the token truth's split-half reliability (Spearman–Brown)",
    "within_reliability": "ρ_within, the same for Â_t − Â_k/n_k",
    "n_tokens": "measured tokens compared",
    "n_turns": "turns with a measured token",
    "within_note": "why within_corr is what it is when it is not measured (flat credit, no turn truth), else empty",
    "note": "why noise-corrected numbers are withheld, else empty",
}

FLAT_NOTE = "flat credit: constant within each turn, its within-turn part is 0 on every token (0 by construction)"
NO_TURN_NOTE = (
    "no turn-level truth to centre the truth by (Â_k/n_k): run mpo-viz truth with the turn-level truth "
    "too, or measure every token (--tokens all)"
)


def has_mc_token_truth(batch: TrajectoryBatch) -> bool:
    """Whether ``batch`` carries the token truth of ``mpo-viz truth --tokens``."""
    return all(batch.has(f) for f in ("mc_tok_adv", "mc_tok_adv_a", "mc_tok_adv_b", "mc_tok_adv_se", "mc_tok_measured"))


def token_truth_text(meta: dict | None) -> str:
    """Which token truth a file carries, in words (its ``mc_truth["tokens"]`` metadata)."""
    t = (meta or {}).get("tokens") if isinstance(meta, dict) else None
    if not isinstance(t, dict):
        return "the policy's Monte-Carlo token truth"
    rule = t.get("positions", "?")
    if rule == "uncertain":
        rule = (
            f"uncertain tokens (1 − π > {t.get('threshold', '?')}, at most {t.get('max_per_turn', '?')} a turn, "
            f"{t.get('controls', '?')} control a turn)"
        )
    return (
        f"the Monte-Carlo token truth of {t.get('policy', 'the policy')} at {rule}: M = {t.get('m', '?')} "
        f"continuation pairs per token, estimator {t.get('estimator', '?')}, seed {t.get('seed', '?')}, "
        f"{t.get('measured', '?')} tokens"
    )


def _threshold(batch: TrajectoryBatch) -> tuple[str, float]:
    t = batch.meta.get("mc_truth", {}).get("tokens", {}) if isinstance(batch.meta.get("mc_truth"), dict) else {}
    return str(t.get("positions", "uncertain")), float(t.get("threshold", 0.01))


def mc_token_accuracy_parts(batch: TrajectoryBatch, advantages) -> dict:
    """One chunk's arrays for :func:`finish_mc_token_accuracy`: at the measured tokens the truth, its
    halves and error, the uncertain flags, the turn each is in and the turn's truth ``Â_k/n_k``; per
    turn with a measured token its token count and counts of uncertain / measured tokens; per
    estimator its credit at the measured tokens, its turn mean there, and per turn the absolute
    credit on the uncertain tokens and in all."""
    if not has_mc_token_truth(batch):
        raise ValueError(
            "batch: within-turn accuracy needs the token truth of mpo-viz truth --tokens (mc_tok_adv, "
            "mc_tok_adv_a, mc_tok_adv_b, mc_tok_adv_se, mc_tok_measured); this batch lacks "
            + ", ".join(
                f
                for f in ("mc_tok_adv", "mc_tok_adv_a", "mc_tok_adv_b", "mc_tok_adv_se", "mc_tok_measured")
                if not batch.has(f)
            )
        )
    m, idx = batch_turn_index(batch)
    rule, thr = _threshold(batch)

    def tok(name, fill=np.nan):
        return as_2d(batch.padded(name, torch.float64, fill=fill), name)[idx.rows, idx.cols]

    meas = tok("mc_tok_measured", 0.0) > 0.5
    ctl = (tok("mc_tok_control", 0.0) > 0.5) if batch.has("mc_tok_control") else np.zeros_like(meas)
    if rule == "all" and batch.has("mc_tok_pi"):
        unc = meas & (1.0 - tok("mc_tok_pi") > thr)
    else:
        unc = meas & ~ctl
    slot = idx.slot
    turn_adv = np.full(idx.n_slots, np.nan)
    if has_mc_truth(batch):
        turn_adv = mc_turn_truth(batch)["adv"]
    else:
        all_meas = np.bincount(slot, weights=meas.astype(np.float64), minlength=idx.n_slots) == idx.count
        s = np.bincount(slot, weights=np.where(meas, np.nan_to_num(tok("mc_tok_adv")), 0.0), minlength=idx.n_slots)
        turn_adv = np.where(all_meas & (idx.count > 0), s, np.nan)
    per_turn = turn_adv / np.maximum(idx.count, 1)
    has = np.bincount(slot[meas], minlength=idx.n_slots) > 0
    out = {
        "adv": tok("mc_tok_adv")[meas],
        "a": tok("mc_tok_adv_a")[meas],
        "b": tok("mc_tok_adv_b")[meas],
        "se": tok("mc_tok_adv_se")[meas],
        "unc": unc[meas],
        "slot": slot[meas],
        "turn_mean_truth": per_turn[slot[meas]],
        "turn_count": idx.count[has],
        "turn_meas": np.bincount(slot[meas], minlength=idx.n_slots)[has],
        "n_turns": int(has.sum()),
        "turn_of_meas": np.searchsorted(np.flatnonzero(has), slot[meas]),
        "credit": {},
    }
    for name, a in adv_tensors(advantages).items():
        at = as_2d(a, f"advantages[{name!r}]")[idx.rows, idx.cols]
        mean = np.bincount(slot, weights=at, minlength=idx.n_slots) / np.maximum(idx.count, 1)
        centred = at - mean[slot]
        out["credit"][name] = {
            "c": at[meas],
            "mean": mean[slot[meas]],
            "abs_unc": np.bincount(slot[unc], weights=np.abs(at[unc]), minlength=idx.n_slots)[has],
            "abs_all": np.bincount(slot, weights=np.abs(at), minlength=idx.n_slots)[has],
            "within_max": float(np.abs(centred[has[slot]]).max()) if has.any() else 0.0,
        }
    return out


def _split_half(a: np.ndarray, b: np.ndarray) -> float:
    r = corr(a, b)
    return 2 * r / (1 + r) if math.isfinite(r) and r > -1 else math.nan


def _with_interval(prefix: str, dis: str, x: np.ndarray, y: np.ndarray, rel: float) -> dict:
    r = corr(x, y)
    lo, hi = fisher_interval(r, len(x))
    rd, dlo, dhi = disattenuate(r, lo, hi, rel)
    return {prefix: r, f"{prefix}_lo": lo, f"{prefix}_hi": hi, f"{prefix}_dis": rd, f"{dis}_lo": dlo, f"{dis}_hi": dhi}


def _mean_share(num: np.ndarray, den: np.ndarray) -> float:
    ok = den > 0
    return float(np.mean(num[ok] / den[ok])) if ok.any() else math.nan


def finish_mc_token_accuracy(parts: list[dict]) -> pd.DataFrame:
    """The :data:`MC_TOKEN_COLUMNS` table, one row per estimator, from the parts of one or more chunks."""
    parts = [p for p in parts if len(p["adv"])] or parts[:1]

    def cat(key):
        return np.concatenate([p[key] for p in parts]) if parts else np.zeros(0)

    A, Aa, Ab, se, unc = cat("adv"), cat("a"), cat("b"), cat("se"), cat("unc")
    tmean = cat("turn_mean_truth")
    offs = np.cumsum([0] + [p["n_turns"] for p in parts])
    tix = np.concatenate([p["turn_of_meas"] + o for p, o in zip(parts, offs)]) if parts else np.zeros(0, dtype=int)
    n_turns = int(offs[-1])
    count, n_meas = cat("turn_count"), cat("turn_meas")
    rel = _split_half(Aa, Ab)
    within_ok = bool(len(A)) and np.all(np.isfinite(tmean))
    W, Wa, Wb = A - tmean, Aa - tmean, Ab - tmean
    rel_w = _split_half(Wa, Wb) if within_ok else math.nan
    # the truth's share on the uncertain tokens: the other tokens of a turn at the controls' mean |Â|
    absA = np.abs(A)
    truth_unc = np.bincount(tix[unc], weights=absA[unc], minlength=n_turns)
    truth_rest = np.bincount(tix[~unc], weights=absA[~unc], minlength=n_turns)
    fill = float(absA[~unc].mean()) if (~unc).any() else 0.0
    truth_den = truth_unc + truth_rest + (count - n_meas) * fill
    clear = np.abs(A) > 1.96 * se
    note = reliability_note(rel, "the token truth")
    rows = []
    for name in parts[0]["credit"] if parts else []:
        c = np.concatenate([p["credit"][name]["c"] for p in parts])
        cm = np.concatenate([p["credit"][name]["mean"] for p in parts])
        flat = max(p["credit"][name]["within_max"] for p in parts) <= 1e-9
        sums = pair_sums(c, A)
        row = {"estimator": name, **_with_interval("tok_corr", "tok_dis", c, A, rel)}
        if flat:
            row.update(
                within_corr=0.0,
                within_corr_lo=math.nan,
                within_corr_hi=math.nan,
                within_corr_dis=0.0,
                within_dis_lo=math.nan,
                within_dis_hi=math.nan,
                within_note=FLAT_NOTE,
            )
        elif not within_ok:
            row.update(
                {
                    k: math.nan
                    for k in (
                        "within_corr",
                        "within_corr_lo",
                        "within_corr_hi",
                        "within_corr_dis",
                        "within_dis_lo",
                        "within_dis_hi",
                    )
                },
                within_note=NO_TURN_NOTE,
            )
        else:
            row.update(_with_interval("within_corr", "within_dis", c - cm, W, rel_w), within_note="")
        abs_unc = np.concatenate([p["credit"][name]["abs_unc"] for p in parts])
        abs_all = np.concatenate([p["credit"][name]["abs_all"] for p in parts])
        row.update(
            {
                "unc_share": _mean_share(abs_unc, abs_all),
                "unc_share_truth": _mean_share(truth_unc, truth_den),
                "sign_agreement": float(np.mean(np.sign(c[clear]) == np.sign(A[clear]))) if clear.any() else math.nan,
                "n_sign": int(clear.sum()),
                "slope_credit_on_truth": slope(sums),
                "slope_credit_on_truth_dis": slope(sums) / rel if not note else math.nan,
                "slope_truth_on_credit": slope(sums[[0, 2, 1, 4, 3, 5]]),
                "reliability": rel,
                "within_reliability": rel_w,
                "n_tokens": len(A),
                "n_turns": n_turns,
                "note": note,
            }
        )
        rows.append(row)
    return pd.DataFrame(rows, columns=["estimator", *MC_TOKEN_COLUMNS])


def mc_token_accuracy(batch: TrajectoryBatch, advantages) -> pd.DataFrame:
    """One row per estimator of ``advantages`` (``{name: (B, L)}`` or results) with the
    :data:`MC_TOKEN_COLUMNS`: its credit inside turns against the policy's token truth."""
    return finish_mc_token_accuracy([mc_token_accuracy_parts(batch, advantages)])


def token_truth_table(batch: TrajectoryBatch, advantages=None) -> pd.DataFrame:
    """One row per measured token of ``batch`` (the explorer's per-token table): ``traj_id``, ``turn``,
    ``t`` (its place in the turn), ``pos`` (response position), ``token`` (its text, when the batch has
    ``response_tokens``), ``control``, ``pi`` (``π(a_t|h_t)``), ``truth`` (``Â_t``), ``truth_lo`` /
    ``truth_hi`` (``Â_t ∓ 1.96·se``), ``truth_within`` (``Â_t − Â_k/n_k``, NaN without a turn-level truth
    or a fully measured turn) and per estimator of ``advantages`` ``adv_<name>`` (its credit) and
    ``within_<name>`` (the credit minus its turn's mean)."""
    m, idx = batch_turn_index(batch)
    parts = mc_token_accuracy_parts(batch, advantages or {})
    meas = as_2d(batch.padded("mc_tok_measured", torch.float64, fill=0.0), "m")[idx.rows, idx.cols] > 0.5
    rows, cols = idx.rows[meas], idx.cols[meas]
    k = np.asarray(idx.turn_k)[idx.slot[meas]]
    first = np.full(idx.n_slots, np.iinfo(np.int64).max)
    np.minimum.at(first, idx.slot, np.arange(len(idx.slot)))
    t = np.flatnonzero(meas) - first[idx.slot[meas]]
    tids = batch.traj_ids
    data: dict = {"traj_id": [tids[r] for r in rows], "turn": k, "t": t, "pos": cols}
    if batch.has("response_tokens"):
        toks = batch.field("response_tokens")
        data["token"] = [str(toks[r][c]) if toks[r] is not None else "" for r, c in zip(rows, cols)]
    ctl = (
        as_2d(batch.padded("mc_tok_control", torch.float64, fill=0.0), "c")[rows, cols] > 0.5
        if batch.has("mc_tok_control")
        else np.zeros(len(rows), dtype=bool)
    )
    data["control"] = ctl.astype(np.int64)
    data["pi"] = (
        as_2d(batch.padded("mc_tok_pi", torch.float64, fill=np.nan), "pi")[rows, cols]
        if batch.has("mc_tok_pi")
        else np.nan
    )
    se = parts["se"]
    data.update(
        truth=parts["adv"],
        truth_lo=parts["adv"] - 1.96 * se,
        truth_hi=parts["adv"] + 1.96 * se,
        truth_within=parts["adv"] - parts["turn_mean_truth"],
    )
    for name, c in parts["credit"].items():
        data[f"adv_{name}"] = c["c"]
        data[f"within_{name}"] = c["c"] - c["mean"]
    return pd.DataFrame(data)


# --------------------------------------------------------------------------------------------- reference


def _ref_corr(x: list, y: list) -> float:
    n = len(x)
    if n < 2:
        return math.nan
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx <= 1e-24 or syy <= 1e-24:
        return math.nan
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def _ref_slope(x: list, y: list) -> float:
    """The slope of ``x`` regressed on ``y``."""
    n = len(x)
    if n < 2:
        return math.nan
    mx, my = sum(x) / n, sum(y) / n
    syy = sum((b - my) ** 2 for b in y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / syy if syy > 1e-24 else math.nan


@dataclass
class _RefToken:
    A: float
    a: float
    b: float
    se: float
    unc: bool
    turn_mean: float  # Â_k / n_k
    c: dict  # estimator -> credit
    c_mean: dict  # estimator -> the credit's mean over the turn


@dataclass
class _RefTurn:
    n: int
    meas: int
    unc_truth: float
    rest_truth: float
    abs_unc: dict
    abs_all: dict
    within_max: dict


def _ref_turns(batch: TrajectoryBatch, adv: dict) -> tuple[list[_RefToken], list[_RefTurn]]:
    """The measured tokens and the turns with one, row by row and turn by turn."""
    rule, thr = _threshold(batch)
    turn_truth = mc_turn_truth(batch)["adv"] if has_mc_truth(batch) else None

    def f(name):
        return batch.field(name) if batch.has(name) else None

    tru, ta, tb, tse, meas_f, ctl_f, pi_f = (
        f(n)
        for n in (
            "mc_tok_adv",
            "mc_tok_adv_a",
            "mc_tok_adv_b",
            "mc_tok_adv_se",
            "mc_tok_measured",
            "mc_tok_control",
            "mc_tok_pi",
        )
    )
    tids = batch.turn_ids.numpy()
    toks: list[_RefToken] = []
    turns: list[_RefTurn] = []
    slot = 0
    for i, mask in enumerate(batch.field("loss_mask")):
        for k in sorted({int(tids[i, j]) for j in range(len(mask)) if mask[j]}):
            cols = [j for j in range(len(mask)) if mask[j] and tids[i, j] == k]
            meas = [j for j in cols if meas_f[i][j] == 1]
            if rule == "all" and pi_f is not None:
                unc = [j for j in meas if 1 - pi_f[i][j] > thr]
            else:
                unc = [j for j in meas if ctl_f is None or ctl_f[i][j] != 1]
            if turn_truth is not None:
                a_k = float(turn_truth[slot])
            else:
                a_k = sum(float(tru[i][j]) for j in cols) if len(meas) == len(cols) else math.nan
            slot += 1
            if not meas:
                continue
            n = len(cols)
            credit = {nm: [float(a[i, j]) for j in cols] for nm, a in adv.items()}
            turns.append(
                _RefTurn(
                    n=n,
                    meas=len(meas),
                    unc_truth=sum(abs(float(tru[i][j])) for j in unc),
                    rest_truth=sum(abs(float(tru[i][j])) for j in meas if j not in unc),
                    abs_unc={nm: sum(abs(float(adv[nm][i, j])) for j in unc) for nm in adv},
                    abs_all={nm: sum(abs(x) for x in credit[nm]) for nm in adv},
                    within_max={nm: max(abs(x - sum(credit[nm]) / n) for x in credit[nm]) for nm in adv},
                )
            )
            for j in meas:
                toks.append(
                    _RefToken(
                        A=float(tru[i][j]),
                        a=float(ta[i][j]),
                        b=float(tb[i][j]),
                        se=float(tse[i][j]),
                        unc=j in unc,
                        turn_mean=a_k / n,
                        c={nm: float(adv[nm][i, j]) for nm in adv},
                        c_mean={nm: sum(credit[nm]) / n for nm in adv},
                    )
                )
    return toks, turns


def _ref_within(toks: list[_RefToken], turns: list[_RefTurn], nm: str, rel_w: float) -> dict:
    names = ("within_corr", "within_corr_lo", "within_corr_hi", "within_corr_dis", "within_dis_lo", "within_dis_hi")
    if all(tu.within_max[nm] <= 1e-9 for tu in turns):
        return {**dict(zip(names, (0.0, math.nan, math.nan, 0.0, math.nan, math.nan))), "within_note": FLAT_NOTE}
    W = [t.A - t.turn_mean for t in toks]
    if not toks or not all(math.isfinite(w) for w in W):
        return {**{k: math.nan for k in names}, "within_note": NO_TURN_NOTE}
    r = _ref_corr([t.c[nm] - t.c_mean[nm] for t in toks], W)
    lo, hi = fisher_interval(r, len(W))
    return {**dict(zip(names, (r, lo, hi, *disattenuate(r, lo, hi, rel_w)))), "within_note": ""}


def mc_token_accuracy_reference(batch: TrajectoryBatch, advantages) -> pd.DataFrame:
    """:func:`mc_token_accuracy` by plain loops over rows, turns and tokens (the readable reference)."""
    adv = {k: np.asarray(v, dtype=np.float64) for k, v in adv_tensors(advantages).items()}
    toks, turns = _ref_turns(batch, adv)
    A = [t.A for t in toks]

    def spearman_brown(r):
        return 2 * r / (1 + r) if math.isfinite(r) else math.nan

    rel = spearman_brown(_ref_corr([t.a for t in toks], [t.b for t in toks]))
    finite = bool(toks) and all(math.isfinite(t.turn_mean) for t in toks)
    rel_w = (
        spearman_brown(_ref_corr([t.a - t.turn_mean for t in toks], [t.b - t.turn_mean for t in toks]))
        if finite
        else math.nan
    )
    rest = [abs(t.A) for t in toks if not t.unc]
    fill = sum(rest) / len(rest) if rest else 0.0
    truth_shares = [
        tu.unc_truth / d for tu in turns if (d := tu.unc_truth + tu.rest_truth + (tu.n - tu.meas) * fill) > 0
    ]
    clear = [t for t in toks if abs(t.A) > 1.96 * t.se]
    note = reliability_note(rel, "the token truth")
    rows = []
    for nm in adv:
        c = [t.c[nm] for t in toks]
        r = _ref_corr(c, A)
        lo, hi = fisher_interval(r, len(A))
        shares = [tu.abs_unc[nm] / tu.abs_all[nm] for tu in turns if tu.abs_all[nm] > 0]
        b = _ref_slope(c, A)
        rows.append(
            {
                "estimator": nm,
                **dict(
                    zip(
                        ("tok_corr", "tok_corr_lo", "tok_corr_hi", "tok_corr_dis", "tok_dis_lo", "tok_dis_hi"),
                        (r, lo, hi, *disattenuate(r, lo, hi, rel)),
                    )
                ),
                **_ref_within(toks, turns, nm, rel_w),
                "unc_share": sum(shares) / len(shares) if shares else math.nan,
                "unc_share_truth": sum(truth_shares) / len(truth_shares) if truth_shares else math.nan,
                "sign_agreement": (
                    sum(float(np.sign(t.c[nm]) == np.sign(t.A)) for t in clear) / len(clear) if clear else math.nan
                ),
                "n_sign": len(clear),
                "slope_credit_on_truth": b,
                "slope_credit_on_truth_dis": b / rel if not note else math.nan,
                "slope_truth_on_credit": _ref_slope(A, c),
                "reliability": rel,
                "within_reliability": rel_w,
                "n_tokens": len(A),
                "n_turns": len(turns),
                "note": note,
            }
        )
    return pd.DataFrame(rows, columns=["estimator", *MC_TOKEN_COLUMNS])
