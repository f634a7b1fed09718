"""``VarianceView``: the paper's Fig. 2 diagnostic (critic values across vs within turns), live.

Left: :func:`mpo_viz.render.plots.across_within` in a ``FigureWidget`` (scatter, one point per trajectory,
and the histogram of log10(across/within)) and a selection table of the same trajectories
(sortable by ratio, across, within, reward). Clicking a point — or picking a row of the table —
opens that trajectory in a :class:`~mpo_viz.widgets.explorer.TrajectoryExplorer` beside the plot.
The table is there because a click needs the plotly front end's click events; it also reaches
trajectories the scatter leaves out (zero statistics cannot sit on log axes, and at most
``max_points`` points are drawn).
"""

from __future__ import annotations

from pathlib import Path

import ipywidgets as W

from mpo_viz import analysis as an
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.render import plots
from mpo_viz.widgets.explorer import TrajectoryExplorer, as_batch
from mpo_viz.widgets.export_bar import Exportable, ExportBar
from mpo_viz.widgets.figure import FigureWidget
from mpo_viz.widgets.picker import TrajectoryPicker
from mpo_viz.widgets.snapshot import Snapshot

__all__ = ["VarianceView"]


class VarianceView(Exportable, W.Box):
    """Across-vs-within scatter and histogram; click a point to explore that trajectory.

    ``batch``: TrajectoryBatch or path (needs critic values). ``max_points``: most points drawn.
    ``explorer_options``: keyword arguments of the explorer opened beside the plot (``estimators``,
    ``gamma``, ...). Attributes: ``table`` (the :func:`mpo_viz.analysis.value_variance` DataFrame),
    ``figure`` (FigureWidget), ``picker``, ``explorer`` (None until a trajectory is opened),
    ``opened`` (traj_ids opened so far, in order).
    """

    def __init__(
        self, batch: TrajectoryBatch | str | Path, *, max_points: int = 5000, page_size: int = 10, **explorer_options
    ):
        self.batch = as_batch(batch)
        if self.batch.values is None:
            raise ValueError(
                "batch: VarianceView needs values (the 'values' field: a critic's or an oracle's); this batch has none"
            )
        self.table = an.value_variance(self.batch)
        self.summary = an.variance_summary(self.table)
        fig = plots.across_within(self.table, max_points=max_points, source=an.values_source(self.batch))
        # 400+ points: a tall plot at the full width of its column (translucent markers, see across_within)
        fig.update_layout(clickmode="event", title_font_size=13, height=560)
        self.figure = FigureWidget(fig)
        self.figure.data[0].on_click(self._clicked)
        t = self.table[["traj_id", "reward", "n_turns", "across", "within", "ratio"]].copy()
        t.insert(0, "row", range(len(t)))
        self.picker = TrajectoryPicker(
            t.rename(columns={"n_turns": "turns"}), sort_by="ratio", descending=True, page_size=page_size
        )
        self.picker.on_pick(self.open_trajectory)
        self.explorer_options = explorer_options
        self.explorer: TrajectoryExplorer | None = None
        self.opened: list[str] = []
        s = self.summary
        self.info = W.HTML(
            f"<b>{s['n_traj']:,} trajectories</b> · median across/within {s['median_ratio']:.3g} · "
            f"share with across &gt; within {s['share_across_gt_within']:.1%} · click a point or pick a row"
        )
        self.export = ExportBar(basename="mpo_viz_variance")
        self.export.set_tables(self.tables())
        self.right = W.VBox(layout=W.Layout(flex="1 1 600px", min_width="560px", overflow="hidden"))
        # the scatter takes the room it gets (400+ points need it); the explorer wraps below when narrow
        left = W.VBox(
            [self.info, self.figure, self.picker, self.export], layout=W.Layout(flex="1 1 720px", min_width="520px")
        )
        super().__init__([left, self.right], layout=W.Layout(display="flex", flex_flow="row wrap", width="100%"))
        self.add_class("mpo-variance")
        self.add_class("mpo-view")

    def _clicked(self, trace, points, _state=None) -> None:
        """plotly click callback on the scatter: open the clicked trajectory."""
        inds = list(getattr(points, "point_inds", []) or [])
        if not inds:
            return
        self.open_trajectory(trace.text[inds[0]])

    def open_trajectory(self, traj) -> None:
        """Open trajectory ``traj`` (batch row or traj_id) in the explorer beside the plot."""
        row = self.batch.traj_ids.index(traj) if isinstance(traj, str) else int(traj)
        self.picker.show(row)  # the list highlights what is open
        if self.explorer is None:
            opts = {"strip_height": 280, **self.explorer_options}
            self.explorer = TrajectoryExplorer(self.batch, row=row, show_picker=False, **opts)
            self.right.children = (self.explorer,)
        else:
            self.explorer.select(row)
        self.opened.append(self.batch.traj_ids[row])

    def tables(self) -> dict:
        """``{"value_variance": the per-trajectory across/within table}``."""
        return {"value_variance": self.table}

    def figures(self) -> dict:
        return {"across_within": self.figure}

    def to_html(self, path=None) -> str:
        """Static snapshot: summary, the figure, and the opened trajectory's explorer view."""
        snap = Snapshot("mpo_viz: critic values across vs within turns")
        snap.kv([(k, v) for k, v in self.summary.items()])
        snap.figure(self.figure)
        if self.explorer is not None:
            self.explorer.snapshot(snap)
        return snap.output(path)
