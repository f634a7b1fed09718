"""The widgets in a real JupyterLab 4 (fresh server, Chromium): run all cells through the Run menu,
move a slider, pick a trajectory, click a point of the variance scatter, and check that the strip
and the plots changed to the numbers mpo_viz.advantages.compute gives. Screenshots: see WRITE_DOCS.

One server and one test: starting JupyterLab and a kernel is most of the cost. Refresh the
screenshots in docs/ with ``MPO_VIZ_SCREENSHOTS=1 pytest tests/browser/test_widgets_lab.py``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz import advantages as adv
from mpo_viz.advantages import accepted_options
from tests.browser.jupyter_helpers import (  # noqa: I001
    open_notebook,
    plot_data,
    run_all,
    tidy_for_screenshots,
    time_pick,
    time_slider,
    write_notebook,
)

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "trajectories" / "search.parquet"
# screenshots: into docs/ when MPO_VIZ_SCREENSHOTS=1 (to refresh the documentation's images), else
# into the test's temporary folder, so `make test` leaves the working tree untouched
WRITE_DOCS = os.environ.get("MPO_VIZ_SCREENSHOTS") == "1"


def _write_run(d: Path) -> None:
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"estimator": "mpo", "loss": "turn_ppo", "lr": 1e-5}))
    rng = np.random.default_rng(0)
    lines = []
    for i in range(30):
        lines.append(
            json.dumps(
                {
                    "iteration": i,
                    "phase": "train",
                    "time_s": 12.0 * i,
                    "success_rate": float(min(1, 0.2 + 0.02 * i + 0.03 * rng.normal())),
                    "reward_mean": 0.1 + 0.02 * i,
                    "policy_loss": float(0.5 * np.exp(-i / 10) + 0.02 * rng.normal()),
                    "value_loss": 0.3 * np.exp(-i / 15),
                    "approx_kl": 0.002 + 0.0005 * i,
                    "kl_ref": 0.001 * i,
                    "clipfrac_low": 0.01 + 0.001 * i,
                    "clipfrac_high": 0.02,
                    "turn_clipfrac": 0.05,
                    "within_turn_shift": 0.001 * (1 + np.sin(i / 3)),
                    "value_across": 0.05,
                    "value_within": 0.004 + 0.0001 * i,
                    "values_across_within_ratio": 0.05 / (0.004 + 0.0001 * i),
                    "critic_explained_var": 0.2 + 0.01 * i,
                    "entropy": 0.07 * np.exp(-i / 40),
                    "ratio_max": float(2.0 + 0.2 * i + rng.random()),
                    "turn_ratio_max": 1.05 + 0.002 * i,
                    "ratio_min": float(0.4 - 0.005 * i),
                    "turn_ratio_min": 0.95,
                    "timings": {"rollout_s": 6.0 + rng.random(), "advantages_s": 0.05, "update_s": 4.0 + rng.random()},
                }
            )
        )
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _strip_title(page, scope: str) -> str:
    return page.evaluate("(s) => document.querySelector(s + ' .mpo-strip-title').textContent", scope)


def _turn_colours(page, scope: str) -> dict:
    """{turn: set of background colours of its visible action tokens} in the strip of ``scope``."""
    return page.evaluate(
        """(scope) => {
          const root = document.querySelector(scope + ' .mpo-strip');
          const out = {}; let turn = null;
          for (const row of root.querySelectorAll('.mpo-strip-row')) {
            const lab = row.querySelector('.mpo-strip-gutter').textContent;
            if (/^T\\d+$/.test(lab)) turn = lab;
            if (row.classList.contains('mpo-strip-obsrow') || turn === null) continue;
            for (const t of row.querySelectorAll('.mpo-strip-tok:not(.mpo-strip-obs)'))
              (out[turn] = out[turn] || new Set()).add(t.style.background);
          }
          return Object.fromEntries(Object.entries(out).map(([k, v]) => [k, [...v]]));
        }""",
        scope,
    )


def _trace(page, scope: str, name: str) -> np.ndarray:
    i = page.evaluate(f"document.querySelector('{scope} .js-plotly-plot').data.findIndex((t) => t.name === {name!r})")
    assert i >= 0, name
    return np.array([np.nan if v is None else v for v in plot_data(page, f"{scope} .js-plotly-plot", i)], dtype=float)


def _wait_first_value(page, scope: str, value: float) -> None:
    """Wait until the first finite y of the figure's "A (mpo)" trace equals ``value``."""
    page.wait_for_function(
        "([sel, v]) => { const gd = document.querySelector(sel); const t = gd.data.find((d) => d.name === 'A (mpo)');"
        " const ys = Array.from(t.y).filter((y) => y !== null && !Number.isNaN(y)); return ys.length > 0 &&"
        " Math.abs(ys[0] - v) < 1e-5; }",
        arg=[f"{scope} .js-plotly-plot", value],
    )


