"""The statistics of the replication grids: paired t-tests with their intervals, Holm's
step-down correction, the power of a paired test at a Holm level, and small numeric helpers.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps


def finite_or_none(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def corr(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def paired_test(diff) -> dict:
    """Mean of the paired differences, its 95% t-interval and the two-sided paired t-test p-value
    (NaN with fewer than 2 pairs; p = 1 when every difference is 0)."""
    d = np.asarray(diff, float)
    n = len(d)
    if n < 2:
        m = float(d.mean()) if n else math.nan
        return {"mean_diff": m, "ci_low": math.nan, "ci_high": math.nan, "p_value": math.nan}
    m, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))
    if se == 0:
        return {"mean_diff": m, "ci_low": m, "ci_high": m, "p_value": 1.0 if m == 0 else 0.0}
    t = m / se
    q = float(sps.t.ppf(0.975, n - 1))
    return {"mean_diff": m, "ci_low": m - q * se, "ci_high": m + q * se, "p_value": float(2 * sps.t.sf(abs(t), n - 1))}


def power(sd: float, n: int, diff: float = 0.05, alpha: float = 0.025) -> float:
    """Power of a two-sided paired t-test at level ``alpha`` (α/2 = 0.025: Holm's first step over two)
    for a true mean difference ``diff``, with unit spread ``sd`` over ``n`` units (noncentral t;
    its normal limit where scipy's noncentral t fails far out in the tail). NaN without a spread."""
    if not (sd > 0 and n > 1):
        return math.nan
    q = float(sps.t.ppf(1 - alpha / 2, n - 1))
    nc = diff / (sd / math.sqrt(n))
    p = float(sps.nct.sf(q, n - 1, nc) + sps.nct.cdf(-q, n - 1, nc))
    if not math.isfinite(p):
        p = float(sps.norm.sf(q - nc) + sps.norm.cdf(-q - nc))
    return p


def holm(p_values) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and is not counted)."""
    p = np.asarray(p_values, float)
    ok = np.flatnonzero(np.isfinite(p))
    out = np.full(len(p), math.nan)
    m = len(ok)
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def ms_change(rs: list[dict]) -> tuple[float, float]:
    """Mean change of sampled success (final − start) and the half-width of its 95% t-interval."""
    t = paired_test([r["final_sampled"] - r["start_sampled"] for r in rs])
    return t["mean_diff"], (t["ci_high"] - t["mean_diff"]) if math.isfinite(t["ci_high"]) else math.nan


def paired_half(values) -> float:
    """Half-width of the 95% t-interval of a mean (NaN below 2 values)."""
    v = np.asarray(values, float)
    if len(v) < 2:
        return math.nan
    return float(sps.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def effect_reading(r: dict) -> str:
    """The words of the rule fixed in advance for an effect against a baseline (E5, E6's MPO-token
    vs PPO): *helps* / *hurts* (Holm p < 0.05), *makes no difference larger than 0.02* (the 95%
    interval inside ±0.02), else *cannot be told at this power*; *not measured* without a p."""
    p, d, lo, hi = r["p_holm"], r["mean_diff"], r["ci_low"], r["ci_high"]
    if not math.isfinite(p):
        return "not measured"
    if p < 0.05:
        return "helps" if d > 0 else "hurts"
    if -0.02 < lo and hi < 0.02:
        return "makes no difference larger than 0.02"
    return f"cannot be told at this power (the 95% interval is {lo:+.3f} to {hi:+.3f})"


def ranking_reading(c: dict) -> str:
    """E6's rule fixed in advance for ``bilevel_gae`` - ``ppo``: the ranking *replicates* (Holm
    p < 0.05, positive), *is reversed* (Holm p < 0.05, negative), or *cannot be told at this power*;
    *not measured* without a p."""
    if not math.isfinite(c["p_holm"]):
        return "not measured"
    if c["p_holm"] < 0.05:
        return "replicates" if c["mean_diff"] > 0 else "is reversed"
    return "cannot be told at this power"
