"""E5's runner (experiments/within_turn.py): the scoring set, the units, the tests and their reading,
the power of the first snapshot's spread, and the whole pipeline at its smoke size."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from experiments import stats
from experiments import within_turn as wt
from mpo_viz.data.synthetic import make_batch


def test_the_scoring_set_is_the_last_groups_in_order_of_appearance():
    batch = make_batch(12, seed=0, group_size=3)  # groups in rows 0-2, 3-5, 6-8, 9-11
    labels = [str(g) for g in batch.field("group_id")]
    fit, scoring = wt.scoring_split(batch, 2)
    assert scoring.tolist() == [6, 7, 8, 9, 10, 11] and fit.tolist() == [0, 1, 2, 3, 4, 5]
    assert not {labels[i] for i in fit} & {labels[i] for i in scoring}
    with pytest.raises(ValueError, match="expected more than 4 task groups"):
        wt.scoring_split(batch, 4)


def _fits(diffs: dict[str, list[float]], measure="tok_corr_dis", snapshots=("s1", "s2", "s3"), seeds=(0, 1)):
    """Fit rows whose per-unit mean over the two trunks is 0.3 for turn_gae and 0.3 + d for the others."""
    rows = []
    k = 0
    for snap in snapshots:
        for seed in seeds:
            for trunk, jitter in (("fresh", -0.01), ("policy", +0.01)):
                base = {"snapshot": snap, "seed": seed, "trunk": trunk, "values": "critic"}
                rows.append({**base, "estimator": "turn_gae", measure: 0.3 + jitter, "within_corr": 0.0})
                for est, ds in diffs.items():
                    rows.append({**base, "estimator": est, measure: 0.3 + ds[k] + jitter, "within_corr": ds[k]})
            k += 1
    return pd.DataFrame(rows)


def test_units_average_the_trunks_and_the_tests_are_paired_with_holm():
    d_tg = [0.05, 0.07, 0.04, 0.06, 0.05, 0.03]
    d_b = [0.0, 0.01, -0.01, 0.0, 0.01, -0.01]
    df = _fits({"mpo": d_tg, "mpo_baseline": list(np.subtract(d_tg, d_b))})
    u = wt.units(df, "tok_corr_dis")
    assert len(u) == 6 * 3 and np.allclose(u[u.estimator == "turn_gae"].tok_corr_dis, 0.3)
    comps = wt.comparisons(df)
    first, second, within = comps
    d = np.array(d_tg)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(6))
    from scipy import stats as sps

    p = 2 * sps.t.sf(abs(t), 5)
    assert first["units"] == 6 and first["mean_diff"] == pytest.approx(d.mean())
    assert first["p_value"] == pytest.approx(p)
    assert first["snapshot_mean_diff"] == pytest.approx(d.mean()) and first["snapshots"] == 3
    assert second["mean_diff"] == pytest.approx(np.mean(d_b), abs=1e-12)
    ps = sorted([first["p_value"], second["p_value"]])
    assert min(first["p_holm"], second["p_holm"]) == pytest.approx(min(1, 2 * ps[0]))
    assert first["reading"] == "helps" and first["measure"] == "tok_corr_dis"
    assert within["units"] == 6 and within["mean_diff"] == pytest.approx(d.mean())


def test_a_unit_with_one_trunk_so_far_is_left_out():
    df = _fits({"mpo": [0.05] * 6, "mpo_baseline": [0.0] * 6})
    partial = df[~((df.snapshot == "s3") & (df.seed == 1) & (df.trunk == "policy"))]
    u = wt.units(partial, "tok_corr_dis")
    assert len(u) == 5 * 3 and not ((u.snapshot == "s3") & (u.seed == 1)).any()
    assert wt.comparisons(partial)[0]["units"] == 5


def test_the_unfloored_measure_is_used_when_any_primary_value_is_withheld():
    df = _fits({"mpo": [0.05] * 6, "mpo_baseline": [0.0] * 6})
    df["tok_corr_dis_unfloored"] = df["tok_corr_dis"]
    assert wt.measure_of(df) == "tok_corr_dis"
    df.loc[0, "tok_corr_dis"] = np.nan
    assert wt.measure_of(df) == "tok_corr_dis_unfloored"


def test_the_reading_rule():
    assert stats.effect_reading({"p_holm": 0.01, "mean_diff": 0.03, "ci_low": 0.01, "ci_high": 0.05}) == "helps"
    assert stats.effect_reading({"p_holm": 0.01, "mean_diff": -0.03, "ci_low": -0.05, "ci_high": -0.01}) == "hurts"
    no = {"p_holm": 0.4, "mean_diff": 0.001, "ci_low": -0.015, "ci_high": 0.017}
    assert stats.effect_reading(no) == "makes no difference larger than 0.02"
    wide = {"p_holm": 0.4, "mean_diff": 0.01, "ci_low": -0.03, "ci_high": 0.05}
    assert stats.effect_reading(wide).startswith("cannot be told at this power (the 95% interval is -0.030 to +0.050)")
    assert stats.effect_reading({"p_holm": math.nan, "mean_diff": 0.0, "ci_low": 0.0, "ci_high": 0.0}) == "not measured"


def test_validation_passes_only_when_both_rules_agree():
    rows = pd.DataFrame(
        [
            {"positions": "uncertain", "estimator": "pi", "z_lt_3": 0.972, "controls_lt_3se": 1.0},
            {"positions": "decisive", "estimator": "pi", "z_lt_3": 0.96, "controls_lt_3se": 1.0},
            {"positions": "uncertain", "estimator": "plain", "z_lt_3": 0.5, "controls_lt_3se": 0.9},
        ]
    )
    assert wt.validation_passed(rows)
    rows.loc[1, "z_lt_3"] = 0.94
    assert not wt.validation_passed(rows)
    assert not wt.validation_passed(rows.iloc[:1])


@pytest.mark.slow
def test_the_quick_pipeline_measures_scores_resumes_and_reports(tmp_path):
    """The smoke size on the shipped start: its token truth and two fits written, every estimator
    scored with both values; flat estimators' within-turn part is 0 by construction; a second run
    measures nothing again; the report rebuilds the tables from the archive."""
    out, archive = tmp_path / "out", tmp_path / "records"
    assert wt.main(["--quick", "--out", str(out), "--archive", str(archive)]) == 0
    tok = archive / "snapshots" / "start" / "truth_tokens.parquet"
    fits = sorted((archive / "fits" / "start").glob("*.csv"))
    assert tok.is_file() and [f.name for f in fits] == ["fresh-seed0.csv", "policy-seed0.csv"]
    meta = json.loads((tok.parent / "truth_tokens.json").read_text())
    assert meta["episodes"] == 8 and meta["m"] == 2 and meta["measured"] > 0
    df = pd.read_csv(fits[0])
    labels = [e for e, _, _ in wt.ESTIMATORS]
    assert sorted(df.estimator.unique()) == sorted(labels) and set(df["values"]) == {"critic", "flattened"}
    flat = df[(df["values"] == "flattened") & df.estimator.isin(["mpo", "mpo_baseline", "turn_gae"])]
    assert np.allclose(flat.within_corr.fillna(0), 0.0)
    # with flattened values MPO's centred part and the baseline's are 0: both equal turn GAE
    assert np.allclose(flat.tok_corr.to_numpy(), flat.tok_corr.iloc[0])
    stamp = tok.stat().st_mtime_ns, fits[0].stat().st_mtime_ns
    assert wt.main(["--quick", "--out", str(out), "--archive", str(archive)]) == 0
    assert (tok.stat().st_mtime_ns, fits[0].stat().st_mtime_ns) == stamp
    comps = [json.loads(x) for x in (archive / "comparisons.jsonl").read_text().splitlines()]
    assert [c["comparison"] for c in comps][:2] == ["mpo - turn_gae", "mpo - mpo_baseline"]
    assert "## Means over fits" in (archive / "tables.md").read_text()
    assert (archive / "figures" / "within_turn.png").stat().st_size > 1000


def test_e6s_ranking_reading_follows_its_rule():
    """bilevel_gae - ppo: replicates / is reversed only past Holm, else cannot be told; no p: not measured."""
    assert stats.ranking_reading({"p_holm": 0.01, "mean_diff": 0.03}) == "replicates"
    assert stats.ranking_reading({"p_holm": 0.04, "mean_diff": -0.02}) == "is reversed"
    assert stats.ranking_reading({"p_holm": 0.05, "mean_diff": 0.03}) == "cannot be told at this power"
    assert stats.ranking_reading({"p_holm": math.nan, "mean_diff": 0.0}) == "not measured"
