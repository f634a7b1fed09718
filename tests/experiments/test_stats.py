"""The replication grids' statistics (experiments/stats.py): the paired test, Holm and the power."""

import math

import numpy as np
import pytest

from experiments.stats import holm, paired_test, power


def test_paired_test_by_hand():
    d = np.array([0.01, 0.03, 0.02, 0.04])
    m, se = 0.025, np.std(d, ddof=1) / 2
    r = paired_test(d)
    from scipy import stats as sps

    assert r["mean_diff"] == pytest.approx(m)
    assert r["ci_low"] == pytest.approx(m - sps.t.ppf(0.975, 3) * se)
    assert r["p_value"] == pytest.approx(2 * sps.t.sf(m / se, 3))
    assert math.isnan(paired_test([0.1])["p_value"])


def test_holm_by_hand():
    # sorted p 0.01, 0.02, 0.04 (and a NaN not counted): 3·0.01, max(0.03, 2·0.02), max(0.04, 0.04)
    assert holm([0.04, 0.01, math.nan, 0.02]) == pytest.approx([0.04, 0.03, math.nan, 0.04], nan_ok=True)


def test_power_against_simulation():
    """The noncentral-t power of a two-sided paired t-test at α/2 = 0.025 against the rejection rate of
    simulated units (20,000 draws, n = 15, true difference 0.05, unit spread 0.08)."""
    from scipy import stats as sps

    rng = np.random.default_rng(0)
    d = rng.normal(0.05, 0.08, size=(20_000, 15))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(15))
    sim = np.mean(np.abs(t) > sps.t.ppf(1 - 0.025 / 2, 14))
    assert power(0.08, 15) == pytest.approx(sim, abs=0.01)
    assert 0.4 < power(0.08, 15) < 0.7
    assert math.isnan(power(0.0, 15))


def test_power_far_in_the_tail_is_finite_monotone_and_reaches_one():
    """scipy's noncentral t gives NaN far out in the tail (unit spreads of a few thousandths over 15
    units for 0.05, as E5's first snapshot had): the normal limit takes over there, so the power stays
    finite and rises monotonically to 1 as the spread shrinks."""
    sds = np.geomspace(0.2, 0.002, 60)
    p = np.array([power(sd, 15) for sd in sds])
    assert np.all(np.isfinite(p)) and np.all(np.diff(p) >= -1e-7)
    assert p[-1] == pytest.approx(1.0) and p[0] < 0.2
