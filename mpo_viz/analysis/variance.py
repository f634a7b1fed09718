"""The across/within split of a per-token quantity (docs/concepts.md §7.8): do values (or
advantages) vary across turns more than within them?

:func:`variance_split` on tensors, :func:`value_variance` one row per trajectory of a batch,
:func:`variance_summary` the batch's statistics. Streamed in chunks, the per-trajectory tables of
the chunks merge (:func:`merge_variance`) and the summary is taken once at the end.
:func:`variance_split_reference` is the readable loop the vectorized split is tested against.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mpo_viz.analysis.arrays import prepare, scores, turn_index, turn_means
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = [
    "variance_split",
    "variance_split_reference",
    "value_variance",
    "advantage_variance",
    "variance_summary",
    "merge_variance",
]


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
    x, m, t = prepare(x, mask, turn_ids)
    B = x.shape[0]
    idx = turn_index(m, t)
    T = idx.n_slots
    xv = x[idx.rows, idx.cols]
    mk = turn_means(x, idx)  # (T,)
    dev2 = (xv - mk[idx.slot]) ** 2
    var_k = np.bincount(idx.slot, weights=dev2, minlength=T) / np.maximum(idx.count, 1)
    K = idx.n_turns.astype(np.float64)
    n = np.bincount(idx.rows, minlength=B).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_of_means = np.bincount(idx.turn_row, weights=mk, minlength=B) / K
        across = np.bincount(idx.turn_row, weights=(mk - mean_of_means[idx.turn_row]) ** 2, minlength=B) / K
        within = np.bincount(idx.turn_row, weights=var_k, minlength=B) / K
        m_all = np.bincount(idx.rows, weights=xv, minlength=B) / n
        across_w = np.bincount(idx.turn_row, weights=idx.count * (mk - m_all[idx.turn_row]) ** 2, minlength=B) / n
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


def variance_split_reference(x, mask, turn_ids=None) -> dict[str, np.ndarray]:
    """Reference loop for :func:`variance_split` (one trajectory, one turn at a time)."""
    x, m, t = prepare(x, mask, turn_ids)
    out: dict[str, list] = {k: [] for k in ("n_tokens", "n_turns", "across", "within", "ratio", "across_w", "within_w")}
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


def value_variance(batch: TrajectoryBatch, values=None, *, name: str = "values") -> pd.DataFrame:
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
            "reward": scores(batch),
            **{k: split[k] for k in ("n_turns", "n_tokens", "across", "within", "ratio", "across_w", "within_w")},
        }
    )
    df.attrs["quantity"] = name
    return df


def advantage_variance(batch: TrajectoryBatch, advantages, *, name: str = "advantages") -> pd.DataFrame:
    """The across/within split (docs/concepts.md §7.8) of an advantage tensor ``(B, L)``:
    :func:`value_variance` with ``values=``.

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


def merge_variance(acc: pd.DataFrame | None, new: pd.DataFrame) -> pd.DataFrame:
    """The rows of two :func:`value_variance` tables (chunks of one file) as one table."""
    return new if acc is None else pd.concat([acc, new], ignore_index=True)
