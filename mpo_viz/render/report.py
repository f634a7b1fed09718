"""One self-contained HTML report that opens offline: plotly.js and the token strip are inlined
(no CDN, no network), data are inline JSON.

Contents: a summary table (batch size, across/within statistics of the critic values, critic
quality, per-estimator advantage statistics), the estimator-comparison table, the across/within
figure, and for a selection of trajectories (best, worst, most disagreed-on) the token strip, the
value curve and the per-turn advantages of every estimator.

The input streams: :func:`build_report` accepts a path (read chunk by chunk with
:func:`mpo_viz.data.io.scan`, memory bounded by the chunk size plus the selected trajectories) or a
TrajectoryBatch. Group estimators need each group's rows in one chunk: the file is scanned with
``keep_groups=True``.
"""

from __future__ import annotations

import datetime as _dt
import heapq
import html
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from mpo_viz import analysis as an
from mpo_viz.advantages import registry
from mpo_viz.data.io import count_rows, scan
from mpo_viz.data.moments import ExplainedVariance
from mpo_viz.data.token_text import tokenizer_decoder
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.doctor import Doctor, Finding
from mpo_viz.render import plots
from mpo_viz.render.export import static_export_available, write_figures, write_tables
from mpo_viz.render.page import (
    figure_html,
    format_value,
    html_table,
    page_html,
    strip_html,
    write_page,
)
from mpo_viz.render.strip import (
    TRUTH_CHANNEL,
    robust_scale,
    set_scale,
    strip_payload,
    within_turn_part,
)
from mpo_viz.version import __version__

__all__ = ["ReportConfig", "build_report", "write_report", "ExportWarning", "LeftOutNote"]


@dataclass
class ReportConfig:
    """Everything :func:`build_report` takes besides the data (one flat config)."""

    estimators: tuple[str, ...] | None = None
    """estimator names; None: those of ``mpo_viz.advantages.DEFAULT_ESTIMATORS`` (mpo, gae, grpo)
    that the data supports."""
    options: dict = field(default_factory=dict)
    """options shared by the estimators (``gamma``, ``lam``, ``beta``, ...; declared in
    :mod:`mpo_viz.advantages.registry`): each estimator takes those it accepts, one that none of
    them takes is an error."""
    n_best: int = 2
    """trajectories with the highest score to show."""
    n_worst: int = 2
    """trajectories with the lowest score to show."""
    n_disagreed: int = 2
    """trajectories where the estimators disagree most on turn signs."""
    title: str = "mpo_viz report"
    """page title."""
    max_tokens: int = 1_000_000
    """chunk size (response tokens) when streaming a file."""
    max_points: int = 5000
    """most points in the across/within scatter."""
    strip_height: int = 320
    """pixel height of each token strip."""
    progress: bool | None = None
    """tqdm progress bar on stderr (None: only on a terminal)."""
    tokenizer: str | None = None
    """a local tokenizer folder (or ``tokenizer.json``): decode ``response_ids`` into the strips'
    text when the data has no ``response_tokens`` (loaded offline; nothing is downloaded)."""
    export_dir: str | None = None
    """also write every table of the report as CSV into this folder, and every figure as PNG and
    SVG when plotly's static renderer (``kaleido``) is installed (else a warning says so)."""


# ------------------------------------------------------------------------------------------------
# streaming accumulation


@dataclass
class _Pick:
    key: float
    order: int
    batch: TrajectoryBatch  # one row
    adv: dict  # name -> (1, L) numpy
    ret: dict


