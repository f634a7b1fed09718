"""``TrainingDashboard``: live curves of a run folder (docs/concepts.md §8), refreshing while the run grows.

A run folder holds ``config.json``, ``metrics.jsonl`` (one JSON object per iteration, appended; a
writer may be caught mid-line), ``trajectories/iter=000123.parquet`` and ``checkpoints/iter=…/``
with a ``latest`` file. The dashboard reads ``metrics.jsonl`` incrementally from the byte offset it
reached, consuming complete lines only (a partial last line is shown if it already parses, and read
again next time), and draws one panel per family of metrics:

success · reward · losses · KL · entropy · importance ratios (log) · clip fractions · within-turn shift ·
across / within ratio (log) · across / within variance · critic fit · phase timings (stacked)

Each panel has its own legend (right of it) and its own colours; ``ratio_max`` is drawn against
``turn_ratio_max`` on a log axis (the collapse signature of docs/training.md, "When a run
collapses"), the phase timings are stacked areas that add up to the iteration's time.

Metric names are matched by pattern (nested objects are flattened with ``/``), so a trainer that
adds a metric gets it drawn without a change here. ``refresh()`` reads and redraws once; with
``live=True`` an asyncio task on the kernel's event loop calls it every ``interval`` seconds.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import html
import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mpo_viz.analysis.ranking import RANKINGS
from mpo_viz.data.runfolder import read_metrics
from mpo_viz.train.forensics import Finding, explain
from mpo_viz.widgets.explorer import TrajectoryExplorer
from mpo_viz.widgets.export_bar import Exportable, ExportBar
from mpo_viz.widgets.figure import FigureWidget, swap_child
from mpo_viz.widgets.iterations import DEFAULT_SORT, IterationOpener
from mpo_viz.widgets.snapshot import Snapshot

__all__ = ["TrainingDashboard", "PANELS", "PALETTE", "Panel", "panel_of", "flatten_keys"]


class Panel(NamedTuple):
    """One panel of the dashboard: its ``title``, ``takes(name)`` (does it draw this flattened
    metric), a ``log`` y axis, ``stacked`` traces (``timings/*`` add up to the iteration's time) and
    the metrics drawn ``first`` (in this order, before the others)."""

    title: str
    takes: Callable[[str], bool]
    log: bool = False
    stacked: bool = False
    first: tuple = ()


def _is_kl(k: str) -> bool:
    return re.search(r"(^|[/_])kl($|[/_])", k) is not None or k.endswith("kl")


def _is_timing(k: str) -> bool:
    return k.startswith(("timings/", "timing/", "time/", "phase_time")) or (k.endswith("_s") and k != "time_s")


#: the panels, in drawing order (two per row, success on top); a metric goes to the first that takes
#: it. Ratios (~1 to ~100) and variances (~0.01) have axes of their own, the ratios a log one.
PANELS = [
    Panel(
        "success", lambda k: "success" in k or "pass@" in k, first=("success", "eval_sampled_success", "eval_success")
    ),
    Panel("reward", lambda k: "reward" in k or "score" in k, first=("reward_mean", "reward_std")),
    Panel("losses", lambda k: "loss" in k),
    Panel("KL", _is_kl),
    Panel("entropy", lambda k: "entropy" in k),
    Panel(
        "importance ratios (log)",
        lambda k: re.fullmatch(r"(turn_)?ratio_(max|min|mean)", k) is not None,
        log=True,
        first=("ratio_max", "turn_ratio_max"),
    ),
    Panel("clip fractions", lambda k: "clipfrac" in k or "clip_frac" in k),
    Panel("within-turn shift", lambda k: "within_turn_shift" in k or "surrogate_gap" in k),
    Panel("across / within ratio (log)", lambda k: k.endswith("across_within_ratio"), log=True),
    Panel("across / within variance", lambda k: "across" in k or "within" in k),
    Panel("critic fit", lambda k: "explained_var" in k or k.endswith(("_mae", "vf_mse"))),
    Panel("phase timings (s, stacked)", _is_timing, stacked=True),
]
_SKIP = {"iteration", "phase", "time_s", "step"}
#: colours within a panel (each panel starts again: a panel's legend never repeats a colour)
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]


def panel_of(key: str) -> int | None:
    """Index in :data:`PANELS` of the panel that draws metric ``key`` (None: not drawn)."""
    if key in _SKIP:
        return None
    for i, panel in enumerate(PANELS):
        if panel.takes(key):
            return i
    return None


def _stacks(key: str) -> bool:
    """Whether a timing adds to the stack: not the total, not a share of another phase (the
    rollout's oracle time)."""
    return key.startswith("timings/") and not key.endswith(("/total", "_oracle"))


def flatten_keys(d: dict, prefix: str = "") -> dict:
    """Nested dicts as one level, their keys joined with ``/`` (``{"timings": {"rollout": 1}}`` ->
    ``{"timings/rollout": 1}``): how metrics and configs are named in the views."""
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_keys(v, name + "/"))
        else:
            out[name] = v
    return out


def _num(v) -> float:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return math.nan


class TrainingDashboard(Exportable, W.VBox):
    """Live training curves of one run folder.

    ``run_dir``: the run folder (it may not hold ``metrics.jsonl`` yet). ``interval``: seconds between
    refreshes when live. ``live``: start refreshing now (default: only when the metrics file changed
    within the last ``interval * 30`` seconds, i.e. the run looks active); the "live" toggle turns it
    on and off. ``sort``: the "sort by" menu's first choice (a ranking of
    :mod:`mpo_viz.analysis.ranking`; :meth:`open_iteration`). Attributes: ``records`` (list of
    flattened metric dicts, one per complete line),
    ``pending`` (the partial last line, parsed, or None), ``figure`` (FigureWidget), ``config``.
    """

    def __init__(self, run_dir, *, interval: float = 2.0, live: bool | None = None, sort: str = DEFAULT_SORT):
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise ValueError(f"run_dir: expected a run folder, found {str(self.run_dir)!r} (not a directory)")
        if interval <= 0:
            raise ValueError(f"interval: expected > 0 seconds, found {interval}")
        self.interval = float(interval)
        self.records: list[dict] = []
        self.pending: dict | None = None
        self._offset = 0
        self._keys: tuple = ()
        self._task: asyncio.Task | None = None
        self.config: dict = {}
        self.figure: FigureWidget | None = None
        self.figure_box = W.VBox(layout=W.Layout(width="100%"))  # a column: the figure takes the full width
        self.status = W.HTML()
        self.config_html = W.HTML()
        self.live = W.ToggleButton(
            value=False,
            description="live",
            tooltip=f"refresh every {self.interval:g} s",
            icon="refresh",
            layout=W.Layout(width="90px"),
        )
        self.refresh_button = W.Button(description="refresh", layout=W.Layout(width="90px"))
        #: the iterations' episodes: the "trajectories" and "sort by" menus, "explore", the explorer below
        self.opener = IterationOpener(self.run_dir, sort=sort)
        self.iterations, self.sort, self.open_button = self.opener.iterations, self.opener.sort, self.opener.open_button
        self.explorer_box = self.opener.explorer_box
        self.refresh_button.on_click(lambda _: self.refresh())
        self.live.observe(self._live_changed, names="value")
        self.export = ExportBar(basename="mpo_viz_training")
        bar = W.HBox([self.live, self.refresh_button, self.opener.controls])
        #: the collapse signatures the trainer flagged: where each began, and its episodes one click away
        self.findings: list[Finding] = []
        self._flagged = 0
        self.collapse_html = W.HTML()
        self.collapse_button = W.Button(description="explore collapse", layout=W.Layout(width="150px", display="none"))
        self.collapse_button.on_click(lambda _: self.open_collapse())
        super().__init__(
            [
                bar,
                self.status,
                W.HBox([self.collapse_html, self.collapse_button]),
                self.figure_box,
                self.export,
                W.HTML("<b>config</b>"),
                self.config_html,
                self.explorer_box,
            ]
        )
        self.add_class("mpo-dashboard")
        self.add_class("mpo-view")
        self.refresh()
        if live is None:
            m = self.run_dir / "metrics.jsonl"
            live = m.exists() and time.time() - m.stat().st_mtime < self.interval * 30
        self.live.value = bool(live)

    # --- reading ---------------------------------------------------------------------------------------
    def refresh(self) -> int:
        """Read what the run wrote since the last call and redraw; returns the number of new records."""
        cfg = self.run_dir / "config.json"
        if cfg.exists() and not self.config:
            try:
                self.config = json.loads(cfg.read_text())
            except json.JSONDecodeError:
                self.config = {}  # being written: read it next time
            self.config_html.value = _kv_html(flatten_keys(self.config)) if self.config else "<i>no config.json yet</i>"
        got = read_metrics(self.run_dir / "metrics.jsonl", self._offset)
        new = [flatten_keys(r) for r in got.records]
        self._offset, self.pending = got.offset, (flatten_keys(got.pending) if got.pending is not None else None)
        self.records.extend(new)
        self.opener.sync()
        self._redraw()
        self._update_status(len(new))
        self._update_collapse()
        if new and not self.live.value:  # while live, the CSV link waits (it would travel every interval)
            self.export.set_tables(self.tables())
        return len(new)

    def tables(self) -> dict:
        """``{"metrics": one row per iteration, the flattened metrics}``."""
        import pandas as pd

        return {"metrics": pd.DataFrame(self.records)}

    def figures(self) -> dict:
        return {"training_curves": self.figure} if self.figure is not None else {}

    def trajectory_files(self) -> list[Path]:
        """``trajectories/iter=*.parquet`` (and ``.jsonl``), oldest first."""
        return list(self.opener.files().values())

    @property
    def explorer(self) -> TrajectoryExplorer | None:
        """The explorer :meth:`open_iteration` opened last (None before)."""
        return self.opener.explorer

    def latest_checkpoint(self) -> str | None:
        f = self.run_dir / "checkpoints" / "latest"
        try:
            return f.read_text().strip() or None
        except OSError:
            return None

    @property
    def table(self):
        """The metrics as a DataFrame (complete lines, then the pending one if any)."""
        import pandas as pd

        return pd.DataFrame(self.records + ([self.pending] if self.pending else []))

    # --- drawing -----------------------------------------------------------------------------------
    def _series(self):
        recs = self.records + ([self.pending] if self.pending else [])
        keys: dict[int, list[str]] = {}
        for r in recs:
            for k, v in r.items():
                i = panel_of(k)
                if i is not None and isinstance(v, (int, float)) and k not in keys.get(i, []):
                    keys.setdefault(i, []).append(k)
        for i, ks in keys.items():
            first = [k for k in PANELS[i].first if k in ks]
            keys[i] = first + [k for k in ks if k not in first]
        x = np.array([_num(r.get("iteration", j)) for j, r in enumerate(recs)])
        ys = {k: np.array([_num(r.get(k)) for r in recs]) for ks in keys.values() for k in ks}
        return x, keys, ys

    def _redraw(self) -> None:
        x, keys, ys = self._series()
        layout_keys = tuple((i, tuple(ks)) for i, ks in sorted(keys.items()))
        if self.figure is None or layout_keys != self._keys:
            self._keys = layout_keys
            self.figure = FigureWidget(self._build(x, keys, ys))
            for tr in self.figure.data:  # a click on any panel's point opens that iteration's episodes
                tr.on_click(self._clicked)
            swap_child(self.figure_box, self.figure)
            return
        with self.figure.batch_update():
            for tr in self.figure.data:
                tr.x, tr.y = _points(x, ys[tr.meta])

    def _build(self, x, keys, ys) -> go.Figure:
        """Two panels per row, each with its own legend (right of it) and colours, a log y axis for
        the ratios, the phase timings stacked."""
        rows = math.ceil(len(PANELS) / 2)
        fig = make_subplots(
            rows=rows, cols=2, subplot_titles=[p.title for p in PANELS], vertical_spacing=0.06, horizontal_spacing=0.22
        )
        for i, ks in keys.items():
            r, c = i // 2 + 1, i % 2 + 1
            legend = "legend" if i == 0 else f"legend{i + 1}"
            for j, k in enumerate(ks):
                fig.add_trace(_trace(x, ys[k], k, j, legend, PANELS[i].stacked and _stacks(k)), row=r, col=c)
            if PANELS[i].log:
                fig.update_yaxes(type="log", row=r, col=c)
        fig.update_xaxes(title_text="iteration", row=rows, col=1)
        fig.update_xaxes(title_text="iteration", row=rows, col=2)
        fig.update_layout(
            height=240 * rows,
            template="plotly_white",
            margin=dict(l=50, r=150, t=50, b=40),
            title=f"run: {self.run_dir.name}",
            **_legends(fig, keys),
        )
        return fig

    def _update_status(self, n_new: int) -> None:
        last = self.records[-1] if self.records else {}
        it = last.get("iteration", len(self.records) - 1 if self.records else None)
        # records of other phases (SFT, critic warm-up, evaluations) are not iterations
        n_it = sum(1 for r in self.records if r.get("phase", "rl") == "rl")
        bits = [f"<b>{self.run_dir.name}</b>", f"{n_it} iteration{'' if n_it == 1 else 's'}"]
        if it is not None:
            bits.append(f"last iteration {it}")
        if "phase" in last:
            bits.append(f"phase {last['phase']}")
        if self.pending is not None:
            bits.append("a line is being written")
        bits.append(f"{len(self.trajectory_files())} trajectory files")
        ck = self.latest_checkpoint()
        if ck:
            bits.append(f"latest checkpoint {ck}")
        bits.append(f"+{n_new} at {dt.datetime.now().strftime('%H:%M:%S')}")
        self.status.value = " · ".join(bits)

    # --- live refresh -------------------------------------------------------------------------------------
    def _live_changed(self, change) -> None:
        if change["new"]:
            self.start()
        else:
            self.stop()
            self.export.set_tables(self.tables())

    def start(self) -> None:
        """Refresh every ``interval`` seconds on the running event loop (the kernel's)."""
        if self._task is not None and not self._task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            try:
                loop = asyncio.get_event_loop()
            except RuntimeError:
                loop = None
        if loop is None or not loop.is_running():
            # no running loop (a plain script): live refresh is not possible; call refresh() yourself
            self.live.value = False
            return
        self._task = loop.create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self.live.value:
            self.live.value = False

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.refresh()
            except ValueError as exc:
                self.status.value = f"<span style='color:#b00'>{exc}</span>"

    # --- trajectories of an iteration -----------------------------------------------------------------------
    def open_iteration(
        self, n: int | str | None = None, *, sort: str | None = None, **explorer_options
    ) -> TrajectoryExplorer:
        """Open iteration ``n``'s saved episodes (an int, or a name ``"iter=000003"``; default: the
        selected one) in an explorer below, sorted by ``sort``: a ranking of
        :mod:`mpo_viz.analysis.ranking` (``"abs_advantage"``: the largest |advantage|,
        ``"reward"``: the lowest reward, ``"ratio"``: the largest saved token ratio,
        ``"logprob_gap"``, ``"entropy"``, ``"surprisal"``); default: the "sort by" menu's, when the
        file carries its fields. An iteration written since the last refresh is found. The explorer
        opened before is closed (``params=`` shared with it stay open)."""
        return self.opener.open_iteration(n, sort=sort, **explorer_options)

    def _update_collapse(self) -> None:
        """Re-read the collapse forensics (:func:`mpo_viz.train.forensics.explain`) when the number
        of lines the trainer flagged (``collapse``) changed, and say them above the curves."""
        flagged = sum(1 for r in self.records if r.get("collapse"))
        if flagged == self._flagged:
            return
        self._flagged = flagged
        try:
            self.findings = explain(self.run_dir, top=1).findings if flagged else []
        except ValueError as exc:
            self.findings = []
            self.collapse_html.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
            return
        bits = []
        for f in self.findings:
            where = (
                f"episodes of iteration {f.episodes_iteration}, sorted by {RANKINGS[f.ranking].short}"
                if f.ranking
                else f.note
            )
            bits.append(
                f"<b>{html.escape(f.metric)}</b> first crossed its threshold at iteration {f.first} "
                f"({html.escape(where)})"
            )
        self.collapse_html.value = ("<span style='color:#b00'>collapse? </span>" + "; ".join(bits)) if bits else ""
        self.collapse_button.layout.display = "" if any(f.ranking for f in self.findings) else "none"

    def open_collapse(self, metric: str | None = None, **explorer_options) -> TrajectoryExplorer:
        """Open the episodes behind a collapse signature (default: the first that fired) in the
        explorer below: the iteration it first crossed its threshold at, sorted by what relates to
        the metric (as ``mpo-viz runs explain`` says; :mod:`mpo_viz.train.forensics`)."""
        found = [f for f in self.findings if f.ranking and (metric is None or f.metric == metric)]
        if not found:
            names = ", ".join(f.metric for f in self.findings if f.ranking) or "none"
            raise ValueError(f"metric: expected a collapse signature with saved episodes ({names}), found {metric!r}")
        f = found[0]
        return self.open_iteration(f.episodes_iteration, sort=f.ranking, **explorer_options)

    def _clicked(self, trace, points, _state=None) -> None:
        """plotly click callback on any trace: open the clicked iteration's episodes, sorted by the
        "sort by" menu (an iteration without saved episodes: the next one saved; none: said beside
        the menus)."""
        if not points.xs:
            return
        it = int(round(float(points.xs[0])))
        files = self.opener.sync()  # the menu lists what the run wrote since
        later = [n for n in files if n >= it]
        if not later:
            self.opener.message.value = f"<i>no saved episodes at or after iteration {it}</i>"
            return
        self.opener.iterations.value = files[later[0]].stem
        self.opener.clicked()

    def to_html(self, path=None) -> str:
        """Static snapshot: status, the curves, the config."""
        snap = Snapshot(f"mpo_viz training run {self.run_dir.name}")
        snap.raw(f"<p>{self.status.value}</p>")
        if self.figure is not None:
            snap.figure(self.figure)
        if self.config:
            snap.heading("config").kv(list(flatten_keys(self.config).items()))
        return snap.output(path)


def _points(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The points of one metric: the lines that hold it (``eval_success`` is on evaluation lines
    only; a timing is on iteration lines only), so lines join real measurements and a stack never
    drops to 0 at a line of another phase."""
    keep = np.isfinite(y)
    return x[keep], y[keep]


def _trace(x, y, key: str, j: int, legend: str, stacked: bool) -> go.Scatter:
    """Metric ``key`` as the ``j``-th trace of its panel (colour ``PALETTE[j]``, dashed past the
    palette), in that panel's legend; a stacked timing is a filled area. A ratio's minimum starts
    hidden (click its legend entry): near 0 it would squash the log axis that ``ratio_max`` and
    ``turn_ratio_max`` are read on."""
    line = dict(color=PALETTE[j % len(PALETTE)], width=1.5, dash="solid" if j < len(PALETTE) else "dash")
    kw = dict(stackgroup="timings", mode="lines") if stacked else dict(mode="lines+markers")
    x, y = _points(x, y)
    visible = "legendonly" if re.fullmatch(r"(turn_)?ratio_min", key) else True
    return go.Scatter(
        x=x,
        y=y,
        name=key,
        meta=key,
        marker=dict(size=4),
        line=line,
        legend=legend,
        visible=visible,
        hovertemplate=f"{key}<br>iteration %{{x}}: %{{y:.4g}}<extra></extra>",
        **kw,
    )


def _legends(fig: go.Figure, keys: dict) -> dict:
    """One legend per drawn panel, just right of it at its top (``legend``, ``legend2``, ...)."""
    out = {}
    for i in keys:
        ax = fig.get_subplot(i // 2 + 1, i % 2 + 1)
        name = "legend" if i == 0 else f"legend{i + 1}"
        out[name] = dict(
            x=ax.xaxis.domain[1] + 0.01,
            y=ax.yaxis.domain[1],
            xanchor="left",
            yanchor="top",
            font=dict(size=9),
            bgcolor="rgba(255,255,255,0.6)",
            tracegroupgap=0,
        )
    return out


def _kv_html(d: dict) -> str:
    """The config as name/value pairs in newspaper columns (a run's config has ~60 fields: one long
    table would be taller than the curves above it)."""
    items = "".join(
        "<div style='break-inside:avoid;padding:1px 0;overflow-wrap:anywhere'><span "
        "style='color:#555;padding-right:8px'>"
        f"{html.escape(str(k))}</span>{html.escape(json.dumps(v) if not isinstance(v, str) else v)}</div>"
        for k, v in d.items()
    )
    return f"<div class='mpo-config' style='font-size:12px;columns:280px;column-gap:24px'>{items}</div>"
