"""Analysis: the across/within variance split, per-turn tables, estimator comparison, critic quality.

Pandas out; tensors (torch or numpy, ``(B, L)``) or a :class:`~mpo_viz.trajectory.TrajectoryBatch`
in. Every statistic is computed over **action tokens** (``mask == 1``) only: observation and padding
tokens carry no value and no credit (docs/concepts.md §1–2).

Turns are the ids of ``batch.turn_ids`` (given, or derived from mask runs by
:func:`mpo_viz.turns.turn_ids_from_mask` — the one definition shared with estimators and losses).

Each vectorized function has a plain-Python reference loop beside it (``_*_ref``); the tests check
them against each other on edge cases.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mpo_viz.advantages import registry
from mpo_viz.advantages.token import gae
from mpo_viz.turns import turn_ids_from_mask

__all__ = [
    "variance_split",
    "explained_variance",
    "pass_at_k",
    "value_variance",
    "advantage_variance",
    "variance_summary",
    "turn_table",
    "compute_advantages",
    "to_numpy",
    "td_error",
    "compare_estimators",
    "compare_stats",
    "merge_compare_stats",
    "finish_compare",
    "sign_flips",
    "disagreement",
    "Disagreement",
    "critic_quality",
    "CriticQuality",
    "has_oracle",
    "ORACLE_FIELDS",
    "accuracy_stats",
    "merge_accuracy_stats",
    "finish_accuracy",
    "credit_accuracy",
    "accuracy_reading",
    "NO_ORACLE_TEXT",
    "ACCURACY_COLUMNS",
    "values_source",
]


# ---------------------------------------------------------------------------------------------
# helpers


def to_numpy(x, dtype=np.float64) -> np.ndarray:
    """A torch tensor or array-like as a numpy array of ``dtype`` (a copy only when needed)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def _as_2d(x, name: str, dtype=np.float64) -> np.ndarray:
    a = to_numpy(x, dtype)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2:
        raise ValueError(f"{name}: expected a (B, L) tensor, found shape {tuple(a.shape)}")
    return a


def _prepare(x, mask, turn_ids, name: str = "x"):
    """Validate shapes and return float64 ``x``, bool ``mask``, int64 ``turn_ids`` (all (B, L))."""
    x = _as_2d(x, name)
    m = _as_2d(mask, "mask") != 0
    if x.shape != m.shape:
        raise ValueError(f"{name}: expected shape {m.shape} (the mask's), found {x.shape}")
    if turn_ids is None:
        t = turn_ids_from_mask(m.astype(np.int64))
    else:
        t = _as_2d(turn_ids, "turn_ids", np.int64)
        if t.shape != m.shape:
            raise ValueError(f"turn_ids: expected shape {m.shape} (the mask's), found {t.shape}")
    bad = m & ~np.isfinite(x)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise ValueError(
            f"{name}: row {r}, token {c}: expected a finite number on action tokens, found {x[r, c]}"
        )
    return x, m, t


@dataclass
class _Turns:
    """Flat index of the turns of a batch: action token ``(rows[i], cols[i])`` is in turn slot
    ``slot[i]``; slot ``s`` belongs to row ``turn_row[s]`` and has turn number ``turn_k[s]``."""

    rows: np.ndarray  # (N,) int64, action tokens in row-major order
    cols: np.ndarray  # (N,)
    slot: np.ndarray  # (N,) flat turn index
    n_turns: np.ndarray  # (B,) K per row
    offsets: np.ndarray  # (B + 1,) first slot of each row
    turn_row: np.ndarray  # (T,)
    turn_k: np.ndarray  # (T,)
    count: np.ndarray  # (T,) action tokens per turn

    @property
    def n_slots(self) -> int:
        return int(self.offsets[-1])


def _turn_index(m: np.ndarray, t: np.ndarray) -> _Turns:
    rows, cols = np.nonzero(m)
    k = t[rows, cols]
    B = m.shape[0]
    n_turns = np.zeros(B, dtype=np.int64)
    if rows.size:
        np.maximum.at(n_turns, rows, k + 1)
    offsets = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(n_turns, out=offsets[1:])
    slot = offsets[rows] + k
    T = int(offsets[-1])
    turn_row = np.repeat(np.arange(B), n_turns)
    turn_k = np.arange(T) - offsets[turn_row]
    count = np.bincount(slot, minlength=T).astype(np.int64)
    return _Turns(rows, cols, slot, n_turns, offsets, turn_row, turn_k, count)