@dataclass
class _Acc:
    """What the streaming pass keeps: counts, the mergeable statistics of :mod:`mpo_viz.analysis`
    (each merged chunk by chunk, finished once in :func:`_render`), and the selected trajectories."""

    estimators: list
    n_best: int
    n_worst: int
    n_disagreed: int
    n_traj: int = 0
    n_tokens: int = 0
    n_action: int = 0
    n_rejected: int = 0
    vv: pd.DataFrame | None = None  # analysis.value_variance, merged
    adv: dict | None = None  # analysis.advantage_stats, merged
    cmp: dict | None = None  # analysis.compare_stats, merged
    ev: ExplainedVariance = field(default_factory=ExplainedVariance)
    ev_source: str | None = None
    best: list = field(default_factory=list)
    worst: list = field(default_factory=list)
    disagreed: list = field(default_factory=list)
    order: int = 0
    timings: dict = field(default_factory=dict)
    scores: dict = field(default_factory=dict)  # score (rounded) -> number of trajectories
    accuracy: dict | None = None  # merged analysis.accuracy_stats (oracle columns present)
    mc_parts: list = field(default_factory=list)  # analysis.mc_accuracy_parts per chunk (mc_* truth present)
    mc_meta: dict | None = None  # the mc_truth metadata of the file (policy, M, seed)
    mc_token_parts: list = field(default_factory=list)  # analysis.mc_token_accuracy_parts per chunk (token truth)
    values_source: str = "critic"
    n_compared: int = 0  # trajectories with a disagreement value (>= 2 estimators)
    left_out: str | None = None  # default estimators the data cannot run, and how to get them
    critic_fit: dict | None = None  # the values' fit record when they come from mpo-viz fit-critic
    noise: str | None = None  # why the values are noise (analysis.values_are_noise), if they are
    max_turns: int = 0  # the most turns of any trajectory (the verdicts' minimum of data)

    def _push(self, heap: list, n: int, key: tuple, group, make) -> None:
        """Keep the largest keys (ties: earliest row first), at most ``n`` per group, in a min-heap
        of (key, -order, group, pick): ``n`` plus as many as the other selections take, so that
        :meth:`picks` can choose trajectories of distinct groups across them."""
        cap = n + self.n_best + self.n_worst + self.n_disagreed if n > 0 else 0
        if cap <= 0 or not math.isfinite(key[0]):
            return
        item = (key, -self.order)
        same = [j for j, h in enumerate(heap) if h[2] == group]
        if len(same) >= n:  # the group has its share: replace its weakest candidate if this one is better
            j = min(same, key=lambda k: heap[k][:2])
            if item > heap[j][:2]:
                heap[j] = (*item, group, make())
                heapq.heapify(heap)
            return
        if len(heap) < cap:
            heapq.heappush(heap, (*item, group, make()))
        elif item > heap[0][:2]:
            heapq.heapreplace(heap, (*item, group, make()))

    def add(self, chunk: TrajectoryBatch, results: dict) -> None:
        t0 = time.perf_counter()
        self.n_traj += len(chunk)
        self.n_tokens += int(chunk.lengths.sum())
        self.n_action += int(chunk.mask.sum())
        self.max_turns = max(self.max_turns, int(chunk.num_turns.max()) if len(chunk) else 0)
        adv = {k: r.advantages.detach().cpu().numpy() for k, r in results.items()}
        ret = {k: r.returns.detach().cpu().numpy() for k, r in results.items()}
        self._add_statistics(chunk, adv, ret)
        dis = an.disagreement(chunk, adv) if len(adv) >= 2 else np.full(len(chunk), np.nan)
        self._add_picks(chunk, adv, ret, dis)
        self.timings["accumulate"] = self.timings.get("accumulate", 0.0) + time.perf_counter() - t0

    def _add_statistics(self, chunk: TrajectoryBatch, adv: dict, ret: dict) -> None:
        """Merge the chunk's statistics (values' across/within, explained variance, advantages,
        agreement, accuracy) into the running ones."""
        if chunk.values is not None:
            self.vv = an.merge_variance(self.vv, an.value_variance(chunk))
            src = registry.returns_source(ret)
            if src is not None:
                self.ev_source = src
                self.ev = self.ev.merge(ExplainedVariance.of(ret[src], chunk.values, chunk.mask))
        self.adv = an.merge_advantage_stats(self.adv, an.advantage_stats(chunk, adv))
        self.values_source = an.values_source(chunk)
        if chunk.values is not None:
            self.critic_fit = an.fitted_critic(chunk)
            self.noise = an.values_are_noise(chunk)
        if adv and an.has_oracle(chunk):
            self.accuracy = an.merge_accuracy_stats(self.accuracy, an.accuracy_stats(chunk, adv))
        if adv and an.has_mc_truth(chunk):
            self.mc_parts.append(an.mc_accuracy_parts(chunk, adv, use_q=chunk.has("mc_q")))
        if adv and an.has_mc_token_truth(chunk):
            self.mc_token_parts.append(an.mc_token_accuracy_parts(chunk, adv))
        if adv and (self.mc_parts or self.mc_token_parts):
            self.mc_meta = chunk.meta.get("mc_truth") if isinstance(chunk.meta.get("mc_truth"), dict) else None
        if len(adv) >= 2:
            self.cmp = an.merge_compare_stats(self.cmp, an.compare_stats(chunk, adv))

    def _add_picks(self, chunk: TrajectoryBatch, adv: dict, ret: dict, dis: np.ndarray) -> None:
        """Offer each trajectory of the chunk to the best / worst / most disagreed-on selections."""
        mask = chunk.mask.numpy() != 0
        score = chunk.padded("rewards").numpy().astype(np.float64).sum(axis=1)
        groups = chunk.group_ids
        for i in range(len(chunk)):
            self.order += 1

            def make(i=i):
                L = int(chunk.lengths[i])
                # copies: a view would keep the chunk's whole (B, L) arrays alive as long as the pick
                return _Pick(
                    0.0,
                    self.order,
                    chunk[[i]],
                    {k: a[i : i + 1, :L].copy() for k, a in adv.items()},
                    {k: g[i : i + 1, :L].copy() for k, g in ret.items()},
                )

            if not mask[i].any():
                continue
            sc = round(float(score[i]), 9)
            self.scores[sc] = self.scores.get(sc, 0) + 1
            # ties on the score (0/1 rewards: most of the batch) are broken by the estimators'
            # disagreement, the trajectory most worth a look among equals
            d = float(dis[i]) if math.isfinite(dis[i]) else -math.inf
            self.n_compared += math.isfinite(dis[i])
            g = groups[i]
            self._push(self.best, self.n_best, (sc, d), g, make)
            self._push(self.worst, self.n_worst, (-sc, d), g, make)
            if dis[i] > 0:  # nothing to show where every estimator agrees on every turn's sign
                self._push(self.disagreed, self.n_disagreed, (float(dis[i]),), g, make)

    def picks(self) -> list[tuple[list[str], _Pick]]:
        """Selected trajectories in display order, each once, with labels that say why it was chosen.

        "best" / "worst" are the highest / lowest scores; where several trajectories share that
        score (0/1 rewards), the one the estimators disagree on most (share of turn signs that
        differ) is taken, and the label says so and how many tied — or, when no tied trajectory has
        a turn sign the estimators disagree on, that there was nothing to rank by. When every
        trajectory has the same score there is no best or worst: the largest disagreements are
        shown instead. The selections span groups: each takes trajectories of groups not shown yet
        first (the G samples of one task are alike), and a group already shown only when too few
        groups are left.
        """
        out: dict[str, tuple[list[str], _Pick]] = {}
        one_score = len(self.scores) == 1
        lists = (
            [("same score", self.best, self.n_best, 1), ("most disagreed-on", self.disagreed, self.n_disagreed, 1)]
            if one_score
            else [
                ("best", self.best, self.n_best, 1),
                ("worst", self.worst, self.n_worst, -1),
                ("most disagreed-on", self.disagreed, self.n_disagreed, 1),
            ]
        )
        shown: set = set()
        for tag, heap, n, sign in lists:
            ranked = sorted(heap, key=lambda h: (h[0], h[1]), reverse=True)
            chosen: list = []
            while len(chosen) < min(n, len(ranked)):  # the best of a group not shown yet, else the best left
                h = next((h for h in ranked if h[2] not in shown and h not in chosen), None) or next(
                    h for h in ranked if h not in chosen
                )
                chosen.append(h)
                shown.add(h[2])
            for key, _neg, _group, pick in sorted(chosen, key=lambda h: (h[0], h[1]), reverse=True):
                label = self._label(tag, key, sign)
                tid = pick.batch.traj_ids[0]
                if tid in out:
                    out[tid][0].append(label)
                else:
                    out[tid] = ([label], pick)
        return [(tags, p) for tags, p in out.values()]

    def _label(self, tag: str, key: tuple, sign: int) -> str:
        """Why a trajectory was selected (:meth:`picks`)."""
        if tag == "most disagreed-on":
            return f"{tag} ({key[0]:.0%} of turn signs differ)"
        if tag == "same score":
            n = self.scores[round(key[0], 9)]
            if n <= 1:
                return f"the only trajectory (score {key[0]:.4g})"
            return f"every trajectory scores {key[0]:.4g}, so none is best or worst: chosen by {self._how(key[1])}"
        sc = sign * key[0]
        tied = self.scores.get(round(sc, 9), 1)
        label = f"{'highest' if tag == 'best' else 'lowest'} score {sc:.4g}"
        if tied > 1:
            label += f", shared by {tied:,} trajectories: chosen by {self._how(key[1], ' among them')}"
        return label

    @staticmethod
    def _how(d: float, among: str = "") -> str:
        """How a trajectory was chosen among equal scores, from its disagreement ``d``."""
        if not math.isfinite(d):
            return "the first in the data (one estimator: no disagreement to rank by)"
        if d <= 0:
            return (
                "the first in the data from a group not shown yet: there was nothing to rank by (the estimators "
                "agree on the sign of each of its turns: 0% differ)"
            )
        return f"the largest estimator disagreement{among} ({d:.0%} of turn signs differ)"


