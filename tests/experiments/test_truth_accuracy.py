"""experiments/truth_accuracy.py (replication v3, E1 and E4): E4's rows by hand, the resumption
from OUT and from the archive, and the whole pipeline at its smoke size."""

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import mpo_viz as mv
from experiments import truth_accuracy as bench
from mpo_viz.advantages import compute
from mpo_viz.analysis import mc_accuracy
from mpo_viz.data.trajectory import TrajectoryBatch

HERE = Path(__file__).resolve().parents[2]


def _batch(rewards):
    """Rows of two 2-token turns, each followed by an observation token, with a Monte-Carlo truth."""
    rows = [
        {
            "traj_id": f"t{i}",
            "group_id": f"g{i // 2}",
            "prompt_ids": [1],
            "response_ids": [2] * 6,
            "loss_mask": [1, 1, 0, 1, 1, 0],
            "reward": r,
        }
        for i, r in enumerate(rewards)
    ]
    n = len(rewards)
    rng = np.random.default_rng(0)
    v = rng.uniform(0.2, 0.8, (n, 2))
    return TrajectoryBatch.from_rows(rows).with_turn_fields(
        mc_value=v.tolist(),
        mc_value_se=np.full((n, 2), 0.1).tolist(),
        mc_value_a=(v + rng.normal(0, 0.05, v.shape)).tolist(),
        mc_value_b=(v + rng.normal(0, 0.05, v.shape)).tolist(),
    )


def test_e4_rows_by_hand():
    b = _batch([1.0, 0.0, 1.0, 0.0])
    V = np.array(
        [[1, 0.5, 0, 0.6, 0.2, 0], [0, 0.5, 0, 0.2, 0.2, 0], [1, 0.5, 0, 0.6, 0.2, 0], [0, 0.5, 0, 0.2, 0.2, 0]]
    )
    rows = bench.e4_rows(b, V)
    assert [r["estimator"] for r in rows] == list(bench.E4_ESTIMATORS) == ["mpo", "turn_gae", "gae lam=1"]
    assert {(label, est) for label, est, opts in bench.ca.ESTIMATORS if label in bench.E4_ESTIMATORS and not opts} == {
        ("mpo", "mpo"),
        ("turn_gae", "turn_gae"),
        ("gae lam=1", "gae"),
    }
    # Monte-Carlo returns: the outcome on every action token; EV = 1 − Var(G − V) / Var(G)
    m = np.array([1, 1, 0, 1, 1, 0], bool)
    G = np.array([[1.0] * 4, [0.0] * 4] * 2)
    Va = V[:, m]
    assert rows[0]["heldout_ev"] == pytest.approx(1 - np.var(G - Va) / np.var(G))
    ts = [0, 2]  # the turn starts among the action tokens
    assert rows[0]["heldout_ev_turn_start"] == pytest.approx(1 - np.var(G[:, ts] - Va[:, ts]) / np.var(G[:, ts]))
    # across/within by hand: row 0 turn means .75, .4 and variances .0625, .04; row 1 .25, .2 and .0625, 0
    r0 = (0.175**2) / ((0.0625 + 0.04) / 2)
    r1 = (0.025**2) / (0.0625 / 2)
    assert all(r["values_ratio"] == pytest.approx(np.median([r0, r1, r0, r1])) for r in rows)
    # the accuracy columns: mc_accuracy of the estimators at their defaults with these values
    bv = b.with_token_fields(values=V.astype(np.float32))
    ref = mc_accuracy(
        bv,
        {
            "mpo": compute(bv, "mpo").advantages,
            "turn_gae": compute(bv, "turn_gae").advantages,
            "gae lam=1": compute(bv, "gae").advantages,
        },
    ).set_index("estimator")
    for r in rows:
        assert r["turn_corr"] == pytest.approx(ref.loc[r["estimator"], "turn_corr"], nan_ok=True)
        assert r["reliability"] == pytest.approx(ref.loc[r["estimator"], "reliability"], nan_ok=True)


