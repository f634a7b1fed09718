"""Benchmark: `mpo-viz advantages` on 2M- and 10M-token Parquet files, and the token strip's first
render of a 50,000-token trajectory in Chromium.

1. Synthetic Parquet files of about 2M and 10M response tokens (written once under
   ``$TMPDIR/mpo_viz_bench/``, reused).
2. Each file through ``mpo-viz advantages -e mpo,gae,grpo`` (streaming, chunks of 1M tokens) in a
   fresh process — into one file (parts merged) and into a folder (one file per chunk) — side by
   side with the baseline that loads the whole file, computes and saves it in one piece
   (``mv.load`` → ``compute`` → ``mv.save``). Reported: wall time, tokens/s, and the
   peak resident memory of the process (``wait4`` rusage) — the streaming one should stay flat as
   the file grows, the baseline grows with it.
3. The strip: a page with a 50,000-token payload, loaded in headless Chromium 3 times; reported:
   median time of JSON.parse + mount (first render) and navigation start → mounted. Target <= 1 s.

Usage: ``python benchmarks/report.py [--sizes 2,10] [--quick] [--screenshot docs/report.png]``
(``--quick``: 0.2M and 1M tokens, for a smoke run). Speed is printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(tempfile.gettempdir()) / "mpo_viz_bench"  # generated files, reused between runs
sys.path.insert(0, str(ROOT))

ESTIMATORS = "mpo,gae,grpo"


def make_file(m_tokens: float) -> Path:
    """A synthetic Parquet file of about ``m_tokens`` million response tokens (cached)."""
    import mpo_viz as mv
    from mpo_viz.data.io import merge_parts

    target = int(m_tokens * 1e6)
    out = CACHE / f"synthetic_{m_tokens:g}M.parquet"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    parts = Path(tempfile.mkdtemp(dir=CACHE))
    total, seed = 0, 0
    while total < target:
        b = mv.synthetic.make_batch(400, seed=1000 + seed, group_size=4)
        mv.save(b, parts / f"part-{seed:06d}.parquet")
        total += b.num_tokens
        seed += 1
    merge_parts(parts, out)
    for f in parts.iterdir():
        f.unlink()
    parts.rmdir()
    return out


_STREAM = """
import json, sys
from mpo_viz.render.annotate import AnnotateConfig, annotate_file
s = annotate_file(sys.argv[1], sys.argv[2], AnnotateConfig(estimators=tuple(sys.argv[3].split(',')), progress=False))
print(json.dumps(s))
"""

_BASELINE = """
import json, sys, time
import mpo_viz as mv
from mpo_viz import advantages as adv
t = time.perf_counter()
b = mv.load(sys.argv[1])
cols = {}
for n in sys.argv[3].split(','):
    r = adv.compute(b, n)
    cols['adv_' + n] = r.advantages
    cols['ret_' + n] = r.returns
