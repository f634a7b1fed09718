"""experiments/credit_accuracy.py --critic learned at a tiny size: the table, the CSV of every fit,
the t-intervals over critic seeds, scoring on held-out groups only, and a stopped run resuming."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import mpo_viz as mv
from experiments import credit_accuracy as bench

ROOT = Path(__file__).resolve().parents[2]

ARGS = [
    "--critic",
    "learned",
    "--envs",
    "search",
    "--sizes",
    "400",
    "--targets",
    "oracle",
    "--trunks",
    "fresh",
    "--seeds",
    "0",
    "1",
    "--budgets",
    "2",
    "4",
]


@pytest.fixture
def small_set(monkeypatch):
    """The shipped search set's first 40 episodes (10 groups of 4): a fit takes seconds."""
    batch = mv.load(ROOT / "trajectories" / "search.parquet")[:40]
    monkeypatch.setattr(bench, "expert_set", lambda env, size: batch)
    return batch


def test_learned_table_csv_and_intervals(small_set, tmp_path, capsys):
    csv = tmp_path / "fits.csv"
    assert bench.main([*ARGS, "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "== search: a critic fitted to expert episodes" in out
    assert "| 400 | oracle | fresh | 2 |" in out and "| 400 | oracle | fresh | best (" in out
    df = pd.read_csv(csv, dtype={"budget": str})
    n_est = len(bench.ESTIMATORS)
    assert len(df) == 2 * 3 * n_est  # 2 seeds × (budgets 2, 4 and best) × every estimator
    assert sorted(df.budget.unique()) == ["2", "4", "best"]
    assert set(df.seed) == {0, 1}
    # the summary: mean and the 95% t half-width over the two seeds, by hand
    summary = pd.read_csv(tmp_path / "fits_summary.csv", dtype={"budget": str})
    g = df[(df.budget == "4") & (df.estimator == "mpo")]
    s = summary[(summary.budget == "4") & (summary.estimator == "mpo")].iloc[0]
    v = g.turn_corr.to_numpy()
    assert s.turn_corr == pytest.approx(v.mean())
    assert s.turn_corr_ci == pytest.approx(stats.t.ppf(0.975, 1) * v.std(ddof=1) / math.sqrt(2))
    assert s.seeds == 2
    # every held-out EV is a number; a seed's held-out groups (hence the oracle's across/within ratio
    # on them) are the same at every budget
    assert np.isfinite(df.heldout_ev).all()
    assert (df.groupby("seed").oracle_ratio.nunique() == 1).all()


@pytest.mark.slow  # a fit of its own (the default suite has the table test)
def test_scores_only_held_out_groups(small_set, monkeypatch):
    seen = []
    real = bench.score_heldout

    def spy(batch, values, held):
        seen.append(np.asarray(held))
        return real(batch, values, held)

    monkeypatch.setattr(bench, "score_heldout", spy)
    bench.run_learned(["search"], [400], ["mc"], ["fresh"], [0], [2], log=lambda s: None)
    from mpo_viz.train.critic_fit import holdout_split

    groups = small_set.field("group_id")
    train, held = holdout_split(len(small_set), 0.2, 0, groups)
    assert all(np.array_equal(np.sort(h), np.sort(held)) for h in seen)
    assert not set(np.asarray(groups)[train]) & set(np.asarray(groups)[held])  # whole groups held out


@pytest.mark.slow  # three fits
def test_stopped_run_resumes_from_csv(small_set, tmp_path, monkeypatch, capsys):
    csv = tmp_path / "fits.csv"
    bench.main([*ARGS[:-5], "0", "--budgets", "2", "--csv", str(csv)])  # seed 0 only
    first = pd.read_csv(csv)
    calls = []
    real = bench.fit_and_score

    def counted(env, size, target, trunk, seed, *a, **k):
        calls.append(seed)
        return real(env, size, target, trunk, seed, *a, **k)

    monkeypatch.setattr(bench, "fit_and_score", counted)
    capsys.readouterr()
    bench.main([*ARGS[:-5], "0", "1", "--budgets", "2", "--csv", str(csv)])
    assert calls == [1]  # seed 0 was in the file
    assert "1 fits already there" in capsys.readouterr().out
    both = pd.read_csv(csv)
    assert len(both) == 2 * len(first)
    pd.testing.assert_frame_equal(both.iloc[: len(first)], first)


def test_centring_factor_by_hand():
    # one turn of 3 tokens and one of 1: j = [0, 1, 2 | 0], n = [3, 3, 3 | 1]
    ref = {"inv": np.array([0, 0, 0, 1]), "counts": np.array([3.0, 1.0])}
    lam = 0.5
    # intra: c_j = 1 − (1/n)·Σ_{j'≤j} λ^{j−j'}; 0 at each turn's last token
    np.testing.assert_allclose(
        bench.centring_factor(ref, "mpo", {"lam": lam}), [1 - 1 / 3, 1 - (1 + lam) / 3, 0.0, 0.0]
    )
    np.testing.assert_allclose(
        bench.centring_factor(ref, "mpo", {"lam": lam, "within": "local"}),
        [1 - 1 / 3, 1 - (1 + lam) / 3, 1 - (1 + lam + lam**2) / 3, 0.0],
    )
    np.testing.assert_allclose(bench.centring_factor(ref, "mpo", {"within": "td"}), [2 / 3, 2 / 3, 2 / 3, 0.0])
    np.testing.assert_allclose(bench.centring_factor(ref, "mpo", {"within": "baseline"}), 0.0)
    np.testing.assert_allclose(bench.centring_factor(ref, "gae", {}), 0.0)


def test_oracle_critic_slopes_follow_the_derivation(monkeypatch, capsys):
    # the shipped automation set (400 episodes) with its exact values as the critic: every estimator's
    # measured slope on decisive tokens is the derivation's (1 + β·c_t) within sampling error, centred
    # MPO over-credits, the uncentred baseline does not
    df = bench.run_calibration(["automation"], 400).set_index("estimator")
    assert (df["episodes"] == 400).all() and (df["decisive"] > 1000).all()
    np.testing.assert_allclose(df["dec_slope"], df["pred_dec"], atol=0.06)
    assert df.loc["mpo", "pred_dec"] > 1.3 and df.loc["mpo within=td", "pred_dec"] > 1.8
    assert abs(df.loc["mpo within=baseline", "dec_slope"] - 1.0) < 0.06
    np.testing.assert_allclose(df.loc[["mpo", "turn_gae", "mpo within=td"], "turn_slope"], 1.0, atol=0.02)
    assert bench.main(["--oracle-critic", "--episodes", "400"]) == 0
    out = capsys.readouterr().out
    assert "== automation: 400 expert episodes" in out and "pred_dec" in out and "mpo within=baseline" in out


def test_token_truth_validation_on_the_expert(capsys):
    """--truth mc-token --policy expert at a tiny size: the agreement with the exact oracle per rule and
    estimator, and the within-turn table with the oracle's values as the critic."""
    check, table = bench.expert_token_validation("search", episodes=8, m=8, seed=1)
    assert list(check.positions) == ["uncertain", "decisive", "uncertain"] and list(check.estimator) == [
        "pi",
        "pi",
        "plain",
    ]
    # the statistical check itself is tests/rollout/test_token_truth.py's (M = 32); here the columns are filled
    assert (check.decisive > 0).all() and ((check.z_lt_3 > 0) & (check.z_lt_3 <= 1)).all()
    assert (check.mean_err.abs() < 0.05).all()
    assert check.controls_zero.iloc[0] == 1.0 and check.controls_lt_3se.iloc[0] == 1.0  # π = 1 at filler: Â = 0
    t = table.set_index("estimator")
    assert t.loc["oracle (a*_t)", "tok_corr"] > 0.9 and t.loc["turn_gae", "within_corr"] == 0.0
    assert "flat credit" in t.loc["grpo", "within_note"]
