"""One self-contained HTML report that opens offline: plotly.js and the token strip are inlined
(no CDN, no network), data are inline JSON.

Contents: a summary table (batch size, across/within statistics of the critic values, critic
quality, per-estimator advantage statistics), the estimator-comparison table, the across/within
figure, and for a selection of trajectories (best, worst, most disagreed-on) the token strip, the
value curve and the per-turn advantages of every estimator.

The input streams: :func:`build_report` accepts a path (read chunk by chunk with
:func:`mpo_viz.io.scan`, memory bounded by the chunk size plus the selected trajectories) or a
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

from mpo_viz import analysis as an
from mpo_viz.io import count_rows, scan
from mpo_viz.version import __version__

__all__ = ["ReportConfig", "build_report", "write_report", "ExportWarning"]


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
    batch: object  # one-row TrajectoryBatch
    adv: dict  # name -> (1, L) numpy
    ret: dict


@dataclass
class _Acc:
    estimators: list
    n_best: int
    n_worst: int
    n_disagreed: int
    n_traj: int = 0
    n_tokens: int = 0
    n_action: int = 0
    n_rejected: int = 0
    vv: list = field(default_factory=list)
    adv_split: dict = field(default_factory=dict)  # name -> list of DataFrames (across/within)
    adv_mom: dict = field(default_factory=dict)  # name -> [n, Σa, Σa², Σ|a|]
    cmp: dict | None = None
    ev: np.ndarray = field(default_factory=lambda: np.zeros(5))  # n, Σg, Σg², Σ(g−v), Σ(g−v)²
    ev_source: str | None = None
    best: list = field(default_factory=list)
    worst: list = field(default_factory=list)
    disagreed: list = field(default_factory=list)
    order: int = 0
    timings: dict = field(default_factory=dict)
    scores: dict = field(default_factory=dict)  # score (rounded) -> number of trajectories
    accuracy: dict | None = None  # merged analysis.accuracy_stats (oracle columns present)
    values_source: str = "critic"
    n_compared: int = 0  # trajectories with a disagreement value (>= 2 estimators)
    left_out: str | None = None  # default estimators the data cannot run, and how to get them

    def _push(self, heap: list, n: int, key: tuple, make) -> None:
        """Keep the ``n`` largest keys (ties: earliest row first) in a min-heap of (key, -order)."""
        if n <= 0 or not math.isfinite(key[0]):
            return
        item = (key, -self.order)
        if len(heap) < n:
            heapq.heappush(heap, (*item, make()))
        elif item > heap[0][:2]:
            heapq.heapreplace(heap, (*item, make()))

    def add(self, chunk, results: dict) -> None:
        t0 = time.perf_counter()
        B = len(chunk)
        mask = chunk.mask.numpy() != 0
        self.n_traj += B
        self.n_tokens += int(chunk.lengths.sum())
        self.n_action += int(mask.sum())
        adv = {k: r.advantages.detach().cpu().numpy() for k, r in results.items()}
        ret = {k: r.returns.detach().cpu().numpy() for k, r in results.items()}
        if chunk.values is not None:
            self.vv.append(an.value_variance(chunk))
            src = next((k for k in ("mpo", "mae", "gae", "turn_gae", "vapo") if k in ret), None)
            if src is not None:
                self.ev_source = src
                g = ret[src][mask].astype(np.float64)
                d = g - chunk.values.numpy()[mask].astype(np.float64)
                self.ev += np.array([g.size, g.sum(), (g * g).sum(), d.sum(), (d * d).sum()])
        for k, a in adv.items():
            s = an.variance_split(a, chunk.mask, chunk.turn_ids)
            self.adv_split.setdefault(k, []).append(pd.DataFrame({"across": s["across"], "within": s["within"], "ratio": s["ratio"], "n_tokens": s["n_tokens"]}))
            av = a[mask].astype(np.float64)
            mo = np.array([av.size, av.sum(), (av * av).sum(), np.abs(av).sum()])
            self.adv_mom[k] = self.adv_mom.get(k, np.zeros(4)) + mo
        self.values_source = an.values_source(chunk)
        if adv and an.has_oracle(chunk):
            self.accuracy = an.merge_accuracy_stats(self.accuracy, an.accuracy_stats(chunk, adv))
        if len(adv) >= 2:
            self.cmp = an.merge_compare_stats(self.cmp, an.compare_stats(chunk, adv))
            dis = an.disagreement(chunk, adv)
        else:
            dis = np.full(B, np.nan)
        score = chunk.padded("rewards").numpy().astype(np.float64).sum(axis=1)
        for i in range(B):
            self.order += 1

            def make(i=i):
                L = int(chunk.lengths[i])
                return _Pick(0.0, self.order, chunk[[i]], {k: a[i : i + 1, :L] for k, a in adv.items()},
                             {k: g[i : i + 1, :L] for k, g in ret.items()})

            if not mask[i].any():
                continue
            sc = round(float(score[i]), 9)
            self.scores[sc] = self.scores.get(sc, 0) + 1
            # ties on the score (0/1 rewards: most of the batch) are broken by the estimators'
            # disagreement, the trajectory most worth a look among equals
            d = float(dis[i]) if math.isfinite(dis[i]) else -math.inf
            self.n_compared += math.isfinite(dis[i])
            self._push(self.best, self.n_best, (sc, d), make)
            self._push(self.worst, self.n_worst, (-sc, d), make)
            if dis[i] > 0:  # nothing to show where every estimator agrees on every turn's sign
                self._push(self.disagreed, self.n_disagreed, (float(dis[i]),), make)
        self.timings["accumulate"] = self.timings.get("accumulate", 0.0) + time.perf_counter() - t0

    def picks(self) -> list[tuple[list[str], _Pick]]:
        """Selected trajectories in display order, each once, with labels that say why it was chosen.

        "best" / "worst" are the highest / lowest scores; where several trajectories share that
        score (0/1 rewards), the one the estimators disagree on most (share of turn signs that
        differ) is taken, and the label says so and how many tied. When every trajectory has the
        same score there is no best or worst: the largest disagreements are shown instead.
        """
        out: dict[str, tuple[list[str], _Pick]] = {}
        one_score = len(self.scores) == 1
        lists = [("same score", self.best, 1), ("most disagreed-on", self.disagreed, 1)] if one_score else [
            ("best", self.best, 1), ("worst", self.worst, -1), ("most disagreed-on", self.disagreed, 1)]
        for tag, heap, sign in lists:
            for key, _neg, pick in sorted(heap, key=lambda h: (h[0], h[1]), reverse=True):
                tid = pick.batch.traj_ids[0]
                if tag == "most disagreed-on":
                    label = f"{tag} ({key[0]:.0%} of turn signs differ)"
                elif tag == "same score":
                    n = self.scores[round(key[0], 9)]
                    how = (f"the largest estimator disagreement ({key[1]:.0%} of turn signs differ)"
                           if math.isfinite(key[1]) else "the first in the data")
                    label = (f"every trajectory scores {key[0]:.4g}, so none is best or worst: chosen by {how}"
                             if n > 1 else f"the only trajectory (score {key[0]:.4g})")
                else:
                    sc = sign * key[0]
                    tied = self.scores.get(round(sc, 9), 1)
                    label = f"{'highest' if tag == 'best' else 'lowest'} score {sc:.4g}"
                    if tied > 1:
                        how = (f"the largest estimator disagreement among them ({key[1]:.0%} of turn signs differ)"
                               if math.isfinite(key[1]) else "the first in the data (one estimator: no disagreement to rank by)")
                        label += f", shared by {tied:,} trajectories: chosen by {how}"
                if tid in out:
                    out[tid][0].append(label)
                else:
                    out[tid] = ([label], pick)
        return [(tags, p) for tags, p in out.values()]


# ------------------------------------------------------------------------------------------------
# building the page


def _iter_source(source, cfg: ReportConfig):
    if isinstance(source, (str, Path)):
        return scan(source, max_tokens=cfg.max_tokens, keep_groups=True)
    return iter([source])


def _first_chunk_estimators(batch, requested) -> list[str]:
    from mpo_viz.advantages import registry

    if requested:
        return list(registry.parse_names(requested))  # unknown names raise, listing the available ones
    return registry.default_estimators(batch)


class LeftOutNote(UserWarning):
    """Default estimators the report left out because the data lacks what they need (said once,
    with how to get it; the page's summary says it too)."""


def _left_out(batch, requested, source_name: str) -> str | None:
    """Which default estimators the batch cannot run, and how to make it able to, or None."""
    from mpo_viz.advantages import registry

    if requested:
        return None  # named estimators that cannot run raise, saying what they need
    out = {n: registry.missing(batch, n) for n in registry.DEFAULT_ESTIMATORS}
    out = {n: lacks for n, lacks in out.items() if lacks}
    if not out:
        return None
    names = ", ".join(out)
    if all(lacks == ["values"] for lacks in out.values()):
        return (f"{names} left out: they need critic values, and {source_name} has none. Fit a critic to its returns "
                f"and report again: mpo-viz fit-critic {source_name} -o with_values.parquet && mpo-viz report "
                "with_values.parquet")
    need = "; ".join(f"{n} needs {', '.join(registry.NEED_TEXT.get(x, x) for x in lacks)}" for n, lacks in out.items())
    return f"{names} left out: {need}"


def _progress(total, cfg: ReportConfig, unit: str, desc: str):
    from tqdm.auto import tqdm

    disable = None if cfg.progress is None else not cfg.progress
    return tqdm(total=total, unit=unit, desc=desc, disable=disable, leave=False, dynamic_ncols=True)


def _count_rows(source) -> int | None:
    return count_rows(source) if isinstance(source, (str, Path)) else len(source)


def build_report(source, config: ReportConfig | None = None, *, source_name: str | None = None) -> str:
    """The report's HTML text. ``source``: a path (``.jsonl``, ``.parquet``, folder) or a batch."""
    cfg = config or ReportConfig()
    opts = {k: v for k, v in cfg.options.items() if v is not None}
    t_start = time.perf_counter()
    from mpo_viz.tokens import tokenizer_decoder

    decode = tokenizer_decoder(cfg.tokenizer) if cfg.tokenizer else None  # a bad folder fails before any work
    acc = None
    names: list[str] = []
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
            acc.add(chunk, results)
            bar.update(len(chunk))
    finally:
        bar.close()
    if acc is None:
        raise ValueError(f"{source_name or source}: no trajectories to report on")
    return _render(acc, cfg, opts, source_name or (str(source) if isinstance(source, (str, Path)) else "batch"),
                   time.perf_counter() - t_start, decode)


def write_report(source, path, config: ReportConfig | None = None) -> Path:
    """Write :func:`build_report` to ``path`` (temporary name, then rename). Returns the path."""
    import os

    p = Path(path)
    text = build_report(source, config, source_name=str(source) if isinstance(source, (str, Path)) else None)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)
    return p


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return "—"
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        a = abs(v)
        return f"{v:.3e}" if a and (a < 1e-3 or a >= 1e5) else f"{v:.4g}"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    return html.escape(str(v))


