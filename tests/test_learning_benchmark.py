"""benchmarks/learning.py: the grid's plan and statistics, and a tiny smoke run of the whole pipeline
(SFT start, critic warm-up, two methods, results, tables, figures, resume)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def learning(load_script):
    return load_script(REPO / "benchmarks" / "learning.py", "learning_benchmark")


def test_plan_is_seed_major_and_complete(learning):
    runs = learning.plan("small")
    seeds = [s for s, _, _ in runs]
    assert seeds == sorted(seeds)  # a partial grid has whole seeds
    per_seed = [(c.name, m) for s, c, m in runs if s == 0]
    assert ("search", "grpo") in per_seed and ("automation", "sao") in per_seed
    assert {m for c, m in per_seed if c.endswith("-g1")} == {"mpo", "ppo"}  # G = 1: GRPO is undefined
    assert len(runs) == len(set((s, c.name, m) for s, c, m in runs))
    assert len(learning.SIZES["small"]["seeds"]) >= 5
    full = {c.name for _, c, _ in learning.plan("full")}
    assert {"automation-h3", "automation-h12", "automation-slip0", "automation-slip0.3"} <= full


def test_every_method_config_is_valid(learning, tmp_path):
    for name in learning.CELLS:
        cell = learning.CELLS[name]
        for m in cell.methods:
            cfg = learning.run_config("small", cell, m, 0, tmp_path)
            assert cfg.episodes % cfg.group_size == 0
            assert cfg.sft_steps == 0 and cfg.model_dir == str(tmp_path)
            if cfg.uses_critic:
                assert cfg.critic_warmup_steps == 0  # the shared start's critic
    vapo = learning.run_config("small", learning.CELLS["search"], "vapo", 0, tmp_path)
    assert vapo.loss_options["clip_high"] == 0.28


def test_statistics(learning):
    assert learning.iqm([0.0, 1.0, 2.0, 3.0, 100.0]) == pytest.approx(2.0)  # 5 // 4 = 1 cut per end
    assert learning.iqm([1.0, 2.0, 3.0, 4.0]) == pytest.approx(2.5)
    assert math.isnan(learning.iqm([]))
    lo, hi = learning.bootstrap_ci([0.2, 0.4, 0.6, 0.8, 1.0])
    assert lo < 0.6 < hi and 0.2 <= lo and hi <= 1.0
    assert learning.bootstrap_ci([0.5]) == (0.5, 0.5)
    # the bootstrap is seeded: the same CI every time
    assert learning.bootstrap_ci([0.1, 0.9, 0.3]) == learning.bootstrap_ci([0.1, 0.9, 0.3])
    rows = [{"iteration": 1, "eval_success": 0.3, "env_steps": 10.0}, {"iteration": 2, "eval_success": 0.6, "env_steps": 25.0},
            {"iteration": 3, "eval_success": 0.4, "env_steps": 40.0}]
    assert learning._first_reach(rows, "env_steps", 0.5) == 25.0
    assert math.isnan(learning._first_reach(rows, "env_steps", 0.8))


def test_tiny_grid_runs_reports_and_resumes(learning, tmp_path):
    out = tmp_path / "grid"
    assert learning.main(["--size", "tiny", "--out", str(out), "--threads", "1"]) == 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rows} == {"mpo", "grpo"}
    assert all(0.0 <= r["eval_success"] <= 1.0 for r in rows)
    mpo = [r for r in rows if r["method"] == "mpo"]
    trained = [r for r in mpo if r["iteration"] > 0]  # the evaluation before RL has no trajectories
    assert trained and all(np.isfinite(r["credit_token_corr"]) or math.isnan(r["credit_token_corr"]) for r in trained)
    assert mpo[-1]["critic_explained_var"] is not None  # a critic method logs its critic
    # each run's curve starts with the evaluation before RL, at 0 environment steps
    first = {r["method"]: r for r in sorted(rows, key=lambda r: -r["iteration"])}
    assert all(r["iteration"] == 0 and r["env_steps"] == 0.0 and r["episodes"] == 0 for r in first.values())
    assert all(r["iteration"] == 1 and r["env_steps"] > 0 for r in rows if r["iteration"] != 0)
    summary = [json.loads(x) for x in (out / "summary.jsonl").read_text().splitlines()]
    assert {(s["method"], s["seeds_done"]) for s in summary} == {("mpo", 1), ("grpo", 1)}
    assert "| automation | mpo | 1/1 |" in (out / "tables.md").read_text()
    assert (out / "figures" / "learning_tiny_automation.png").stat().st_size > 1000
    # both runs started from the same model folder
    starts = {json.loads((d / "config.json").read_text())["model_dir"] for d in (out / "runs" / "automation").glob("*/seed=0")}
    assert len(starts) == 1
    # a second call finds every run done and runs nothing new
    before = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.jsonl")}
    assert learning.main(["--size", "tiny", "--out", str(out)]) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.jsonl")} == before