# ------------------------------------------------------------------------------------------------
# building the page


def _iter_source(source, cfg: ReportConfig):
    if isinstance(source, (str, Path)):
        return scan(source, max_tokens=cfg.max_tokens, keep_groups=True)
    return iter([source])


def _first_chunk_estimators(batch: TrajectoryBatch, requested) -> list[str]:
    if requested:
        return list(registry.parse_names(requested))  # unknown names raise, listing the available ones
    return registry.default_estimators(batch)


class LeftOutNote(UserWarning):
    """Default estimators the report left out because the data lacks what they need (said once,
    with how to get it; the page's summary says it too)."""


def _left_out(batch: TrajectoryBatch, requested, source_name: str) -> str | None:
    """Which of the default estimators the batch cannot run, and how to make it able to, or None
    (named estimators that cannot run raise instead, saying what they need)."""
    if requested:
        return None
    lacking = {n: registry.missing(batch, n) for n in registry.DEFAULT_ESTIMATORS}
    lacking = {n: lacks for n, lacks in lacking.items() if lacks}
    if not lacking:
        return None
    names = ", ".join(lacking)
    if all(lacks == ["values"] for lacks in lacking.values()):
        return (
            f"{names} left out: they need critic values, and {source_name} has none. Fit a critic to its returns "
            f"and report again: mpo-viz fit-critic {source_name} -o with_values.parquet && mpo-viz report "
            "with_values.parquet"
        )
    need = "; ".join(
        f"{n} needs {', '.join(registry.NEED_TEXT.get(x, x) for x in lacks)}" for n, lacks in lacking.items()
    )
    return f"{names} left out: {need}"


