"""Run-folder logging from verl's compute_advantage: v1 trajectories, metrics.jsonl, the dashboard."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import verl.trainer.ppo.ray_trainer as rt
from omegaconf import OmegaConf

import mpo_viz as mv
import mpo_viz.advantages as A
from mpo_viz.integrations.verl.batch import move_observation_rewards
from tests.integrations.verl_batches import UIDS, copy, multi_turn_batch


def algo(name="mpo", **sections):
    return OmegaConf.create(
        {"adv_estimator": name, "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True, **sections}
    )


def step(data, cfg):
    return rt.compute_advantage(
        data,
        adv_estimator=cfg.adv_estimator,
        gamma=cfg.gamma,
        lam=cfg.lam,
        num_repeat=1,
        norm_adv_by_std_in_grpo=True,
        config=cfg,
    )


def read_lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def ref_across_within(values, mask):
    """Across/within of one row by hand: population variance of turn means / mean turn variance."""
    turns, cur, prev = [], None, 0
    for v, m in zip(values, mask):
        if m and not prev:
            cur = []
            turns.append(cur)
        if m:
            cur.append(v)
        prev = m
    means = [np.mean(t) for t in turns]
    return float(np.var(means)), float(np.mean([np.var(t) for t in turns]))


def test_env_run_dir_writes_v1_trajectories_and_metrics(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("MPO_VIZ_RUN_DIR", str(run))
    cfg = algo("mpo", mpo={"beta": 0.5})
    batches = [multi_turn_batch(seed=s) for s in range(3)]
    outs = [step(copy(b), cfg) for b in batches]
    files = sorted(p.name for p in (run / "trajectories").iterdir())
    assert files == ["iter=000000.parquet", "iter=000001.parquet", "iter=000002.parquet"]
    recs = read_lines(run / "metrics.jsonl")
    assert [r["iteration"] for r in recs] == [0, 1, 2] and recs[0]["estimator"] == "mpo"

    # the trajectories load (validated) as v1 and hold what verl had, on the valid response tokens
    b = mv.load(run / "trajectories" / "iter=000001.parquet")
    data, out = batches[1], outs[1]
    assert len(b) == 6 and list(b.group_ids) == UIDS and b.meta["source_framework"] == "verl"
    att = data.batch["attention_mask"][:, data.batch["prompts"].shape[1] :].sum(1)
    m = data.batch["response_mask"].bool()
    for i in range(6):
        n = int(att[i])
        np.testing.assert_array_equal(b.field("response_ids")[i], data.batch["responses"][i, :n].numpy())
        np.testing.assert_array_equal(b.field("loss_mask")[i], data.batch["response_mask"][i, :n].numpy())
        np.testing.assert_allclose(b.field("values")[i], data.batch["values"][i, :n].numpy())
        np.testing.assert_allclose(b.field("old_logprobs")[i], data.batch["old_log_probs"][i, :n].numpy())
        np.testing.assert_allclose(b.field("advantages")[i], out.batch["advantages"][i, :n].numpy())
        assert b.field("step")[i] == 1
    # the rewards moved onto action tokens: the trajectory reward is the verl score, on an action token
    r, moved, _ = move_observation_rewards(data.batch["token_level_rewards"], data.batch["response_mask"])
    np.testing.assert_allclose(b.field("reward"), data.batch["token_level_rewards"].sum(1).numpy().astype(np.float64))
    assert recs[1]["log/moved_to_action"] == moved == 2

    # metrics: across/within of the critic values by hand; side-by-side estimators by their own functions
    vals, mask = data.batch["values"].double().numpy(), m.numpy()
    aw = [ref_across_within(vals[i], mask[i]) for i in range(6)]
    assert recs[1]["values/across"] == pytest.approx(np.mean([a for a, _ in aw]), rel=1e-9)
    assert recs[1]["values/within"] == pytest.approx(np.mean([w for _, w in aw]), rel=1e-9)
    mpo_adv, _ = A.mae(r, data.batch["values"], m.float(), beta=0.5)
    assert recs[1]["adv/mpo/mean"] == pytest.approx(float(mpo_adv[m].double().mean()), rel=1e-5)
    assert recs[1]["adv/trained/mean"] == pytest.approx(float(out.batch["advantages"][m].double().mean()), rel=1e-5)
    assert recs[1]["adv/mpo/corr_trained"] == pytest.approx(1.0, abs=1e-6)  # mpo is what was trained
    gae_adv, _ = A.gae(r, data.batch["values"], m.float(), gamma=1.0, lam=1.0)  # verl's algorithm.gamma/lam
    assert recs[1]["adv/gae/abs_mean"] == pytest.approx(float(gae_adv[m].double().abs().mean()), rel=1e-5)
    grpo_adv, _ = A.grpo(r, m.float(), UIDS)
    assert recs[1]["adv/grpo/std"] == pytest.approx(float(grpo_adv[m].double().std(unbiased=False)), rel=1e-5)
    assert {"adv/gae/across", "adv/gae/within", "adv/mpo/across", "adv/grpo/within"} <= set(recs[1])
    cfg_json = json.loads((run / "config.json").read_text())
    assert cfg_json["estimator"] == "mpo" and cfg_json["estimator_options"]["beta"] == 0.5


def test_dashboard_reads_the_folder_while_it_grows(tmp_path):
    from mpo_viz.widgets import TrainingDashboard
    from mpo_viz.widgets.dashboard import panel_of

    run = tmp_path / "live"
    cfg = algo("gae", mpo_viz={"run_dir": str(run)})
    step(multi_turn_batch(seed=0), cfg)
    dash = TrainingDashboard(run, live=False)
    assert len(dash.records) == 1 and dash.iterations.options == ("iter=000000",)
    drawn = {k for k in dash.records[0] if panel_of(k) is not None}
    assert {"values/across", "values/within", "reward/mean", "adv/mpo/across"} <= drawn
    step(multi_turn_batch(seed=1), cfg)
    assert dash.refresh() == 1 and len(dash.records) == 2
    ex = dash.open_iteration("iter=000001")
    assert len(ex.batch) == 6 and "mpo" in ex.names


def test_subsampling_keeps_whole_groups_and_every_skips_steps(tmp_path):
    run = tmp_path / "sub"
    cfg = algo("grpo", mpo_viz={"run_dir": str(run), "max_rows": 3, "every": 2, "seed": 1})
    for s in range(4):
        step(multi_turn_batch(seed=s), cfg)
    recs = read_lines(run / "metrics.jsonl")
    assert [r["iteration"] for r in recs] == [0, 2]
    for r in recs:
        b = mv.load(run / "trajectories" / r["log/trajectory_file"])
        groups = list(b.group_ids)
        assert len(b) == r["log/rows_saved"] <= 3
        assert all(groups.count(g) == 2 for g in set(groups))  # groups of two, never split


def test_disk_cap_stops_trajectories_not_metrics(tmp_path):
    run = tmp_path / "cap"
    cfg = algo("mpo", mpo_viz={"run_dir": str(run), "max_mb": 1e-6})
    for s in range(2):
        step(multi_turn_batch(seed=s), cfg)
    recs = read_lines(run / "metrics.jsonl")
    assert len(recs) == 2 and recs[1]["log/trajectories_skipped"].startswith("max_mb=")
    assert len(list((run / "trajectories").iterdir())) == 1


def test_resume_appends_after_the_last_iteration_and_global_steps_wins(tmp_path):
    from mpo_viz.integrations.verl import runlog

    run = tmp_path / "resume"
    cfg = algo("mpo", mpo_viz={"run_dir": str(run)})
    step(multi_turn_batch(seed=0), cfg)
    runlog._LOGGERS.clear()  # a new process
    step(multi_turn_batch(seed=1), cfg)
    d = multi_turn_batch(seed=2)
    d.meta_info["global_steps"] = 40
    step(d, cfg)
    assert [r["iteration"] for r in read_lines(run / "metrics.jsonl")] == [0, 1, 40]


def test_v1_trainer_batch_without_tokens_logs_metrics_only(tmp_path):
    """The v1 trainer fetches only uid/response_mask/scores/log-probs/values for the advantage step."""
    from verl import DataProto

    run = tmp_path / "v1"
    full = multi_turn_batch(seed=0)
    keep = ["response_mask", "token_level_rewards", "token_level_scores", "old_log_probs", "values"]
    data = DataProto.from_dict(tensors={k: full.batch[k] for k in keep}, non_tensors=dict(full.non_tensor_batch))
    step(data, algo("mpo", mpo_viz={"run_dir": str(run)}))
    (rec,) = read_lines(run / "metrics.jsonl")
    assert "prompts" in rec["log/trajectories_skipped"] and rec["log/rows_saved"] == 0
    assert rec["values/across"] > 0


@pytest.mark.parametrize(
    "section, key",
    [
        ({"every": 0}, "every"),
        ({"max_rows": -1}, "max_rows"),
        ({"compare": "mpo,nope"}, "compare"),
        ({"rundir": "x"}, "rundir"),
        ({"compare": "gigpo"}, "compare"),
    ],
)
def test_bad_logging_settings_name_the_key(tmp_path, section, key):
    cfg = algo("mpo", mpo_viz={"run_dir": str(tmp_path / "bad"), **section})
    with pytest.raises(ValueError, match=rf"algorithm\.mpo_viz\.{key}"):
        step(multi_turn_batch(), cfg)


def test_env_setting_error_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("MPO_VIZ_RUN_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("MPO_VIZ_EVERY", "often")
    with pytest.raises(ValueError, match=r"MPO_VIZ_EVERY: expected an integer >= 1, found .often."):
        step(multi_turn_batch(), algo("mpo"))


def test_no_run_dir_no_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = step(multi_turn_batch(), algo("mpo"))
    assert torch.isfinite(out.batch["advantages"]).all() and list(tmp_path.iterdir()) == []
