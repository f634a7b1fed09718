"""The views' figure widget: plotly's FigureWidget whose front end imports plotly's module once per
page and follows its output's width (the browser side is checked in tests/browser/test_widgets_lab.py:
full width, non-empty, no "Failed to initialize model" after reopening the notebook)."""

from __future__ import annotations

from pathlib import Path

import plotly
import plotly.graph_objects as go
import pytest

import mpo_viz as mv
from mpo_viz.widgets import EstimatorComparison, TrainingDashboard, TrajectoryExplorer, VarianceView
from mpo_viz.widgets.figure import FIGURE_JS, FigureWidget, PlotlySource, plotly_source, swap_child


@pytest.fixture(scope="module")
def batch():
    return mv.synthetic.make_batch(8, seed=3, turns=(2, 4), turn_len=(4, 10), obs_len=(3, 6))


def test_the_state_it_opens_with_refers_to_the_one_plotly_source():
    # the front end reads the module source while initializing, before any later message is
    # applied: the reference must be in the state the widget opens with, not set afterwards; the
    # ~5 MB source itself is in one model per kernel, not in each figure
    f = FigureWidget(go.Figure(go.Scatter(y=[1, 2, 3])))
    g = FigureWidget(go.Figure())
    state = f.get_state()
    src = plotly_source()
    assert state["_plotly_source"] == f"IPY_MODEL_{src.model_id}" == g.get_state()["_plotly_source"]
    bundle = (Path(plotly.__file__).parent / "package_data" / "widgetbundle.js").read_text(encoding="utf-8")
    assert src.source == bundle and isinstance(src, PlotlySource)
    assert all(len(str(v)) < 100_000 for v in state.values())  # no copy of the bundle in the figure
    assert state["_esm"] == FIGURE_JS and "globalThis" in FIGURE_JS and "ResizeObserver" in FIGURE_JS
    assert state["_config"]["responsive"] is True  # plotly's resize handler, which figure.js calls
    assert "width" not in f.layout.to_plotly_json()  # no fixed width: the output's
    assert list(f.data[0].y) == [1, 2, 3] and isinstance(f, go.FigureWidget)


def test_a_layout_width_is_kept():
    f = FigureWidget(go.Figure(layout=dict(width=500)))
    assert f.layout.width == 500


def test_every_view_uses_it(batch, tmp_path):
    ex = TrajectoryExplorer(batch, estimators=["mpo", "gae"])
    assert isinstance(ex.figure, FigureWidget) and ex.figure.layout.width is None
    figure = ex.figure
    ex.select(3)  # a pick updates the figure in place
    assert ex.figure is figure
    assert isinstance(EstimatorComparison(batch, ["mpo", "gae"]).figure, FigureWidget)
    vv = VarianceView(batch)
    assert isinstance(vv.figure, FigureWidget) and vv.figure.layout.height >= 540
    assert TrajectoryExplorer(batch, figure_width=640).figure.layout.width == 640


def test_a_closed_source_is_made_again():
    src = plotly_source()
    src.close()
    again = plotly_source()
    assert again is not src and again.comm is not None
    assert FigureWidget(go.Figure()).get_state()["_plotly_source"] == f"IPY_MODEL_{again.model_id}"


def _open(w) -> bool:
    return w.comm is not None


def test_swap_child_closes_what_it_replaces_and_keeps_the_source():
    import ipywidgets as W

    old = W.VBox([W.HTML("a"), FigureWidget(go.Figure())])
    inner, fig = old.children
    box = W.Box([old])
    new = W.HTML("b")
    swap_child(box, new)
    assert box.children == (new,) and _open(new)
    assert not _open(old) and not _open(inner) and not _open(fig) and not _open(inner.layout) and not _open(inner.style)
    assert _open(plotly_source())
    swap_child(box, new)  # the same child again: kept open
    assert _open(new) and box.children == (new,)


def test_views_close_the_figures_they_replace(batch, tmp_path):
    cmp = EstimatorComparison(batch, ["mpo", "gae"], row=0)
    first = cmp.figure
    cmp.select(1)  # a new row builds a new figure
    assert cmp.figure is not first and not _open(first) and _open(cmp.figure)
    run = tmp_path / "run"
    (run / "trajectories").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"iteration": 0, "success_rate": 0.1}\n')
    dash = TrainingDashboard(run, live=False)
    fig = dash.figure
    with (run / "metrics.jsonl").open("a") as f:  # a new metric: a new panel, so a new figure
        f.write('{"iteration": 1, "success_rate": 0.2, "policy_loss": 0.3}\n')
    dash.refresh()
    assert dash.figure is not fig and not _open(fig) and _open(dash.figure)


def test_swap_child_keeps_controls_the_new_view_shares(batch):
    """An explorer replaced by another that shares its ``params``: the old one is closed, the
    shared controls stay open and stop calling the closed view."""
    import ipywidgets as W

    from mpo_viz.widgets import ParamControls

    params = ParamControls(["mpo", "gae"])
    a = TrajectoryExplorer(batch, estimators=["mpo", "gae"], params=params)
    box = W.Box([a])
    b = TrajectoryExplorer(batch, estimators=["mpo", "gae"], params=params)
    swap_child(box, b)
    assert not _open(a) and not _open(a.strip) and not _open(a.figure)
    assert _open(params) and all(_open(c) for c in params.controls.values()) and _open(b)
    owners = [getattr(cb, "__self__", None) for cb in params._callbacks]
    assert a not in owners and b in owners  # the closed view is no longer called
    key = params.keys_of("lam", "mpo")[0]
    mpo_before = b.results["mpo"][0].clone()
    params.controls[key].value = 0.5
    assert not b.results["mpo"][0].equal(mpo_before)  # the live view recomputed
