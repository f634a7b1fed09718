"""From a run folder's iterations to their episodes: the "trajectories" menu, the "sort by" menu and
the "explore" button that the TrainingDashboard and the RunComparison share.

:class:`IterationOpener` lists ``trajectories/iter=N.*`` of one run folder (re-listed on every
:meth:`~IterationOpener.sync` and on every open, so an iteration the run wrote since appears
without a reload) and opens one in a :class:`~mpo_viz.widgets.explorer.TrajectoryExplorer`
sorted by a ranking of :mod:`mpo_viz.analysis.ranking` (largest |advantage|, lowest reward,
largest token ratio, ... as the file carries the fields). It is not a widget itself: its
``controls`` (an HBox) and ``explorer_box`` go where the host view puts them.
"""

from __future__ import annotations

import html
from pathlib import Path

import ipywidgets as W

from mpo_viz.analysis.ranking import RANKINGS, available
from mpo_viz.data.io import load
from mpo_viz.data.runfolder import RunFolder
from mpo_viz.widgets.explorer import TrajectoryExplorer
from mpo_viz.widgets.figure import swap_child

__all__ = ["IterationOpener", "SORT_OPTIONS", "DEFAULT_SORT"]

#: the "sort by" menu: (entry, ranking name)
SORT_OPTIONS = [(r.short, name) for name, r in RANKINGS.items()]
DEFAULT_SORT = "abs_advantage"


class IterationOpener:
    """The iterations of the run folder ``run_dir`` (None: none yet, see :meth:`set_run`) and the
    explorer of the one opened. Attributes: ``iterations`` (Dropdown of ``iter=NNNNNN`` names),
    ``sort`` (Dropdown of rankings), ``open_button``, ``message`` (HTML: what went wrong on a
    click), ``controls``, ``explorer_box``, ``explorer`` (the last one opened, or None),
    ``opened`` (``(iteration, sort)`` of it)."""

    def __init__(self, run_dir=None, *, sort: str = DEFAULT_SORT):
        if sort not in RANKINGS:
            raise ValueError(f"sort: expected one of {', '.join(RANKINGS)}, found {sort!r}")
        self.run = RunFolder(run_dir) if run_dir is not None else None
        self.iterations = W.Dropdown(
            description="trajectories", options=[], style={"description_width": "80px"}, layout=W.Layout(width="300px")
        )
        self.sort = W.Dropdown(
            description="sort by",
            options=SORT_OPTIONS,
            value=sort,
            style={"description_width": "50px"},
            layout=W.Layout(width="300px"),
        )
        self.open_button = W.Button(
            description="explore",
            tooltip="open the selected iteration's episodes, sorted",
            layout=W.Layout(width="90px"),
        )
        self.message = W.HTML()
        self.explorer_box = W.Box(layout=W.Layout(width="100%"))
        self.explorer: TrajectoryExplorer | None = None
        self.opened: tuple[int, str | None] | None = None
        self.open_button.on_click(lambda _: self.clicked())
        self.controls = W.HBox([self.iterations, self.sort, self.open_button, self.message])
        self.sync()

    def set_run(self, run_dir) -> None:
        """List the iterations of another run folder."""
        self.run = RunFolder(run_dir)
        self.sync()

    def files(self) -> dict[int, Path]:
        """``{iteration: file}`` of the run folder now."""
        return self.run.trajectory_files() if self.run is not None else {}

    def sync(self) -> dict[int, Path]:
        """Re-list the files into the menu (the selection kept, else the newest); returns them."""
        files = self.files()
        labels = [f.stem for f in files.values()]
        if labels != list(self.iterations.options):
            cur = self.iterations.value
            self.iterations.options = labels
            self.iterations.value = cur if cur in labels else (labels[-1] if labels else None)
        return files

    def _resolve(self, n, files: dict[int, Path]) -> int:
        """Iteration ``n`` (an int, an ``iter=NNNNNN`` name, or None: the menu's selection)."""
        n = self.iterations.value if n is None else n
        by_name = {f.stem: it for it, f in files.items()}
        it = by_name.get(n) if isinstance(n, str) else n
        if isinstance(it, bool) or not isinstance(it, int) or it not in files:
            where = self.run.trajectories if self.run is not None else "(no run folder)"
            raise ValueError(
                f"n: expected an iteration with saved episodes in {where} ({', '.join(map(str, files)) or 'none'}), "
                f"found {n!r}"
            )
        return it

    def open_iteration(self, n=None, *, sort: str | None = None, **explorer_options) -> TrajectoryExplorer:
        """Open iteration ``n``'s episodes (default: the menu's selection) in an explorer in
        ``explorer_box``, sorted by ranking ``sort`` (default: the menu's, when the file carries
        its fields, else the explorer's own order; given, it must be one the file can rank by).
        The explorer opened before is closed (``params=`` shared with it stay open)."""
        files = self.sync()
        it = self._resolve(n, files)
        batch = load(files[it])
        if sort is None:
            sort = self.sort.value if self.sort.value in available(batch) else None
        elif sort in RANKINGS:
            self.sort.value = sort
        self.explorer = TrajectoryExplorer(batch, sort=sort, **explorer_options)
        self.opened = (it, sort)
        self.iterations.value = files[it].stem
        swap_child(self.explorer_box, self.explorer)
        self.message.value = ""
        return self.explorer

    def clicked(self) -> None:
        """The "explore" button: open the selection sorted by the menu's ranking (unsorted, and said
        beside the button, when the file lacks its fields; an error is said there too)."""
        try:
            self.open_iteration()
            it, used = self.opened or (None, None)
        except ValueError as exc:
            self.message.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
            return
        if used != self.sort.value:
            self.message.value = (
                f"<i>iteration {it}'s file carries no fields to rank by "
                f"{html.escape(RANKINGS[self.sort.value].short)}: in the explorer's order</i>"
            )
