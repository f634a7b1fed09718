"""experiments/replication.py: the v2 grid's plan, configs and statistics, and a tiny smoke run of the
whole pipeline (shared warm-up, three arms, records, tables, figures, resume)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from experiments import grids, replication, runner, stats
from experiments import report as records
from mpo_viz.envs import make_env

REPO = Path(__file__).resolve().parents[2]


def test_plan_is_cell_then_seed_major_and_complete():
    runs = grids.plan("v2")
    assert len(runs) == 2 * 7 * 6 and len(set(runs)) == len(runs)
    assert [c for c, _, _ in runs] == sorted(c for c, _, _ in runs)  # the 3-4 cell first
    first = [s for c, s, _ in runs if c == "automation-d3-4"]
    assert first == sorted(first)  # a partial cell has whole seeds
    assert {a for _, _, a in runs} == {"grpo", "ppo", "turn_gae", "mpo_token", "mpo", "mpo_bare", "mpo_oracle"}
    assert grids.plan("v2", seeds=[1, 3]) == [r for r in runs if r[1] in (1, 3)]
    assert grids.plan("v2", seeds=[2], arms=["ppo", "grpo"]) == [
        r for r in runs if r[1] == 2 and r[2] in ("ppo", "grpo")
    ]
    assert [a for _, _, a in grids.plan("v2", seeds=[0], arms=["ppo", "grpo"])] == ["grpo", "ppo"] * 2  # grid order
    # v3 E2's recorded deviation: mpo_mc (= turn_gae_mc by construction) runs on seeds 0 and 1 only
    e2 = grids.plan("v3-e2")
    assert len(e2) == 6 * 4 + 2 and sorted(s for _, s, a in e2 if a == "mpo_mc") == [0, 1]
    assert {a for _, s, a in e2 if s == 5} == {"grpo", "ppo", "turn_gae", "turn_gae_mc"}


def test_arm_configs(tmp_path):
    s = grids.SIZES["v2"]
    assert s["iterations"] >= 20 and s["episodes"] >= 32 and len(s["seeds"]) >= 6 and s["eval_episodes"] >= 128
    cfgs = {a: runner.run_config("v2", "automation-d3-4", a, 3, tmp_path) for a in s["arms"]}
    for a, cfg in cfgs.items():  # equal budgets and one evaluation set for every arm of a seed
        assert (cfg.iterations, cfg.episodes, cfg.group_size, cfg.epochs, cfg.minibatches, cfg.policy_lr) == (
            20,
            32,
            4,
            2,
            4,
            1e-4,
        ), a
        assert cfg.eval_key == 3 and cfg.eval_episodes == 128 and cfg.difficulty == [3, 4] and cfg.sft_steps == 0
    learned = [a for a, c in cfgs.items() if c.learns_critic]
    assert sorted(learned) == ["mpo", "mpo_bare", "mpo_token", "ppo", "turn_gae"]
    for a in learned:  # the shared warm-up folder, not warmed again, 4 critic epochs, one critic target
        assert cfgs[a].model_dir == str(tmp_path) and cfgs[a].critic_warmup_steps == 0 and cfgs[a].critic_epochs == 4
        assert cfgs[a].critic_option("value_target") == "mc"
        as_v2 = runner.run_config("v2", "automation-d3-4", a, 3, tmp_path, value_target="estimator")
        assert as_v2.critic_option("value_target") == "estimator" and as_v2.differences(cfgs[a]) == [
            "value_target: 'estimator' != 'mc'"
        ]
    assert cfgs["grpo"].model_dir == str(grids.START) and not cfgs["grpo"].uses_critic
    assert cfgs["mpo_oracle"].critic == "expert" and cfgs["mpo_oracle"].model_dir == str(grids.START)
    assert cfgs["mpo_bare"].loss_options == {"token_clip": None} and cfgs["mpo"].loss_options == {}
    assert (cfgs["turn_gae"].estimator, cfgs["turn_gae"].loss) == ("turn_gae", "token_ppo")
    warm = runner.warmup_config("v2", "automation-d3-4", 3)
    assert (
        warm.critic_warmup_episodes,
        warm.critic_warmup_steps,
        warm.critic_option("critic_warmup_lr"),
        warm.critic_option("critic_warmup_ev"),
    ) == (512, 256, 1e-3, 0.2)


def test_sao_arm_pairs_the_sao_loss_with_its_estimator(tmp_path):
    # SAO's estimator: token GAE with λ = 1 − 1/(1.5·ℓ) (lam_rule="vapo", alpha=1.5)
    cfg = runner.run_config("v2", "automation-d3-4", "sao", 3, tmp_path)
    assert (cfg.estimator, cfg.loss) == ("gae", "sao")
    assert cfg.estimator_options == {"lam_rule": "vapo", "alpha": 1.5}


def test_paired_t_test_by_hand():
    # differences 0.1, 0.2, 0.3: mean 0.2, sd 0.1, se 0.1/√3, t = 2√3 ≈ 3.4641 with 2 df;
    # two-sided p = 1 − t/√(t² + 2) for 2 df (closed form) = 1 − 3.4641/3.7417 = 0.07418
    r = stats.paired_test([0.1, 0.2, 0.3])
    assert r["mean_diff"] == pytest.approx(0.2)
    t = 2 * math.sqrt(3)
    assert r["p_value"] == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-9)
    q = 4.302652729911275  # t_{0.975, 2}
    assert r["ci_low"] == pytest.approx(0.2 - q * 0.1 / math.sqrt(3)) and r["ci_high"] == pytest.approx(
        0.2 + q * 0.1 / math.sqrt(3)
    )
    assert stats.paired_test([0.1, 0.1])["p_value"] == 0.0  # no spread, a non-zero mean
    assert stats.paired_test([0.0, 0.0])["p_value"] == 1.0
    assert math.isnan(stats.paired_test([0.3])["p_value"])


def test_holm_by_hand():
    # p sorted 0.01, 0.02, 0.04, 0.30 with m = 4: 0.04, 0.06, 0.08, 0.30 (monotone)
    assert stats.holm([0.04, 0.01, 0.30, 0.02]) == pytest.approx([0.08, 0.04, 0.30, 0.06])
    # monotonicity carries forward: 0.01·3 = 0.03, then 0.011·2 = 0.022 -> 0.03, then 0.5
    assert stats.holm([0.01, 0.011, 0.5]) == pytest.approx([0.03, 0.03, 0.5])
    out = stats.holm([0.02, float("nan"), 0.01])  # NaN is neither counted nor adjusted
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.02)


def test_collapse_rule():
    recs = [{"phase": "rl", "iteration": i, "success": s} for i, s in enumerate([0.5, 0.0, 0.3, 0.4, 0.01, 0.4], 1)]
    assert records.collapsed(recs)  # 0.01 at iteration 5, after the 4th
    recs[4]["success"] = 0.2
    assert not records.collapsed(recs)  # 0.0 at iteration 2 does not count: the first 4 are free
    recs.append({"phase": "rl", "iteration": 7, "success": 0.04})
    assert records.collapsed(recs)


@pytest.mark.experiment
def test_tiny_grid_runs_reports_and_resumes(tmp_path):
    out, archive = tmp_path / "grid", tmp_path / "archive"
    assert replication.main(["--size", "tiny", "--out", str(out), "--archive", str(archive)]) == 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rows} == {"mpo", "grpo", "mpo_oracle"}
    for r in rows:
        for k in (
            "cell",
            "method",
            "seed",
            "iteration",
            "sampled_success",
            "greedy_success",
            "n_eval_tasks",
            "eval_seed",
            "critic_explained_var",
            "values_across_within_ratio",
            "collapsed",
        ):
            assert k in r, k
        assert r["n_eval_tasks"] == 8 and r["eval_seed"] == 0
        assert 0.0 <= r["sampled_success"] <= 1.0 and 0.0 <= r["greedy_success"] <= 1.0
    # every arm starts from the same policy on the same tasks: one start, measured once per run
    starts = {(r["sampled_success"], r["greedy_success"]) for r in rows if r["iteration"] == 0}
    assert len(starts) == 1
    # the critic arms log the explained variance of the values they read, the oracle arm too
    for arm in ("mpo", "mpo_oracle"):
        assert any(r["critic_explained_var"] is not None for r in rows if r["method"] == arm and r["iteration"] > 0)
    assert all(r["critic_explained_var"] is None for r in rows if r["method"] == "grpo")
    # every row says what its critic trained on: Monte-Carlo returns, or no critic trained at all
    assert {r["value_target"] for r in rows if r["method"] == "mpo"} == {"mc"}
    assert all(r["value_target"] is None for r in rows if r["method"] in ("grpo", "mpo_oracle"))
    assert json.loads((out / "grid.json").read_text())["value_target"] == "mc"
    # the learned-critic arm starts from the seed's shared warm-up
    warm = out / "warmups" / "automation-d3-4" / "seed=0"
    assert json.loads((out / "runs" / "automation-d3-4" / "mpo" / "seed=0" / "config.json").read_text())[
        "model_dir"
    ] == str(warm / "model")
    w = json.loads((warm / "warmup.json").read_text())
    assert w["warmup_stop"] in ("gate", "budget") and w["warmup_episodes"] == 20
    finals = [json.loads(x) for x in (out / "final.jsonl").read_text().splitlines()]
    assert len(finals) == 3 and all(0 <= f["pass@1"] <= f["pass@2"] <= 1 for f in finals)
    assert {f["method"]: f["value_target"] for f in finals} == {"mpo": "mc", "grpo": None, "mpo_oracle": None}
    comps = [json.loads(x) for x in (out / "comparisons.jsonl").read_text().splitlines()]
    assert {(c["a"], c["b"]) for c in comps} == {(a, b) for _, a, b in grids.COMPARISONS}
    for c in comps:
        for k in ("cell", "a", "b", "paired_seeds", "mean_diff", "ci_low", "ci_high", "p_value", "p_holm", "verdict"):
            assert k in c
    assert "| automation-d3-4 | mpo | 1 |" in (out / "tables.md").read_text()
    assert (out / "figures" / "learning_tiny_automation-d3-4.png").stat().st_size > 1000
    # --measure-start measures the same start on the same tasks as every run's iteration 0, alone
    st = tmp_path / "start"
    assert replication.main(["--size", "tiny", "--out", str(st), "--measure-start"]) == 0
    (rec,) = [json.loads(x) for x in (st / "start.jsonl").read_text().splitlines()]
    assert (rec["sampled_success"], rec["greedy_success"]) == starts.pop()
    assert (rec["start"], rec["n_eval_tasks"], rec["eval_seed"]) == ("automation", 8, 0) and not (st / "runs").exists()
    # a second call finds every run done and runs nothing new
    before = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.jsonl")}
    assert replication.main(["--size", "tiny", "--out", str(out)]) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.jsonl")} == before
    assert np.isfinite([f["final_sampled"] for f in finals]).all()
    # the archive keeps the records without the models; with the run folders gone, the grid runs
    # nothing and rebuilds the same records from it
    arch = archive / "runs" / "automation-d3-4" / "mpo" / "seed=0"
    assert {p.name for p in arch.iterdir()} == {
        "config.json",
        "metrics.jsonl",
        "pass_at_k.json",
        "warmup.json",
        "credit.jsonl",
    }
    assert len((arch / "credit.jsonl").read_text().splitlines()) == len(
        list((out / "runs" / "automation-d3-4" / "mpo" / "seed=0" / "trajectories").iterdir())
    )
    before_rows = (out / "results.jsonl").read_text()
    shutil.rmtree(out / "runs"), shutil.rmtree(out / "warmups")
    assert replication.main(["--size", "tiny", "--out", str(out), "--archive", str(archive)]) == 0
    assert not (out / "runs").exists() and not (out / "warmups").exists()
    assert (out / "results.jsonl").read_text() == before_rows
    assert [json.loads(x) for x in (out / "final.jsonl").read_text().splitlines()] == finals
    assert "done (archived)" in records.status("tiny", out, archive)
    assert json.loads((archive / "grid.json").read_text())["grid"]["start"] == "trajectories/starts/automation"


def test_matched_step_rule_by_hand():
    # token_ppo's KL 1e-3; the ladder (2.0, 1.5, 1.3, 1.2, 1.1): the first band within ±20% wins
    kls = {2.0: 2.1e-3, 1.5: 1.5e-3, 1.3: 1.19e-3, 1.2: 0.9e-3}
    got = runner.choose_token_clip(1e-3, kls)
    assert got == {"token_clip": 1.3, "kl_ratio": pytest.approx(1.19), "matched": True}
    # none inside: the closest in log ratio (1.1: ratio 0.5, |log| 0.69; 1.5: ratio 1.5, |log| 0.41)
    got = runner.choose_token_clip(1e-3, {2.0: 2.5e-3, 1.5: 1.5e-3, 1.1: 0.5e-3})
    assert got["token_clip"] == 1.5 and got["matched"] is False
    with pytest.raises(ValueError, match="calibration: expected a positive reference KL"):
        runner.choose_token_clip(0.0, kls)


def test_matched_step_calibration_on_a_tiny_run(tmp_path):
    out = tmp_path / "grid"
    assert replication.main(["--size", "tiny", "--out", str(out), "--calibrate-step"]) == 0
    recs = [json.loads(x) for x in (out / "calibration.jsonl").read_text().splitlines()]
    assert len(recs) == 1
    r = recs[0]
    assert (r["cell"], r["seed"], r["reference"], r["value_target"]) == ("automation-d3-4", 0, "mpo_token", "mc")
    assert r["reference_kl"] > 0 and r["iterations"] == grids.CALIBRATION_ITERATIONS
    kls = {float(k): v for k, v in r["kls"].items()}
    tried = list(kls)
    assert tried == list(grids.TOKEN_CLIP_LADDER[: len(tried)])  # in the ladder's order
    ratios = {c: v / r["reference_kl"] for c, v in kls.items()}
    inside = [c for c in tried if 0.8 <= ratios[c] <= 1.2]
    if r["matched"]:  # the chosen band brings the KL into the band; the looser ones tried did not
        assert inside == [r["token_clip"]] == [tried[-1]]
    else:  # every band tried, none inside: the closest
        assert tried == list(grids.TOKEN_CLIP_LADDER) and not inside
        assert r["token_clip"] == min(ratios, key=lambda c: abs(math.log(ratios[c])))
    assert r["kl_ratio"] == pytest.approx(ratios[r["token_clip"]])
    # the record is kept and reused; the short runs are not
    assert not (out / "calibration" / "automation-d3-4" / "seed=0").exists()
    before = (out / "calibration" / "automation-d3-4" / "seed=0.json").read_text()
    assert replication.main(["--size", "tiny", "--out", str(out), "--calibrate-step"]) == 0
    assert (out / "calibration" / "automation-d3-4" / "seed=0.json").read_text() == before
    # on a new machine, the archive's record is restored instead of measured again
    archive, fresh = tmp_path / "archive", tmp_path / "fresh"
    (archive / "calibration" / "automation-d3-4").mkdir(parents=True)
    shutil.copy(out / "calibration" / "automation-d3-4" / "seed=0.json", archive / "calibration" / "automation-d3-4")
    assert replication.main(["--size", "tiny", "--out", str(fresh), "--archive", str(archive), "--calibrate-step"]) == 0
    assert (fresh / "calibration" / "automation-d3-4" / "seed=0.json").read_text() == before
    assert not (fresh / "warmups").exists()  # nothing was measured


def test_v3_arm_configs(tmp_path):
    """The v3 arms: critic="mc" arms read the policy's Monte-Carlo values (8 continuations, no critic,
    no warm-up folder), mpo_baseline is MAE with within="baseline" and token_ppo on the shared warm-up,
    and mpo_matched takes the token band of the seed's matched-step record."""
    warm = tmp_path / "warmups" / "automation-d5-6" / "seed=2" / "model"
    mc = runner.run_config("v3-e2", "automation-d3-4", "turn_gae_mc", 2, warm)
    assert (mc.estimator, mc.loss, mc.critic, mc.mc_samples, mc.learns_critic) == (
        "turn_gae",
        "token_ppo",
        "mc",
        8,
        False,
    )
    assert mc.model_dir == str(grids.START) and records.critic_target(mc) == "policy_mc"
    base = runner.run_config("v3-e3", "automation-d5-6", "mpo_baseline", 2, warm)
    assert base.estimator_options == {"within": "baseline"} and base.loss == "token_ppo" and base.model_dir == str(warm)
    assert records.critic_target(base) == "mc" and base.difficulty == [5, 6]
    rec = tmp_path / "calibration" / "automation-d5-6" / "seed=2.json"
    rec.parent.mkdir(parents=True)
    rec.write_text(json.dumps({"token_clip": 1.3, "matched": True}) + "\n")
    m = runner.run_config("v3-e3", "automation-d5-6", "mpo_matched", 2, warm)
    assert (m.loss, m.loss_options) == ("turn_ppo", {"token_clip": 1.3})
    assert records.critic_target(runner.run_config("v3-e2", "automation-d3-4", "grpo", 2, warm)) is None


