"""Benchmark: widget responsiveness.

1. **Slider change** (Python side). A TrajectoryExplorer on a 64-trajectory batch of about 100k
   response tokens (``mpo_viz.synthetic.make_batch``), estimators mpo, gae, grpo. One slider change
   = ``params.set(beta=…)``: recompute every estimator on the whole batch (kernels only), update the
   picker's disagreement column, build and push the strip's new advantage channels (JSON through the
   widget's comm; outside a kernel ipywidgets' DummyComm, so serialization is counted, the socket
   write is not), update the figure traces and the per-turn table. Median and p90 of 20, by phase.
   Baseline side by side: the naive path — ``mpo_viz.advantages.compute`` per estimator, a full
   ``strip_payload`` rebuild and a new FigureWidget. Target: median <= 100 ms.
2. **Opening a 50,000-token trajectory** (Chromium). Python: ``explorer.select(row)`` (payload,
   FigureWidget, per-turn table). Browser (headless Debian Chromium via Playwright): a page with
   the strip ES module and plotly.js inline; timed from handing over the payload JSON and the
   figure JSON to the strip's ``render({model, el})`` and ``Plotly.newPlot`` until both are drawn
   (after the next animation frame). Median of 3. Target: browser render <= 1 s.

Usage: ``python benchmarks/widgets.py [--repeats 20] [--no-browser]``. Speed is printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _stats(ts):
    ts = sorted(ts)
    return statistics.median(ts) * 1000, ts[min(len(ts) - 1, int(0.9 * len(ts)))] * 1000


def bench_slider(repeats: int) -> None:
    import plotly.graph_objects as go

    import mpo_viz as mv
    from mpo_viz import advantages as adv
    from mpo_viz import plots
    from mpo_viz.advantages import estimator_options
    from mpo_viz.strip import payload_json, strip_payload
    from mpo_viz.widgets import TrajectoryExplorer

    b = mv.synthetic.make_batch(64, seed=0, turns=(4, 8), turn_len=(80, 260), obs_len=(50, 200))
    names = ["mpo", "gae", "grpo"]
    ex = TrajectoryExplorer(b, estimators=names, row=0)
    n_row = int(b.lengths[0])
    betas = np.linspace(0.2, 1.8, repeats)
    ex.params.set(beta=0.5)  # warm-up (JIT, caches)
    ts, phases = [], {}
    for beta in betas:
        t0 = time.perf_counter()
        ex.params.set(beta=float(beta))
        ts.append(time.perf_counter() - t0)
        for k, v in ex.timings.items():
            phases.setdefault(k, []).append(v)
    # baseline: the naive path
    sub = b[[0]]

    def naive(beta):
        opts = {**ex.params.options, "beta": float(beta)}
        res = {k: adv.compute(b, k, **estimator_options(k, opts)) for k in names}
        rows = {k: r.advantages[0:1, :n_row] for k, r in res.items()}
        p = strip_payload(sub, 0, advantages=rows)
        payload_json(p)
        go.FigureWidget(plots.value_curve(sub, 0, advantages=rows, returns=res["mpo"].returns[0:1, :n_row]))

    naive(0.5)
    tb = []
    for beta in betas:
        t0 = time.perf_counter()
        naive(beta)
        tb.append(time.perf_counter() - t0)
    med, p90 = _stats(ts)
    bmed, bp90 = _stats(tb)
    print(f"\n## 1. slider change: {len(b)} trajectories, {b.num_tokens:,} response tokens "
          f"(padded {tuple(b.mask.shape)}), shown row {n_row:,} tokens, estimators {', '.join(names)}; {repeats} changes\n")
    print("| path | median ms | p90 ms | ratio vs baseline |")
    print("|---|---|---|---|")
    print(f"| explorer (kernels, partial payload, in-place traces) | {med:.1f} | {p90:.1f} | {bmed / med:.1f}x faster |")
    print(f"| baseline (compute() x3, full strip_payload, new FigureWidget) | {bmed:.1f} | {bp90:.1f} | 1.0x |")
    print(f"\ntarget: median <= 100 ms -> {'met' if med <= 100 else 'NOT met'}\n")
    print("| phase | median ms |")
    print("|---|---|")
    for k, v in phases.items():
        print(f"| {k} | {statistics.median(v) * 1000:.2f} |")
    print(f"\npushed strip payload: {len(ex.strip.payload) / 1e3:.0f} kB of JSON")


_FAKE_MODEL = """
class FakeModel {
  constructor(state) { this.state = state; this.handlers = {}; }
  get(k) { return this.state[k]; }
  set(k, v) { this.state[k] = v; (this.handlers["change:" + k] || []).slice().forEach((f) => f()); }
  on(e, f) { (this.handlers[e] = this.handlers[e] || []).push(f); }
  off(e, f) { this.handlers[e] = (this.handlers[e] || []).filter((g) => g !== f); }
  save_changes() {}
}
"""


def bench_open(repeats: int = 3) -> None:
    import plotly.io as pio
    import plotly.offline

    import mpo_viz as mv
    from mpo_viz.strip import strip_css, strip_js
    from mpo_viz.widgets import TrajectoryExplorer

    b = mv.synthetic.make_batch(2, seed=1, turns=None, max_len=50_000, group_size=2)
    n = int(b.lengths[0])
    ex = TrajectoryExplorer(b, estimators=["mpo", "gae", "grpo"], row=1)
    tp = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ex.select(0)
        tp.append(time.perf_counter() - t0)
    py_med = statistics.median(tp) * 1000
    payload = ex.strip.payload  # the JSON text the comm carries
    fig_json = pio.to_json(ex.figure, validate=False)
    tmp = Path(tempfile.mkdtemp(prefix="mpo_viz_bench_widgets_"))
    (tmp / "payload.js").write_text("window.PAYLOAD = " + json.dumps(payload) + ";\nwindow.FIG = " + json.dumps(fig_json) + ";")
    html = (f"<!doctype html><meta charset=utf-8><style>{strip_css()}</style>"
            f"<script>{plotly.offline.get_plotlyjs()}</script><script src='payload.js'></script>"
            "<div id=w style='width:1200px'></div><div id=f style='width:1200px'></div>"
            f"<script type=module>{strip_js()}\n{_FAKE_MODEL}\n"
            "window.openTrajectory = async () => {\n"
            "  const t0 = performance.now();\n"
            "  const model = new FakeModel({payload: window.PAYLOAD, channel: 'adv_mpo', height: 320});\n"
            "  render({ model, el: document.getElementById('w') });\n"
            "  const t1 = performance.now();\n"
            "  const fig = JSON.parse(window.FIG);\n"
            "  await Plotly.newPlot('f', fig.data, fig.layout);\n"
            "  const t2 = performance.now();\n"
            "  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));\n"
            "  const t3 = performance.now();\n"
            "  return {strip: t1 - t0, plot: t2 - t1, total: t3 - t0,\n"
            "          tokens: document.querySelectorAll('#w .mpo-strip-tok').length};\n"
            "};\nwindow.ready = true;</script>")
    (tmp / "page.html").write_text(html)
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests" / "browser"))
    from conftest import CHROMIUM, CHROMIUM_ARGS

    rows = []
    with sync_playwright() as pw:
        br = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        for _ in range(repeats):
            page = br.new_page(viewport={"width": 1280, "height": 900})
            page.goto((tmp / "page.html").as_uri())
            page.wait_for_function("window.ready === true")
            rows.append(page.evaluate("window.openTrajectory()"))
            page.close()
        br.close()
    med = {k: statistics.median(r[k] for r in rows) for k in ("strip", "plot", "total")}
    print(f"\n## 2. opening a {n:,}-token trajectory ({int(b.mask[0, :n].sum()):,} action tokens, "
          f"{int(b.num_turns[0])} turns) in Chromium; median of {repeats}\n")
    print("| step | ms |")
    print("|---|---|")
    print(f"| Python: explorer.select() (payload, FigureWidget, per-turn table) | {py_med:.0f} |")
    print(f"| Chromium: strip render (JSON in model → first rows drawn; {rows[0]['tokens']} token spans in the DOM) | {med['strip']:.0f} |")
    print(f"| Chromium: value curve Plotly.newPlot | {med['plot']:.0f} |")
    print(f"| Chromium: total to the next frame | {med['total']:.0f} |")
    print(f"\npayload {len(payload) / 1e6:.1f} MB, figure {len(fig_json) / 1e6:.1f} MB of JSON; "
          f"target: browser render <= 1000 ms -> {'met' if med['total'] <= 1000 else 'NOT met'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--no-browser", action="store_true")
    a = ap.parse_args(argv)
    bench_slider(a.repeats)
    if not a.no_browser:
        bench_open()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