def html_table(rows: list[tuple], header: tuple | None = None, cls: str = "kv", *, csv: str | None = None) -> str:
    """A table; with ``csv`` (a file name without extension) and a header, a "CSV" download link under it."""
    link = ""
    if csv and header:
        from mpo_viz.export import csv_link

        link = "<div class=export>" + csv_link(pd.DataFrame([tuple(r) for r in rows], columns=list(map(str, header))), csv) + "</div>"
    h = ""
    if header:
        h = "<tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in header) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td>{c if isinstance(c, str) and c.startswith('<') else _fmt(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}">{h}{body}</table>{link}'


def figure_html(fig, div_id: str) -> str:
    """A plotly figure (no plotly.js: the page inlines it once) and its "PNG · SVG" export links
    (plotly.js's own image export, wired by :func:`page_html`)."""
    from mpo_viz.plots import FIGURE_CONFIG

    links = (f'<div class=export>export <a href="#" data-fig="{div_id}" data-fmt="png">PNG</a> · '
             f'<a href="#" data-fig="{div_id}" data-fmt="svg">SVG</a></div>')
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=FIGURE_CONFIG) + links


def strip_html(element_id: str, payload: dict, height: int = 320, *, payload_id: str | None = None) -> str:
    """A strip placeholder plus its JSON payload (in a script tag with id ``payload_id``, default
    ``<element_id>-data``); :func:`page_html`'s script mounts it."""
    from mpo_viz.strip import payload_json

    pid = payload_id or f"{element_id}-data"
    return (f'<div class="strip" id="{element_id}" data-payload="{pid}" data-height="{int(height)}"></div>'
            f'<script type="application/json" id="{pid}">{payload_json(payload)}</script>')