def _progress(total, cfg: ReportConfig, unit: str, desc: str):
    disable = None if cfg.progress is None else not cfg.progress
    return tqdm(total=total, unit=unit, desc=desc, disable=disable, leave=False, dynamic_ncols=True)


def _count_rows(source) -> int | None:
    return count_rows(source) if isinstance(source, (str, Path)) else len(source)


def build_report(source, config: ReportConfig | None = None, *, source_name: str | None = None) -> str:
    """The report's HTML text. ``source``: a path (``.jsonl``, ``.parquet``, folder), which **streams**
    (chunk by chunk, memory set by ``config.max_tokens``, statistics of the whole input), or a batch."""
    cfg = config or ReportConfig()
    opts = {k: v for k, v in cfg.options.items() if v is not None}
    t_start = time.perf_counter()
    decode = tokenizer_decoder(cfg.tokenizer) if cfg.tokenizer else None  # a bad folder fails before any work
    acc = None
    names: list[str] = []
    doctor = Doctor()  # the doctor's numbers chunk by chunk: the findings of the whole file
    bar = _progress(_count_rows(source), cfg, "traj", "report")
    try:
        for chunk in _iter_source(source, cfg):
            if acc is None:
                names = _first_chunk_estimators(chunk, cfg.estimators)
                acc = _Acc(names, cfg.n_best, cfg.n_worst, cfg.n_disagreed)
                acc.left_out = _left_out(chunk, cfg.estimators, source_name or "FILE")
                if acc.left_out:
                    warnings.warn(acc.left_out, LeftOutNote, stacklevel=2)
            t0 = time.perf_counter()
            results = an.compute_advantages(chunk, names, **opts)
            acc.timings["estimators"] = acc.timings.get("estimators", 0.0) + time.perf_counter() - t0
            acc.n_rejected += len(getattr(chunk, "rejected", []) or [])
            doctor.add(chunk)
            acc.add(chunk, results)
            bar.update(len(chunk))
    finally:
        bar.close()
    if acc is None:
        raise ValueError(f"{source_name or source}: no trajectories to report on")
    return _render(
        acc,
        cfg,
        opts,
        source_name or (str(source) if isinstance(source, (str, Path)) else "batch"),
        time.perf_counter() - t_start,
        decode,
        doctor.findings(),
    )


def write_report(source, path, config: ReportConfig | None = None) -> Path:
    """Write :func:`build_report` to ``path`` (temporary name, then rename). Returns the path."""
    text = build_report(source, config, source_name=str(source) if isinstance(source, (str, Path)) else None)
    return write_page(path, text)


# ------------------------------------------------------------------------------------------------
# the page, section by section


@dataclass
class _Page:
    """The page being built: its HTML parts, the tables and figures it shows (for ``export_dir``)
    and the ids of its figures (for the page's export links)."""

    parts: list = field(default_factory=list)
    tables: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    figure_ids: list = field(default_factory=list)

    def figure(self, fig, div_id: str, name: str) -> None:
        self.parts.append(figure_html(fig, div_id))
        self.figure_ids.append(div_id)
        self.figures[name] = fig


def _render(
    acc: _Acc,
    cfg: ReportConfig,
    opts: dict,
    source_name: str,
    wall: float,
    decode=None,
    findings: list[Finding] | None = None,
) -> str:
    t0 = time.perf_counter()
    page = _Page()
    vv = acc.vv
    _doctor(page, findings or [])
    _summary(page, acc, opts, source_name, vv)
    _estimator_tables(page, acc)
    _accuracy(page, acc)
    if vv is not None and len(vv):
        f = plots.across_within(vv, max_points=cfg.max_points, source=acc.values_source)
        page.parts.append(f"<h2>Values ({html.escape(acc.values_source)}): across vs within turns</h2>")
        page.figure(f, "fig-across-within", "across_within")
        page.tables["value_variance"] = vv
    _selected(page, acc, cfg, decode)
    export_note = _export(cfg.export_dir, page.tables, page.figures) if cfg.export_dir else ""
    render_s = time.perf_counter() - t0
    timing = ", ".join(f"{k} {v:.2f}s" for k, v in {**acc.timings, "render": render_s}.items())
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    foot = (
        f"<footer>mpo_viz {html.escape(__version__)} · generated {stamp} in {wall + render_s:.1f}s "
        f"({html.escape(timing)}) · self-contained: opens offline{html.escape(export_note)}</footer>"
    )
    return page_html(cfg.title, "\n".join(page.parts), footer=foot, figure_ids=page.figure_ids)


