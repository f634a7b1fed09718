"""Collapse forensics (``mpo-viz runs explain``): on hand-built run folders whose every number is
read off the rows below, and on a tiny run forced to collapse, checked against its own metrics and
an independent recomputation from its saved episodes."""

import json

import numpy as np
import pytest

from mpo_viz.cli import main
from mpo_viz.data.io import load, save
from mpo_viz.data.runfolder import RunFolder
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.train import Trainer
from mpo_viz.train.collapse import DOCS, collapse_flags, stretches
from mpo_viz.train.forensics import explain, explanation_text
from tests.train.train_helpers import tiny

MASKS = [[1, 1, 0, 1], [1, 0, 1, 1], [1, 1, 1, 0]]
ADV = [[0.5, -2.0, 9.0, 1.0], [0.1, 0.0, 0.3, -0.4], [-1.0, -1.0, -1.0, 7.0]]
LOGP = [[-0.1, -0.2, 0.0, -3.0], [-1.0, 0.0, -2.0, -0.5], [-0.05, -0.05, -0.2, 0.0]]


def _batch(it, rewards, ratio=None):
    rows = []
    for i in range(3):
        r = {
            "traj_id": f"it{it}-e{i}",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [5, 6, 7, 8],
            "loss_mask": MASKS[i],
            "reward": rewards[i],
            "advantages": ADV[i],
            "old_logprobs": LOGP[i],
            "rollout_logprobs": LOGP[i],
        }
        if ratio is not None:
            r["ratio"] = ratio[i]
        rows.append(r)
    return TrajectoryBatch.from_rows(rows)


def _run(tmp_path, loss, lines, batches):
    run = RunFolder(tmp_path / "run")
    run.create()
    run.config_path.write_text(json.dumps({"loss": loss, "policy_lag": 0}))
    for rec in lines:
        run.append_metrics(rec)
    for it, b in batches.items():
        run.write_trajectories(b, it, max_mb=100)
    return run.path


def _rl(it, **m):
    return {"iteration": it, "phase": "rl", **m}


def test_success_and_evaluation_collapse_name_their_first_iteration_and_episodes(tmp_path):
    lines = [
        {"iteration": 0, "phase": "eval", "eval_success": 0.5},
        _rl(1, success=0.5),
        _rl(2, success=0.0),
        _rl(3, success=0.0),
        {"iteration": 3, "phase": "eval", "eval_success": 0.0},
    ]
    d = _run(tmp_path, "token_ppo", lines, {1: _batch(1, [1, 1, 0]), 2: _batch(2, [1, 0, 0]), 3: _batch(3, [0, 0, 0])})
    e = explain(d, top=2)
    assert [f.metric for f in e.findings] == ["success", "eval_success"] and e.saved == [1, 2, 3]
    s, ev = e.findings
    assert (s.first, s.spans, s.episodes_iteration) == (2, [(2, 3)], 2)  # iteration 2's own rollout scored it
    assert s.ranking == "reward" and s.tied == 2  # e1 and e2 of iteration 2 both scored 0
    assert s.top_episodes["traj_id"].tolist() == ["it2-e1", "it2-e2"]
    # turns by the most negative mean advantage: e2 turn 0 (-1), e0 turn 0 ((0.5 - 2) / 2)
    assert list(zip(s.top_turns["traj_id"], s.top_turns["turn"])) == [("it2-e2", 0), ("it2-e0", 0)]
    assert s.top_turns["score"].tolist() == pytest.approx([-1.0, -0.75])
    # the evaluation at 3 scored the policy after update 3; no later rollout was saved: the file at 3, said so
    assert (ev.first, ev.episodes_iteration) == (3, 3) and "sampled before the update of iteration 3" in ev.note
    text = explanation_text(e)
    assert (
        "success: first crossed its threshold at iteration 2 (success <= 0.05 after an earlier line reached "
        ">= 0.2); flagged on iterations 2-3" in text
    )
    assert "ranked by lowest reward" in text and "2 episodes tie at the top score" in text
    assert f"collapse? iteration 2: success fell to 0.000 from 0.500; see {DOCS}" in text


def test_ratio_max_ranked_by_the_saved_ratio_else_by_advantage_with_the_reason(tmp_path):
    lines = [_rl(1, ratio_max=3.0, turn_ratio_max=1.1), _rl(2, ratio_max=25.0, turn_ratio_max=1.2)]
    ratio = [[1.0, 1.5, 1.0, 30.0], [2.0, 1.0, 0.5, 1.0], [1.0, 4.0, 1.0, 1.0]]
    e = explain(_run(tmp_path / "a", "turn_ppo", lines, {2: _batch(2, [0, 0, 0], ratio)}))
    (f,) = e.findings
    assert (f.metric, f.first, f.ranking) == ("ratio_max", 2, "ratio")
    assert f.top_episodes["traj_id"].tolist() == ["it2-e0", "it2-e2", "it2-e1"]
    assert f.top_episodes["score"].tolist() == [30.0, 4.0, 2.0]
    # no ratio saved and old == rollout log-probs: the largest |advantage|, and the text says why
    e = explain(_run(tmp_path / "b", "turn_ppo", lines, {2: _batch(2, [0, 0, 0])}))
    (f,) = e.findings
    assert f.ranking == "abs_advantage" and f.top_episodes["score"].tolist() == pytest.approx([2.0, 1.0, 0.4])
    assert "old and rollout log-probs agree (largest gap 0)" in explanation_text(e)
    # under a loss that clips each token's own ratio the rule is not judged
    e = explain(_run(tmp_path / "c", "token_ppo", lines, {2: _batch(2, [0, 0, 0])}))
    assert e.findings == [] and "no collapse signature fired" in explanation_text(e)