def _turn_means(x: np.ndarray, idx: _Turns) -> np.ndarray:
    """Mean of ``x`` over each turn's action tokens, ``(T,)`` (NaN for an empty slot)."""
    s = np.bincount(idx.slot, weights=x[idx.rows, idx.cols], minlength=idx.n_slots)
    with np.errstate(invalid="ignore", divide="ignore"):
        return s / idx.count


# ---------------------------------------------------------------------------------------------
# across / within split (docs/concepts.md §7.8)


def variance_split(x, mask, turn_ids=None) -> dict[str, np.ndarray]:
    """The across/within split (docs/concepts.md §7.8) for any per-token tensor (values, advantages, ...).

    Shapes: ``x``, ``mask``, ``turn_ids`` are ``(B, L)`` (torch or numpy; ``turn_ids=None`` derives
    turns from mask runs). Returns a dict of float64 / int64 numpy arrays of shape ``(B,)``:

    * ``across = Var_k(m_k)`` with ``m_k = mean_{t∈k} x_t`` (population variance over the K turns,
      each turn weighing 1);
    * ``within = mean_k Var_{t∈k}(x_t)`` (population variance inside each turn; a one-token turn
      contributes 0);
    * ``ratio = across / within``: ``inf`` when ``within == 0 < across``; ``nan`` when both are 0
      (nothing varies) or the row has no action token. A variance below ``1e-24 · max(x²)`` of the
      row is round-off (e.g. a turn of identical values) and counts as 0;
    * the length-weighted pair ``across_w = Σ_k n_k (m_k − m)² / n`` and
      ``within_w = Σ_k n_k Var_k / n`` (``m`` the mean over all n action tokens), which sum to the
      population variance of the row's action-token values;
    * ``n_tokens`` (action tokens) and ``n_turns`` (K).

    Rows without action tokens get NaN statistics. Only action tokens are read, so ``x`` may hold
    anything (even NaN) on observation and padding tokens.
    """
    x, m, t = _prepare(x, mask, turn_ids)
    B = x.shape[0]
    idx = _turn_index(m, t)
    T = idx.n_slots
    xv = x[idx.rows, idx.cols]
    mk = _turn_means(x, idx)  # (T,)
    dev2 = (xv - mk[idx.slot]) ** 2
    var_k = np.bincount(idx.slot, weights=dev2, minlength=T) / np.maximum(idx.count, 1)
    K = idx.n_turns.astype(np.float64)
    n = np.bincount(idx.rows, minlength=B).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_of_means = np.bincount(idx.turn_row, weights=mk, minlength=B) / K
        across = np.bincount(idx.turn_row, weights=(mk - mean_of_means[idx.turn_row]) ** 2, minlength=B) / K
        within = np.bincount(idx.turn_row, weights=var_k, minlength=B) / K
        m_all = np.bincount(idx.rows, weights=xv, minlength=B) / n
        across_w = np.bincount(
            idx.turn_row, weights=idx.count * (mk - m_all[idx.turn_row]) ** 2, minlength=B
        ) / n
        within_w = np.bincount(idx.turn_row, weights=idx.count * var_k, minlength=B) / n
    # round-off: a turn of identical values can leave a variance of ~1e-34·x² instead of 0, which
    # would turn an infinite ratio into an astronomically large finite one; snap those to 0
    scale2 = np.zeros(B)
    if xv.size:
        np.maximum.at(scale2, idx.rows, xv * xv)
    tiny = _TINY * scale2
    for arr in (across, within, across_w, within_w):
        arr[arr <= tiny] = 0.0
    ratio = _ratio(across, within)
    return {
        "n_tokens": n.astype(np.int64),
        "n_turns": idx.n_turns,
        "across": across,
        "within": within,
        "ratio": ratio,
        "across_w": across_w,
        "within_w": within_w,
    }


_TINY = 1e-24  # variances below _TINY · max(x²) of the row are round-off: treated as 0


def _ratio(across: np.ndarray, within: np.ndarray) -> np.ndarray:
    across = np.asarray(across, dtype=np.float64)
    within = np.asarray(within, dtype=np.float64)
    out = np.full(across.shape, np.nan)
    pos = within > 0
    out[pos] = across[pos] / within[pos]
    out[(within == 0) & (across > 0)] = np.inf
    return out