def page_html(title: str, body: str, *, footer: str, figure_ids: list[str]) -> str:
    """The self-contained page shell shared by the report and widget snapshots.

    Inlines the page CSS, the strip's CSS and script and plotly.js (no CDN: opens offline), then
    mounts every strip placed with :func:`strip_html`. Sets ``window.mpoStrips``,
    ``window.mpoReportFigures`` (``figure_ids``) and ``window.mpoReportReady`` for tests.
    """
    import plotly.offline

    from mpo_viz.strip import strip_css, strip_js

    t = html.escape(title)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{t}</title>
<style>{PAGE_CSS}</style>
<style>{strip_css()}</style>
<script>{plotly.offline.get_plotlyjs()}</script>
<script>{strip_js(module=False)}</script>
</head><body>
<h1>{t}</h1>
{body}
{footer}
<script>
(function () {{
  window.mpoStrips = [];
  document.querySelectorAll("div.strip[data-payload]").forEach(function (el) {{
    var p = JSON.parse(document.getElementById(el.dataset.payload).textContent);
    window.mpoStrips.push(window.mpoStrip.mount(el, p, {{ height: +el.dataset.height || 320 }}));
  }});
  window.mpoReportFigures = {json.dumps(figure_ids)};
  document.querySelectorAll("a[data-fig]").forEach(function (a) {{
    a.addEventListener("click", function (ev) {{
      ev.preventDefault();
      Plotly.downloadImage(document.getElementById(a.dataset.fig), {{ format: a.dataset.fmt, filename: a.dataset.fig }});
    }});
  }});
  window.mpoReportReady = true;
}})();
</script>
</body></html>
"""


def _render(acc: _Acc, cfg: ReportConfig, opts: dict, source_name: str, wall: float, decode=None) -> str:

    from mpo_viz import plots
    from mpo_viz.strip import robust_scale, set_scale, strip_payload, within_turn_part

    t0 = time.perf_counter()
    parts: list[str] = []
    tables: dict[str, pd.DataFrame] = {}  # for export_dir
    fig_objs: dict = {}
    # ---- summary
    summary = [("source", source_name), ("trajectories", acc.n_traj), ("response tokens", acc.n_tokens),
               ("action tokens", acc.n_action), ("estimators", ", ".join(acc.estimators) or "none"),
               *([("estimators left out", acc.left_out)] if acc.left_out else []),
               ("shared options", json.dumps(opts) if opts else "defaults")]
    if acc.n_rejected:
        summary.append(("rejected rows", acc.n_rejected))
    vv = pd.concat(acc.vv, ignore_index=True) if acc.vv else None
    if vv is not None:
        s = an.variance_summary(vv)
        summary += [
            ("value across-turn variance (mean)", s["mean_across"]),
            ("value within-turn variance (mean)", s["mean_within"]),
            ("median across / within", s["median_ratio"]),
            ("share with across > within", f"{s['share_across_gt_within']:.1%}" if not math.isnan(s["share_across_gt_within"]) else "—"),
            ("infinite ratios (within = 0)", s["n_inf_ratio"]),
            ("length-weighted across / within (means)", f"{_fmt(s['mean_across_w'])} / {_fmt(s['mean_within_w'])}"),
        ]
        n, sg, sgg, sd, sdd = acc.ev
        if n > 1:
            var_g = sgg / n - (sg / n) ** 2
            var_d = sdd / n - (sd / n) ** 2
            ev = 1 - var_d / var_g if var_g > 0 else float("nan")
            summary += [(f"explained variance of the values ({acc.values_source}) vs {acc.ev_source} returns", ev),
                        ("value bias mean(V − G)", -sd / n)]
    else:
        summary.append(("critic values", "absent: no across/within diagnostic"))
    parts.append("<h2>Summary</h2>" + html_table(summary))
    tables["summary"] = pd.DataFrame(summary, columns=["quantity", "value"])
    # ---- per-estimator statistics
    rows = []
    for k in acc.estimators:
        n, s1, s2, sa = acc.adv_mom.get(k, np.zeros(4))
        sp = pd.concat(acc.adv_split[k], ignore_index=True) if acc.adv_split.get(k) else None
        sp = sp[sp["n_tokens"] > 0] if sp is not None else None
        rows.append((k, s1 / n if n else float("nan"), math.sqrt(max(s2 / n - (s1 / n) ** 2, 0)) if n else float("nan"),
                     sa / n if n else float("nan"),
                     float(sp["across"].mean()) if sp is not None and len(sp) else float("nan"),
                     float(sp["within"].mean()) if sp is not None and len(sp) else float("nan")))
    if rows:
        head = ("estimator", "mean", "std", "mean |A|", "across-turn var (mean)", "within-turn var (mean)")
        parts.append("<h2>Advantages by estimator</h2>" + html_table(rows, head, "grid", csv="advantages_by_estimator"))
        tables["advantages_by_estimator"] = pd.DataFrame(rows, columns=list(head))
    if acc.cmp:
        cmp = an.finish_compare(acc.cmp)
        tables["estimator_agreement"] = cmp
        parts.append("<h2>Estimator agreement</h2><p class=note>Per pair of estimators: Pearson correlation and sign "
                     "agreement over action tokens and over turns (turn advantage = mean over the turn); rank agreement = "
                     "share of concordant turn pairs within a trajectory; sign flips = turns with opposite signs.</p>"
                     + html_table([tuple(r) for r in cmp.itertuples(index=False)], tuple(cmp.columns), "grid",
                                  csv="estimator_agreement"))
    # ---- accuracy against the oracle, or what would tell without one
    if acc.accuracy:
        ac = an.finish_accuracy(acc.accuracy)
        tables["accuracy"] = ac
        legend = "".join(f"<li><b>{k}</b>: {html.escape(v)}</li>" for k, v in an.ACCURACY_COLUMNS.items())
        parts.append("<h2 id=accuracy>Accuracy against the oracle</h2>"
                     f"<p class=reading>{html.escape(an.accuracy_reading(ac, acc.values_source))}</p>"
                     + html_table([tuple(r) for r in ac.itertuples(index=False)], tuple(ac.columns), "grid", csv="accuracy")
                     + f"<ul class=note>{legend}</ul><p class=note>Over every turn and action token of the data, each "
                     "estimator with the options above. The same measures over the shipped sets, many option settings "
                     "and critic noise levels: <code>benchmarks/credit_accuracy.py</code> (docs/report.md explains "
                     "its columns).</p>")
    else:
        parts.append(f"<h2 id=accuracy>Accuracy</h2><p class=note>{html.escape(an.NO_ORACLE_TEXT)}</p>")
    figs: list[str] = []
    if vv is not None and len(vv):
        f = plots.across_within(vv, max_points=cfg.max_points, source=acc.values_source)
        parts.append(f"<h2>Values ({html.escape(acc.values_source)}): across vs within turns</h2>"
                     + figure_html(f, "fig-across-within"))
        figs.append("fig-across-within")
        fig_objs["across_within"] = f
        tables["value_variance"] = vv
    # ---- selected trajectories
    picks = acc.picks()
    # one colour scale for every advantage channel of every strip (and one for MAE's within-turn
    # part): the 99th percentile of |A| over the selected trajectories, the largest over estimators,
    # so that the same number has the same colour whichever strip and channel shows it
    s_adv = max((robust_scale(a, p.batch.mask) for _, p in picks for a in p.adv.values()), default=1.0)
    micro = [k for k in acc.estimators if k in ("mpo", "mae")][:1]
    s_micro = max((robust_scale(within_turn_part(p.adv[micro[0]], p.batch.mask, p.batch.turn_ids), p.batch.mask)
                   for _, p in picks), default=1.0) if micro else 1.0
    if picks:
        parts.append("<h2>Selected trajectories</h2><p class=note>Hover a token to see every channel; the menu "
                     "switches the colouring (diverging scale centred at 0; grey = observation tokens). Every "
                     f"advantage channel of every strip saturates at the same ±{_fmt(s_adv)} (the 99th percentile of "
                     "|A| over these trajectories and estimators); tokens beyond it are clipped, marked ▲ and counted "
                     "in the legend.</p>")
    for j, (tags, p) in enumerate(picks):
        b = p.batch
        tid = b.traj_ids[0]
        parts.append(f'<section class="traj"><h3>{html.escape(tid)} <small>{html.escape(" · ".join(tags))}</small></h3>')
        tokens = decode if decode is not None and not _has_tokens(b) else None
        payload = strip_payload(b, 0, advantages=p.adv, td=an.td_error(b), title=f"trajectory {tid}", tokens=tokens)
        adv_names = [k for k in payload["channels"] if k.startswith("adv_")]
        set_scale(payload, adv_names, s_adv, "shared by the estimators and the selected trajectories")
        set_scale(payload, [k for k in payload["channels"] if k.startswith("micro_")], s_micro,
                  "shared by the selected trajectories")
        parts.append(strip_html(f"strip-{j}", payload, cfg.strip_height, payload_id=f"payload-{j}"))
        if b.values is not None:
            ret = p.ret.get(acc.ev_source) if acc.ev_source else None
            fig = plots.value_curve(b, 0, advantages=p.adv, returns=ret)
            parts.append(figure_html(fig, f"fig-value-{j}"))
            figs.append(f"fig-value-{j}")
            fig_objs[f"value_curve_{tid}"] = fig
        if p.adv:
            fig = plots.estimator_comparison(b, 0, p.adv)
            parts.append(figure_html(fig, f"fig-turns-{j}"))
            figs.append(f"fig-turns-{j}")
            fig_objs[f"turn_advantages_{tid}"] = fig
            tables[f"turns_{tid}"] = an.turn_table(b, p.adv)
        parts.append("</section>")
    export_note = ""
    if cfg.export_dir:
        export_note = _export(cfg.export_dir, tables, fig_objs)
    render_s = time.perf_counter() - t0
    timing = ", ".join(f"{k} {v:.2f}s" for k, v in {**acc.timings, "render": render_s}.items())
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    foot = (f"<footer>mpo_viz {html.escape(__version__)} · generated {stamp} in {wall + render_s:.1f}s "
            f"({html.escape(timing)}) · self-contained: opens offline{html.escape(export_note)}</footer>")
    body = "\n".join(parts)
    return page_html(cfg.title, body, footer=foot, figure_ids=figs)


def _has_tokens(b) -> bool:
    return b.has("response_tokens") and b.field("response_tokens")[0] is not None


class ExportWarning(RuntimeWarning):
    """The report's ``export_dir`` wrote the tables but not the figures (no static renderer)."""