mv.save(b.with_token_fields(**cols), sys.argv[2])
print(json.dumps({"tokens": b.num_tokens, "seconds": time.perf_counter() - t}))
"""


def run_child(code: str, *args: str) -> tuple[dict, float, float]:
    """Run ``code`` in a fresh interpreter; returns (its JSON output, wall seconds, peak RSS MiB)."""
    t = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"child failed ({p.returncode}):\n{err.decode()[-2000:]}")
    return json.loads(out.decode().strip().splitlines()[-1]), wall, ru.ru_maxrss / 1024


def bench_advantages(sizes: list[float]) -> list[dict]:
    """Per file: the baseline (load all) and streaming into one file / into a folder, side by side."""
    rows = []
    for m in sizes:
        f = make_file(m)
        with tempfile.TemporaryDirectory(dir=CACHE) as d:
            b, bwall, brss = run_child(_BASELINE, str(f), str(Path(d) / "base.parquet"), ESTIMATORS)
            rows.append({"file": f.name, "mode": "load all (baseline)", "tokens": b["tokens"], "s": bwall, "rss": brss})
            for mode, out in (("stream -> file", "out.parquet"), ("stream -> folder", "outdir")):
                s, wall, rss = run_child(_STREAM, str(f), str(Path(d) / out), ESTIMATORS)
                rows.append(
                    {
                        "file": f.name,
                        "mode": mode,
                        "tokens": s["tokens"],
                        "s": wall,
                        "rss": rss,
                        "timings": s["timings"],
                        "base_s": bwall,
                        "base_rss": brss,
                    }
                )
    return rows


def _chromium():
    from playwright.sync_api import sync_playwright

    args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]
    pw = sync_playwright().start()
    return pw, pw.chromium.launch(executable_path="/usr/bin/chromium", args=args, headless=True)


def bench_strip(n: int = 50_000, repeats: int = 3) -> dict:
    from mpo_viz.data.synthetic import strip_arrays
    from mpo_viz.render.strip import payload_from_arrays, payload_json, strip_css, strip_js

    toks, mask, chans = strip_arrays(n, seed=0)
    p = payload_from_arrays(toks, mask, None, chans)
    html = (
        f"<!doctype html><meta charset=utf-8><style>{strip_css()}</style><div id=s></div>"
        f"<script type='application/json' id=p>{payload_json(p)}</script><script>{strip_js(module=False)}</script>"
        "<script>const t0 = performance.now();"
        "window.v = mpoStrip.mount(document.getElementById('s'), JSON.parse(document.getElementById('p').textContent));"
        "window.mountMs = performance.now() - t0; window.sinceNav = performance.now();</script>"
    )
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "strip.html"
        f.write_text(html)
        pw, browser = _chromium()
        try:
            mount, nav = [], []
            for _ in range(repeats):
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f.as_uri())
                mount.append(page.evaluate("window.mountMs"))
                nav.append(page.evaluate("window.sinceNav"))
                page.close()
        finally:
            browser.close()
            pw.stop()
    return {
        "tokens": n,
        "payload_mb": len(html) / 1e6,
        "mount_ms": statistics.median(mount),
        "nav_ms": statistics.median(nav),
    }


def screenshot(path: Path) -> None:
    """A screenshot of the report on the shipped search trajectories (summary + one strip with hover)."""
    from mpo_viz.render.report import ReportConfig, write_report

    src = ROOT / "trajectories" / "search.parquet"
    with tempfile.TemporaryDirectory() as d:
        rep = write_report(
            src, Path(d) / "report.html", ReportConfig(progress=False, n_best=1, n_worst=1, n_disagreed=1)
        )
        pw, browser = _chromium()
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900}, device_scale_factor=1)
            page.goto(rep.as_uri())
            page.wait_for_function("window.mpoReportReady === true")
            sec = page.locator("section.traj").first
            sec.scroll_into_view_if_needed()
            # a token of the last turn: its tooltip opens upwards, over the strip, not over the figure below
            page.hover("#strip-0 .mpo-strip-turnstart >> nth=-1")
            page.hover("#strip-0 .mpo-strip-turnstart >> nth=-1 >> .mpo-strip-tok >> nth=3")
            path.parent.mkdir(parents=True, exist_ok=True)
            sec.screenshot(path=str(path))
        finally:
            browser.close()
            pw.stop()
    print(f"screenshot: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2,10", help="file sizes in millions of tokens (default 2,10)")
    ap.add_argument("--quick", action="store_true", help="0.2M and 1M tokens")
    ap.add_argument("--no-strip", action="store_true")
    ap.add_argument("--screenshot", type=Path, help="also write a screenshot of the report here")
    a = ap.parse_args()
    sizes = [0.2, 1.0] if a.quick else [float(x) for x in a.sizes.split(",")]
    rows = bench_advantages(sizes)
    print(
        f"\nmpo-viz advantages -e {ESTIMATORS}, chunks of 1M tokens (fresh process each; wall time includes "
        "imports and numba JIT)"
    )
    print(
        f"{'file':<24}{'mode':<21}{'tokens':>12}{'wall s':>8}{'tokens/s':>11}{'peak MiB':>10}"
        f"{'speed vs base':>15}{'memory vs base':>16}"
    )
    for r in rows:
        base = "base_s" in r
        print(
            f"{r['file']:<24}{r['mode']:<21}{r['tokens']:>12,}{r['s']:>8.1f}"
            f"{r['tokens'] / r['s']:>11,.0f}{r['rss']:>10,.0f}"
            f"{(r['base_s'] / r['s'] if base else 1):>14.2f}x{(r['rss'] / r['base_rss'] if base else 1):>15.2f}x"
        )
    for r in rows:
        if "timings" in r:
            t = r["timings"]
            print(
                f"  {r['file']} {r['mode']}: read {t['read']:.1f}s, estimate {t['estimate']:.1f}s, write "
                f"{t['write']:.1f}s"
            )
    by_mode = {}
    for r in rows:
        by_mode.setdefault(r["mode"], []).append(r)
    if len(sizes) >= 2:
        print(
            "peak memory, largest / smallest file: "
            + ", ".join(f"{k} {v[-1]['rss'] / v[0]['rss']:.2f}x" for k, v in by_mode.items())
            + f" (file {rows[-1]['tokens'] / rows[0]['tokens']:.1f}x larger)"
        )
    if not a.no_strip:
        s = bench_strip()
        print(f"\nstrip first render, {s['tokens']:,} tokens, 6 channels, page {s['payload_mb']:.1f} MB (median of 3):")
        print(
            f"  JSON.parse + mount {s['mount_ms']:.0f} ms; navigation start -> mounted {s['nav_ms']:.0f} ms "
            f"(target <= 1000 ms: {'met' if s['nav_ms'] <= 1000 else 'NOT met'})"
        )
    if a.screenshot:
        screenshot(a.screenshot)


if __name__ == "__main__":
    main()
