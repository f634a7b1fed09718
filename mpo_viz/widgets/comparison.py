"""``EstimatorComparison``: one trajectory under several estimators.

Stacked strips (one per estimator, each coloured by that estimator's advantages; hover shows them
all), the per-turn advantages as grouped bars (:func:`mpo_viz.render.plots.estimator_comparison`), and
the agreement metrics (:func:`mpo_viz.analysis.compare_estimators`: correlation, sign agreement,
rank agreement, sign flips) on this trajectory and on the whole batch. The sliders are shared by
every estimator (each takes the options it accepts).

The stacked strips share one colour scale (``scale="absolute"`` by default: one number for the
whole batch, so the same advantage has the same colour in every strip, on every trajectory and
after every slider move; see :mod:`mpo_viz.widgets.scales`), and each opens scrolled to the turn
where the estimators disagree most.
"""

from __future__ import annotations

import html
import time
from pathlib import Path

import ipywidgets as W
import numpy as np

from mpo_viz import analysis as an
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.render import plots
from mpo_viz.render.strip import strip_payload
from mpo_viz.widgets.engine import AdvantageEngine, ParamControls, default_estimators
from mpo_viz.widgets.explorer import (
    TABLE_CSS,
    as_batch,
    changed_channels,
    frame_html,
    opts_text,
    token_decoder,
    trajectory_table,
)
from mpo_viz.widgets.export_bar import Exportable, ExportBar, style_widget
from mpo_viz.widgets.figure import FigureWidget, swap_child
from mpo_viz.widgets.picker import TrajectoryPicker
from mpo_viz.widgets.scales import ColourScale
from mpo_viz.widgets.snapshot import Snapshot
from mpo_viz.widgets.strip_widget import StripWidget, patch_strips

__all__ = ["EstimatorComparison"]