def test_v3_e3_starts_from_its_own_start(tmp_path):
    """E3 (5–6 turns) starts every arm and warm-up from trajectories/starts/automation-d5-6, the
    start made for that horizon; E2 and v2 keep the shipped start; a learned-critic arm starts
    from the seed's warm-up, whose policy is that start."""
    warm = tmp_path / "warmups" / "automation-d5-6" / "seed=0" / "model"
    d56 = str(grids.START_D56)
    assert grids.START_D56.name == "automation-d5-6" and (grids.START_D56 / "policy").is_dir()
    assert runner.run_config("v3-e3", "automation-d5-6", "grpo", 0, warm).model_dir == d56
    assert runner.warmup_config("v3-e3", "automation-d5-6", 0).model_dir == d56
    assert runner.run_config("v3-e3", "automation-d5-6", "ppo", 0, warm).model_dir == str(warm)
    for size, cell in (("v3-e2", "automation-d3-4"), ("v2", "automation-d5-6")):
        assert runner.run_config(size, cell, "grpo", 0, warm).model_dir == str(grids.START)
        assert runner.warmup_config(size, cell, 0).model_dir == str(grids.START)
    meta = json.loads(json.dumps(grids.grid_meta("v3-e3")))  # grid.json: the start as a repository path
    assert meta["grid"]["start"] == "trajectories/starts/automation-d5-6" and meta["runs"] == 48
    assert [a for a in grids.ARMS if grids.uses_warmup(a)] == [
        "ppo",
        "turn_gae",
        "mpo_token",
        "mpo",
        "mpo_bare",
        "mpo_baseline",
        "mpo_matched",
        "sao",
        "bilevel_gae",
    ]