def _doctor(page: _Page, findings: list[Finding]) -> None:
    """The doctor's findings (:mod:`mpo_viz.doctor`, docs/doctor.md) first: those that fired, or one
    line saying none did."""
    fired = [f for f in findings if f.fired]
    rows = [(f.check, f.source, f.rows_hit, ", ".join(f.examples), f.detail, f.fix) for f in fired]
    ran = sum(f.status != "skipped" for f in findings)
    head = (
        f"<p>{len(fired)} of {ran} checks that could run fired (over the whole file, as "
        "<code>mpo-viz doctor FILE</code> finds them; the doctor also reads a run folder's metrics and "
        "each file's iteration).</p>"
    )
    table = (
        html_table(rows, ("check", "from", "rows hit", "example ids", "measured", "what to fix"), cls="grid")
        if rows
        else ""
    )
    page.parts.append("<h2 id=doctor>Doctor</h2>" + head + table)
    page.tables["doctor"] = pd.DataFrame([f.to_dict() for f in findings])


def _summary(page: _Page, acc: _Acc, opts: dict, source_name: str, vv: pd.DataFrame | None) -> None:
    """The summary table: sizes, the values' across/within statistics and the critic's explained
    variance against the returns of :func:`mpo_viz.advantages.returns_source`."""
    summary = [
        ("source", source_name),
        ("trajectories", acc.n_traj),
        ("response tokens", acc.n_tokens),
        ("action tokens", acc.n_action),
        ("estimators", ", ".join(acc.estimators) or "none"),
        *([("estimators left out", acc.left_out)] if acc.left_out else []),
        ("shared options", json.dumps(opts) if opts else "defaults"),
    ]
    if acc.n_rejected:
        summary.append(("rejected rows", acc.n_rejected))
    if vv is not None:
        s = an.variance_summary(vv)
        share = s["share_across_gt_within"]
        summary += [
            ("value across-turn variance (mean)", s["mean_across"]),
            ("value within-turn variance (mean)", s["mean_within"]),
            ("median across / within", s["median_ratio"]),
            ("share with across > within", f"{share:.1%}" if not math.isnan(share) else "—"),
            ("infinite ratios (within = 0)", s["n_inf_ratio"]),
            (
                "length-weighted across / within (means)",
                f"{format_value(s['mean_across_w'])} / {format_value(s['mean_within_w'])}",
            ),
        ]
        if acc.ev.n > 1:
            where = (
                " — in-sample: over all of this data, the critic's own training part included"
                if acc.critic_fit is not None
                else ""
            )
            summary += [
                (
                    f"explained variance of the values ({acc.values_source}) vs {acc.ev_source} returns{where}",
                    acc.ev.value,
                ),
                ("value bias mean(V − G)", acc.ev.bias),
            ]
        if acc.critic_fit is not None:
            summary.append(("values from", _fitted_text(acc.critic_fit)))
        if acc.noise:
            critic_based = an.critic_based(acc.estimators)
            summary.append(
                (
                    "critic-based credit",
                    f"NOISE: {acc.noise}; "
                    + (f"{', '.join(critic_based)} not ranked" if critic_based else "no estimator here uses it"),
                )
            )
    else:
        summary.append(("critic values", "absent: no across/within diagnostic"))
    page.parts.append("<h2>Summary</h2>" + html_table(summary))
    page.tables["summary"] = pd.DataFrame(summary, columns=["quantity", "value"])


def _estimator_tables(page: _Page, acc: _Acc) -> None:
    """Advantages by estimator, and the agreement of every pair of estimators."""
    if acc.estimators:
        table = an.finish_advantages(acc.adv or {}, acc.estimators)
        rows = [tuple(r) for r in table.itertuples(index=False)]
        page.parts.append(
            "<h2>Advantages by estimator</h2>"
            + _fitted_note(acc)
            + html_table(rows, an.ADVANTAGE_COLUMNS, "grid", csv="advantages_by_estimator")
        )
        page.tables["advantages_by_estimator"] = table
    if acc.cmp:
        cmp = an.finish_compare(acc.cmp)
        page.tables["estimator_agreement"] = cmp
        page.parts.append(
            "<h2>Estimator agreement</h2><p class=note>Per pair of estimators: Pearson correlation and "
            "sign agreement over action tokens and over turns (turn advantage = mean over the turn); rank "
            "agreement = share of concordant turn pairs within a trajectory; sign flips = turns with "
            "opposite signs.</p><p class=note>sign_agreement counts <i>tokens</i> (0 being its own sign); "
            "the other tokens are sign_opposite (strictly opposite signs) or sign_one_zero (exactly one of "
            "the two is 0, e.g. a group estimator in a group whose episodes all score alike): the three add "
            "up to 1. n_sign_flips counts <i>turns</i> whose turn means have strictly opposite signs, so a "
            "low sign_agreement beside n_sign_flips = 0 is no contradiction: the tokens that disagree are "
            "against a 0, or inside turns whose means agree.</p>"
            + html_table(
                [tuple(r) for r in cmp.itertuples(index=False)], tuple(cmp.columns), "grid", csv="estimator_agreement"
            )
        )


