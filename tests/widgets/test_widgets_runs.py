"""RunComparison: one metric of several run folders on one axis."""

import json

import pytest

from mpo_viz.widgets import RunComparison


def _run(path, name, est, rows):
    d = path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"estimator": est, "loss": "token_ppo"}))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_one_line_per_run_and_only_real_points(tmp_path):
    a = _run(tmp_path, "mpo", "mpo", [{"iteration": i, "time_s": 10.0 * i, "success": 0.1 * i,
                                      **({"eval_success": 0.2 * i} if i % 2 == 0 else {})} for i in range(1, 6)])
    b = _run(tmp_path, "grpo", "grpo", [{"iteration": i, "time_s": 7.0 * i, "success": 0.05 * i,
                                        "timings": {"rollout": 1.0 + i}} for i in range(1, 4)])
    with open(b / "metrics.jsonl", "a") as fh:
        fh.write('{"iteration": 4, "succ')  # a writer caught mid-line
    view = RunComparison([a, b])
    assert [t.name for t in view.figure.data] == ["mpo (mpo + token_ppo)", "grpo (grpo + token_ppo)"]
    assert list(view.figure.data[0].x) == [2, 4] and list(view.figure.data[0].y) == pytest.approx([0.4, 0.8])
    assert list(view.figure.data[1].x) == []  # grpo has no eval_success yet
    assert {"success", "eval_success", "timings/rollout"} <= set(view.metric.options)
    view.metric.value = "success"
    view.x.value = "time_s"
    assert list(view.figure.data[1].x) == [7.0, 14.0, 21.0]
    assert list(view.figure.data[1].y) == pytest.approx([0.05, 0.1, 0.15])
    assert view.figure.layout.xaxis.title.text == "training wall time (s)"
    with open(b / "metrics.jsonl", "w") as fh:  # the run grows: refresh reads it
        fh.write("".join(json.dumps({"iteration": i, "time_s": 7.0 * i, "success": 0.5}) + "\n" for i in range(1, 6)))
    view.refresh()
    assert len(view.figure.data[1].x) == 5


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="run_dirs: expected at least one"):
        RunComparison([])
    with pytest.raises(ValueError, match="not a directory"):
        RunComparison([tmp_path / "nope"])
    with pytest.raises(ValueError, match="^x: expected one of iteration, time_s"):
        RunComparison([tmp_path], x="wall")
    with pytest.raises(ValueError, match="labels: expected 1 names"):
        RunComparison([tmp_path], labels=["a", "b"])
