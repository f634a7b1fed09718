"""Success of a policy's samples: pass@k."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["pass_at_k"]


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
