"""``TrajectoryExplorer``: pick a trajectory, see its token strip, value curve and per-turn table,
and move γ, λ, γ_T, λ_T, β (and MAE's ``within`` / ``value_at``) to recompute the advantages live.

Layout (top to bottom): the parameter controls; the picker (sortable, paginated: reward, turns,
length, estimator disagreement, across/within ratio); the strip (anywidget wrapping the strip ES
module: channel menu, hover shows every channel); the value curve with turn spans and per-token
advantages (``plots.value_curve`` in a ``FigureWidget``); the per-turn table.

A slider change recomputes every estimator on the whole batch (kernels only, see
:class:`~mpo_viz.widgets.engine.AdvantageEngine`), updates the picker's disagreement column, and
pushes only what changed: the strip's advantage channels, the advantage and return traces of the
figure, and the per-turn table.
"""

from __future__ import annotations

import html
import time
from pathlib import Path

import ipywidgets as W
import numpy as np
import pandas as pd

from mpo_viz import analysis as an
from mpo_viz.advantages import registry
from mpo_viz.analysis.ranking import RANKINGS, episode_scores
from mpo_viz.data.io import load
from mpo_viz.data.token_text import tokenizer_decoder
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.render import plots
from mpo_viz.render.strip import TRUTH_CHANNEL, advantage_channels, set_scale, strip_payload
from mpo_viz.widgets.engine import AdvantageEngine, ParamControls, default_estimators
from mpo_viz.widgets.export_bar import Exportable, ExportBar, style_widget
from mpo_viz.widgets.figure import FigureWidget, swap_child
from mpo_viz.widgets.picker import TrajectoryPicker
from mpo_viz.widgets.scales import ColourScale
from mpo_viz.widgets.snapshot import Snapshot
from mpo_viz.widgets.strip_widget import StripWidget, patch_strips

__all__ = ["TrajectoryExplorer", "as_batch", "trajectory_table"]


TABLE_CSS = """.mpo-turns table { border-collapse: collapse; font-size: 12px; }
.mpo-turns td, .mpo-turns th { padding: 2px 8px; border-bottom: 1px solid #eee; text-align: right;
  font-variant-numeric: tabular-nums; }
.mpo-turns th { background: #f6f6f6; }
"""


def as_batch(source):
    """A TrajectoryBatch as is, or a path (``.jsonl``, ``.parquet``, folder) loaded with ``mv.load``."""
    if isinstance(source, (str, Path)):
        return load(source)
    if not hasattr(source, "traj_ids") or not hasattr(source, "mask"):
        raise ValueError(f"batch: expected a TrajectoryBatch or a path, found {type(source).__name__}")
    return source


def trajectory_table(batch: TrajectoryBatch, advantages: dict | None = None) -> pd.DataFrame:
    """One row per trajectory for the picker: ``row``, ``traj_id``, ``reward`` (score), ``turns``,
    ``tokens`` (response length), ``action`` (action tokens), ``disagree`` (share of turn/estimator
    pairs with opposite signs; with >= 2 estimators), ``ratio`` (critic across/within; with values)."""
    mask = batch.mask.numpy() != 0
    df = pd.DataFrame(
        {
            "row": np.arange(len(batch)),
            "traj_id": list(batch.traj_ids),
            "reward": batch.token_rewards.numpy().astype(np.float64).sum(axis=1) if len(batch) else np.zeros(0),
            "turns": np.asarray(batch.num_turns, dtype=np.int64),
            "tokens": batch.lengths.numpy().astype(np.int64),
            "action": mask.sum(axis=1).astype(np.int64),
        }
    )
    if advantages and len(advantages) >= 2:
        df["disagree"] = an.disagreement(batch, advantages)
    if batch.values is not None and len(batch):
        df["ratio"] = an.variance_split(batch.values, batch.mask, batch.turn_ids)["ratio"]
    return df


MAX_TURN_ROWS = 200
"""The per-turn table shows at most this many turns (all of them are in ``turn_df`` and the CSV)."""


def opts_text(o: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in o.items()) or "no options"