def _variance_split_ref(x, mask, turn_ids=None) -> dict[str, np.ndarray]:
    """Reference loop for :func:`variance_split` (one trajectory, one turn at a time)."""
    x, m, t = _prepare(x, mask, turn_ids)
    out = {k: [] for k in ("n_tokens", "n_turns", "across", "within", "ratio", "across_w", "within_w")}
    for b in range(x.shape[0]):
        turns: dict[int, list[float]] = {}
        for j in range(x.shape[1]):
            if m[b, j]:
                turns.setdefault(int(t[b, j]), []).append(float(x[b, j]))
        vals = [v for k in sorted(turns) for v in turns[k]]
        n, K = len(vals), len(turns)
        out["n_tokens"].append(n)
        out["n_turns"].append(max(turns) + 1 if turns else 0)
        if n == 0:
            for k in ("across", "within", "ratio", "across_w", "within_w"):
                out[k].append(math.nan)
            continue
        means = [sum(v) / len(v) for v in turns.values()]
        variances = [sum((a - mu) ** 2 for a in v) / len(v) for v, mu in zip(turns.values(), means)]
        mm = sum(means) / K
        across = sum((mu - mm) ** 2 for mu in means) / K
        within = sum(variances) / K
        m_all = sum(vals) / n
        across_w = sum(len(v) * (mu - m_all) ** 2 for v, mu in zip(turns.values(), means)) / n
        within_w = sum(len(v) * var for v, var in zip(turns.values(), variances)) / n
        tiny = _TINY * max(a * a for a in vals)
        across, within, across_w, within_w = (0.0 if z <= tiny else z for z in (across, within, across_w, within_w))
        out["across"].append(across)
        out["within"].append(within)
        out["across_w"].append(across_w)
        out["within_w"].append(within_w)
        out["ratio"].append(math.inf if within == 0 and across > 0 else (across / within if within > 0 else math.nan))
    return {k: np.asarray(v, dtype=np.int64 if k.startswith("n_") else np.float64) for k, v in out.items()}


def _scores(batch) -> np.ndarray:
    """The trajectory score (docs/concepts.md §3): the sum of the rewards an estimator sees, ``(B,)``."""
    r = to_numpy(batch.rewards)
    return r.sum(axis=1) if r.ndim == 2 else r


def value_variance(batch, values=None, *, name: str = "values") -> pd.DataFrame:
    """The across/within diagnostic, one row per trajectory of ``batch`` (the paper's Fig. 2 diagnostic).

    ``values``: a ``(B, L)`` tensor to split instead of ``batch.values`` — pass an advantage tensor
    to get the same split for advantages (see :func:`advantage_variance`).

    Columns: ``traj_id``, ``group_id``, ``reward`` (the trajectory score: sum of the rewards the
    estimators see), ``n_turns``, ``n_tokens`` (action tokens), ``across``, ``within``, ``ratio``,
    ``across_w``, ``within_w`` (see :func:`variance_split`). Raises ``ValueError`` when the batch has
    no values and none are given.
    """
    if values is None:
        values = batch.values
        if values is None:
            raise ValueError(f"{name}: the batch has no 'values' field; pass values= explicitly")
    split = variance_split(values, batch.mask, batch.turn_ids)
    df = pd.DataFrame(
        {
            "traj_id": list(batch.traj_ids),
            "group_id": list(batch.group_ids),
            "reward": _scores(batch),
            **{k: split[k] for k in ("n_turns", "n_tokens", "across", "within", "ratio", "across_w", "within_w")},
        }
    )
    df.attrs["quantity"] = name
    return df


def advantage_variance(batch, advantages, *, name: str = "advantages") -> pd.DataFrame:
    """The across/within split (docs/concepts.md §7.8) of an advantage tensor ``(B, L)``: :func:`value_variance` with ``values=``.

    For MAE the turn means are exactly ``A^T_k``, so ``across`` is the macro-scale spread and
    ``within`` the micro-scale (β-weighted centred signal) spread.
    """
    return value_variance(batch, advantages, name=name)


def variance_summary(df: pd.DataFrame) -> dict:
    """Batch statistics of a :func:`value_variance` table (plain floats / ints).

    Means are over trajectories with at least one action token (NaN rows excluded).
    ``median_ratio`` is over finite ratios only; ``n_inf_ratio`` counts ratios that are ``inf``
    (within = 0 < across); ``n_flat`` counts rows where neither varies (ratio NaN);
    ``share_across_gt_within`` is over rows with at least one action token.
    """
    valid = df["n_tokens"] > 0
    d = df[valid]
    ratio = d["ratio"].to_numpy(dtype=np.float64)
    finite = ratio[np.isfinite(ratio)]

    def mean(col):
        return float(d[col].mean()) if len(d) else math.nan

    return {
        "n_traj": int(len(df)),
        "n_valid": int(valid.sum()),
        "mean_across": mean("across"),
        "mean_within": mean("within"),
        "mean_across_w": mean("across_w"),
        "mean_within_w": mean("within_w"),
        "median_ratio": float(np.median(finite)) if finite.size else math.nan,
        "share_across_gt_within": float((d["across"] > d["within"]).mean()) if len(d) else math.nan,
        "n_inf_ratio": int(np.isinf(ratio).sum()),
        "n_flat": int(np.isnan(ratio).sum()),
    }


