"""mpo_viz.render.plots: figure contents (traces, steps at the turn means, shaded spans, log axes)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.render import plots


def _batch():
    # turns of 2 and 3 action tokens with 2 observation tokens between; obs values 9 must not show
    rows = [
        {
            "traj_id": "A",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": list(range(7)),
            "loss_mask": [1, 1, 0, 0, 1, 1, 1],
            "values": [0.5, 0.7, 9, 9, 0.2, 0.3, 0.4],
            "reward": 1.0,
        }
    ]
    return TrajectoryBatch.from_rows(rows)


def test_value_curve_steps_spans_and_gaps():
    b = _batch()
    adv = {"x": torch.tensor([[1.0, 2.0, 0, 0, 3.0, 3.0, 3.0]])}
    fig = plots.value_curve(b, 0, advantages=adv)
    names = [t.name for t in fig.data]
    assert names == ["value", "turn mean", "A (x)"]
    val = np.array(fig.data[0].y, dtype=float)
    np.testing.assert_allclose(val[[0, 1, 4, 5, 6]], [0.5, 0.7, 0.2, 0.3, 0.4], rtol=1e-6)
    assert np.isnan(val[2]) and np.isnan(val[3])  # observation tokens are gaps
    step = fig.data[1]
    # the turn mean is a flat segment over exactly the turn's shaded span, not past it
    assert list(step.x) == [-0.5, 1.5, None, 3.5, 6.5, None]
    np.testing.assert_allclose([y for y in step.y if y is not None], [0.6, 0.6, 0.3, 0.3], rtol=1e-6)
    # one shaded span per turn and panel: [start - .5, end + .5]
    spans = sorted({(s.x0, s.x1) for s in fig.layout.shapes})
    assert spans == [(-0.5, 1.5), (3.5, 6.5)]
    assert fig.data[2].yaxis == "y2"
    assert fig.data[0].mode == "lines"  # no isolated point: no markers


def test_value_curve_single_token_turn_is_drawn():
    # turns of 1, 2 and 1 action tokens: a line needs two points, so one-token turns get a marker
    rows = [
        {
            "traj_id": "A",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": list(range(7)),
            "loss_mask": [1, 0, 1, 1, 0, 0, 1],
            "values": [0.5, 9, 0.2, 0.3, 9, 9, 0.8],
            "reward": 1.0,
        }
    ]
    b = TrajectoryBatch.from_rows(rows)
    fig = plots.value_curve(b, 0, advantages={"x": torch.tensor([[1.0, 0, 2.0, 3.0, 0, 0, 4.0]])})
    for tr in (fig.data[0], fig.data[2]):
        assert tr.mode == "lines+markers"
        assert list(tr.marker.size) == [6, 0, 0, 0, 0, 0, 6]  # exactly the one-token turns
    step = fig.data[1]
    assert list(step.x) == [-0.5, 0.5, None, 1.5, 3.5, None, 5.5, 6.5, None]


def test_value_curve_needs_values():
    rows = [
        {"traj_id": "A", "group_id": "g", "prompt_ids": [1], "response_ids": [1, 2], "loss_mask": [1, 1], "reward": 1.0}
    ]
    with pytest.raises(ValueError, match="values"):
        plots.value_curve(TrajectoryBatch.from_rows(rows), 0)


def test_across_within_log_axes_and_histogram():
    vv = pd.DataFrame(
        {
            "traj_id": ["a", "b", "c", "d"],
            "reward": [1.0, 0.0, 1.0, 0.0],
            "n_turns": [3, 3, 1, 2],
            "across": [1.0, 0.01, 0.0, 0.5],
            "within": [0.1, 0.1, 0.2, 0.0],
            "ratio": [10.0, 0.1, 0.0, math.inf],
        }
    )
    fig = plots.across_within(vv)
    sc, line, hist = fig.data
    assert list(sc.x) == [0.1, 0.1] and list(sc.y) == [1.0, 0.01]  # c and d cannot sit on log axes
    assert list(sc.marker.color) == [1.0, 0.0]
    assert list(line.x) == list(line.y) == [0.01, 1.0]  # y = x over the data range
    np.testing.assert_allclose(hist.x, [1.0, -1.0])  # log10 of the finite positive ratios
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "2 with a zero statistic" in fig.layout.title.text and "1 infinite" in fig.layout.title.text


def test_estimator_comparison_bars_are_turn_means():
    b = _batch()
    adv = {"mpo": torch.tensor([[1.0, 3.0, 0, 0, -1.0, -2.0, -3.0]]), "grpo": torch.ones(1, 7)}
    fig = plots.estimator_comparison(b, 0, adv)
    assert [t.name for t in fig.data] == ["mpo", "grpo"]
    assert list(fig.data[0].x) == ["T0", "T1"]
    np.testing.assert_allclose(fig.data[0].y, [2.0, -2.0])
    np.testing.assert_allclose(fig.data[1].y, [1.0, 1.0])
    assert fig.layout.barmode == "group"


def test_plots_do_not_import_ipywidgets():
    import subprocess

    code = "import sys, mpo_viz.render.plots; print('ipywidgets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_line_points_short_lines_keep_every_token():
    y = np.array([0.5, 0.6, 9.0, 0.7, 0.8])
    act = np.array([1, 1, 0, 1, 1], dtype=bool)
    x, yy = plots.line_points(y, act)
    assert x.tolist() == [0, 1, 2, 3, 4]
    assert np.isnan(yy[2]) and yy.dtype == np.float32
    np.testing.assert_allclose(yy[[0, 1, 3, 4]], [0.5, 0.6, 0.7, 0.8], rtol=1e-6)


def test_line_points_decimates_long_lines_faithfully():
    rng = np.random.default_rng(0)
    n = 50_000
    act = np.ones(n, dtype=bool)
    act[10_000:10_300] = False  # one observation gap
    act[30_000:30_050] = False
    y = np.cumsum(rng.normal(size=n))
    x, yy = plots.line_points(y, act, max_points=2000)
    assert len(x) <= 2000 + 3 * 3  # two per bucket, plus run starts/ends and one gap marker per run
    assert np.all(np.diff(x) > 0)
    drawn = ~np.isnan(yy)
    np.testing.assert_allclose(yy[drawn], y[x[drawn]], rtol=1e-6)  # every point is a real token value
    assert not act[x[~drawn]].any()  # NaNs only on observation tokens: the gaps survive
    assert {9_999, 10_000, 10_300, 29_999, 30_000, 30_050, n - 1} <= set(x.tolist())
    for lo, hi in ((0, 10_000), (10_300, 30_000), (30_050, n)):  # each run's extremes are drawn
        seg = y[lo:hi]
        assert lo + int(seg.argmin()) in x and lo + int(seg.argmax()) in x


def test_span_shapes_rects_then_two_paths():
    # turns [0, 2], [4, 6], [10, 12]: spans [-0.5, 2.5], [3.5, 6.5], [9.5, 12.5]
    rects = plots.span_shapes([0, 4, 10], [2, 6, 12], max_shapes=3)
    assert [(s["type"], s["x0"], s["x1"], s["fillcolor"]) for s in rects] == [
        ("rect", -0.5, 2.5, "#9ecae1"),
        ("rect", 3.5, 6.5, "#c6dbef"),
        ("rect", 9.5, 12.5, "#9ecae1"),
    ]
    # more turns than max_shapes: one path per colour, the same rectangles (y in paper units)
    paths = plots.span_shapes([0, 4, 10], [2, 6, 12], max_shapes=2)
    assert [(s["type"], s["fillcolor"], s["yref"]) for s in paths] == [
        ("path", "#9ecae1", "paper"),
        ("path", "#c6dbef", "paper"),
    ]
    assert paths[0]["path"] == "M-0.5,0 H2.5 V1 H-0.5 Z M9.5,0 H12.5 V1 H9.5 Z"
    assert paths[1]["path"] == "M3.5,0 H6.5 V1 H3.5 Z"
    # a plotly figure takes them as they are
    import plotly.graph_objects as go

    assert [s.type for s in go.Figure(layout={"shapes": paths}).layout.shapes] == ["path", "path"]