def test_no_saved_episodes_is_said_and_bad_input_is_named(tmp_path, capsys):
    d = _run(tmp_path, "turn_ppo", [_rl(1, success=0.5), _rl(2, success=0.0)], {1: _batch(1, [1, 1, 1])})
    (f,) = explain(d).findings
    assert f.episodes is None and "no saved episodes at or after iteration 2 (saved iterations: 1;" in f.note
    with pytest.raises(ValueError, match="metric: expected a signature that fired \\(success\\), found 'entropy'"):
        explain(d, metric="entropy")
    with pytest.raises(ValueError, match="expected a run folder with metrics.jsonl, found none"):
        explain(tmp_path)
    assert main(["runs", "explain", str(tmp_path)]) == 1
    assert "mpo-viz runs: error: run_dir: expected a run folder with metrics.jsonl" in capsys.readouterr().err
    assert main(["runs", "explain", str(d), "--top", "0"]) == 2
    assert "--top: expected >= 1" in capsys.readouterr().err
    assert main(["runs", "explain", str(d), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(f["metric"], f["first_iteration"], f["flagged"]) for f in out["findings"]] == [("success", 2, [[2, 2]])]
    assert out["findings"][0]["episodes"] is None and out["saved_iterations"] == [1]


def test_a_forced_collapse_explained_against_its_metrics_and_episodes(tmp_path, capsys, one_thread):
    """A random tiny policy at policy lr 0.3: its entropy falls below a tenth of the first
    iteration's with no gain in success (the entropy signature) within 4 iterations."""
    cfg = tiny(policy_lr=0.3, iterations=4, loss="turn_ppo", save_trajectories_every=1, eval_interval=0)
    Trainer(cfg, tmp_path / "run").run_all(log=print)
    console = capsys.readouterr()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in lines if r["phase"] == "rl"]
    # the signature recomputed by hand from the metrics: the first line under a tenth of the first entropy
    first = next(
        r["iteration"] for r in rl if r["entropy"] < 0.1 * rl[0]["entropy"] and r["success"] <= rl[0]["success"]
    )
    assert first == stretches(lines, collapse_flags(lines), "entropy")[0][0]
    assert f"first flagged at iteration {first}, its episodes: mpo-viz runs explain {tmp_path / 'run'}" in console.err
    assert f"collapse? entropy since iteration {first}" in console.out

    assert main(["runs", "explain", str(tmp_path / "run"), "--top", "3"]) == 0
    text = capsys.readouterr().out
    ent = next(r["entropy"] for r in rl if r["iteration"] == first)
    assert f"entropy: first crossed its threshold at iteration {first}" in text
    assert f"entropy fell to {ent:.4f} from {rl[0]['entropy']:.4f}" in text
    # the rollout records the policy's per-token entropy: the episodes are ranked by it
    assert (
        f"iter={first:06d}.parquet" in text and "ranked by lowest mean per-token entropy (the saved `entropy`)" in text
    )
    # the top episodes: the lowest mean saved entropy over action tokens, recomputed row by row
    b = load(tmp_path / "run" / "trajectories" / f"iter={first:06d}.parquet")
    mean = {}
    for tid, m, ent in zip(b.traj_ids, b.field("loss_mask"), b.field("entropy")):
        act = np.asarray(m) != 0
        mean[tid] = float(np.asarray(ent, dtype=np.float64)[act].mean())
    expect = sorted(mean, key=mean.get)[:3]
    block = text.split("top 3 episodes:")[1].split("top 3 turns")[0].splitlines()[2:5]
    assert [row.split()[1] for row in block] == expect
    assert [float(row.split()[2]) for row in block] == pytest.approx([mean[t] for t in expect], rel=1e-3)

    # the same episodes without their entropy (a file of another framework): ranked by the surprisal
    # -log pi(a) instead, the lowest mean -old_logprobs over action tokens
    path = tmp_path / "run" / "trajectories" / f"iter={first:06d}.parquet"
    rows = [{k: v for k, v in r.items() if k != "entropy"} for r in b.rows()]
    save(TrajectoryBatch.from_rows(rows, meta=b.meta), path)
    assert main(["runs", "explain", str(tmp_path / "run"), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "the saved episodes carry no per-token entropy" in text
    surprisal = {}
    for tid, m, lp in zip(b.traj_ids, b.field("loss_mask"), b.field("old_logprobs")):
        act = np.asarray(m) != 0
        surprisal[tid] = float(-np.asarray(lp, dtype=np.float64)[act].mean())
    expect = sorted(surprisal, key=surprisal.get)[:3]
    block = text.split("top 3 episodes:")[1].split("top 3 turns")[0].splitlines()[2:5]
    assert [row.split()[1] for row in block] == expect
    assert [float(row.split()[2]) for row in block] == pytest.approx([surprisal[t] for t in expect], rel=1e-3)