# ---------------------------------------------------------------------------------------------
# estimators (thin wrapper over mpo_viz.advantages.compute)


def compute_advantages(batch, estimators, **options) -> dict:
    """Run each named estimator on ``batch``: ``{name: result}`` (``result.advantages``, ``.returns``).

    ``options`` are shared (e.g. ``gamma=``, ``lam=``, ``beta=``); each estimator receives only the
    options it accepts (:func:`mpo_viz.advantages.split_options`, which refuses an option none of
    them takes), so ``-e mpo,grpo --beta 0.5`` works.
    """
    names = registry.parse_names(estimators)
    return {name: registry.compute(batch, name, **o) for name, o in registry.split_options(names, options).items()}


def td_error(batch, *, gamma: float = 1.0):
    """The one-step TD error ``δ_t = r_t + γ·V_{t+1} − V_t`` over action tokens (``V_{t+1}``: the
    value at the next action token; after the last, the bootstrap value or 0), ``(B, L)`` float32,
    0 on masked positions: token GAE with λ = 0. None when the batch has no values. The strip's
    ``td`` channel."""
    if batch.values is None:
        return None
    # float32 inputs, like compute(): the same compiled kernel, no second JIT specialization
    adv, _ = gae(batch.rewards, batch.values, batch.mask, gamma=gamma, lam=0.0,
                 bootstrap_value=batch.bootstrap_value)
    return adv


def _adv_tensors(advantages) -> dict[str, np.ndarray]:
    """Accept ``{name: tensor}`` or ``{name: result}`` (anything with ``.advantages``)."""
    out = {}
    for k, v in advantages.items():
        out[k] = to_numpy(getattr(v, "advantages", v))
    return out


# ---------------------------------------------------------------------------------------------
# per-turn tables


def turn_table(batch, advantages=None, *, returns=None, **options) -> pd.DataFrame:
    """The per-turn table of ``batch`` (:meth:`TrajectoryBatch.turns`, columns in docs/concepts.md).

    ``advantages``: ``{name: (B, L) tensor or result}`` -> ``adv_<name>`` columns (mean over the
    turn's action tokens); or estimator names (``"mpo,gae"`` or a list) to compute here with the
    shared ``options`` (see :func:`compute_advantages`), which also fill ``ret_<name>``.
    ``returns``: ``{name: (B, L) tensor or result}`` -> ``ret_<name>`` columns (the return at the
    turn's first action token).
    """
    if isinstance(advantages, str) or (isinstance(advantages, (list, tuple)) and all(isinstance(a, str) for a in advantages)):
        advantages = compute_advantages(batch, advantages, **options)
        if returns is None:
            returns = advantages
    elif options:
        raise ValueError(f"options: only used with estimator names, found {sorted(options)}")
    return batch.turns(advantages=advantages, returns=returns)


def _turn_table_ref(batch, advantages=None) -> pd.DataFrame:
    """Reference loop for :func:`turn_table` (core columns + advantages)."""
    m = _as_2d(batch.mask, "mask") != 0
    t = _as_2d(batch.turn_ids, "turn_ids", np.int64)
    r = _as_2d(batch.rewards, "rewards")
    adv = _adv_tensors(advantages or {})
    rows = []
    for b in range(m.shape[0]):
        turns: dict[int, list[int]] = {}
        for j in range(m.shape[1]):
            if m[b, j]:
                turns.setdefault(int(t[b, j]), []).append(j)
        for k in sorted(turns):
            pos = turns[k]
            row = {
                "traj_id": batch.traj_ids[b],
                "row": b,
                "turn": k,
                "start": pos[0],
                "end": pos[-1],
                "n_tokens": len(pos),
                "reward": sum(r[b, j] for j in pos),
            }
            for name, a in adv.items():
                row[f"adv_{name}"] = sum(a[b, j] for j in pos) / len(pos)
            rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# estimator comparison