def token_decoder(tokens):
    """The ``tokens=`` argument of the views: display strings, a callable ``ids -> strings``, a
    tokenizer object (its per-token decode), or a local tokenizer folder (loaded offline); None
    keeps the batch's ``response_tokens``."""
    if tokens is None or callable(tokens) and not hasattr(tokens, "convert_ids_to_tokens"):
        return tokens
    if isinstance(tokens, (str, Path)) or hasattr(tokens, "convert_ids_to_tokens"):
        return tokenizer_decoder(tokens)
    return tokens


def _frame_html_pandas(df: pd.DataFrame) -> str:
    """:func:`frame_html` by pandas' ``to_html`` (the reference the fast path is tested against)."""
    return df.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="—", border=0)


def _html_text(v) -> str:
    return str(v).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # as pandas escapes


def frame_html(df: pd.DataFrame) -> str:
    """A DataFrame as a compact HTML table for an ``ipywidgets.HTML`` with class ``mpo-turns`` (the
    explorer's turn table, the comparison's agreement tables). Its stylesheet, ``TABLE_CSS``, is not
    in the HTML: a view holds it once in a :func:`mpo_viz.widgets.export_bar.style_widget`, since a
    ``<style>`` in HTML replaced on every update makes the browser rebuild its style rules.

    The same text as pandas' ``df.to_html(index=False, float_format="{:.4g}", na_rep="—",
    border=0)`` (a test compares them), written column by column: a slider move rewrites the turn
    table, and pandas' writer took ~7 ms of the kernel's ~15 ms for a few rows. Frames with other
    column types (categorical, datetime, nested objects) or other column labels (repeated, not
    strings) go through pandas itself."""
    if not df.columns.is_unique or not (
        isinstance(df.columns, pd.RangeIndex) or all(isinstance(c, str) for c in df.columns)
    ):
        return _frame_html_pandas(df)
    cols = []
    for c in df.columns:
        s = df[c]
        kind = s.dtype.kind
        a = s.to_numpy()
        if kind == "f":
            cols.append(["—" if v != v else f"{v:.4g}" for v in a.tolist()])
        elif kind in "iub":
            cols.append([str(v) for v in a.tolist()])
        elif kind == "O" and all(isinstance(v, str) for v in a):
            cols.append([_html_text(v) for v in a])
        elif kind == "O" and all(v is None or isinstance(v, float) and v != v or isinstance(v, str) for v in a):
            cols.append(["—" if not isinstance(v, str) else _html_text(v) for v in a])
        else:
            return _frame_html_pandas(df)
    head = "".join(f"      <th>{_html_text(c)}</th>\n" for c in df.columns)
    rows = "".join(
        "    <tr>\n" + "".join(f"      <td>{col[i]}</td>\n" for col in cols) + "    </tr>\n" for i in range(len(df))
    )
    return (
        '<table class="dataframe">\n  <thead>\n    <tr style="text-align: right;">\n'
        + head
        + "    </tr>\n  </thead>\n  <tbody>\n"
        + rows
        + "  </tbody>\n</table>"
    )


def changed_channels(sub: TrajectoryBatch, adv: dict, ran) -> dict:
    """The strip channels of the estimators in ``ran`` (those whose options changed) for the
    one-row batch ``sub`` and its advantages ``adv`` (``{name: (1, L)}``): ``adv_<name>`` and MAE's
    ``micro_<name>``, as :func:`mpo_viz.render.strip.strip_payload` builds them
    (:func:`mpo_viz.render.strip.advantage_channels`: rounded, observation tokens NaN). Channels are built
    from every estimator and then kept, so MAE's ``micro_`` is the one the payload has."""
    n = int(sub.lengths[0])
    chans = advantage_channels(
        {k: a[0, :n] for k, a in adv.items()}, sub.mask[0, :n].numpy(), sub.turn_ids[0, :n].numpy()
    )
    return {k: v for k, v in chans.items() if k.split("_", 1)[1] in ran}