def _fitted_text(info: dict) -> str:
    """The summary's line on values from ``mpo-viz fit-critic`` (its ``critic_fit`` record)."""

    def num(k):
        v = info.get(k)
        return f"{float(v):.3g}" if isinstance(v, (int, float)) else "?"

    return (
        f"a critic fitted to this data's own returns (mpo-viz fit-critic; target {info.get('target', '?')}, "
        f"{info.get('steps', '?')} steps, {info.get('n_heldout', '?')} held-out trajectories): held-out "
        f"explained variance {num('heldout_explained_variance')} (on trajectories it was not fitted to), "
        f"in-sample {num('train_explained_variance')} (on its training trajectories)"
    )


def _fitted_note(acc: _Acc) -> str:
    """A note beside the critic-based estimators when the values come from a fitted critic, a
    warning when the values are noise (:func:`mpo_viz.analysis.values_are_noise`)."""
    critic_based = an.critic_based(acc.estimators)
    if not critic_based or (acc.critic_fit is None and not acc.noise):
        return ""
    if acc.noise:
        return (
            f"<p class=warn><b>{html.escape(', '.join(critic_based))}: NOISE</b> — {html.escape(acc.noise)}. "
            "Their advantages below are the returns' noise pushed through that critic: the report does not rank "
            "them, and their strips are labelled so. The group estimators do not use the values.</p>"
        )
    ev = (acc.critic_fit or {}).get("heldout_explained_variance")
    ev_txt = f"{float(ev):.3g}" if isinstance(ev, (int, float)) else "?"
    return (
        f"<p class=note><b>{html.escape(', '.join(critic_based))}: values from a fitted critic (held-out EV "
        f"{html.escape(ev_txt)})</b> — a critic fitted by mpo-viz fit-critic to this data's returns, which "
        "explains that share of the variance of returns it was not trained on. The critic-based advantages are "
        "only as good as those values: near 0 (or below) the critic knows little beyond the mean, and these "
        "estimators' credit is mostly the returns' noise; the group estimators do not use it.</p>"
    )


def _with_verdict(ac: pd.DataFrame, acc: _Acc) -> pd.DataFrame:
    """The table with its ``verdict`` column (:func:`mpo_viz.analysis.ranked_column`): critic-based rows
    on values that are noise are not ranked, nor is anything when the truth is too noisy."""
    out = ac.copy()
    out.insert(1, "verdict", an.ranked_column(ac, noise=acc.noise, unranked=an.critic_based(acc.estimators)))
    return out


def _mc_accuracy(page: _Page, acc: _Acc) -> None:
    """Accuracy against the policy's own Monte-Carlo truth (the file's mc_* fields)."""
    ac = _with_verdict(an.finish_mc_accuracy(acc.mc_parts), acc)
    page.tables["accuracy_mc"] = ac
    meta = acc.mc_meta or {}
    who = f"{meta.get('policy', 'the policy')}, M = {meta.get('m', '?')} continuations per turn start"
    kind = (
        "Q̂ − V̂ (continuations after each recorded turn)"
        if ac["truth"].iloc[0] == "q-v"
        else "R_k + V̂(s_k+1) − V̂(s_k) (neighbouring Monte-Carlo values)"
    )
    legend = "".join(f"<li><b>{k}</b>: {html.escape(v)}</li>" for k, v in an.MC_ACCURACY_COLUMNS.items() if v)
    reading = an.mc_accuracy_reading(
        ac,
        "turn_corr_dis",
        "turn credit",
        noise=acc.noise,
        unranked=an.critic_based(acc.estimators),
        shortfall=an.data_shortfall(acc.n_traj, acc.scores, acc.max_turns),
    )
    page.parts.append(
        "<h2 id=accuracy>Accuracy against this policy's truth</h2>"
        f"<p class=reading>Truth used: the Monte-Carlo values of {html.escape(who)} (mpo-viz truth); "
        f"the true turn advantage is {html.escape(kind)}, reliability "
        f"{ac['reliability'].iloc[0]:.2f} over {int(ac['n_turns'].iloc[0])} turns. turn_corr_dis "
        f"corrects the correlation for the truth's own noise (withheld below reliability "
        f"{an.MIN_RELIABILITY}). {html.escape(reading)}</p>"
        + html_table([tuple(r) for r in ac.itertuples(index=False)], tuple(ac.columns), "grid", csv="accuracy_mc")
        + f"<ul class=note>{legend}</ul>"
    )


