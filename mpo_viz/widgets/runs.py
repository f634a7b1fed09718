"""``RunComparison``: one metric of several run folders on one axis (MPO vs GRPO vs PPO, ...).

Each run folder's ``metrics.jsonl`` is read with :func:`~mpo_viz.widgets.dashboard.read_metrics`
(nested metrics flattened with ``/``); one line per run, against ``iteration`` or ``time_s``
(training wall time). Records without the metric (``eval_success`` exists only on evaluation
iterations) are left out, so every drawn point is a real measurement. ``refresh()`` re-reads the
folders (runs still growing); the dropdowns pick the metric and the x axis.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import ipywidgets as W

from mpo_viz.widgets.dashboard import panel_of, read_metrics
from mpo_viz.widgets.figure import FigureWidget

__all__ = ["RunComparison", "run_label"]

X_AXES = {"iteration": "iteration", "time_s": "training wall time (s)"}


def run_label(run_dir: Path) -> str:
    """``name (estimator + loss)`` from the folder's config.json, or the folder name."""
    run_dir = Path(run_dir)
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
        return f"{run_dir.name} ({cfg['estimator']} + {cfg['loss']})"
    except (OSError, ValueError, KeyError, TypeError):
        return run_dir.name


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


class RunComparison(W.VBox):
    """Several run folders, one metric, one axis.

    ``run_dirs``: run folders (each may still be empty); ``metric``: a flattened metric name
    (default ``eval_success``); ``x``: ``"iteration"`` or ``"time_s"``; ``labels``: legend names
    (default :func:`run_label`). Attributes: ``records`` (run -> list of flattened dicts),
    ``figure`` (FigureWidget), ``metric`` and ``x`` (Dropdowns).
    """

    def __init__(self, run_dirs, *, metric: str = "eval_success", x: str = "iteration", labels=None):
        self.run_dirs = [Path(d) for d in run_dirs]
        if not self.run_dirs:
            raise ValueError("run_dirs: expected at least one run folder, found none")
        for d in self.run_dirs:
            if not d.is_dir():
                raise ValueError(f"run_dirs: expected run folders, found {str(d)!r} (not a directory)")
        if x not in X_AXES:
            raise ValueError(f"x: expected one of {', '.join(X_AXES)}, found {x!r}")
        if labels is not None and len(labels) != len(self.run_dirs):
            raise ValueError(f"labels: expected {len(self.run_dirs)} names (one per run), found {len(labels)}")
        self.labels = list(labels) if labels is not None else [run_label(d) for d in self.run_dirs]
        self.records: dict[Path, list[dict]] = {}
        self.metric = W.Dropdown(description="metric", options=[metric], value=metric,
                                 layout=W.Layout(width="360px"))
        self.x = W.Dropdown(description="x", options=[(v, k) for k, v in X_AXES.items()], value=x,
                            layout=W.Layout(width="280px"))
        self.refresh_button = W.Button(description="refresh", layout=W.Layout(width="90px"))
        self.figure = FigureWidget()
        self.figure.update_layout(height=380, margin=dict(l=50, r=20, t=30, b=40), template="plotly_white")
        for label in self.labels:
            self.figure.add_scatter(x=[], y=[], mode="lines+markers", name=label, marker=dict(size=5))
        self.metric.observe(lambda _: self._redraw(), names="value")
        self.x.observe(lambda _: self._redraw(), names="value")
        self.refresh_button.on_click(lambda _: self.refresh())
        super().__init__([W.HBox([self.metric, self.x, self.refresh_button]), self.figure])
        self.add_class("mpo-run-comparison")
        self.refresh()

    def refresh(self) -> None:
        """Re-read every run's metrics.jsonl and redraw."""
        keys: list[str] = []
        for d in self.run_dirs:
            recs, _, pending = read_metrics(d / "metrics.jsonl")
            self.records[d] = recs + ([pending] if pending else [])
            for r in self.records[d]:
                for k, v in r.items():
                    if k not in keys and _num(v) is not None and panel_of(k) is not None:
                        keys.append(k)
        cur = self.metric.value
        opts = sorted(set(keys) | {cur})
        if list(self.metric.options) != opts:
            self.metric.options = opts
            self.metric.value = cur
        self._redraw()

    def series(self, run_dir, metric: str | None = None, x: str | None = None) -> tuple[list, list]:
        """``(xs, ys)`` of one run: the records that have both the metric and the x value."""
        metric = metric or self.metric.value
        x = x or self.x.value
        xs, ys = [], []
        for r in self.records.get(Path(run_dir), []):
            xv, yv = _num(r.get(x)), _num(r.get(metric))
            if xv is not None and yv is not None:
                xs.append(xv)
                ys.append(yv)
        return xs, ys

    def _redraw(self) -> None:
        with self.figure.batch_update():
            for tr, d in zip(self.figure.data, self.run_dirs):
                tr.x, tr.y = self.series(d)
            self.figure.layout.xaxis.title = X_AXES[self.x.value]
            self.figure.layout.yaxis.title = self.metric.value