def _set_slider(page, scope: str, label: str, value: str) -> None:
    """Type a value into an ipywidgets slider's editable readout and press Enter (as a user can)."""
    slider = (
        page.locator(scope)
        .first.locator(".widget-slider")
        .filter(has=page.locator(".widget-label", has_text=re.compile(f"^{re.escape(label)}$")))
    )
    readout = slider.locator(".widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(value)
    page.keyboard.press("Enter")


def _check_comparison(page, cmp_css: str, b, tmp_path: Path) -> None:
    """The stacked strips share one colour scale (the legends say the same range, the one computed
    here from the whole batch) and count the clipped tokens; the accuracy section is there; the
    export bar's PNG / SVG buttons and CSV links download."""
    from mpo_viz.analysis import credit_accuracy
    from mpo_viz.render.strip import _floats, robust_scale

    names = ["mpo", "gae", "grpo"]
    res = {k: adv.compute(b, k).advantages for k in names}
    s = max(robust_scale(a, b.mask) for a in res.values())
    his = page.eval_on_selector_all(f"{cmp_css} .mpo-strip-hi", "els => els.map(e => e.textContent)")
    los = page.eval_on_selector_all(f"{cmp_css} .mpo-strip-lo", "els => els.map(e => e.textContent)")
    assert len(set(his)) == 1 and len(his) == 3, his
    assert float(his[0]) == pytest.approx(s, abs=1e-4) and float(los[0]) == pytest.approx(-s, abs=1e-4)
    row = 5
    n = int(b.lengths[row])
    m = b.mask[row, :n].numpy() != 0
    clip = page.eval_on_selector_all(f"{cmp_css} .mpo-strip-clipinfo", "els => els.map(e => e.textContent)")
    s4 = _floats([s], 4)[0]  # what the payload carries: the scale to 4 digits, values to 5
    for name, text in zip(names, clip):
        v = np.array(_floats(res[name][row, :n].numpy()[m], 5))
        want = int((np.abs(v) > s4 * (1 + 1e-9)).sum())
        got = int(re.match(r"\D*(\d+) clipped", text).group(1)) if text else 0
        assert got == want, (name, text, want)
    # accuracy against the oracle: the reading names the estimator with the best token correlation
    acc = credit_accuracy(b, res)
    best = acc.loc[acc["tok_corr"].idxmax(), "estimator"]
    reading = page.locator(f"{cmp_css} .mpo-reading").inner_text()
    assert reading.startswith(f"Token credit closest to the oracle: {best} ")
    # export: plotly.js's image export from the bar's buttons, and the CSV links
    bar = page.locator(f"{cmp_css} .mpo-export").first
    for fmt in ("png", "svg"):
        with page.expect_download(timeout=30_000) as dl:
            bar.locator(f".mpo-export-{fmt}").click()
        f = tmp_path / f"fig.{fmt}"
        dl.value.save_as(f)
        head = f.read_bytes()[:64]
        assert head.startswith(b"\x89PNG") if fmt == "png" else b"<svg" in f.read_bytes()[:400]
    with page.expect_download() as dl:
        bar.locator("a[download='accuracy.csv']").click()
    f = tmp_path / "acc.csv"
    dl.value.save_as(f)
    import pandas as pd

    got = pd.read_csv(f).set_index("estimator")
    np.testing.assert_allclose(got.loc[list(acc["estimator"]), "tok_corr"], acc["tok_corr"], rtol=1e-9)


def test_widgets_in_jupyterlab(page, page_errors, jupyter_server, tmp_path):
    root = jupyter_server.root
    shots = REPO / "docs" if WRITE_DOCS else tmp_path
    _write_run(root / "run")
    cells = [
        "import mpo_viz as mv\nfrom mpo_viz.widgets import TrajectoryExplorer, VarianceView, EstimatorComparison, "
        f"TrainingDashboard\nb = mv.load({str(DATA)!r})",
        "ex = TrajectoryExplorer(b, row=0)\nex",
        "vv = VarianceView(b)\nvv",
        "cmp = EstimatorComparison(b, ['mpo', 'gae', 'grpo'], row=5)\ncmp",
        f"dash = TrainingDashboard({str(root / 'run')!r}, live=False)\ndash",
    ]
    write_notebook(root / "widgets.ipynb", cells)
    page.set_viewport_size({"width": 1440, "height": 2600})  # tall: element screenshots are not clipped
    open_notebook(page, jupyter_server, "widgets.ipynb")
    tidy_for_screenshots(page)
    run_all(page)
    ex_css = ".jp-OutputArea-output .mpo-explorer"
    page.wait_for_selector(f"{ex_css} .mpo-strip-row", timeout=90_000)  # the front end may still be busy
    page.wait_for_selector(f"{ex_css} .js-plotly-plot .scatterlayer", timeout=90_000)
    b = mv.load(DATA)
    n0 = int(b.lengths[0])
    act0 = b.mask[0, :n0].numpy() != 0
    assert b.traj_ids[0] in _strip_title(page, ex_css)

    # ---- the explorer's first view: MPO with the default sliders
    def mpo_row(row, **opts):
        o = dict(opts)  # unset options: mpo's defaults, as the sliders start
        return adv.compute(b, "mpo", **accepted_options("mpo", o)).advantages[row].numpy()

    a_before = _trace(page, ex_css, "A (mpo)")
    np.testing.assert_allclose(a_before[act0], mpo_row(0)[:n0][act0], rtol=1e-5, atol=1e-6)
    colours_before = _turn_colours(page, ex_css)
    assert any(len(c) > 1 for c in colours_before.values())  # β = 1: colour varies inside a turn

    # ---- move β to 0: MAE becomes turn GAE, constant over each turn's tokens. The latency from the
    # Enter key to the redrawn figure is measured in the page and printed (a measurement, not an
    # assert: benchmarks/widgets.py reports it with the Python side)
    lat = {"slider": time_slider(page, ex_css, "β", "0", "A (mpo)", float(mpo_row(0, beta=0.0)[:n0][act0][0]))}
    a_after = _trace(page, ex_css, "A (mpo)")
    np.testing.assert_allclose(a_after[act0], mpo_row(0, beta=0.0)[:n0][act0], rtol=1e-5, atol=1e-6)
    page.wait_for_function(
        "(scope) => [...document.querySelectorAll(scope + ' .mpo-strip-turnstart')].length > 0", arg=ex_css
    )
    colours_after = _turn_colours(page, ex_css)
    assert colours_after and all(len(c) == 1 for c in colours_after.values()), colours_after

    # ---- and back to β = 1 (the colour varies inside turns again)
    _set_slider(page, ex_css, "β", "1")
    _wait_first_value(page, ex_css, float(mpo_row(0)[:n0][act0][0]))
    page.wait_for_function(
        "(scope) => [...document.querySelectorAll(scope + ' .mpo-strip-turnstart')].length > 0", arg=ex_css
    )
    assert any(len(c) > 1 for c in _turn_colours(page, ex_css).values())

    # ---- pick another trajectory from the picker (the third row of its first page), timed in the page
    sel = page.locator(ex_css).first.locator(".mpo-picker-list select")
    label = sel.locator("option").nth(2).inner_text()
    tid = label.split("\u00a0")[0].strip()
    lat["pick"] = time_pick(page, ex_css, 2, tid)
    row = b.traj_ids.index(tid)
    print(
        f"\nbrowser latency (Chromium, loaded machine; measurements, not asserts): pick of a "
        f"{int(b.lengths[row])}-token trajectory {lat['pick']['ms']:.0f} ms (painted {lat['pick']['painted_ms']:.0f} "
        "ms), "
        f"β slider on {len(b)} trajectories {lat['slider']['ms']:.0f} ms (painted {lat['slider']['painted_ms']:.0f} ms)"
    )
    assert all(v["ms"] > 0 for v in lat.values())
    n = int(b.lengths[row])
    act = b.mask[row, :n].numpy() != 0
    page.wait_for_function(
        f"(s) => document.querySelector(s + ' .js-plotly-plot').data[0].x.length === {n}", arg=ex_css
    )
    np.testing.assert_allclose(_trace(page, ex_css, "A (mpo)")[act], mpo_row(row)[:n][act], rtol=1e-5, atol=1e-6)
    assert f"{n:,} tokens" in _strip_title(page, ex_css)
    page.locator(ex_css).first.screenshot(path=str(shots / "widgets_explorer.png"))

    # ---- the variance view: clicking a point opens that trajectory in an explorer beside it
    vv_css = ".jp-OutputArea-output .mpo-variance"
    page.wait_for_selector(f"{vv_css} .js-plotly-plot .scatterlayer .point")
    k = 7
    clicked = page.evaluate(f"document.querySelector('{vv_css} .js-plotly-plot').data[0].text[{k}]")
    pt = page.locator(f"{vv_css} .js-plotly-plot .scatterlayer .trace").first.locator(".point").nth(k)
    pt.scroll_into_view_if_needed()
    box = pt.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.up()
    page.wait_for_selector(f"{vv_css} .mpo-explorer .mpo-strip-title", timeout=60_000)
    page.wait_for_function(
        f"(s) => document.querySelector(s + ' .mpo-strip-title').textContent.includes({clicked!r})", arg=vv_css
    )
    page.wait_for_selector(f"{vv_css} .mpo-explorer .js-plotly-plot .scatterlayer")
    page.mouse.move(5, 5)  # no hover label in the screenshot
    page.wait_for_timeout(300)
    page.locator(vv_css).screenshot(path=str(shots / "widgets_variance.png"))

    # ---- the comparison (three stacked strips, bars) and the dashboard drew
    cmp_css = ".jp-OutputArea-output .mpo-comparison"
    page.wait_for_selector(f"{cmp_css} .js-plotly-plot .barlayer")
    assert page.locator(f"{cmp_css} .mpo-strip").count() == 3
    _check_comparison(page, cmp_css, b, tmp_path)
    page.mouse.move(5, 5)
    page.locator(cmp_css).screenshot(path=str(shots / "widgets_comparison.png"))
    dash_css = ".jp-OutputArea-output .mpo-dashboard"
    page.wait_for_selector(f"{dash_css} .js-plotly-plot .scatterlayer")
    n_traces = page.evaluate(f"document.querySelector('{dash_css} .js-plotly-plot').data.length")
    assert n_traces >= 12
    page.locator(dash_css).screenshot(path=str(shots / "widgets_dashboard.png"))
    # every figure is drawn at the width of its output (not plotly's 700 px) and is not empty
    for css in (ex_css, vv_css, cmp_css, dash_css):
        _check_full_width(page, css)
    errs = [e for e in page_errors if "favicon" not in e]
    assert errs == []

    # ---- reopen the notebook with the live kernel, twice: every view is drawn again from the
    # kernel's models, with no "[anywidget] Failed to initialize model" (each figure model used to
    # import plotly's 5 MB module afresh; the later ones missed anywidget's 2 s limit) and no "model
    # not found" (each figure used to carry its own copy of that module: ~26 MB of state here, and
    # half the reopens under load gave up on the views before the kernel's state had arrived)
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.lm-TabBar-tab.jp-mod-dirty')", timeout=30_000)
    drawn = (
        "(css) => { const gd = document.querySelector(css + ' .js-plotly-plot');"
        " return !!gd && !!gd._fullLayout && (gd.data || []).length > 0 && !!gd.querySelector('.main-svg'); }"
    )
    for attempt in range(2):
        page.reload(wait_until="domcontentloaded")
        try:
            for css in (ex_css, vv_css, cmp_css, dash_css):
                page.wait_for_function(drawn, arg=css, timeout=120_000)
            page.wait_for_selector(f"{ex_css} .mpo-strip-row", state="attached", timeout=60_000)
        except Exception:
            page.screenshot(path=str(tmp_path / "reopened.png"), full_page=True)
            raise AssertionError(
                f"after reopening ({attempt + 1}), a view was not drawn (css {css!r}; screenshot "
                f"{tmp_path / 'reopened.png'}); console: {page_errors[:5]}"
            ) from None
    page.wait_for_timeout(3_000)  # anywidget's limit is 2 s: a model that missed it has said so by now
    assert tid in _strip_title(page, ex_css)  # the state the kernel holds, not the first view's
    for css in (ex_css, vv_css, cmp_css, dash_css):
        _check_full_width(page, css)
    failed = [e for e in page_errors if "Failed to initialize model" in e]
    assert failed == [], failed[:3]
    assert [e for e in page_errors if "favicon" not in e] == []


def _check_full_width(page, css: str) -> None:
    """Each plotly figure in the view ``css`` has traces and its SVG spans its output element's width
    (the figure's own container, give or take 2 px), far wider than plotly's 700 px default here."""
    figs = page.eval_on_selector_all(
        f"{css} .js-plotly-plot",
        "els => els.map(e => ({svg: e.querySelector('.main-svg').getBoundingClientRect().width,"
        " box: e.getBoundingClientRect().width, traces: (e.data || []).length}))",
    )
    assert figs, css
    for f in figs:
        assert f["traces"] > 0, (css, f)
        assert abs(f["svg"] - f["box"]) <= 2, (css, f)
        assert f["svg"] > 720, (css, f)
