"""Interactive views for JupyterLab 4 (ipywidgets 8, plotly ``FigureWidget``, anywidget).

* :class:`TrajectoryExplorer` — picker, token strip, value curve, per-turn table; sliders recompute.
* :class:`VarianceView` — critic values across vs within turns; click a point (or pick from the
  list) to open that trajectory in an explorer beside the plot.
* :class:`EstimatorComparison` — one trajectory under several estimators: stacked strips, per-turn
  bars, agreement metrics; parameters shared through sliders.
* :class:`TrainingDashboard` — live curves of a run folder, refreshing while it grows.
* :class:`RunComparison` — several metrics of several run folders, runs grouped by method (or any
  config field, or your tags) with the mean and a band over seeds.

Every view takes a TrajectoryBatch or a path and has ``to_html()`` for a static snapshot built with
the report's machinery. The token strip is the anywidget :class:`StripWidget` around the one strip
ES module (:mod:`mpo_viz.render.strip`); the figures are :mod:`mpo_viz.render.plots` figures in ``FigureWidget``.
"""

from mpo_viz.widgets.comparison import EstimatorComparison
from mpo_viz.widgets.dashboard import TrainingDashboard
from mpo_viz.widgets.engine import AdvantageEngine, ParamControls, default_estimators
from mpo_viz.widgets.explorer import TrajectoryExplorer, trajectory_table
from mpo_viz.widgets.picker import TrajectoryPicker
from mpo_viz.widgets.runs import RunComparison
from mpo_viz.widgets.snapshot import Snapshot
from mpo_viz.widgets.strip_widget import StripWidget
from mpo_viz.widgets.variance import VarianceView

__all__ = [
    "TrajectoryExplorer",
    "VarianceView",
    "EstimatorComparison",
    "TrainingDashboard",
    "RunComparison",
    "StripWidget",
    "TrajectoryPicker",
    "ParamControls",
    "AdvantageEngine",
    "default_estimators",
    "trajectory_table",
    "Snapshot",
]