def test_fit_one_passes_positions_and_gives_e1_rows_only_for_the_default(monkeypatch):
    """That a turn-start fit reads only turn starts is tests/train/test_critic.py's
    test_fit_at_turn_starts_reads_only_turn_start_positions; here: the benchmark asks for it."""
    import mpo_viz.train.critic_fit as cf

    seen = []
    real = cf.fit_values

    def spy(*a, **kw):
        seen.append(kw["positions"])
        return real(*a, **kw)

    monkeypatch.setattr(cf, "fit_values", spy)
    b = _batch([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    ts = bench.fit_one(Path("."), "start", b, "fresh", 1, 2, "turn_start")
    assert seen == ["turn_start"] and ts["e1"] == []
    assert {r["positions"] for r in ts["e4"]} == {"turn_start"} and len(ts["e4"]) == 3
    d = bench.fit_one(Path("."), "start", b, "fresh", 1, 2, "all")
    assert seen[-1] == "all" and {r["values"] for r in d["e1"]} == {"critic", "flattened"}
    assert d["e1"][0]["heldout_ev"] == pytest.approx(d["e4"][0]["heldout_ev"], abs=1e-5)


def _rows(name, trunk, seed, positions=None):
    key = {"snapshot": name, "trunk": trunk, "seed": seed}
    e4 = [
        {
            **key,
            "positions": positions,
            "estimator": e,
            "heldout_ev": 0.3,
            "heldout_ev_turn_start": 0.4,
            "turn_corr_dis": 0.1,
        }
        for e in ("mpo", "gae")
    ]
    return {
        "e4": e4,
        "e1": [{**key, "values": "critic", "estimator": "mpo", "turn_corr_dis": 0.2}] if positions == "all" else [],
    }


def test_resumption_skips_finished_fits_and_the_archive_restores_them(tmp_path, monkeypatch):
    out, archive = tmp_path / "out", tmp_path / "archive"
    out.mkdir()
    spec = dict(trunks=("fresh",), seeds=(0, 1), steps=2)
    done = [
        _rows("start", "fresh", 0, "all"),
        _rows("start", "fresh", 0, "turn_start"),
        _rows("start", "fresh", 1, "all"),
    ]
    pd.DataFrame(done[0]["e1"]).to_csv(out / "e1.csv", index=False)  # seed 1's E1 rows are missing
    pd.DataFrame([r for d in done for r in d["e4"]]).to_csv(out / "e4.csv", index=False)
    calls = []

    def fake(out_, name, batch, trunk, seed, steps, positions="all"):
        calls.append((trunk, seed, positions))
        return _rows(name, trunk, seed, positions)

    monkeypatch.setattr(bench, "fit_one", fake)
    assert bench.run_fits(out, "start", None, spec, archive) == 2
    assert calls == [("fresh", 1, "all"), ("fresh", 1, "turn_start")]
    e4 = pd.read_csv(out / "e4.csv")
    assert len(e4) == 8 and not e4.duplicated(["seed", "positions", "estimator"]).any()
    assert len(pd.read_csv(out / "e1.csv")) == 2
    assert bench.run_fits(out, "start", None, spec, archive) == 0 and len(calls) == 2
    # OUT's older fits go to the archive too; on a new machine every fit is restored and skipped
    bench.sync_rows(out, archive)
    assert len(list((archive / "e4").rglob("*.csv"))) == 4 and len(list((archive / "e1").rglob("*.csv"))) == 2
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    bench.sync_rows(fresh, archive)
    assert bench.run_fits(fresh, "start", None, spec, archive) == 0 and len(calls) == 2
    assert len(pd.read_csv(fresh / "e4.csv")) == 8 and len(pd.read_csv(fresh / "e1.csv")) == 2


def test_restoring_from_the_archive_skips_the_truth_and_keeps_no_weights(tmp_path, monkeypatch):
    out, archive = tmp_path / "out", tmp_path / "archive"
    b = _batch([1.0, 0.0])
    d = bench.snapshot_dir(out, "ppo@1")
    (d / "policy").mkdir(parents=True)
    (d / "policy" / "model.safetensors").write_bytes(b"weights")
    mv.save(b, d / "truth.parquet")
    (d / "snapshot.json").write_text("{}\n")
    bench.copy_truth(out, archive, "ppo@1")
    assert (archive / "snapshots" / "ppo_it1" / "truth.parquet").is_file()
    assert not list(archive.rglob("*.safetensors"))

    def never(*a, **kw):
        raise AssertionError("the truth was measured again")

    monkeypatch.setattr("mpo_viz.rollout.truth.mc_truth", never)
    monkeypatch.setattr(bench, "snapshot_policy", never)
    new = tmp_path / "new"
    got = bench.snapshot_truth(new, "ppo@1", 2, 2, False, archive)
    assert list(got.traj_ids) == ["t0", "t1"] and (bench.snapshot_dir(new, "ppo@1") / "truth.parquet").is_file()
    with pytest.raises(ValueError, match="expected 4 episodes of snapshot ppo@1, found 2"):
        bench.snapshot_truth(new, "ppo@1", 4, 2, False, archive)


def test_weights_digest_reads_tensors_not_headers(tmp_path):
    from safetensors.torch import save_file

    t = {"a": torch.arange(4, dtype=torch.float32), "b": torch.ones(2, 2)}
    for name, meta in (("x", {"format": "pt"}), ("y", {"format": "pt", "note": "other"})):
        (tmp_path / name).mkdir()
        save_file(t, str(tmp_path / name / "model.safetensors"), metadata=meta)
    assert bench.weights_sha256(tmp_path / "x") == bench.weights_sha256(tmp_path / "y")
    (tmp_path / "z").mkdir()
    save_file({**t, "b": torch.ones(2, 2) + 1e-7}, str(tmp_path / "z" / "model.safetensors"))
    assert bench.weights_sha256(tmp_path / "z") != bench.weights_sha256(tmp_path / "x")


def test_mean_ci_over_seeds_by_hand():
    m = bench.mean_ci(pd.DataFrame({"x": [0.2, 0.4]}), ["x"])
    assert m["seeds"] == 2 and m["x"] == pytest.approx(0.3)
    assert m["x_ci"] == pytest.approx(12.7062047 * np.std([0.2, 0.4], ddof=1) / np.sqrt(2))


@pytest.mark.slow
def test_quick_pipeline_writes_rows_resumes_and_restores(tmp_path, monkeypatch):
    out, archive, export = tmp_path / "out", tmp_path / "archive", tmp_path / "export"
    assert bench.main(["--quick", "--out", str(out), "--archive", str(archive)]) == 0
    e1, e4 = pd.read_csv(out / "e1.csv"), pd.read_csv(out / "e4.csv")
    assert set(e1.snapshot) == {"start", "ppo@1", "mpo@2"} and set(e1["values"]) == {"critic", "flattened", "expert"}
    assert len(e4) == 3 * 2 * 2 * 3 and set(e4.positions) == {"all", "turn_start"}
    assert {"heldout_ev", "heldout_ev_turn_start", "values_ratio", "turn_corr_dis", "reliability"} <= set(e4.columns)
    assert not list(archive.rglob("*.safetensors"))
    n1, n4 = len(e1), len(e4)
    assert bench.main(["--quick", "--out", str(out)]) == 0  # every fit done: nothing runs again
    assert len(pd.read_csv(out / "e1.csv")) == n1 and len(pd.read_csv(out / "e4.csv")) == n4
    # a new machine: the truth comes from the archive, one policy-trunk fit is left to run, so
    # mpo@2 is trained again; its weights must be bit-identical (checked against the archive too)
    calls = []
    monkeypatch.setattr("mpo_viz.rollout.truth.mc_truth", lambda *a, **k: calls.append(1))
    (archive / "e4" / "mpo_it2" / "policy-seed0-turn_start.csv").unlink()
    new = tmp_path / "new"
    assert bench.main(["--quick", "--out", str(new), "--archive", str(archive), "--export", str(export)]) == 0
    assert calls == []
    assert bench.weights_sha256(bench.snapshot_dir(new, "mpo@2")) == bench.weights_sha256(
        bench.snapshot_dir(out, "mpo@2")
    )
    cols = ["snapshot", "trunk", "seed", "positions", "estimator"]
    a = e4.sort_values(cols).reset_index(drop=True)
    b = pd.read_csv(new / "e4.csv").sort_values(cols).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b[a.columns])
    assert {p.name for p in export.iterdir()} == {"e1.csv", "e4.csv", "accuracy_vs_ev.png"}
    shutil.rmtree(new / "snapshots")
    assert bench.main(["--quick", "--out", str(new), "--report-only"]) == 0


def test_flattened_values_by_hand():
    b = TrajectoryBatch.from_rows(
        [
            {
                "traj_id": "a",
                "group_id": "g",
                "prompt_ids": [1],
                "response_ids": [2] * 5,
                "loss_mask": [1, 1, 0, 1, 1],
                "reward": 1.0,
            }
        ]
    )
    v = np.array([[0.1, 0.2, 0.9, 0.4, 0.5]])
    np.testing.assert_allclose(bench.flattened(b, v), [[0.1, 0.1, 0.9, 0.4, 0.4]])