def _concordance(ta: np.ndarray, tb: np.ndarray, turn_row: np.ndarray) -> tuple[int, int]:
    """(concordant, comparable) turn pairs within trajectories: a pair ``k < k'`` of the same
    trajectory is comparable when neither estimator ties it, concordant when both order it alike."""
    conc = comp = 0
    bounds = np.flatnonzero(np.diff(turn_row)) + 1
    for s, e in zip(np.r_[0, bounds], np.r_[bounds, turn_row.size]):
        if e - s < 2:
            continue
        da = np.sign(ta[s:e, None] - ta[None, s:e])
        db = np.sign(tb[s:e, None] - tb[None, s:e])
        iu = np.triu_indices(e - s, 1)
        da, db = da[iu], db[iu]
        ok = (da != 0) & (db != 0)
        comp += int(ok.sum())
        conc += int((ok & (da == db)).sum())
    return conc, comp


def compare_stats(batch, advantages) -> dict:
    """Additive sufficient statistics of :func:`compare_estimators` for one batch.

    ``{(a, b): {...sums...}}``; statistics of several batches (chunks of one file) add up key by key
    (:func:`merge_compare_stats`) and :func:`finish_compare` turns them into the comparison table,
    so a file streamed in chunks gets exactly the numbers of the whole file.
    """
    adv = _adv_tensors(advantages)
    if len(adv) < 2:
        raise ValueError(f"advantages: expected at least two estimators, found {len(adv)}")
    m = _as_2d(batch.mask, "mask") != 0
    t = _as_2d(batch.turn_ids, "turn_ids", np.int64)
    idx = _turn_index(m, t)
    tok, turn = {}, {}
    for k, v in adv.items():
        v = _as_2d(v, f"advantages[{k!r}]")
        if v.shape != m.shape:
            raise ValueError(f"advantages[{k!r}]: expected shape {m.shape} (the mask's), found {v.shape}")
        tok[k] = v[idx.rows, idx.cols]
        turn[k] = _turn_means(v, idx)
    out = {}
    for a, b in itertools.combinations(adv, 2):
        conc, comp = _concordance(turn[a], turn[b], idx.turn_row)
        out[(a, b)] = {
            "tok": _moments(tok[a], tok[b]),
            "turn": _moments(turn[a], turn[b]),
            "tok_sign": float((np.sign(tok[a]) == np.sign(tok[b])).sum()),
            "turn_sign": float((np.sign(turn[a]) == np.sign(turn[b])).sum()),
            "conc": conc,
            "comp": comp,
            "flips": int((turn[a] * turn[b] < 0).sum()),
        }
    return out


