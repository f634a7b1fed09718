"""``RunComparison``: several metrics of several run folders, runs grouped (by method, say) with the
mean and a band over seeds.

Each run folder's ``metrics.jsonl`` is read with :func:`~mpo_viz.data.runfolder.read_metrics`
(nested metrics flattened with ``/``: :func:`~mpo_viz.widgets.dashboard.flatten_keys`). Every point is a real
measurement: a line without the metric
(``eval_success`` exists only on evaluation lines) is left out. One panel per metric, against
``iteration`` or ``time_s`` (training wall time).

Grouping (``group_by``): ``None`` draws each run as its own line; a config field (``"estimator"``,
``"loss_options/token_clip"``: nested fields joined with ``/``) or a list of them groups the runs
whose values agree (``"mpo + turn_ppo"``); a dict ``{run_dir: tag}`` groups by your own tags. A
group is drawn as the mean over its runs at each iteration, with a band (``band="std"``: mean ± the
sample standard deviation; ``"minmax"``: the lowest and highest run) and the number of runs behind
each point in the hover; against wall time the x of a point is the runs' mean ``time_s`` at that
iteration. :func:`group_table` is that computation on a long table, usable without the widget.

Export like the other views: ``to_html()``, ``tables()`` (``runs``: one row per run, metric and
line; ``groups``: the means and bands) as CSV with ``export_tables``, ``export_figures`` (PNG/SVG).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import ipywidgets as W
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mpo_viz.data.runfolder import read_metrics
from mpo_viz.widgets.dashboard import PALETTE, flatten_keys, panel_of
from mpo_viz.widgets.export_bar import Exportable, ExportBar
from mpo_viz.widgets.figure import FigureWidget, swap_child
from mpo_viz.widgets.iterations import DEFAULT_SORT, IterationOpener
from mpo_viz.widgets.snapshot import Snapshot

__all__ = ["RunComparison", "run_label", "group_table", "BANDS"]

X_AXES = {"iteration": "iteration", "time_s": "training wall time (s)"}
BANDS = ("std", "minmax")
#: config fields never offered for grouping (they differ between seeds of one method)
_NOT_GROUPS = {"seed", "eval_seed", "model_dir"}


def run_label(run_dir: Path) -> str:
    """``name (estimator + loss)`` from the folder's config.json, or the folder name."""
    cfg = _config(run_dir)
    try:
        return f"{Path(run_dir).name} ({cfg['estimator']} + {cfg['loss']})"
    except (KeyError, TypeError):
        return Path(run_dir).name


