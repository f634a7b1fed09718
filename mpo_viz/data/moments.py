"""Mergeable moments: statistics of data seen in chunks, equal to those of the whole.

:class:`Moments` holds ``n``, the mean and ``M2 = Σ (x − mean)²`` of a series; two are merged with
Chan et al.'s pairwise update, so a file streamed chunk by chunk (the report) and a minibatch cut
into micro-batches (the value loss) give the numbers of the whole, two-pass exact within a chunk.
:class:`ExplainedVariance` is the one owner of the critic's explained variance
``1 − Var(G − V) / Var(G)`` over action tokens: the value loss's ``vf_explained_var``, the trainer's
``critic_explained_var``, the report's summary and :func:`mpo_viz.analysis.explained_variance` all
finish one. :func:`pair_sums` / :func:`correlation` are the raw sums of a Pearson correlation
(estimator comparison, accuracy against the oracle); :func:`slope` reads the same sums as a
least-squares calibration slope.

Inputs are numpy arrays or torch tensors (read as float64 numpy on the CPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Moments", "ExplainedVariance", "pair_sums", "correlation", "slope", "as_float64"]


def as_float64(x) -> np.ndarray:
    """A torch tensor (detached, on the CPU) or array-like as a float64 numpy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


@dataclass(frozen=True)
class Moments:
    """Count, mean and ``M2 = Σ (x − mean)²`` of a series (``n = 0``: mean and M2 are 0)."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @classmethod
    def of(cls, x) -> Moments:
        """The moments of ``x`` (any shape, read as float64), two-pass."""
        a = as_float64(x).ravel()
        if not a.size:
            return cls()
        m = float(a.mean())
        return cls(int(a.size), m, float(((a - m) ** 2).sum()))

    def merge(self, other: Moments) -> Moments:
        """The moments of both series together (Chan et al.)."""
        if not other.n:
            return self
        if not self.n:
            return other
        n = self.n + other.n
        delta = other.mean - self.mean
        return Moments(n, self.mean + delta * other.n / n, self.m2 + other.m2 + delta * delta * self.n * other.n / n)

    @property
    def var(self) -> float:
        """The population variance ``M2 / n`` (NaN for an empty series)."""
        return self.m2 / self.n if self.n else math.nan

    @property
    def std(self) -> float:
        return math.sqrt(self.var) if self.n else math.nan

    @property
    def mean_or_nan(self) -> float:
        return self.mean if self.n else math.nan

    @property
    def mean_square(self) -> float:
        """``mean x² = Var + mean²`` (NaN for an empty series)."""
        return self.var + self.mean * self.mean if self.n else math.nan


@dataclass(frozen=True)
class ExplainedVariance:
    """The mergeable statistics of the explained variance of values V against returns G over the
    action tokens: the moments of G and of the error ``D = G − V``.

    ``ExplainedVariance.of(returns, values, mask)`` for one batch (``(B, L)`` each, the mask 0/1),
    ``a.merge(b)`` for two, then :attr:`value` ``= 1 − Var(D) / Var(G)`` (population variances;
    NaN when Var(G) = 0 or there is no action token: 1 perfect, 0 no better than the mean, < 0
    worse), :attr:`mse` ``= mean D²``, :attr:`bias` ``= mean (V − G)`` (positive: optimistic).
    """

    returns: Moments = Moments()
    error: Moments = Moments()

    @classmethod
    def of(cls, returns, values, mask) -> ExplainedVariance:
        m = as_float64(mask) != 0
        g = as_float64(returns)[m]
        return cls(Moments.of(g), Moments.of(g - as_float64(values)[m]))

    def merge(self, other: ExplainedVariance) -> ExplainedVariance:
        return ExplainedVariance(self.returns.merge(other.returns), self.error.merge(other.error))

    @property
    def n(self) -> int:
        return self.returns.n

    @property
    def value(self) -> float:
        g, d = self.returns, self.error
        return 1.0 - d.m2 / g.m2 if g.n and g.m2 > 0 else math.nan

    @property
    def mse(self) -> float:
        return self.error.mean_square

    @property
    def bias(self) -> float:
        return -self.error.mean if self.n else math.nan


def pair_sums(x, y) -> np.ndarray:
    """``[n, Σx, Σy, Σx², Σy², Σxy]`` of two series (about a shift of 0: the values are O(1)
    advantages); sums of several chunks add up, :func:`correlation` reads them."""
    x, y = as_float64(x), as_float64(y)
    return np.array([x.size, x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum()], dtype=np.float64)


def correlation(sums) -> float:
    """The Pearson correlation from :func:`pair_sums` (NaN for fewer than 2 points or a constant
    series; clipped to [−1, 1])."""
    n, sx, sy, sxx, syy, sxy = sums
    if n < 2:
        return math.nan
    cov = sxy - sx * sy / n
    vx, vy = sxx - sx * sx / n, syy - sy * sy / n
    # guard against cancellation leaving a tiny negative / zero variance for a constant series
    tol = 1e-12 * max(sxx, syy, 1e-300)
    if vx <= tol or vy <= tol:
        return math.nan
    return float(max(-1.0, min(1.0, cov / math.sqrt(vx * vy))))


def slope(sums) -> float:
    """The least-squares slope (with intercept) of the first series regressed on the second, from
    :func:`pair_sums` ``(x, y)``: ``b = Cov(x, y) / Var(y)`` minimizing ``Σ (x − a − b·y)²``.

    With ``x`` an estimate and ``y`` the truth it estimates, 1 means calibrated (a unit of true
    credit moves the estimate by one unit), > 1 over-credits, < 1 shrinks. NaN for fewer than 2
    points or a constant ``y``.
    """
    n, sx, sy, sxx, syy, sxy = sums
    if n < 2:
        return math.nan
    vy = syy - sy * sy / n
    if vy <= 1e-12 * max(syy, 1e-300):
        return math.nan
    return float((sxy - sx * sy / n) / vy)