def _mc_token_accuracy(page: _Page, acc: _Acc) -> None:
    """Within-turn credit against the policy's token truth (the file's mc_tok_* fields)."""
    ac = _with_verdict(an.finish_mc_token_accuracy(acc.mc_token_parts), acc)
    page.tables["accuracy_mc_tokens"] = ac
    first = ac.iloc[0] if len(ac) else None
    if acc.mc_parts:
        centre = "the turn-level truth above (Â_k)"
    elif len(ac) and (ac["within_note"] == an.NO_TURN_NOTE).all():
        centre = "nowhere: the file has no turn-level truth, so the within-turn part is not scored"
    else:
        centre = "the sum of the turn's token truths (every token measured)"
    legend = "".join(f"<li><b>{k}</b>: {html.escape(v)}</li>" for k, v in an.MC_TOKEN_COLUMNS.items() if v)
    unranked = an.critic_based(acc.estimators)
    shortfall = an.data_shortfall(acc.n_traj, acc.scores, acc.max_turns)
    reading = " ".join(
        an.mc_accuracy_reading(ac, col, what, noise=acc.noise, unranked=unranked, shortfall=shortfall)
        for col, what in (("tok_corr_dis", "token credit"), ("within_corr_dis", "within-turn credit"))
    )
    stats = (
        ""
        if first is None
        else f" Reliability of the token truth {first['reliability']:.2f} over "
        f"{int(first['n_tokens'])} tokens in {int(first['n_turns'])} turns."
    )
    page.parts.append(
        "<h2 id=accuracy-tokens>Within-turn credit against this policy's token truth</h2>"
        f"<p class=reading>Truth used: {html.escape(an.token_truth_text(acc.mc_meta))} (mpo-viz truth "
        f"--tokens); a turn's true mean Â_k/n_k from {html.escape(centre)}.{html.escape(stats)} "
        "within_corr scores the credit's within-turn part (the credit minus its turn's mean): what a "
        "redistribution inside the turn adds over flat turn credit, which scores 0 here by "
        f"construction. {html.escape(reading)}</p>"
        + html_table(
            [tuple(r) for r in ac.itertuples(index=False)], tuple(ac.columns), "grid", csv="accuracy_mc_tokens"
        )
        + f"<ul class=note>{legend}</ul>"
    )


def _accuracy(page: _Page, acc: _Acc) -> None:
    """Accuracy against the policy's Monte-Carlo truth when the file carries it; against the
    expert's oracle when it has the oracle columns; or what would tell without either."""
    if acc.mc_parts:
        _mc_accuracy(page, acc)
    if acc.mc_token_parts:
        _mc_token_accuracy(page, acc)
    if not acc.accuracy:
        if not acc.mc_parts and not acc.mc_token_parts:
            page.parts.append(f"<h2 id=accuracy>Accuracy</h2><p class=note>{html.escape(an.NO_ORACLE_TEXT)}</p>")
        return
    ac = an.finish_accuracy(acc.accuracy)
    page.tables["accuracy"] = ac
    legend = "".join(f"<li><b>{k}</b>: {html.escape(v)}</li>" for k, v in an.ACCURACY_COLUMNS.items())
    reading = an.accuracy_reading(
        ac,
        acc.values_source,
        shortfall=an.data_shortfall(acc.n_traj, acc.scores, acc.max_turns),
        noise=acc.noise,
        unranked=an.critic_based(acc.estimators),
    )
    title = (
        "<h2 id=accuracy-expert>Accuracy against the scripted expert's oracle (biased for this policy)</h2>"
        if acc.mc_parts or acc.mc_token_parts
        else "<h2 id=accuracy>Accuracy against the oracle</h2>"
    )
    page.parts.append(
        title
        + f"<p class=reading>{html.escape(reading)}</p>"
        + html_table([tuple(r) for r in ac.itertuples(index=False)], tuple(ac.columns), "grid", csv="accuracy")
        + f"<ul class=note>{legend}</ul><p class=note>Over every turn and action token of the data, "
        "each estimator with the options above. The same measures over the shipped sets, many option "
        "settings and critic noise levels: <code>experiments/credit_accuracy.py</code> (docs/report.md "
        "explains its columns).</p>"
    )