def _export(folder, tables: dict, figures: dict) -> str:
    """Write the report's tables as CSV and, with a renderer, its figures as PNG and SVG into
    ``folder``; returns a note for the footer. Without a renderer: an :class:`ExportWarning` that
    says what was written, what to install, and that the page's PNG / SVG links still work."""
    import warnings

    from mpo_viz.export import static_export_available, write_figures, write_tables

    paths = write_tables(tables, folder)
    if static_export_available():
        paths += write_figures(figures, folder, ("png", "svg"))
        return f" · exported {len(paths)} files to {folder}"
    warnings.warn(f"export: wrote {len(paths)} tables as CSV to {folder}, but not the {len(figures)} figures: "
                  "static figure export needs plotly's renderer, the 'kaleido' package (pip install kaleido). "
                  "The report's PNG / SVG links under each figure export them from the browser without it.",
                  ExportWarning, stacklevel=3)
    return f" · exported {len(paths)} tables (CSV) to {folder}; figures: no static renderer (kaleido) installed"


PAGE_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto; max-width: 1200px;
       padding: 0 16px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin-bottom: 6px; } h3 small { color: #666; font-weight: normal; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
td, th { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: left; font-variant-numeric: tabular-nums; }
table.kv td:first-child { color: #555; } table.grid th { background: #f6f6f6; }
.note { color: #555; font-size: 13px; } .reading { font-size: 14px; background: #f3f7fb; padding: 6px 10px;
  border-left: 3px solid #1f5fa8; } section.traj { margin: 18px 0 30px; }
.export { font-size: 12px; color: #666; margin: 2px 0 10px; } .export a { color: #1f5fa8; margin-right: 6px; }
footer { margin-top: 40px; color: #888; font-size: 12px; }
"""