class EstimatorComparison(Exportable, W.VBox):
    """Compare estimators on one trajectory (picked from a table), with shared parameter sliders.

    ``estimators``: names (default: mpo, gae, grpo where supported; at least one). ``row``: index
    or traj_id. ``options``: initial slider values. Attributes: ``params``, ``picker``, ``strips``
    (``{name: StripWidget}``), ``figure`` (per-turn bars), ``metrics`` (HTML), ``metrics_df``
    (this trajectory), ``batch_metrics_df`` (whole batch), ``results``.
    """

    def __init__(
        self,
        batch: TrajectoryBatch | str | Path,
        estimators=None,
        *,
        row=0,
        page_size: int = 10,
        tokens=None,
        strip_height: int = 160,
        params: ParamControls | None = None,
        scale="absolute",
        **options,
    ):
        self.batch = as_batch(batch)
        if len(self.batch) == 0:
            raise ValueError("batch: expected at least one trajectory to compare estimators on, found an empty batch")
        names = list(estimators) if estimators is not None else default_estimators(self.batch)
        self.engine = AdvantageEngine(self.batch, names)
        self.names = self.engine.names
        self.params = params if params is not None else ParamControls(self.names, **options)
        self.tokens = token_decoder(tokens)
        self.results = self.engine.compute(self.params.options)
        self.scale = ColourScale(scale, self.batch, self.results)
        self.picker = TrajectoryPicker(
            trajectory_table(self.batch, self._adv()),
            page_size=page_size,
            sort_by="disagree" if len(self.names) >= 2 else "reward",
        )
        self.strips = {n: StripWidget(height=strip_height) for n in self.names}
        self.strip_labels = {n: W.HTML() for n in self.names}
        self.figure: FigureWidget | None = None
        self.figure_box = W.VBox(layout=W.Layout(width="100%"))  # a column: the figure takes the full width
        self.metrics = W.HTML()
        self.metrics.add_class("mpo-turns")
        self.export = ExportBar(basename="mpo_viz_comparison")
        self.timings: dict = {}
        self.accuracy_df = None
        self.mc_accuracy_df = None
        self.accuracy_html: str = ""
        self._acc_options: dict | None = None
        self.picker.on_pick(self.select)
        self.params.on_change(self._params_changed)
        self.scale.on_change(lambda: self._redraw(new_row=False, ran=set()))  # new scales: a patch of channel info
        strips = [w for n in self.names for w in (self.strip_labels[n], self.strips[n])]
        controls = W.HBox(
            [self.params, self.scale.control], layout=W.Layout(flex_flow="row wrap", align_items="flex-end")
        )
        super().__init__(
            [self.picker, controls, *strips, self.figure_box, style_widget(TABLE_CSS), self.metrics, self.export],
            layout=W.Layout(width="100%"),
        )
        self.add_class("mpo-comparison")
        self.add_class("mpo-view")
        self.row = -1
        r = self.batch.traj_ids.index(row) if isinstance(row, str) else int(row) % len(self.batch)
        self.select(r)

    def _adv(self) -> dict:
        return {k: a for k, (a, _) in self.results.items()}

    def _rows(self) -> dict:
        return {k: a[self.row : self.row + 1, : self._n].detach().cpu().numpy() for k, (a, _) in self.results.items()}

    def select(self, row: int) -> None:
        """Show batch row ``row``."""
        self.row = int(row)
        self.picker.show(self.row)
        self._sub = self.batch[[self.row]]
        self._n = int(self._sub.lengths[0])
        self._redraw(new_row=True)

    def _params_changed(self, options: dict) -> None:
        t0 = time.perf_counter()
        self.results = self.engine.compute(options)
        if "disagree" in self.picker.table.columns and self.engine.ran:
            self.picker.set_column("disagree", an.disagreement(self.batch, self._adv()))
        self.timings["compute"] = time.perf_counter() - t0
        self._redraw(new_row=False, ran=set(self.engine.ran))

    def _redraw(self, new_row: bool, ran=None) -> None:
        """Show the current row. ``new_row`` (a pick): a new payload per strip. Else (a slider move,
        a new colour scale; ``ran``: the estimators whose options changed, default all) each strip
        gets a patch of the channels of the estimators that ran (the same channels for every
        strip, one colour scale) and the focus, as the explorer's strip does."""
        adv = self._rows()
        focus = self.focus_token(adv)
        tid = self.batch.traj_ids[self.row]
        if new_row:
            payload = strip_payload(
                self._sub, 0, advantages=adv, td=an.td_error(self._sub), tokens=self.tokens, arrays=True
            )
            payload["focus"] = focus
            payloads = [dict(payload, channel=f"adv_{name}", title=f"{name} · {tid}") for name in self.strips]
            self.scale.apply(payloads)  # one scale for the stacked strips (they share channel_info)
            for w, p in zip(self.strips.values(), payloads):
                w.set_payload(p, keep_channel=False)
        else:
            ran = set(self.names) if ran is None else ran
            chans = changed_channels(self._sub, adv, ran)
            patch_strips(self.strips.values(), chans, self.scale.apply, focus=focus)
        for name in self.strips:
            self.strip_labels[name].value = (
                f"<b>{name}</b> <span style='color:#555'>ran with "
                f"{html.escape(opts_text(self.engine.options_for(name, self.params.options)))}"
                "</span>"
            )
        bars = plots.estimator_comparison(self._sub, 0, adv)
        if new_row or self.figure is None:
            self.figure = FigureWidget(bars)
            swap_child(self.figure_box, self.figure)
        else:
            with self.figure.batch_update():
                for tr, new in zip(self.figure.data, bars.data):
                    tr.y = new.y
        self.metrics_df = an.compare_estimators(self._sub, adv) if len(adv) >= 2 else None
        self.batch_metrics_df = an.compare_estimators(self.batch, self._adv()) if len(adv) >= 2 else None
        if self.metrics_df is None:
            text = "<i>one estimator: nothing to compare</i>"
        else:
            text = (
                "<b>agreement on this trajectory</b>"
                + frame_html(self.metrics_df)
                + "<b>agreement on the whole batch</b>"
                + frame_html(self.batch_metrics_df)
            )
        if self._acc_options != self.params.options:  # batch-wide: depends on the options, not on the row
            self._accuracy()
        self.metrics.value = text + self.accuracy_html
        self.export.set_tables(self.tables())

    def _accuracy(self) -> None:
        """Accuracy of every estimator on the whole batch, for the options on the controls now:
        against the policy's own Monte-Carlo truth when the batch carries it (``mc_accuracy_df``),
        and against the oracle (or, without oracle columns, what would tell)."""
        self._acc_options = dict(self.params.options)
        self.mc_accuracy_df = an.mc_accuracy(self.batch, self._adv()) if an.has_mc_truth(self.batch) else None
        if self.mc_accuracy_df is not None:  # as the report: no rank on values that are noise or on a noisy truth
            self.mc_accuracy_df.insert(
                1,
                "verdict",
                an.ranked_column(
                    self.mc_accuracy_df, noise=an.values_are_noise(self.batch), unranked=an.critic_based(self.names)
                ),
            )
        mc_html = (
            ""
            if self.mc_accuracy_df is None
            else (
                "<div class='mpo-accuracy'><b>accuracy against this policy's truth (Monte-Carlo values of mpo-viz "
                "truth; turn credit, raw and corrected for the truth's noise)</b>"
                + frame_html(self.mc_accuracy_df)
                + "</div>"
            )
        )
        self._accuracy_oracle()
        self.accuracy_html = mc_html + self.accuracy_html

    def _accuracy_oracle(self) -> None:
        """The oracle part of :meth:`_accuracy` (the scripted expert's credit)."""
        if not an.has_oracle(self.batch):
            self.accuracy_df = None
            self.accuracy_reading = an.NO_ORACLE_TEXT
            self.accuracy_html = f"<p class='mpo-accuracy'><b>accuracy</b>: {html.escape(an.NO_ORACLE_TEXT)}</p>"
            return
        self.accuracy_df = an.credit_accuracy(self.batch, self._adv())
        self.accuracy_reading = an.accuracy_reading(
            self.accuracy_df,
            an.values_source(self.batch),
            shortfall=an.batch_shortfall(self.batch),
            noise=an.values_are_noise(self.batch),
            unranked=an.critic_based(self.names),
        )
        legend = "; ".join(f"<b>{k}</b> {html.escape(v)}" for k, v in an.ACCURACY_COLUMNS.items())
        self.accuracy_html = (
            "<div class='mpo-accuracy'><b>accuracy against the oracle (whole batch, options as set)"
            f"</b><p class='mpo-reading'>{html.escape(self.accuracy_reading)}</p>"
            + frame_html(self.accuracy_df)
            + f"<details><summary>columns</summary><small>{legend}</small></details></div>"
        )

    def focus_token(self, adv: dict) -> int:
        """First action token of the turn where the estimators disagree most on the current
        trajectory: the largest spread (max − min) of the per-turn mean advantages, each estimator
        divided by its own mean |turn advantage| on this trajectory so that scales compare; -1 with
        fewer than two estimators."""
        if len(adv) < 2:
            return -1
        tt = an.turn_table(self._sub, adv)
        if not len(tt):
            return -1
        cols = []
        for k in adv:
            c = tt[f"adv_{k}"].to_numpy(dtype=np.float64)
            m = np.nanmean(np.abs(c)) if np.isfinite(c).any() else 0.0
            cols.append(c / m if m > 0 else c)
        spread = np.nanmax(cols, axis=0) - np.nanmin(cols, axis=0)
        if not np.isfinite(spread).any():
            return -1
        return int(tt["start"].iloc[int(np.nanargmax(spread))])

    def tables(self) -> dict:
        """The view's tables: the per-turn advantages of the trajectory shown and the agreement metrics."""
        tid = self.batch.traj_ids[self.row]
        adv = self._rows()
        out = {f"turn_advantages_{tid}": an.turn_table(self._sub, adv)}
        if self.metrics_df is not None:
            out[f"agreement_{tid}"] = self.metrics_df
            out["agreement_batch"] = self.batch_metrics_df
        if self.accuracy_df is not None:
            out["accuracy"] = self.accuracy_df
        return out

    def figures(self) -> dict:
        return {f"turn_advantages_{self.batch.traj_ids[self.row]}": self.figure}

    def turn_advantages(self) -> dict:
        """``{name: per-turn mean advantage (K,)}`` of the current trajectory, as the bars show."""
        return {tr.name: np.asarray(tr.y, dtype=np.float64) for tr in (self.figure.data if self.figure else ())}

    def to_html(self, path=None) -> str:
        """Static snapshot: the stacked strips, the per-turn bars and the agreement tables."""
        snap = Snapshot(f"mpo_viz estimator comparison: {self.batch.traj_ids[self.row]}")
        snap.kv([(f"{k} ran with", opts_text(self.engine.options_for(k, self.params.options))) for k in self.names])
        for name, w in self.strips.items():
            snap.heading(name, 3).strip(w.payload_dict, w.height)
        snap.figure(self.figure)
        if self.metrics_df is not None:
            snap.heading("agreement on this trajectory", 3).table(self.metrics_df)
            snap.heading("agreement on the whole batch", 3).table(self.batch_metrics_df)
        snap.heading("accuracy against the oracle", 3).note(self.accuracy_reading)
        if self.accuracy_df is not None:
            snap.table(self.accuracy_df)
        return snap.output(path)