def _selected(page: _Page, acc: _Acc, cfg: ReportConfig, decode) -> None:
    """The selected trajectories: each one's strip, value curve and per-turn advantages.

    One colour scale for every advantage channel of every strip (and one for the within-turn part
    of the multiscale estimator): the 99th percentile of |A| over the selected trajectories, the
    largest over estimators, so that the same number has the same colour whichever strip and
    channel shows it."""
    picks = acc.picks()
    s_adv = max((robust_scale(a, p.batch.mask) for _, p in picks for a in p.adv.values()), default=1.0)
    micro = registry.multiscale_estimator(acc.estimators)
    s_micro = (
        max(
            (
                robust_scale(within_turn_part(p.adv[micro], p.batch.mask, p.batch.turn_ids), p.batch.mask)
                for _, p in picks
            ),
            default=1.0,
        )
        if micro
        else 1.0
    )
    if picks:
        page.parts.append(
            "<h2>Selected trajectories</h2><p class=note>Hover a token to see every channel; the menu "
            "switches the colouring (diverging scale centred at 0; grey = observation tokens). Every "
            f"advantage channel of every strip saturates at the same ±{format_value(s_adv)} (the 99th "
            "percentile of |A| over these trajectories and estimators); tokens beyond it are clipped, "
            "marked ▲ and counted in the legend.</p>"
            + (_within_note(micro) if micro else "")
            + (_truth_note() if acc.mc_token_parts else "")
        )
    for j, (tags, p) in enumerate(picks):
        _trajectory(page, j, tags, p, acc, cfg, decode, (s_adv, s_micro))


def _truth_note() -> str:
    """How to read the token truth in the strips."""
    return (
        "<p class=note><b>True advantage</b>: a bar under each token the token truth measured is coloured by "
        "its true advantage Â_t on the colour scale of the credit shown (the same ±scale), and the hover gives "
        "Â_t ± 1.96·se; the channel <i>true advantage</i> colours the tokens by it. Where a token's colour and its "
        "bar differ, the estimator puts credit where this policy's truth does not.</p>"
    )


def _within_note(micro: str) -> str:
    """How to read the within-turn (centred) channel of the multiscale estimator."""
    return (
        f"<p class=note><b>Within-turn part (micro_{html.escape(micro)})</b>: each token's advantage minus its "
        "turn's mean, so it sums to 0 over every turn. It is relative credit inside the turn: a blue token was "
        "credited <i>more than the rest of its turn</i>, not credited in absolute terms — in a failed episode a "
        "wrong answer can be blue when the turn's other tokens were blamed more. Read it beside the turn's own "
        f"sign (adv_{html.escape(micro)}, or the per-turn advantages below).</p>"
    )


def _trajectory(
    page: _Page, j: int, tags: list, p: _Pick, acc: _Acc, cfg: ReportConfig, decode, scales: tuple[float, float]
) -> None:
    b = p.batch
    tid = b.traj_ids[0]
    page.parts.append(
        f'<section class="traj"><h3>{html.escape(tid)} <small>{html.escape(" · ".join(tags))}</small></h3>'
    )
    tokens = decode if decode is not None and not _has_tokens(b) else None
    payload = strip_payload(b, 0, advantages=p.adv, td=an.td_error(b), title=f"trajectory {tid}", tokens=tokens)
    set_scale(
        payload,
        [k for k in payload["channels"] if k.startswith("adv_") or k == TRUTH_CHANNEL],
        scales[0],
        "shared by the estimators and the selected trajectories",
    )
    set_scale(
        payload,
        [k for k in payload["channels"] if k.startswith("micro_")],
        scales[1],
        "shared by the selected trajectories",
    )
    page.parts.append(strip_html(f"strip-{j}", payload, cfg.strip_height, payload_id=f"payload-{j}"))
    if b.values is not None:
        ret = p.ret.get(acc.ev_source) if acc.ev_source else None
        page.figure(plots.value_curve(b, 0, advantages=p.adv, returns=ret), f"fig-value-{j}", f"value_curve_{tid}")
    if p.adv:
        page.figure(plots.estimator_comparison(b, 0, p.adv), f"fig-turns-{j}", f"turn_advantages_{tid}")
        page.tables[f"turns_{tid}"] = an.turn_table(b, p.adv)
    page.parts.append("</section>")


def _has_tokens(b: TrajectoryBatch) -> bool:
    return b.has("response_tokens") and b.field("response_tokens")[0] is not None


class ExportWarning(RuntimeWarning):
    """The report's ``export_dir`` wrote the tables but not the figures (no static renderer)."""


def _export(folder, tables: dict, figures: dict) -> str:
    """Write the report's tables as CSV and, with a renderer, its figures as PNG and SVG into
    ``folder``; returns a note for the footer. Without a renderer: an :class:`ExportWarning` that
    says what was written, what to install, and that the page's PNG / SVG links still work."""
    paths = write_tables(tables, folder)
    if static_export_available():
        paths += write_figures(figures, folder, ("png", "svg"))
        return f" · exported {len(paths)} files to {folder}"
    warnings.warn(
        f"export: wrote {len(paths)} tables as CSV to {folder}, but not the {len(figures)} figures: "
        "static figure export needs plotly's renderer, the 'kaleido' package (pip install kaleido). "
        "The report's PNG / SVG links under each figure export them from the browser without it.",
        ExportWarning,
        stacklevel=3,
    )
    return f" · exported {len(paths)} tables (CSV) to {folder}; figures: no static renderer (kaleido) installed"