def test_an_archive_made_by_another_grid_is_refused_naming_the_fields(tmp_path, capsys):
    archive = tmp_path / "archive"
    runner.claim_archive(archive, grids.grid_meta("v3-e3"))  # the first grid into an archive marks it
    meta = json.loads((archive / "grid.json").read_text())
    assert meta == json.loads(json.dumps(grids.grid_meta("v3-e3")))
    runner.claim_archive(archive, grids.grid_meta("v3-e3"))  # the same grid again (its tuples now lists)
    share = json.loads(json.dumps(meta))
    share["grid"]["seeds"], share["grid"]["arms"] = [8, 9], ["grpo"]  # more seeds, fewer arms: the same runs
    assert runner.archive_mismatch(meta, share) == []
    # E3's first two runs, from the shipped start: skipping them as the 5-6-turn start's runs would be wrong
    shipped = json.loads(json.dumps(meta))
    shipped["grid"]["start"], shipped["value_target"] = "trajectories/starts/automation", "estimator"
    shipped["arms"]["ppo"]["loss"] = "turn_ppo"
    assert runner.archive_mismatch(shipped, meta) == [
        "value_target: archive 'estimator', this grid 'mc'",
        "start: archive 'trajectories/starts/automation', this grid 'trajectories/starts/automation-d5-6'",
        f"arm ppo: archive {shipped['arms']['ppo']!r}, this grid {meta['arms']['ppo']!r}",
    ]
    # through the command line: a usage error before any run, naming the archive's grid.json
    other = tmp_path / "other"
    other.mkdir()
    tiny = json.loads(json.dumps(grids.grid_meta("tiny")))
    (other / "grid.json").write_text(json.dumps({**tiny, "grid": {**tiny["grid"], "iterations": 99}}))
    with pytest.raises(SystemExit) as e:
        replication.main(["--size", "tiny", "--out", str(tmp_path / "out"), "--archive", str(other)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{other / 'grid.json'}" in err and "iterations: archive 99, this grid 2" in err
    assert not (tmp_path / "out" / "runs").exists()


def test_v3_specs_are_the_preregistered_text():
    """The arms, seeds and primary comparisons of E2 and E3 in experiments/replication.py are those
    docs/results.md fixed in advance (its "Replication v3" section)."""
    text = (REPO / "docs" / "results.md").read_text()
    v3 = text[text.index("## Replication v3") : text.index("## Replication v2")]
    for size, head, nxt in (("v3-e2", "**E2", "**E3"), ("v3-e3", "**E3", "**E1")):
        part = v3[v3.index(head) : v3.index(nxt)]
        spec = grids.SIZES[size]
        arms_line = "Arms: " + ", ".join(f"`{a}`" for a in spec["arms"]) + "."
        assert arms_line in " ".join(part.split()), (size, arms_line)
        listed = [ln[2:].strip() for ln in part.splitlines() if ln.startswith("* `")]
        assert listed == [f"`{a}` − `{b}`" for _, a, b in spec["comparisons"]], (size, listed)
        assert f"Holm over {'both' if len(listed) == 2 else 'the four'}" in part
        assert grids.comparisons_of(size) == spec["comparisons"]
    assert grids.SIZES["v3-e2"]["seeds"] == tuple(range(6)) and "E2 runs 6 seeds (0–5)" in v3
    assert grids.SIZES["v3-e3"]["seeds"] == tuple(range(8)) and "E3 runs 8 seeds (0–7)" in v3
    assert grids.SIZES["v3-e2"]["cells"] == ("automation-d3-4",) and grids.SIZES["v3-e3"]["cells"] == (
        "automation-d5-6",
    )


def test_every_arm_has_a_colour():
    """The figures draw every arm of every size (a v3 arm without a colour once stopped the grid's report)."""
    assert set(grids.ARMS) <= set(grids.COLOURS)


def test_v4_e2p_spec_is_the_preregistered_text(tmp_path):
    """E2' of replication v4: arms, seeds, cell, budget and primaries of ``--size v4-e2p`` are the
    ones docs/results.md fixed in advance; its new arm is turn GAE at λ_T = 0 on the policy's MC values."""
    text = (REPO / "docs" / "results.md").read_text()
    part = text[text.index("**E2' —") : text.index("**Reading rule.**", text.index("**E2' —"))]
    spec = grids.SIZES["v4-e2p"]
    assert "Arms: " + ", ".join(f"`{a}`" for a in spec["arms"]) + "." in " ".join(part.split())
    listed = [ln[2:].strip() for ln in part.splitlines() if ln.startswith("* `")]
    assert listed == [f"`{a}` − `{b}`" for _, a, b in spec["comparisons"]] and "Holm over both" in part
    assert spec["seeds"] == tuple(range(6)) and "seeds 0–5" in part and spec["cells"] == ("automation-d3-4",)
    e2 = grids.SIZES["v3-e2"]
    assert {k: v for k, v in spec.items() if k not in runner.GRID_SHARE} == {
        k: v for k, v in e2.items() if k not in (*runner.GRID_SHARE, "arm_seeds")
    }  # E2's budget exactly
    assert set(spec["arms"]) - {"turn_gae_mc0"} <= set(e2["arms"])
    cfg = runner.run_config("v4-e2p", "automation-d3-4", "turn_gae_mc0", 3, tmp_path / "unused")
    assert (cfg.estimator, cfg.loss, cfg.critic, cfg.mc_samples) == ("turn_gae", "token_ppo", "mc", 8)
    assert cfg.estimator_options == {"turn_lam": 0.0} and not grids.uses_warmup("turn_gae_mc0")


@pytest.mark.parametrize("size,folder", [("v3-e2", "v3/e2"), ("v3-e3", "v3/e3"), ("v4-e2p", "v4/e2p")])
def test_report_only_from_the_archive_rebuilds_the_committed_records(size, folder, tmp_path, monkeypatch):
    """`--report-only --archive experiments/records/...` into a fresh folder reads only the archive
    and writes the committed tables and records byte for byte (figures are drawn, not compared)."""
    archive = REPO / "experiments" / "records" / folder
    monkeypatch.setattr(records, "figures", lambda *a, **k: [])  # matplotlib's bytes are not ours to pin
    assert replication.main(["--size", size, "--report-only", "--archive", str(archive), "--out", str(tmp_path)]) == 0
    for name in ("tables.md", "comparisons.jsonl", "final.jsonl", "results.jsonl", "summary.jsonl"):
        assert (tmp_path / name).read_bytes() == (archive / name).read_bytes(), name
    assert not (tmp_path / "runs").exists()


def test_v4_e6_spec_is_the_preregistered_text(tmp_path):
    """E6 of replication v4: the cell (the exact Sokoban model at its defaults, rooms of 2-6 optimal
    moves), arms, seeds, primaries and start of ``--size v4-e6`` are the ones docs/results.md fixed
    before its start is made; its runs are the v2 budget on the sokoban environment."""
    text = (REPO / "docs" / "results.md").read_text()
    part = " ".join(text[text.index("**E6 —") : text.index("## Replication v3")].split())
    spec = grids.SIZES["v4-e6"]
    arms = part[part.index("**Arms**") : part.index("; the critic arms")]
    assert [a for a in re.findall(r"`([a-z_]+)`", arms) if a != "token_ppo"] == list(spec["arms"])
    primaries = part[part.index("**Primary**") : part.index("**Reading rule.**")]
    assert " and ".join(f"`{a}` − `{b}`" for _, a, b in spec["comparisons"]) in primaries
    assert "Holm over both" in primaries and spec["seeds"] == tuple(range(6)) and "Seeds 0–5" in part
    assert spec["cells"] == ("sokoban-d2-6",) and grids.CELLS["sokoban-d2-6"] == [2, 6]
    assert "`difficulty=(2, 6)`" in part and grids.env_of("sokoban-d2-6") == "sokoban"
    assert spec["start"] == grids.START_E6 and "It is E6's own start, not notebook 07's." in part
    assert {k: v for k, v in spec.items() if k not in (*runner.GRID_SHARE, "start")} == {
        k: v for k, v in grids.SIZES["v2"].items() if k not in runner.GRID_SHARE
    }  # the v2 budget (until the cost rule sets the iterations, recorded in the text)
    cfg = runner.run_config("v4-e6", "sokoban-d2-6", "bilevel_gae", 0, tmp_path / "warm")
    assert (cfg.env, cfg.difficulty, cfg.env_options, cfg.estimator, cfg.loss) == (
        "sokoban",
        [2, 6],
        {},
        "bilevel_gae",
        "token_ppo",
    )
    assert grids.uses_warmup("bilevel_gae") and not grids.uses_warmup("grpo")
    env = make_env(cfg.env, **cfg.env_options)  # the defaults the text names: 6x6, one box, RAGEN's reward
    assert (env.size, env.boxes, env.step_reward, env.solve_reward) == (6, 1, -0.1, 10.0)
    # the start's rule, as make_start.py will make it: noise 0.1, stop at 0.20 or 3,000 steps, 128 rooms
    recipe = (REPO / "trajectories" / "starts" / "make_start.py").read_text()
    recipe = recipe[recipe.index("``sokoban-e6/``") : recipe.index("make_start.py /tmp/sokoban-e6-sft/start")]
    for piece in ("difficulty=[2, 6]", "sft_steps=3000", "sft_noise=0.1", "sft_target_success=0.2",
                  "sft_eval_interval=100", "eval_episodes=128", "sft_lr=3e-3", "sft_batch_episodes=16",
                  "max_turn_tokens=48"):  # fmt: skip
        assert piece in " ".join(recipe.split()), piece


def test_a_grid_whose_start_is_not_made_says_so_before_any_folder(tmp_path, capsys, monkeypatch):
    """A start fixed by its rule and made later (v4-e6's was, until 2026-12-05): a run before it
    exists is one line, no output. The shipped start is hidden behind a name that is not there."""
    assert grids.START_E6.is_dir()  # made and shipped
    missing = grids.START_E6.with_name("sokoban-e6-not-made")
    monkeypatch.setitem(grids.SIZES, "v4-e6", {**grids.SIZES["v4-e6"], "start": missing})
    with pytest.raises(SystemExit) as exc:
        replication.main(["--size", "v4-e6", "--out", str(tmp_path / "out"), "--seeds", "0", "--arms", "grpo"])
    assert exc.value.code == 2
    assert "grid starts from trajectories/starts/sokoban-e6-not-made, which is not there" in capsys.readouterr().err
    assert not (tmp_path / "out" / "grid.json").exists()