def _moments(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[n, Σx, Σy, Σx², Σy², Σxy] about a fixed shift of 0 (values are O(1) advantages)."""
    return np.array([x.size, x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum()], dtype=np.float64)


def _corr_from_moments(mo: np.ndarray) -> float:
    n, sx, sy, sxx, syy, sxy = mo
    if n < 2:
        return math.nan
    cov = sxy - sx * sy / n
    vx, vy = sxx - sx * sx / n, syy - sy * sy / n
    # guard against cancellation leaving a tiny negative / zero variance for a constant series
    tol = 1e-12 * max(sxx, syy, 1e-300)
    if vx <= tol or vy <= tol:
        return math.nan
    return float(max(-1.0, min(1.0, cov / math.sqrt(vx * vy))))


def merge_compare_stats(acc: dict | None, new: dict) -> dict:
    """Add the statistics of :func:`compare_stats` of another batch into ``acc`` (returned)."""
    if acc is None:
        return {k: {kk: (vv.copy() if isinstance(vv, np.ndarray) else vv) for kk, vv in v.items()} for k, v in new.items()}
    for k, v in new.items():
        if k not in acc:
            raise ValueError(f"advantages: estimator pair {k} missing from earlier batches")
        for kk, vv in v.items():
            acc[k][kk] = acc[k][kk] + vv
    return acc


def finish_compare(stats: dict) -> pd.DataFrame:
    """The comparison table (see :func:`compare_estimators`) from accumulated statistics."""
    rows = []
    for (a, b), s in stats.items():
        n_tok, n_turn = s["tok"][0], s["turn"][0]
        rows.append(
            {
                "a": a,
                "b": b,
                "token_corr": _corr_from_moments(s["tok"]),
                "sign_agreement": s["tok_sign"] / n_tok if n_tok else math.nan,
                "turn_corr": _corr_from_moments(s["turn"]),
                "turn_sign_agreement": s["turn_sign"] / n_turn if n_turn else math.nan,
                "turn_rank_agreement": s["conc"] / s["comp"] if s["comp"] else math.nan,
                "n_sign_flips": int(s["flips"]),
                "n_turns": int(n_turn),
            }
        )
    return pd.DataFrame(rows)


def compare_estimators(batch, advantages) -> pd.DataFrame:
    """Agreement between every pair of estimators on one batch, one row per pair ``(a, b)``.

    ``advantages``: ``{name: (B, L) tensor or result}`` (at least two). Over action tokens:
    ``token_corr`` (Pearson correlation of the per-token advantages), ``sign_agreement`` (share of
    action tokens where ``sign(A_a) == sign(A_b)``, zero being its own sign). Over turns (turn
    advantage = mean over the turn's action tokens): ``turn_corr``, ``turn_sign_agreement``,
    ``turn_rank_agreement`` (share of concordant pairs among the pairs of turns *of the same
    trajectory* that neither estimator ties; NaN when there is none), ``n_sign_flips`` (turns where
    ``A_a · A_b < 0``) and ``n_turns``. Correlations are NaN when either side is constant.
    """
    return finish_compare(compare_stats(batch, advantages))


def sign_flips(batch, advantages) -> pd.DataFrame:
    """The turns whose advantage sign differs between two estimators (``A_a · A_b < 0``).

    One row per (pair, turn): ``a``, ``b``, ``traj_id``, ``row``, ``turn``, ``adv_a``, ``adv_b``
    (turn means of the advantages).
    """
    adv = _adv_tensors(advantages)
    tt = turn_table(batch, adv)
    parts = []
    for a, b in itertools.combinations(adv, 2):
        sel = tt[tt[f"adv_{a}"] * tt[f"adv_{b}"] < 0]
        parts.append(
            pd.DataFrame(
                {
                    "a": a,
                    "b": b,
                    "traj_id": sel["traj_id"].to_numpy(),
                    "row": sel["row"].to_numpy(),
                    "turn": sel["turn"].to_numpy(),
                    "adv_a": sel[f"adv_{a}"].to_numpy(),
                    "adv_b": sel[f"adv_{b}"].to_numpy(),
                }
            )
        )
    cols = ["a", "b", "traj_id", "row", "turn", "adv_a", "adv_b"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def disagreement(batch, advantages) -> np.ndarray:
    """Per trajectory ``(B,)``: the share of (turn, estimator pair) combinations whose turn
    advantages have opposite signs — 0 when every estimator agrees on every turn's sign, NaN for a
    row without turns. Used by the report to pick the most disagreed-on trajectories."""
    return Disagreement(batch)(advantages)


class Disagreement:
    """:func:`disagreement` on one batch, computed again and again (a view's sliders): the turn
    index is built once, and an estimator's turn means are kept while its advantages are the same
    tensor object as last time (the widgets' engine returns the same tensors for an estimator whose
    options did not change). ``Disagreement(batch)(advantages)`` equals
    ``disagreement(batch, advantages)``."""

    def __init__(self, batch):
        m = _as_2d(batch.mask, "mask") != 0
        t = _as_2d(batch.turn_ids, "turn_ids", np.int64)
        self._idx = _turn_index(m, t)
        self._B = m.shape[0]
        self._means: dict = {}  # name -> (the advantages object, its turn means)

    def __call__(self, advantages) -> np.ndarray:
        turn = {}
        for k, v in advantages.items():
            obj = getattr(v, "advantages", v)
            hit = self._means.get(k)
            if hit is None or hit[0] is not obj:
                hit = self._means[k] = (obj, _turn_means(_as_2d(to_numpy(obj), k), self._idx))
            turn[k] = hit[1]
        pairs = list(itertools.combinations(turn, 2))
        flips = np.zeros(self._B)
        for a, b in pairs:
            flips += np.bincount(self._idx.turn_row, weights=(turn[a] * turn[b] < 0).astype(np.float64), minlength=self._B)
        with np.errstate(invalid="ignore", divide="ignore"):
            return flips / (self._idx.n_turns * max(len(pairs), 1))


# ---------------------------------------------------------------------------------------------
# pass@k


def pass_at_k(successes, k: int) -> float:
    """The unbiased pass@k of a ``(T, n)`` 0/1 array (T tasks, n samples each; n ≥ k):
    ``mean_tasks [1 − C(n − c, k) / C(n, k)]`` with c the task's successes — the chance that at
    least one of k samples drawn without replacement from the n succeeds (Chen et al., 2021)."""
    s = np.asarray(successes, dtype=np.float64)
    if s.ndim != 2:
        raise ValueError(f"successes: expected a (tasks, samples) array, found shape {s.shape}")
    n = s.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"k: expected 1 <= k <= {n} (the samples per task), found {k}")
    c = s.sum(1).astype(int)
    fail = np.array([math.comb(n - ci, k) / math.comb(n, k) for ci in c])
    return float(np.mean(1.0 - fail)) if len(c) else math.nan


# ---------------------------------------------------------------------------------------------
# critic quality


def explained_variance(returns, values, mask) -> float:
    """``1 − Var(G − V) / Var(G)`` over the action tokens (``mask`` = 1) of ``(B, L)`` returns G and
    values V (population variances, float64): the share of the returns' variance the values
    explain (1 perfect, 0 no better than the mean, < 0 worse). NaN when Var(G) = 0 or there are
    no action tokens."""
    m = _as_2d(mask, "mask") != 0
    g = _as_2d(returns, "returns")[m]
    v = _as_2d(values, "values")[m]
    if g.size == 0:
        return math.nan
    var_g = float(g.var())
    return 1.0 - float((g - v).var()) / var_g if var_g > 0 else math.nan



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

    def as_dict(self) -> dict:
        return {
            "explained_variance": self.explained_variance,
            "mse": self.mse,
            "bias": self.bias,
            "n_tokens": self.n_tokens,
        }


def critic_quality(batch, returns=None, *, estimator: str = "mpo", **options) -> CriticQuality:
    """Explained variance of ``batch.values`` against ``returns`` and the per-turn value error.

    ``returns``: ``(B, L)`` tensor or an estimator result; ``None`` uses the returns of
    ``estimator`` (default ``"mpo"``, whose default critic target is the Monte-Carlo return).
    """
    if batch.values is None:
        raise ValueError("values: the batch has no 'values' field; critic quality needs a critic")
    if returns is None:
        returns = compute_advantages(batch, [estimator], **options)[estimator]
    g = _as_2d(getattr(returns, "returns", returns), "returns")
    v = _as_2d(batch.values, "values")
    m = _as_2d(batch.mask, "mask") != 0
    if g.shape != m.shape:
        raise ValueError(f"returns: expected shape {m.shape}, found {g.shape}")
    gv, vv = g[m], v[m]
    ev = explained_variance(g, v, m)
    tt = batch.turns(returns={"target": g})
    per_turn = tt[["traj_id", "row", "turn"]].copy()
    if "value_first" in tt:
        per_turn["value_first"] = tt["value_first"]
        per_turn["return_first"] = tt["ret_target"]
        per_turn["error"] = per_turn["value_first"] - per_turn["return_first"]
        per_turn["abs_error"] = per_turn["error"].abs()
    return CriticQuality(
        explained_variance=ev,
        mse=float(((vv - gv) ** 2).mean()) if gv.size else math.nan,
        bias=float((vv - gv).mean()) if gv.size else math.nan,
        n_tokens=int(gv.size),
        per_turn=per_turn,
    )


# ---------------------------------------------------------------------------------------------
# accuracy against the oracle (environments of mpo_viz.envs write the exact advantages)

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
}
"""The accuracy columns and what each means (the same as ``benchmarks/credit_accuracy.py``)."""

NO_ORACLE_TEXT = (
    "No oracle columns (oracle_token_adv, decisive: written by mpo-viz generate for its environments), so how "
    "right each estimator is cannot be measured here, only how they agree. What would tell: the explained "
    "variance of the values against the returns (a critic near 0 gives value-based estimators little to work "
    "with), and the across/within split of the values (a critic flat inside turns gives MPO's within-turn "
    "signal nothing to redistribute). To measure accuracy, generate trajectories with an oracle "
    "(mpo-viz generate) or see benchmarks/credit_accuracy.py.")


def values_source(batch) -> str:
    """Where ``values`` come from, from the file metadata (``values_source``: ``critic``,
    ``oracle``, …), else ``"critic"`` — as the label a view should use (an oracle is no critic)."""
    src = (getattr(batch, "meta", None) or {}).get("values_source")
    return str(src) if src else "critic"


def has_oracle(batch) -> bool:
    """Whether ``batch`` carries the oracle columns of :data:`ORACLE_FIELDS`."""
    return all(batch.has(f) for f in ORACLE_FIELDS)


def accuracy_stats(batch, advantages) -> dict:
    """Mergeable sufficient statistics of :func:`credit_accuracy` for one batch (or chunk):
    ``{name: {moment arrays and counts}}``. ``advantages``: ``{name: (B, L) tensor or result}``."""
    if not has_oracle(batch):
        raise ValueError(f"batch: accuracy needs the oracle columns {', '.join(ORACLE_FIELDS)}; this batch lacks "
                         f"{', '.join(f for f in ORACLE_FIELDS if not batch.has(f))}")
    m = _as_2d(batch.mask, "mask") != 0
    t = _as_2d(batch.turn_ids, "turn_ids", np.int64)
    idx = _turn_index(m, t)
    o = np.nan_to_num(_as_2d(batch.padded("oracle_token_adv"), "oracle_token_adv"))
    d = _as_2d(batch.padded("decisive"), "decisive") > 0.5
    ot = o[idx.rows, idx.cols]
    dt = d[idx.rows, idx.cols]
    keep = idx.count > 0
    o_turn = np.bincount(idx.slot, weights=ot, minlength=idx.n_slots)[keep]  # A*_k = Σ_t∈k a*_t
    o_c = ot - (np.bincount(idx.slot, weights=ot, minlength=idx.n_slots) / np.maximum(idx.count, 1))[idx.slot]
    out = {}
    for name, a in _adv_tensors(advantages).items():
        at = a[idx.rows, idx.cols]
        a_mean = np.bincount(idx.slot, weights=at, minlength=idx.n_slots) / np.maximum(idx.count, 1)
        a_c = at - a_mean[idx.slot]
        a_turn = a_mean[keep]
        nz_t = np.abs(o_turn) > 1e-6
        nz_d = dt & (np.abs(ot) > 1e-6)
        out[name] = {
            "turn": _moments(a_turn, o_turn),
            "turn_sign": np.array([np.sum(np.sign(a_turn[nz_t]) == np.sign(o_turn[nz_t])), nz_t.sum()], dtype=np.float64),
            "tok": _moments(at, ot),
            "within": _moments(a_c, o_c),
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
        rows.append({
            "estimator": name,
            "turn_corr": _corr_from_moments(s["turn"]),
            "turn_sign": s["turn_sign"][0] / s["turn_sign"][1] if s["turn_sign"][1] else math.nan,
            "tok_corr": _corr_from_moments(s["tok"]),
            "within_corr": _corr_from_moments(s["within"]) if s["within_max"] > 1e-9 else math.nan,
            "dec_sign": s["dec_sign"][0] / s["dec_sign"][1] if s["dec_sign"][1] else math.nan,
            "dec_mass": s["mass"][0] / s["mass"][1] if s["mass"][1] > 0 else math.nan,
        })
    return pd.DataFrame(rows, columns=["estimator", *ACCURACY_COLUMNS])


def credit_accuracy(batch, advantages) -> pd.DataFrame:
    """How right each estimator's credit is on ``batch``, against the oracle columns: one row per
    entry of ``advantages`` (``{name: (B, L)}``) with the :data:`ACCURACY_COLUMNS`, over all turns
    and action tokens of the batch (the definitions of ``benchmarks/credit_accuracy.py``)."""
    return finish_accuracy(accuracy_stats(batch, advantages))


def accuracy_reading(df: pd.DataFrame, values: str = "critic") -> str:
    """One line that reads an accuracy table: which estimator's token credit is closest to the
    oracle and which is farthest, with the turn-level picture when it differs."""
    d = df.dropna(subset=["tok_corr"])
    if d.empty:
        return "No estimator's token credit varies enough to correlate with the oracle."
    best = d.loc[d["tok_corr"].idxmax()]
    worst = d.loc[d["tok_corr"].idxmin()]
    text = (f"Token credit closest to the oracle: {best['estimator']} (correlation {best['tok_corr']:.2f}, "
            f"{best['dec_mass']:.0%} of its |A| on decisive tokens)")
    if worst["estimator"] != best["estimator"]:
        text += f"; farthest: {worst['estimator']} ({worst['tok_corr']:.2f})"
    dt = df.dropna(subset=["turn_corr"])
    if len(dt):
        bt = dt.loc[dt["turn_corr"].idxmax()]
        text += (f". Across turns {bt['estimator']} is best (turn correlation {bt['turn_corr']:.2f}, "
                 f"{bt['turn_sign']:.0%} of turn signs right)" if bt["estimator"] != best["estimator"] else
                 f". {best['estimator']} is also best across turns (turn correlation {bt['turn_corr']:.2f})")
    if values == "oracle":
        text += ". Values here are the oracle's own (values_source: oracle), so this is the best case for value-based estimators"
    return text + "."