class TrajectoryExplorer(Exportable, W.VBox):
    """Explore one batch's credit assignment, one trajectory at a time.

    ``batch``: a TrajectoryBatch or a path. ``estimators``: names (default: those of mpo, gae, grpo
    the batch supports). ``row``: the trajectory shown first (index or traj_id). ``options``:
    initial γ/λ/... (``gamma``, ``lam``, ``turn_gamma``, ``turn_lam``, ``beta``, ``within``,
    ``value_at``). ``params``: share another widget's :class:`ParamControls` instead of making one.
    ``tokens``: display strings per token id (a callable ``ids -> strings``, or a local tokenizer
    folder / tokenizer object whose per-token decode is used), default the batch's
    ``response_tokens``. ``show_picker``: False hides the picker (an explorer opened by another
    view). ``figure_width``: pixel width of the value curve (default: the output's width).
    ``scale``: colour scale of the advantage channels (``"absolute"`` default, ``"shared"``,
    ``"own"`` or a number; see :mod:`mpo_viz.widgets.scales`). ``sort``: a ranking of
    :mod:`mpo_viz.analysis.ranking` (``"abs_advantage"``, ``"reward"``, ``"ratio"``,
    ``"logprob_gap"``, ``"entropy"``, ``"surprisal"``): its score becomes a picker column, the picker
    is sorted by it (best first) and the best episode is shown first (``row`` is then ignored).

    Attributes: ``params``, ``picker``, ``strip`` (StripWidget), ``figure`` (FigureWidget or None
    without critic values), ``turns`` (HTML table), ``row``, ``results`` (``{name: (adv, ret)}``,
    ``(B, L)`` tensors for the current options), ``timings`` (kernel-side seconds of the last update
    by phase), ``export`` (the PNG / SVG / CSV bar).
    """

    def __init__(
        self,
        batch: TrajectoryBatch | str | Path,
        *,
        estimators=None,
        row=0,
        page_size: int = 15,
        tokens=None,
        strip_height: int = 320,
        params: ParamControls | None = None,
        show_picker: bool = True,
        figure_width: int | None = None,
        scale="absolute",
        sort: str | None = None,
        **options,
    ):
        self.batch = as_batch(batch)
        if len(self.batch) == 0:
            raise ValueError("batch: expected at least one trajectory, found none")
        #: the ranking the picker was sorted by (``sort``), or None
        self.sort = sort
        names = estimators if estimators is not None else default_estimators(self.batch)
        self.engine = AdvantageEngine(self.batch, names)
        self.names = self.engine.names
        self.params = params if params is not None else ParamControls(self.names, **options)
        self.tokens = token_decoder(tokens)
        self.figure_width = figure_width
        self.timings: dict = {}
        self.results = self.engine.compute(self.params.options)
        self.scale = ColourScale(scale, self.batch, self.results)
        self._disagreement = an.Disagreement(self.batch)  # the picker's column, again on every slider move
        table = trajectory_table(self.batch, self._adv())
        sort_by, descending = "reward", True
        if sort is not None:
            sort_by, descending, row = self._ranked(table, sort)
        self.picker = TrajectoryPicker(table, page_size=page_size, sort_by=sort_by, descending=descending)
        self.strip = StripWidget(height=strip_height)
        self.figure: FigureWidget | None = None
        self.figure_box = W.VBox(layout=W.Layout(width="100%"))  # a column: the figure takes the full width
        self.turns = W.HTML(layout=W.Layout(overflow="auto", max_width="100%", max_height="360px"))
        self.turns.add_class("mpo-turns")
        #: the batch carries the policy's token truth (``mpo-viz truth --tokens``): the per-token table of the
        #: trajectory's measured tokens and the within-turn accuracy over the batch are shown under the turns
        self.has_token_truth = an.has_mc_token_truth(self.batch)
        self.token_df: pd.DataFrame | None = None
        self.token_accuracy_df: pd.DataFrame | None = None
        self.tokens_view = W.HTML(layout=W.Layout(overflow="auto", max_width="100%", max_height="360px"))
        self.tokens_view.add_class("mpo-turns")
        self.status = W.HTML()
        self.status.add_class("mpo-status")
        self.export = ExportBar(basename="mpo_viz_explorer")
        self.row = -1
        self.picker.on_pick(self.select)
        self.params.on_change(self._params_changed)
        self.scale.on_change(self._rescale)
        # the controls sit next to what they change: picker, then the sliders and the colour scale
        # right above the strip and curve they recompute
        controls = W.HBox(
            [self.params, self.scale.control], layout=W.Layout(flex_flow="row wrap", align_items="flex-end")
        )
        children = ([self.picker] if show_picker else []) + [
            controls,
            self.status,
            self.strip,
            self.figure_box,
            style_widget(TABLE_CSS),
            self.turns,
        ]
        children += ([self.tokens_view] if self.has_token_truth else []) + [self.export]
        super().__init__(children, layout=W.Layout(width="100%"))
        self.add_class("mpo-explorer")
        self.add_class("mpo-view")
        self.select(self._row_of(row))

    # --- helpers ------------------------------------------------------------------------------------
    def _row_of(self, row) -> int:
        if isinstance(row, str):
            try:
                return self.batch.traj_ids.index(row)
            except ValueError:
                raise ValueError(f"row: no trajectory with traj_id {row!r}") from None
        B = len(self.batch)
        if not -B <= int(row) < B:
            raise ValueError(f"row: expected an index in [0, {B}) or a traj_id, found {row}")
        return int(row) % B

    def _adv(self) -> dict:
        return {k: a for k, (a, _) in self.results.items()}

    def _ranked(self, table: pd.DataFrame, sort: str) -> tuple[str, bool, int]:
        """Add ranking ``sort``'s episode scores to the picker's ``table`` (under the ranking's
        column name); returns ``(sort_by, descending, best row)``."""
        if sort not in RANKINGS:
            raise ValueError(f"sort: expected one of {', '.join(RANKINGS)}, found {sort!r}")
        r = RANKINGS[sort]
        try:
            scores = episode_scores(self.batch, sort)
        except ValueError as exc:
            raise ValueError(f"sort: {str(exc).removeprefix('by: ')}") from None
        table[r.column] = scores
        key = np.where(np.isnan(scores), np.inf, -scores if r.descending else scores)
        return r.column, r.descending, int(np.argmin(key))

    def _ret_source(self) -> str | None:
        return registry.returns_source(self.results)

    def _row_arrays(self):
        """``{name: (1, n) numpy advantages}``, the returns row (or None) of the current trajectory."""
        n = self._n
        adv = {k: a[self.row : self.row + 1, :n].detach().cpu().numpy() for k, (a, _) in self.results.items()}
        src = self._ret_source()
        ret = self.results[src][1][self.row : self.row + 1, :n].detach().cpu().numpy() if src else None
        return adv, ret

    @property
    def advantages(self) -> dict:
        """``{name: (B, L) tensor}`` for the current options."""
        return self._adv()

    # --- picking a trajectory -------------------------------------------------------------------------
    def select(self, row) -> None:
        """Show trajectory ``row`` (index or traj_id); the picker highlights it."""
        t0 = time.perf_counter()
        row = self._row_of(row)
        self.row = row
        self._sub = self.batch[[row]]
        self._n = int(self._sub.lengths[0])
        self.picker.show(row)
        adv, ret = self._row_arrays()
        payload = strip_payload(
            self._sub,
            0,
            advantages=adv,
            td=an.td_error(self._sub),
            tokens=self.tokens,
            channel=f"adv_{self.names[0]}",
            arrays=True,
        )
        self.scale.apply(payload)
        _truth_scale(payload)
        t1 = time.perf_counter()
        self.strip.set_payload(payload)
        t2 = time.perf_counter()
        if self._sub.values is not None:
            self._draw_curve(plots.value_curve_parts(self._sub, 0, advantages=adv, returns=ret))
        else:
            self.figure = None
            swap_child(self.figure_box, W.HTML("<i>no critic values in this batch: no value curve</i>"))
        t3 = time.perf_counter()
        self._update_turns(adv, ret, export=False)
        self._update_tokens(adv, batch_wide=self.token_accuracy_df is None)
        self.export.set_tables(self.tables())
        self.timings = {"payload": t1 - t0, "push": t2 - t1, "figure": t3 - t2, "turn_table": time.perf_counter() - t3}
        self._status()

    def _draw_curve(self, parts: dict) -> None:
        """Show a value curve (:func:`mpo_viz.render.plots.value_curve_parts`): when the figure on screen
        has the same traces (a pick, a slider move), update its trace data, shaded spans and title
        in place (one message, no new figure in the browser); else build a new FigureWidget."""
        old = self.figure
        if old is not None and [t.name for t in old.data] == [t["name"] for t in parts["traces"]]:
            with old.batch_update():
                for tr, new in zip(old.data, parts["traces"]):
                    tr.x, tr.y = new["x"], new["y"]
                    tr.mode = new["mode"]
                    tr.marker.size = new["size"]
                    if new.get("error") is not None:
                        tr.error_y.array = new["error"]
                old.layout.shapes = parts["shapes"]
                old.layout.title.text = parts["title"]
                for ax in ("xaxis", "yaxis", "xaxis2", "yaxis2"):
                    if ax in old.layout:
                        old.layout[ax].autorange = True
            return
        fig = self._figure_from_parts(parts)
        if self.figure_width:
            fig.update_layout(width=self.figure_width)
        self.figure = FigureWidget(fig)
        swap_child(self.figure_box, self.figure)

    def _figure_from_parts(self, parts: dict):
        adv, ret = self._row_arrays()
        return plots.value_curve(self._sub, 0, advantages=adv, returns=ret, title=parts["title"])

    def _update_turns(self, adv, ret, *, export: bool = True) -> None:
        """The per-turn table (``turn_df`` and the HTML); ``export``: also the export bar's CSV links."""
        src = self._ret_source()
        tt = self._sub.turns(advantages=adv, returns={src: ret} if ret is not None else None)
        ov = plots.learned_and_oracle(self._sub)
        if ov is not None and len(tt):  # the critic beside the exact value of each turn's state
            tt["oracle_first"] = ov[0, tt["start"].to_numpy()]
            tt["critic_err"] = tt["value_first"] - tt["oracle_first"]
        cols = [c for c in tt.columns if c not in ("traj_id", "row")]
        self.turn_df = tt[cols]
        # a light table: at most MAX_TURN_ROWS rows in the page (the full table is ``turn_df`` / CSV)
        shown = self.turn_df.head(MAX_TURN_ROWS)
        more = (
            f"<p class='mpo-note'>first {MAX_TURN_ROWS} of {len(self.turn_df):,} turns; all of them in the CSV</p>"
            if len(self.turn_df) > MAX_TURN_ROWS
            else ""
        )
        self.turns.value = frame_html(shown) + more
        if export:
            self.export.set_tables(self.tables())

    def _update_tokens(self, adv, *, batch_wide: bool) -> None:
        """With a token truth: the per-token table of the trajectory's measured tokens (``token_df``: the
        truth ± 1.96·se, its within-turn part, each estimator's credit and within-turn part) and, with
        ``batch_wide``, the within-turn accuracy over the whole batch (``token_accuracy_df``), saying which
        truth they use."""
        if not self.has_token_truth:
            return
        self.token_df = an.token_truth_table(self._sub, {k: a for k, a in adv.items()})
        if batch_wide:
            self.token_accuracy_df = an.mc_token_accuracy(self.batch, self._adv())
        acc = self.token_accuracy_df
        cols = [
            "estimator",
            "tok_corr",
            "tok_corr_dis",
            "within_corr",
            "within_corr_dis",
            "unc_share",
            "unc_share_truth",
            "sign_agreement",
            "slope_credit_on_truth_dis",
            "slope_truth_on_credit",
            "within_note",
            "note",
        ]
        truth = an.token_truth_text(
            self.batch.meta.get("mc_truth") if isinstance(self.batch.meta.get("mc_truth"), dict) else None
        )
        self.tokens_view.value = (
            f"<p class='mpo-note'><b>Truth used</b>: {html.escape(truth)}. Bars under the strip's measured tokens and "
            "the <i>true advantage</i> channel show it.</p>"
            f"<b>measured tokens of {html.escape(self.batch.traj_ids[self.row])}</b>"
            + frame_html(self.token_df)
            + "<b>within-turn credit against the token truth, whole batch</b> (the columns of "
            "credit_accuracy(..., truth='mc-token'); flat credit scores 0 within turns by construction)"
            + frame_html(acc[[c for c in cols if c in acc.columns]] if acc is not None else pd.DataFrame())
        )

    def tables(self) -> dict:
        """The view's tables as DataFrames: ``turns`` (the current trajectory's per-turn table) and
        ``trajectories`` (the picker's table); with a token truth also ``tokens_<traj_id>`` (its measured
        tokens) and ``accuracy_tokens`` (the within-turn accuracy over the batch)."""
        tid = self.batch.traj_ids[self.row]
        out = {f"turns_{tid}": self.turn_df, "trajectories": self.picker.table.drop(columns=["row"])}
        if self.token_df is not None:
            out[f"tokens_{tid}"] = self.token_df
        if self.token_accuracy_df is not None:
            out["accuracy_tokens"] = self.token_accuracy_df
        return out

    def figures(self) -> dict:
        """The view's figures (``{name: figure}``)."""
        return {f"value_curve_{self.batch.traj_ids[self.row]}": self.figure} if self.figure is not None else {}

    def _status(self) -> None:
        """The header: what is shown and with which options. The time given is the kernel's share
        only (recompute + building what is sent); the browser's drawing comes after it and is
        measured by ``benchmarks/widgets.py``, so the header does not claim an end-to-end time."""
        ran = "; ".join(f"<b>{k}</b> {opts_text(self.engine.options_for(k, self.params.options))}" for k in self.names)
        ms = sum(self.timings.values()) * 1000
        self.status.value = (
            f"<b>{self.batch.traj_ids[self.row]}</b> (row {self.row}) · ran with: {ran or '—'}"
            f" · <span title='kernel-side time of the last update until this header (recompute "
            f"and payloads; a slider move refreshes the export bar's CSV links after it); the "
            f"browser draws after it'>kernel {ms:.0f} ms</span>" + _noise_html(self.batch, self.names)
        )

    # --- parameters -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the view; shared ``params`` stop calling it (they may live on in another view). Safe on a
        view whose construction raised (ipywidgets closes it when it is collected)."""
        params = getattr(self, "params", None)
        if params is not None:
            params.off(self._params_changed)
        super().close()

    def _params_changed(self, options: dict) -> None:
        # Sent in the order the browser takes longest over: the value curve first (plotly's redraw
        # is most of a move's time in the browser; it starts while the kernel builds the rest),
        # then the strip's patch, the picker's column, the per-turn table and the header.
        t0 = time.perf_counter()
        self.results = self.engine.compute(options)
        ran = set(self.engine.ran)  # the estimators whose options changed; the others kept their tensors
        adv, ret = self._row_arrays()
        t1 = time.perf_counter()
        if self.figure is not None:
            act = self._sub.mask[0, : self._n].numpy() != 0
            src = self._ret_source()
            with self.figure.batch_update():  # one message: the traces whose numbers changed
                for tr in self.figure.data:
                    if tr.name and tr.name.startswith("A (") and tr.name[3:-1] in adv and tr.name[3:-1] in ran:
                        self._set_line(tr, *plots.line_points(adv[tr.name[3:-1]][0], act))
                    elif tr.name == "return" and ret is not None and src in ran:
                        self._set_line(tr, *plots.line_points(ret[0], act))
        t2 = time.perf_counter()
        # the strip: only the channels of the estimators that ran (and every advantage channel's
        # colour scale, which "shared" takes from all of them) go to the browser, as a patch
        chans = changed_channels(self._sub, adv, ran)
        t3 = time.perf_counter()
        patch_strips([self.strip], chans, self._apply_scale)
        t4 = time.perf_counter()
        if "disagree" in self.picker.table.columns and ran:
            self.picker.set_column("disagree", self._disagreement(self._adv()))
        t5 = time.perf_counter()
        self._update_turns(adv, ret, export=False)
        self._update_tokens(adv, batch_wide=bool(ran))
        self.timings = {
            "compute": t1 - t0,
            "figure": t2 - t1,
            "payload": t3 - t2,
            "push": t4 - t3,
            "picker": t5 - t4,
            "turn_table": time.perf_counter() - t5,
        }
        self._status()
        # the export bar's CSV links last: they are not what a move shows, so they come after the
        # header (its "kernel N ms" is the time until then; ``timings["export"]`` has their share)
        t6 = time.perf_counter()
        self.export.set_tables(self.tables())
        self.timings["export"] = time.perf_counter() - t6

    @staticmethod
    def _set_line(tr, x, y) -> None:
        """Set a trace's points; ``x`` only when it differs (below ``MAX_LINE_POINTS`` tokens it is
        the token positions, the same for every option setting), so a slider move sends ``y`` alone."""
        if tr.x is None or len(tr.x) != len(x) or not np.array_equal(np.asarray(tr.x), x):
            tr.x = x
        tr.y = y

    def _rescale(self) -> None:
        patch_strips([self.strip], {}, self._apply_scale)  # the new scales: a patch of channel info

    def _apply_scale(self, payloads) -> None:
        self.scale.apply(payloads)
        for p in [payloads] if isinstance(payloads, dict) else payloads:
            _truth_scale(p)

    # --- static snapshot ---------------------------------------------------------------------------------
    def snapshot(self, snap: Snapshot | None = None) -> Snapshot:
        snap = snap or Snapshot(f"mpo_viz explorer: {self.batch.traj_ids[self.row]}")
        snap.heading(f"trajectory {self.batch.traj_ids[self.row]} (row {self.row})")
        snap.kv([(f"{k} ran with", opts_text(self.engine.options_for(k, self.params.options))) for k in self.names])
        snap.strip(self.strip.payload_dict, self.strip.height)
        if self.figure is not None:
            snap.figure(self.figure)
        snap.heading("per-turn table", 3).table(self.turn_df)
        if self.token_df is not None:
            snap.heading("measured tokens (the policy's token truth)", 3).table(self.token_df)
        if self.token_accuracy_df is not None:
            snap.heading("within-turn credit against the token truth (whole batch)", 3).table(self.token_accuracy_df)
        return snap

    def to_html(self, path=None) -> str:
        """A static, self-contained HTML page of the current view (the picker's current page, the
        strip, the value curve, the per-turn table). With ``path``: also written there."""
        snap = Snapshot(f"mpo_viz explorer: {self.batch.traj_ids[self.row]}")
        snap.heading("trajectories (current page of the picker)")
        t = self.picker.table.set_index("row").loc[self.picker.page_rows].reset_index()
        snap.table(t)
        self.snapshot(snap)
        return snap.output(path)


def _truth_scale(payload: dict) -> None:
    """The strip's ``truth`` channel on the colour scale of its advantage channels (the first one's), so
    that its marks and colours read on the credit's scale."""
    info = payload.get("channel_info", {})
    if TRUTH_CHANNEL not in payload.get("channels", {}):
        return
    adv = next((k for k in payload["channels"] if k.startswith("adv_")), None)
    if adv is not None:
        set_scale(payload, [TRUTH_CHANNEL], info[adv].get("scale"), info[adv].get("scale_note", ""))


def _noise_html(batch, names) -> str:
    """The header's warning when the critic-based estimators among ``names`` run on values that are
    noise (:func:`mpo_viz.analysis.values_are_noise`), else ``""``."""
    noise = an.values_are_noise(batch)
    based = an.critic_based(names)
    if not noise or not based:
        return ""
    return (
        f"<br><b style='color:#c0661f'>NOISE: {html.escape(', '.join(based))}</b> — {html.escape(noise)}; "
        "their credit is not to be read as credit"
    )
