"""RunComparison: several metrics of several run folders, runs grouped with a mean and a band over
seeds, exported like the other views."""

import json

import numpy as np
import pandas as pd
import pytest

from mpo_viz.widgets import RunComparison
from mpo_viz.widgets.runs import group_table


def _run(path, name, est, rows, **cfg):
    d = path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"estimator": est, "loss": "token_ppo", "seed": 0, **cfg}))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _traces(fig, panel_title):
    """The traces of the panel titled ``panel_title`` (by its axes)."""
    ann = [a.text for a in fig.layout.annotations]
    axis = "x" if ann.index(panel_title) == 0 else f"x{ann.index(panel_title) + 1}"
    return [t for t in fig.data if t.xaxis == axis]


def test_one_line_per_run_and_only_real_points(tmp_path):
    a = _run(
        tmp_path,
        "mpo",
        "mpo",
        [
            {
                "iteration": i,
                "time_s": 10.0 * i,
                "success": 0.1 * i,
                **({"eval_success": 0.2 * i} if i % 2 == 0 else {}),
            }
            for i in range(1, 6)
        ],
    )
    b = _run(
        tmp_path,
        "grpo",
        "grpo",
        [
            {"iteration": i, "time_s": 7.0 * i, "success": 0.05 * i, "timings": {"rollout": 1.0 + i}}
            for i in range(1, 4)
        ],
    )
    with open(b / "metrics.jsonl", "a") as fh:
        fh.write('{"iteration": 4, "succ')  # a writer caught mid-line
    view = RunComparison([a, b], metrics="eval_success")
    assert [t.name for t in view.figure.data] == ["mpo (mpo + token_ppo)", "grpo (grpo + token_ppo)"]
    assert list(view.figure.data[0].x) == [2, 4] and list(view.figure.data[0].y) == pytest.approx([0.4, 0.8])
    assert list(view.figure.data[1].x) == []  # grpo has no eval_success yet
    assert {"success", "eval_success", "timings/rollout"} <= set(view.metrics.options)
    view.metrics.value = ("success",)
    view.x.value = "time_s"
    assert list(view.figure.data[1].x) == [7.0, 14.0, 21.0]
    assert list(view.figure.data[1].y) == pytest.approx([0.05, 0.1, 0.15])
    assert view.figure.layout.xaxis.title.text == "training wall time (s)"
    with open(b / "metrics.jsonl", "w") as fh:  # the run grows: refresh reads it
        fh.write("".join(json.dumps({"iteration": i, "time_s": 7.0 * i, "success": 0.5}) + "\n" for i in range(1, 6)))
    view.refresh()
    assert len(view.figure.data[1].x) == 5


@pytest.fixture
def seeds(tmp_path):
    """Two methods, two seeds each (the grpo seed 1 stops early), and hand-made numbers."""
    runs = []
    for method, base in (("mpo", 0.5), ("grpo", 0.2)):
        for seed in (0, 1):
            n = 3 if (method, seed) == ("grpo", 1) else 4
            rows = [
                {
                    "iteration": i,
                    "phase": "rl",
                    "time_s": 10.0 * i + seed,
                    "success": base + 0.1 * i + 0.2 * seed,
                    "entropy": 1.0 - 0.1 * i,
                }
                for i in range(1, n)
            ]
            runs.append(_run(tmp_path, f"{method}-s{seed}", method, rows, seed=seed))
    return runs


def test_runs_grouped_by_a_config_field_with_mean_and_band(seeds):
    view = RunComparison(seeds, metrics=["success", "entropy"], group_by="estimator")
    fig = view.figure
    assert [a.text for a in fig.layout.annotations] == ["success", "entropy"]  # several metrics at once
    success = {t.meta: t for t in _traces(fig, "success")}
    assert set(success) == {"mpo", "band:mpo", "grpo", "band:grpo"}
    # by hand: mpo at iteration i is the mean of 0.5 + 0.1 i and 0.7 + 0.1 i; sd = 0.2 / sqrt(2)
    np.testing.assert_allclose(success["mpo"].x, [1, 2, 3])
    np.testing.assert_allclose(success["mpo"].y, [0.7, 0.8, 0.9])
    sd = 0.2 / np.sqrt(2)
    np.testing.assert_allclose(success["band:mpo"].y, [0.7 + sd, 0.8 + sd, 0.9 + sd, 0.9 - sd, 0.8 - sd, 0.7 - sd])
    # grpo's seed 1 has no iteration 3: the mean there is seed 0's alone, with no width
    np.testing.assert_allclose(success["grpo"].y, [0.4, 0.5, 0.5])
    assert list(success["grpo"].customdata) == [2, 2, 1]
    np.testing.assert_allclose(success["band:grpo"].y[[2, 3]], [0.5, 0.5])
    # one colour per group in every panel; one legend entry per group
    entropy = {t.meta: t for t in _traces(fig, "entropy")}
    assert entropy["mpo"].line.color == success["mpo"].line.color != success["grpo"].line.color
    assert [t.name for t in fig.data if t.showlegend is not False] == ["mpo", "grpo"]
    # the grouping choices: each run, and the fields that differ between runs (not the seed)
    assert [v for _, v in view.group.options] == [None, "estimator"]
    view.band = "minmax"
    view.group.value = "estimator"  # unchanged value: redraw by hand
    view._redraw()
    g = view.groups_table()
    row = g[(g.group == "mpo") & (g.metric == "success") & (g.iteration == 2)].iloc[0]
    assert (row["low"], row["high"], row["n"]) == pytest.approx((0.7, 0.9, 2))
    view.group.value = None  # each run alone again
    assert len([t for t in view.figure.data if t.xaxis == "x"]) == 4


