"""benchmarks/truth.py runs end to end on a small cell and reports consistent columns."""

from pathlib import Path

import pytest

from mpo_viz import models

HERE = Path(__file__).resolve().parents[2]


@pytest.mark.usefixtures("one_thread")
def test_one_small_cell(load_script):
    bench = load_script(HERE / "benchmarks" / "truth.py", "bench_truth")
    policy, _ = models.load(bench.START)
    r = bench.one_cell(policy, (3, 3), episodes=2, m=2, batch_size=8, repeats=1, seed=0)
    assert r["continuations"] == 2 * r["boundaries"] > 0 and r["tokens"] > 0
    for k in ("a_s_per_ep", "b_s_per_ep", "c_s_per_ep"):
        assert r[k] > 0
    assert r["a_over_c"] == pytest.approx(r["a_s_per_ep"] / r["c_s_per_ep"])


@pytest.mark.usefixtures("one_thread")
def test_one_small_token_cell(load_script):
    bench = load_script(HERE / "benchmarks" / "truth.py", "bench_truth_tokens")
    policy, _ = models.load(bench.START)
    r = bench.token_cell(policy, episodes=1, m=2, batch_size=8, repeats=1, seed=0)
    assert r["positions"] > 0 and r["continuations"] == 4 * r["positions"] and r["tokens"] > 0
    for k in ("a_s_per_token", "b_s_per_token", "c_s_per_token"):
        assert r[k] > 0
    assert r["a_over_c"] == pytest.approx(r["a_s_per_token"] / r["c_s_per_token"])
    assert r["snapshot_min"] == pytest.approx(64 * r["per_episode"] * r["a_s_per_token"] / 60)
