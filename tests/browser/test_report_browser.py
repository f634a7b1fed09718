"""The HTML report and the token strip in a real browser (Chromium + Playwright)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz.data.synthetic import strip_arrays
from mpo_viz.render.report import ReportConfig, write_report
from mpo_viz.render.strip import payload_from_arrays, payload_json, strip_css, strip_js

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def report_file(tmp_path_factory):
    b = mv.synthetic.make_batch(12, seed=7, turns=(2, 4), turn_len=(10, 60), obs_len=(10, 60))
    path = tmp_path_factory.mktemp("report") / "report.html"
    write_report(
        b, path, ReportConfig(estimators=("mpo", "gae", "grpo"), n_best=1, n_worst=1, n_disagreed=1, progress=False)
    )
    return path


def _open(page, path):
    page.goto(path.as_uri())
    page.wait_for_function("window.mpoReportReady === true")


def _payload(page, j=0):
    return json.loads(page.evaluate(f"document.getElementById('payload-{j}').textContent"))


def test_report_opens_offline_and_plots_render(page, page_errors, page_requests, report_file):
    _open(page, report_file)
    figs = page.evaluate("window.mpoReportFigures")
    assert "fig-across-within" in figs and len(figs) >= 4
    for fid in figs:
        # plotly drew the figure: an SVG root and at least one trace with data
        assert page.locator(f"#{fid} .main-svg").count() >= 1, fid
        assert page.evaluate(f"document.getElementById('{fid}').data.length") >= 1, fid
    assert page.locator("#fig-across-within .scatterlayer .point").count() >= 1
    assert page.locator(".mpo-strip").count() == len(re.findall(r'id="payload-\d+"', report_file.read_text()))
    assert page_errors == []
    assert [u for u in page_requests if not u.startswith(("file:", "data:", "blob:"))] == []


def test_hover_shows_every_channel(page, page_errors, report_file):
    _open(page, report_file)
    p = _payload(page, 0)
    i = next(k for k, m in enumerate(p["mask"]) if m and k > 3)
    page.hover(f"#strip-0 [data-i='{i}']")
    tip = page.locator("#strip-0 .mpo-strip-tip")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    assert f"#{i} " in text and "action" in text
    for name, info in p["channel_info"].items():
        assert info["label"] in text, name
    # the active channel's value is shown (rounded to 4 decimals)
    row = tip.locator("tr.mpo-strip-active td").nth(1).inner_text()
    assert float(row) == pytest.approx(p["channels"][p["channel"]][i], abs=1e-4)
    page.mouse.move(1, 1)
    assert page_errors == []


def test_channel_switch_recolours(page, page_errors, report_file):
    _open(page, report_file)
    p = _payload(page, 0)
    sel = "#strip-0 .mpo-strip-tok:not(.mpo-strip-obs)"

    def colours():
        return page.eval_on_selector_all(sel, "els => els.map(e => getComputedStyle(e).backgroundColor)")

    before = colours()
    assert page.input_value("#strip-0 select.mpo-strip-channel") == p["channel"] == "adv_mpo"
    page.select_option("#strip-0 select.mpo-strip-channel", "value")
    after = colours()
    assert len(before) == len(after) > 10
    assert before != after
    lo, hi = page.inner_text("#strip-0 .mpo-strip-lo"), page.inner_text("#strip-0 .mpo-strip-hi")
    assert float(lo) == pytest.approx(-float(hi))  # centred at 0
    # observation tokens stay grey whatever the channel
    obs = page.eval_on_selector_all(
        "#strip-0 .mpo-strip-obs", "els => [...new Set(els.map(e => getComputedStyle(e).backgroundColor))]"
    )
    assert obs == ["rgb(236, 236, 236)"]
    assert page_errors == []


def test_strip_50k_tokens_is_virtualized(page, page_errors, tmp_path):
    n = 50_000
    toks, mask, chans = strip_arrays(n, seed=0)
    p = payload_from_arrays(toks, mask, None, {"adv": chans["adv_mpo"], "value": chans["value"]})
    html = (
        f"<!doctype html><meta charset=utf-8><style>{strip_css()}</style><div id=s></div>"
        f"<script type='application/json' id=p>{payload_json(p)}</script><script>{strip_js(module=False)}</script>"
        "<script>window.v = mpoStrip.mount(document.getElementById('s'), "
        "JSON.parse(document.getElementById('p').textContent));</script>"
    )
    f = tmp_path / "strip.html"
    f.write_text(html)
    page.goto(f.as_uri())
    rows = page.evaluate("window.v.rows")
    assert rows > 1000
    # only the visible rows (plus overscan) are in the DOM
    assert page.locator("#s .mpo-strip-tok").count() < 2500
    page.evaluate(f"window.v.scrollToToken({n - 1})")
    assert page.locator(f"#s [data-i='{n - 1}']").count() == 1
    assert page.locator("#s [data-i='0']").count() == 0
    # every turn starts a labelled row
    n_turns = int(((mask[1:] == 1) & (mask[:-1] == 0)).sum() + mask[0])
    assert page.locator("#s select.mpo-strip-turn option").count() == n_turns
    assert page_errors == []


def test_jupyter_server_fixture_starts_fresh(jupyter_server):
    import urllib.request

    with urllib.request.urlopen(f"{jupyter_server.url}/api/contents", timeout=10) as r:
        listing = json.loads(r.read())
    assert listing["type"] == "directory" and listing["content"] == []
    with urllib.request.urlopen(f"{jupyter_server.url}/api/kernelspecs", timeout=10) as r:
        assert "python3" in json.loads(r.read())["kernelspecs"]


def test_report_accuracy_shared_scale_and_export(page, page_errors, tmp_path):
    """A report on oracle data: the accuracy section shows, every strip's advantage channels share
    one scale (the legend of each says the same range), and the PNG / SVG / CSV links download."""
    from pathlib import Path

    from mpo_viz.render.strip import _floats

    root = Path(__file__).resolve().parents[2]
    b = mv.load(root / "trajectories" / "search.parquet")[:60]
    path = tmp_path / "acc.html"
    write_report(
        b, path, ReportConfig(estimators=("mpo", "gae", "vapo"), n_best=1, n_worst=1, n_disagreed=1, progress=False)
    )
    _open(page, path)
    assert page.locator("h2#accuracy").inner_text() == "Accuracy against the oracle"
    assert page.locator("p.reading").inner_text().startswith("Token credit closest to the oracle:")
    strips = page.locator(".mpo-strip").count()
    assert strips >= 2
    # the same range in every strip's legend, and every strip's payload carries that one scale
    his = {page.inner_text(f"#strip-{j} .mpo-strip-hi") for j in range(strips)}
    assert len(his) == 1, his
    scales = {_payload(page, j)["channel_info"]["adv_mpo"]["scale"] for j in range(strips)}
    assert len(scales) == 1
    s = scales.pop()
    assert float(his.pop()) == pytest.approx(s, abs=1e-4)
    # the clipped count in the legend is the number of tokens beyond the scale
    for j in range(strips):
        p = _payload(page, j)
        v = np.array([x for x, m in zip(p["channels"]["adv_mpo"], p["mask"]) if m and x is not None])
        want = int((np.abs(v) > s * (1 + 1e-9)).sum())
        text = page.inner_text(f"#strip-{j} .mpo-strip-clipinfo") if want else ""
        assert (int(re.match(r"\D*(\d+) clipped", text).group(1)) if want else 0) == want
        assert page.locator(f"#strip-{j} .mpo-strip-clip").count() <= want  # only visible rows are in the DOM
    assert _floats([s], 4)[0] == s
    # export: plotly.js's image export from the links, and a CSV table
    for fmt in ("png", "svg"):
        with page.expect_download(timeout=30_000) as dl:
            page.locator(f"a[data-fig='fig-across-within'][data-fmt='{fmt}']").click()
        f = tmp_path / f"aw.{fmt}"
        dl.value.save_as(f)
        data = f.read_bytes()
        assert data.startswith(b"\x89PNG") if fmt == "png" else b"<svg" in data[:400]
    with page.expect_download() as dl:
        page.locator("a[download='accuracy.csv']").click()
    dl.value.save_as(tmp_path / "acc.csv")
    import pandas as pd

    acc = pd.read_csv(tmp_path / "acc.csv")
    assert list(acc["estimator"]) == ["mpo", "gae", "vapo"]
    assert page_errors == []