def test_group_by_tags_and_by_time(seeds):
    tags = {seeds[0]: "A", seeds[1]: "A", seeds[2]: "B", seeds[3]: "A"}
    view = RunComparison(seeds, metrics="success", group_by=tags, x="time_s")
    line = {t.meta: t for t in view.figure.data}
    # A at iteration 1: runs mpo-s0 (t 10, 0.6), mpo-s1 (t 11, 0.8), grpo-s1 (t 11, 0.5)
    assert line["A"].x[0] == pytest.approx(32 / 3) and line["A"].y[0] == pytest.approx(1.9 / 3)
    with pytest.raises(ValueError, match="group_by: expected a tag for every run, found none for"):
        RunComparison(seeds, group_by={seeds[0]: "A"})
    with pytest.raises(ValueError, match="group_by: expected a config field of the runs"):
        RunComparison(seeds, group_by="method")


def test_group_table_by_hand():
    runs = pd.DataFrame(
        {
            "group": ["a", "a", "a", "b"],
            "run": ["r1", "r2", "r3", "r4"],
            "metric": ["m"] * 4,
            "iteration": [1, 1, 1, 1],
            "x": [1.0, 2.0, 3.0, 4.0],
            "value": [1.0, 2.0, 6.0, 5.0],
        }
    )
    t = group_table(runs).set_index("group")
    assert t.loc["a", "mean"] == 3.0 and t.loc["a", "x"] == 2.0 and t.loc["a", "n"] == 3
    sd = np.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2)
    assert (t.loc["a", "low"], t.loc["a", "high"]) == pytest.approx((3 - sd, 3 + sd))
    assert (t.loc["b", "low"], t.loc["b", "high"]) == (5.0, 5.0)
    mm = group_table(runs, "minmax").set_index("group")
    assert (mm.loc["a", "low"], mm.loc["a", "high"]) == (1.0, 6.0)
    with pytest.raises(ValueError, match="band: expected one of std, minmax"):
        group_table(runs, "ci")


def test_exports_like_the_other_views(seeds, tmp_path):
    view = RunComparison(seeds, metrics=["success"], group_by=["estimator", "loss"])
    assert {t.name for t in view.figure.data if t.showlegend is not False} == {"mpo + token_ppo", "grpo + token_ppo"}
    tables = view.tables()
    assert set(tables) == {"runs", "groups"} and len(tables["runs"]) == 3 + 3 + 3 + 2
    paths = view.export_tables(tmp_path / "out")
    assert sorted(p.name for p in paths) == ["groups.csv", "runs.csv"]
    back = pd.read_csv(tmp_path / "out" / "groups.csv")
    assert back[(back.group == "mpo + token_ppo") & (back.iteration == 1)]["mean"].iloc[0] == pytest.approx(0.7)
    html = view.to_html()
    assert "mpo + token_ppo" in html and "group means" in html and "fig-" in html
    assert "download='runs.csv'" in view.export.value and "download='groups.csv'" in view.export.value
    assert view.figures() == {"run_comparison": view.figure}


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="run_dirs: expected at least one"):
        RunComparison([])
    with pytest.raises(ValueError, match="not a directory"):
        RunComparison([tmp_path / "nope"])
    with pytest.raises(ValueError, match="^x: expected one of iteration, time_s"):
        RunComparison([tmp_path], x="wall")
    with pytest.raises(ValueError, match="labels: expected 1 names"):
        RunComparison([tmp_path], labels=["a", "b"])
    with pytest.raises(ValueError, match="metrics: expected at least one"):
        RunComparison([tmp_path], metrics=[])
    with pytest.raises(ValueError, match="band: expected one of"):
        RunComparison([tmp_path], band="ci")
