"""The views' figure widget: plotly's FigureWidget whose front end imports plotly's module once per
page and follows its output's width (the browser side is checked in tests/browser/test_widgets_lab.py:
full width, non-empty, no "Failed to initialize model" after reopening the notebook)."""

from __future__ import annotations

from pathlib import Path

import plotly
import plotly.graph_objects as go
import pytest

import mpo_viz as mv
from mpo_viz.widgets import EstimatorComparison, TrajectoryExplorer, VarianceView
from mpo_viz.widgets.figure import FIGURE_JS, FigureWidget


@pytest.fixture(scope="module")
def batch():
    return mv.synthetic.make_batch(8, seed=3, turns=(2, 4), turn_len=(4, 10), obs_len=(3, 6))


def test_the_state_it_opens_with_carries_plotly_module():
    # the front end reads the module source while initializing, before any later message is
    # applied: it must be in the state the widget opens with, not set afterwards
    f = FigureWidget(go.Figure(go.Scatter(y=[1, 2, 3])))
    state = f.get_state()
    bundle = (Path(plotly.__file__).parent / "package_data" / "widgetbundle.js").read_text(encoding="utf-8")
    assert state["_plotly_esm"] == bundle
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