def _config(run_dir) -> dict:
    """The folder's config.json, flattened with ``/`` (empty when missing or unreadable)."""
    try:
        return flatten_keys(json.loads((Path(run_dir) / "config.json").read_text()))
    except (OSError, ValueError, AttributeError):
        return {}


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def group_table(runs: pd.DataFrame, band: str = "std") -> pd.DataFrame:
    """Mean and band over the runs of each group, per metric and iteration.

    ``runs``: a long table with columns ``group``, ``run``, ``metric``, ``iteration``, ``x``,
    ``value`` (one row per measurement). Returns one row per (group, metric, iteration): ``x`` (the
    runs' mean x), ``mean``, ``low``/``high`` (mean ∓ sample std with ``band="std"``, 0 wide for a
    single run; min/max with ``"minmax"``) and ``n`` (runs measured there)."""
    if band not in BANDS:
        raise ValueError(f"band: expected one of {', '.join(BANDS)}, found {band!r}")
    cols = ["group", "metric", "iteration", "x", "mean", "low", "high", "n"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    g = runs.groupby(["group", "metric", "iteration"], sort=True)
    out = g.agg(
        x=("x", "mean"),
        mean=("value", "mean"),
        sd=("value", "std"),
        lo=("value", "min"),
        hi=("value", "max"),
        n=("value", "size"),
    ).reset_index()
    sd = out["sd"].fillna(0.0)
    out["low"], out["high"] = (out["mean"] - sd, out["mean"] + sd) if band == "std" else (out["lo"], out["hi"])
    return out[cols]


class RunComparison(Exportable, W.VBox):
    """Several run folders, several metrics (one panel each), runs grouped with a mean and a band.

    ``run_dirs``: run folders (each may still be empty); ``metrics``: flattened metric names (or
    one; default ``eval_sampled_success`` and ``eval_success``); ``x``: ``"iteration"`` or
    ``"time_s"``; ``group_by``: None, a config field or a list of them, or ``{run_dir: tag}`` (see
    the module docstring); ``band``: ``"std"`` or ``"minmax"``; ``labels``: legend names of the runs
    (default :func:`run_label`); ``sort``: the "sort by" menu's first choice (:meth:`open_iteration`).
    Attributes: ``records`` (run -> list of flattened dicts),
    ``configs`` (run -> flattened config), ``figure``, the controls ``metrics``, ``x``, ``group``.
    """

    def __init__(
        self,
        run_dirs,
        *,
        metrics=("eval_sampled_success", "eval_success"),
        x: str = "iteration",
        group_by=None,
        band: str = "std",
        labels=None,
        sort: str = DEFAULT_SORT,
    ):
        self.run_dirs = _check_runs(run_dirs)
        if x not in X_AXES:
            raise ValueError(f"x: expected one of {', '.join(X_AXES)}, found {x!r}")
        if band not in BANDS:
            raise ValueError(f"band: expected one of {', '.join(BANDS)}, found {band!r}")
        if labels is not None and len(labels) != len(self.run_dirs):
            raise ValueError(f"labels: expected {len(self.run_dirs)} names (one per run), found {len(labels)}")
        metrics = [metrics] if isinstance(metrics, str) else list(metrics)
        if not metrics:
            raise ValueError("metrics: expected at least one metric name, found none")
        self.band = band
        self.labels = list(labels) if labels is not None else [run_label(d) for d in self.run_dirs]
        self.configs = {d: _config(d) for d in self.run_dirs}
        self.tags = self._tags(group_by)
        self.records: dict[Path, list[dict]] = {}
        self.metrics = W.SelectMultiple(
            description="metrics", options=metrics, value=tuple(metrics), rows=5, layout=W.Layout(width="360px")
        )
        self.x = W.Dropdown(
            description="x", options=[(v, k) for k, v in X_AXES.items()], value=x, layout=W.Layout(width="280px")
        )
        self.group = W.Dropdown(
            description="group by",
            options=self._group_options(group_by),
            value=_group_key(group_by),
            layout=W.Layout(width="300px"),
        )
        self.refresh_button = W.Button(description="refresh", layout=W.Layout(width="90px"))
        self.figure: FigureWidget | None = None
        self.figure_box = W.VBox(layout=W.Layout(width="100%"))
        self.export = ExportBar(basename="mpo_viz_runs")
        #: a chosen run's iterations: its episodes in an explorer below, sorted (as the dashboard's)
        self.run = W.Dropdown(
            description="run",
            options=[(lb, str(d)) for lb, d in zip(self.labels, self.run_dirs)],
            style={"description_width": "30px"},
            layout=W.Layout(width="320px"),
        )
        self.opener = IterationOpener(self.run_dirs[0], sort=sort)
        self.run.observe(lambda ch: self.opener.set_run(ch["new"]), names="value")
        for w in (self.metrics, self.x, self.group):
            w.observe(lambda _: self._redraw(), names="value")
        self.refresh_button.on_click(lambda _: self.refresh())
        super().__init__(
            [
                W.HBox([self.metrics, W.VBox([self.x, self.group]), self.refresh_button]),
                self.figure_box,
                self.export,
                W.HBox([self.run, self.opener.controls]),
                self.opener.explorer_box,
            ]
        )
        self.add_class("mpo-run-comparison")
        self.add_class("mpo-view")
        self.refresh()

    # --- grouping ---------------------------------------------------------------------------------
    def _tags(self, group_by) -> dict | None:
        """``{run: tag}`` of a dict ``group_by`` (checked: one tag per run), else None."""
        if not isinstance(group_by, dict):
            return None
        tags = {Path(k): str(v) for k, v in group_by.items()}
        missing = [str(d) for d in self.run_dirs if d not in tags]
        if missing:
            raise ValueError(f"group_by: expected a tag for every run, found none for {', '.join(missing)}")
        return tags

    def _group_options(self, group_by) -> list:
        """The dropdown's choices: each run alone, the tags given, and the config fields whose
        values differ between the runs (seed aside)."""
        fields = sorted(
            {
                k
                for c in self.configs.values()
                for k in c
                if k not in _NOT_GROUPS
                and len({json.dumps(c.get(k), sort_keys=True) for c in self.configs.values()}) > 1
            }
        )
        opts = [("each run", None)] + ([("tags", "tags")] if self.tags else [])
        key = _group_key(group_by)
        if isinstance(group_by, str | list | tuple):
            fields_given = [group_by] if isinstance(group_by, str) else list(group_by)
            for f in fields_given:
                if not any(f in c for c in self.configs.values()):
                    raise ValueError(
                        f"group_by: expected a config field of the runs (nested ones joined with '/'), found {f!r}"
                    )
            if key not in fields:
                opts.append((" + ".join(fields_given), key))
        return opts + [(f, f) for f in fields]

    def group_of(self, run_dir) -> str:
        """The group (legend name) of one run under the grouping chosen now."""
        d, key = Path(run_dir), self.group.value
        if key is None:
            return self.labels[self.run_dirs.index(d)]
        if key == "tags" and self.tags is not None:
            return self.tags[d]
        cfg = self.configs[d]
        return " + ".join(str(cfg.get(f)) for f in key.split(" + "))

    # --- reading ------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read every run's metrics.jsonl and redraw."""
        keys: list[str] = []
        for d in self.run_dirs:
            got = read_metrics(d / "metrics.jsonl")
            self.records[d] = [flatten_keys(r) for r in got.records + ([got.pending] if got.pending else [])]
            keys += [
                k for r in self.records[d] for k, v in r.items() if _num(v) is not None and panel_of(k) is not None
            ]
        cur = tuple(self.metrics.value)
        opts = sorted(set(keys) | set(cur))
        if list(self.metrics.options) != opts:
            self.metrics.options = opts
            self.metrics.value = cur
        self.opener.sync()
        self._redraw()

    def open_iteration(self, run, n: int | str | None = None, *, sort: str | None = None, **explorer_options):
        """Open iteration ``n``'s saved episodes of run folder ``run`` (one of ``run_dirs``, or its
        index) in an explorer below, sorted by ``sort``, as
        :meth:`TrainingDashboard.open_iteration <mpo_viz.widgets.dashboard.TrainingDashboard.open_iteration>`
        does; the "run" menu follows."""
        d = self.run_dirs[run] if isinstance(run, int) and not isinstance(run, bool) else Path(run)
        if d not in self.run_dirs:
            raise ValueError(
                f"run: expected one of the runs ({', '.join(map(str, self.run_dirs))}) or an index, found {str(run)!r}"
            )
        self.run.value = str(d)
        return self.opener.open_iteration(n, sort=sort, **explorer_options)

    @property
    def explorer(self):
        """The explorer :meth:`open_iteration` opened last (None before)."""
        return self.opener.explorer

    def series(self, run_dir, metric: str, x: str | None = None) -> tuple[list, list]:
        """``(xs, ys)`` of one run: the lines that have both the metric and the x value."""
        x = x or self.x.value
        xs, ys = [], []
        for r in self.records.get(Path(run_dir), []):
            xv, yv = _num(r.get(x)), _num(r.get(metric))
            if xv is not None and yv is not None:
                xs.append(xv)
                ys.append(yv)
        return xs, ys

    def runs_table(self) -> pd.DataFrame:
        """One row per run, metric chosen and measurement: ``group``, ``run``, ``metric``,
        ``iteration``, ``x``, ``value`` (a run's later line wins at a repeated iteration)."""
        rows = []
        for d, label in zip(self.run_dirs, self.labels):
            for metric in self.metrics.value:
                seen = {}
                for r in self.records.get(d, []):
                    it, xv, yv = _num(r.get("iteration")), _num(r.get(self.x.value)), _num(r.get(metric))
                    if it is not None and xv is not None and yv is not None:
                        seen[it] = (xv, yv)
                rows += [(self.group_of(d), label, metric, it, xv, yv) for it, (xv, yv) in seen.items()]
        return pd.DataFrame(rows, columns=["group", "run", "metric", "iteration", "x", "value"])

    def groups_table(self) -> pd.DataFrame:
        """:func:`group_table` of :meth:`runs_table` (the means and bands drawn)."""
        return group_table(self.runs_table(), self.band)

    # --- drawing --------------------------------------------------------------------------------------
    def _redraw(self) -> None:
        """Rebuild the figure (a change of metrics, grouping or x changes its panels)."""
        self.figure = FigureWidget(self._build())
        swap_child(self.figure_box, self.figure)
        self.export.set_tables(self.tables())

    def _build(self) -> go.Figure:
        """One panel per metric (two per row); per group a line of its mean and, with more than one
        run, a band; one colour per group in every panel, one legend entry per group."""
        metrics = list(self.metrics.value) or ["(no metric chosen)"]
        cols = 1 if len(metrics) == 1 else 2
        rows = math.ceil(len(metrics) / cols)
        fig = make_subplots(rows=rows, cols=cols, subplot_titles=metrics, vertical_spacing=0.12 if rows > 1 else 0.1)
        table = self.groups_table()
        colour = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(dict.fromkeys(map(self.group_of, self.run_dirs)))}
        for i, metric in enumerate(metrics):
            for g, c in colour.items():
                sub = table[(table["group"] == g) & (table["metric"] == metric)].sort_values("iteration")
                for tr in _group_traces(sub, g, c, first=i == 0):
                    fig.add_trace(tr, row=i // cols + 1, col=i % cols + 1)
        fig.update_xaxes(title_text=X_AXES[self.x.value])
        fig.update_layout(
            height=max(340, 300 * rows),
            template="plotly_white",
            margin=dict(l=50, r=20, t=40, b=40),
            legend=dict(font=dict(size=10)),
        )
        return fig

    # --- export ---------------------------------------------------------------------------------------
    def tables(self) -> dict:
        """``runs`` (every measurement drawn) and ``groups`` (the means and bands)."""
        return {"runs": self.runs_table(), "groups": self.groups_table()}

    def figures(self) -> dict:
        return {"run_comparison": self.figure}

    def to_html(self, path=None) -> str:
        """Static snapshot: the panels, the runs and their groups, the group table."""
        snap = Snapshot("mpo_viz run comparison")
        snap.kv([(label, f"{d} → {self.group_of(d)}") for d, label in zip(self.run_dirs, self.labels)])
        snap.figure(self.figure)
        snap.heading("group means", 3).table(self.groups_table())
        return snap.output(path)


def _group_traces(sub: pd.DataFrame, group: str, colour: str, *, first: bool) -> list[go.Scatter]:
    """The mean line of one group in one panel, and its band when some point has two runs or more."""
    x, n = sub["x"].to_numpy(), sub["n"].to_numpy()
    out = []
    if (n > 1).any():
        xs = np.concatenate([x, x[::-1]])
        ys = np.concatenate([sub["high"].to_numpy(), sub["low"].to_numpy()[::-1]])
        out.append(
            go.Scatter(
                x=xs,
                y=ys,
                fill="toself",
                mode="lines",
                line=dict(width=0),
                fillcolor=colour,
                opacity=0.18,
                hoverinfo="skip",
                showlegend=False,
                legendgroup=group,
                name=f"{group} band",
                meta=f"band:{group}",
            )
        )
    out.append(
        go.Scatter(
            x=x,
            y=sub["mean"].to_numpy(),
            mode="lines+markers",
            name=group,
            legendgroup=group,
            showlegend=first,
            meta=group,
            line=dict(color=colour, width=2),
            marker=dict(size=5),
            customdata=n,
            hovertemplate=f"{group}<br>%{{x}}: %{{y:.4g}} (mean of %{{customdata}} runs)<extra></extra>",
        )
    )
    return out


def _group_key(group_by):
    """The dropdown value of a ``group_by`` argument."""
    if group_by is None:
        return None
    if isinstance(group_by, dict):
        return "tags"
    return group_by if isinstance(group_by, str) else " + ".join(group_by)


def _check_runs(run_dirs) -> list[Path]:
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise ValueError("run_dirs: expected at least one run folder, found none")
    for d in dirs:
        if not d.is_dir():
            raise ValueError(f"run_dirs: expected run folders, found {str(d)!r} (not a directory)")
    return dirs
