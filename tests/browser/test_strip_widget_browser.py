"""The strip's anywidget entry point ``render({model, el})`` with a stand-in model, in Chromium."""

from __future__ import annotations

import json

import pytest

from mpo_viz.render.strip import payload_from_arrays, strip_css, strip_js

pytestmark = pytest.mark.browser

_MODEL = """
class FakeModel {
  constructor(state) { this.state = state; this.handlers = {}; this.saved = 0; }
  get(k) { return this.state[k]; }
  set(k, v) { this.state[k] = v; (this.handlers["change:" + k] || []).slice().forEach((f) => f()); }
  on(e, f) { (this.handlers[e] = this.handlers[e] || []).push(f); }
  off(e, f) { this.handlers[e] = (this.handlers[e] || []).filter((g) => g !== f); }
  save_changes() { this.saved += 1; }
}
"""


def test_render_follows_the_model_both_ways(page, page_errors, open_html):
    p1 = payload_from_arrays(
        ["a", "b", "c", "d"], [1, 1, 0, 1], None, {"x": [1.0, -1.0, 0.0, 0.5], "y": [0.1, 0.2, 0.3, 0.4]}, title="first"
    )
    p2 = payload_from_arrays(["p", "q"], [1, 1], None, {"y": [1.0, 2.0]}, title="second")
    # the ES module itself, inline (file:// pages cannot import modules from files)
    html = (
        f"<!doctype html><meta charset=utf-8><style>{strip_css()}</style><div id=w></div>"
        f"<script type=module>{strip_js()}\n{_MODEL}\n"
        f"window.model = new FakeModel({{payload: {json.dumps(json.dumps(p1))}, channel: 'x'}});\n"
        "window.cleanup = render({ model: window.model, el: document.getElementById('w') });\n"
        "window.ready = true;</script>"
    )
    open_html(html, "w.html")
    assert page.input_value("#w select.mpo-strip-channel") == "x"
    assert "first" in page.inner_text("#w .mpo-strip-title")
    # UI -> model
    page.select_option("#w select.mpo-strip-channel", "y")
    assert page.evaluate("[window.model.state.channel, window.model.saved]") == ["y", 1]
    # model -> UI
    page.evaluate("window.model.set('channel', 'x')")
    assert page.input_value("#w select.mpo-strip-channel") == "x"
    page.evaluate(f"window.model.set('payload', {json.dumps(p2)})")  # an object works as well as JSON text
    assert "second" in page.inner_text("#w .mpo-strip-title")
    assert page.locator("#w .mpo-strip-tok").count() == 2
    assert page.input_value("#w select.mpo-strip-channel") == "y"  # x is gone: first channel
    page.evaluate("window.cleanup()")
    assert page.inner_html("#w") == ""
    assert page.evaluate("Object.values(window.model.handlers).every((h) => h.length === 0)")
    assert page_errors == []


def test_mount_while_detached_lays_out_once_attached(page, page_errors, tmp_path):
    words = ["alpha", " beta", " gamma", " delta"] * 500
    p = payload_from_arrays(words, [1] * len(words), None, {"x": [0.1] * len(words)})
    html = (
        f"<!doctype html><meta charset=utf-8><style>{strip_css()}</style><body style='width:700px'>"
        f"<script>{strip_js(module=False)}\n"
        f"const el = document.createElement('div'); window.v = mpoStrip.mount(el, {json.dumps(p)});\n"
        "setTimeout(() => { document.body.appendChild(el); window.attached = true; }, 50);</script>"
    )
    f = tmp_path / "d.html"
    f.write_text(html)
    page.goto(f.as_uri())
    page.wait_for_function("window.attached === true")
    page.wait_for_function("document.querySelectorAll('.mpo-strip-tok').length > 0")
    page.wait_for_timeout(100)
    overflow = page.evaluate("""() => {
        const vp = document.querySelector('.mpo-strip-viewport').getBoundingClientRect();
        return [...document.querySelectorAll('.mpo-strip-row')].filter(r => {
            const t = r.querySelectorAll('.mpo-strip-tok'); return t.length && t[t.length -
            1].getBoundingClientRect().right > vp.right;
        }).length; }""")
    assert overflow == 0
    assert page_errors == []


def test_empty_and_channel_less_payloads(page, page_errors, tmp_path):
    html = (
        f"<!doctype html><meta charset=utf-8><style>{strip_css()}</style><div id=a></div><div id=b></div>"
        f"<script>{strip_js(module=False)}\n"
        "window.a = mpoStrip.mount(document.getElementById('a'), {tokens: []});\n"
        "window.b = mpoStrip.mount(document.getElementById('b'), {tokens: ['x', 'y'], mask: [0, 1]});\n"
        "window.done = true;</script>"
    )
    f = tmp_path / "e.html"
    f.write_text(html)
    page.goto(f.as_uri())
    page.wait_for_function("window.done === true")
    assert page.evaluate("[window.a.rows, window.b.rows]") == [0, 2]
    assert page.locator("#a .mpo-strip-tok").count() == 0
    page.hover("#b [data-i='1']")
    assert "action" in page.inner_text("#b .mpo-strip-tip")
    assert page.is_disabled("#b select.mpo-strip-channel")
    assert page_errors == []


def test_patch_recolours_without_a_new_payload(page, page_errors, open_html):
    p = payload_from_arrays(
        ["a", "b", "c", "d"],
        [1, 1, 0, 1],
        None,
        {"x": [1.0, -1.0, 0.0, 0.5], "y": [0.1, 0.2, 0.3, 0.4]},
        channel_info={"x": {"scale": 1.0}},
        title="patched",
    )
    patch = {
        "channels": {"x": [1.0, 2.0, None, -0.5]},
        "channel_info": {"x": {"label": "x", "center": 0.0, "scale": 2.0}},
    }
    html = (
        f"<!doctype html><meta charset=utf-8><style>{strip_css()}</style><div id=w></div><div id=v></div>"
        f"<script type=module>{strip_js()}\n{_MODEL}\n"
        f"window.model = new FakeModel({{payload: {json.dumps(json.dumps(p))}, patch: '', channel: 'x'}});\n"
        "window.cleanup = render({ model: window.model, el: document.getElementById('w') });\n"
        "window.render = render; window.ready = true;</script>"
    )
    open_html(html, "p.html")
    bg = (
        "(sel) => [...document.querySelectorAll(sel + ' .mpo-strip-tok:not(.mpo-strip-obs)')]"
        ".map((t) => t.style.background)"
    )
    assert page.evaluate(bg, "#w")[0] == "rgb(33, 102, 172)"  # 1.0 at scale 1: the end colour
    page.evaluate("window.before = document.querySelector('#w .mpo-strip-row')")
    page.evaluate(f"window.model.set('patch', {json.dumps(json.dumps(patch))})")
    # by hand: 1.0 / 2 -> half way to blue (140, 175, 210); 2.0 / 2 -> blue; -0.5 / 2 -> a quarter to red (230, 191,
    # 196)
    want = ["rgb(140, 175, 210)", "rgb(33, 102, 172)", "rgb(230, 191, 196)"]
    assert page.evaluate(bg, "#w") == want
    assert page.inner_text("#w .mpo-strip-hi") == "2"
    assert "patched" in page.inner_text("#w .mpo-strip-title")
    page.hover("#w [data-i='1']")
    assert "2" in page.inner_text("#w .mpo-strip-tip tr.mpo-strip-active")
    # a view opened later from the same model shows the payload with the patch applied
    page.evaluate("window.cleanup2 = render({ model: window.model, el: document.getElementById('v') }); 0")
    assert page.evaluate(bg, "#v") == want
    # a new payload (with the patch reset) replaces both
    page.evaluate(f"window.model.state.patch = ''; window.model.set('payload', {json.dumps(json.dumps(p))})")
    assert page.evaluate(bg, "#w")[0] == "rgb(33, 102, 172)"
    page.evaluate("window.cleanup(); window.cleanup2()")
    assert page.evaluate("Object.values(window.model.handlers).every((h) => h.length === 0)")
    assert page_errors == []


def test_render_reads_numbers_from_binary_arrays(page, page_errors, open_html):
    from mpo_viz.widgets.strip_widget import split_payload

    p = payload_from_arrays(
        ["a", "b", "c"], [1, 0, 1], [0, 0, 1], {"x": [0.5, None, -2.0], "y": [1.0, 2.0, 3.0]}, title="bin"
    )
    wire, _ = split_payload(p)
    # the buffers as the widget manager hands them over: DataViews, one at an odd offset (copied)
    html = (
        f"<!doctype html><meta charset=utf-8><style>{strip_css()}</style><div id=w></div>"
        f"<script type=module>{strip_js()}\n{_MODEL}\n"
        "const x = new Uint8Array(new Float64Array([0.5, NaN, -2.0]).buffer);\n"
        "const odd = new ArrayBuffer(25); new Uint8Array(odd, 1, 24).set(x);\n"
        "const arrays = "
        "{channels: {x: new DataView(odd, 1, 24), y: new DataView(new Float64Array([1, 2, 3]).buffer)},\n"
        "  mask: new DataView(new Uint8Array([1, 0, 1]).buffer), turn_ids: new DataView(new Int32Array([0, 0, "
        "1]).buffer)};\n"
        f"window.model = new FakeModel({{payload: {json.dumps(json.dumps(wire))}, arrays, patch: '', channel: 'x'}});\n"
        "window.cleanup = render({ model: window.model, el: document.getElementById('w') });\n"
        "window.ready = true;</script>"
    )
    open_html(html, "b.html")
    assert page.locator("#w .mpo-strip-tok").count() == 3 and page.locator("#w .mpo-strip-obs").count() == 1
    # by hand: the strip's own scale is the lower 99th-percentile |x| over action tokens {0.5, 2}: 0.5;
    # 0.5 -> the blue end, -2 -> the red end, clipped
    bg = page.evaluate(
        "[...document.querySelectorAll('#w .mpo-strip-tok:not(.mpo-strip-obs)')].map((t) => t.style.background)"
    )
    assert bg == ["rgb(33, 102, 172)", "rgb(178, 24, 43)"]
    assert page.locator("#w .mpo-strip-clip").count() == 1
    page.hover("#w [data-i='1']")  # the observation token: x is missing (NaN), y is 2
    rows = page.eval_on_selector_all("#w .mpo-strip-tip tr", "rs => rs.map((r) => r.textContent)")
    assert rows == ["x\u2014", "y2"]
    page.evaluate("window.cleanup()")
    assert page_errors == []


def test_patch_values_from_binary_buffers(page, page_errors, open_html):
    """The widget's patch: JSON naming the channels (null) with their values in ``patch_arrays``
    (float64 buffers, as the comm hands them over: DataViews); patch and patch_arrays set one
    after the other (one message) are applied once, with both; a view opened later starts from
    payload + patch."""
    from mpo_viz.widgets.strip_widget import split_payload

    p = payload_from_arrays(
        ["a", "b", "c", "d"],
        [1, 1, 0, 1],
        None,
        {"x": [1.0, -1.0, 0.0, 0.5], "y": [0.1, 0.2, 0.3, 0.4]},
        channel_info={"x": {"scale": 1.0}},
        title="bufs",
    )
    wire, _ = split_payload(p)
    patch = {"channels": {"x": None}, "channel_info": {"x": {"label": "x", "center": 0.0, "scale": 2.0}}, "focus": 3}
    html = (
        f"<!doctype html><meta charset=utf-8><style>{strip_css()}</style><div id=w></div><div id=v></div>"
        f"<script type=module>{strip_js()}\n{_MODEL}\n"
        "const f64 = (a) => new DataView(new Float64Array(a).buffer);\n"
        "const arrays = {channels: {x: f64([1, -1, 0, 0.5]), y: f64([0.1, 0.2, 0.3, 0.4])},\n"
        "  mask: new DataView(new Uint8Array([1, 1, 0, 1]).buffer), turn_ids: new DataView(new Int32Array([0, 0, 1, "
        "1]).buffer)};\n"
        "window.model = new "
        f"FakeModel({{payload: {json.dumps(json.dumps(wire))}, arrays, patch: '', "
        "patch_arrays: {}, channel: 'x'});\n"
        "window.applied = 0;\n"
        "window.cleanup = render({ model: window.model, el: document.getElementById('w') });\n"
        "window.f64 = f64; window.render = render; window.ready = true;</script>"
    )
    open_html(html, "pb.html")
    bg = (
        "(sel) => [...document.querySelectorAll(sel + ' .mpo-strip-tok:not(.mpo-strip-obs)')]"
        ".map((t) => t.style.background)"
    )
    assert page.evaluate(bg, "#w")[0] == "rgb(33, 102, 172)"  # 1.0 at scale 1: the end colour
    # patch first, its buffers second (as one message applies them): the strip must wait for both
    page.evaluate(
        f"window.model.set('patch', {json.dumps(json.dumps(patch))});"
        "window.model.set('patch_arrays', {x: window.f64([1, 2, NaN, -0.5])})"
    )
    # by hand, as test_patch_recolours_without_a_new_payload: 0.5 of blue, blue, a quarter of red
    want = ["rgb(140, 175, 210)", "rgb(33, 102, 172)", "rgb(230, 191, 196)"]
    assert page.evaluate(bg, "#w") == want
    assert page.inner_text("#w .mpo-strip-hi") == "2"
    # a second move: only the buffers change (the JSON is the same string)
    page.evaluate("window.model.set('patch_arrays', {x: window.f64([2, 2, NaN, 2])})")
    assert page.evaluate(bg, "#w") == ["rgb(33, 102, 172)"] * 3
    page.evaluate("window.model.set('patch_arrays', {x: window.f64([1, 2, NaN, -0.5])})")
    # a view opened later shows the payload with the patch applied
    page.evaluate("window.cleanup2 = render({ model: window.model, el: document.getElementById('v') }); 0")
    assert page.evaluate(bg, "#v") == want
    page.hover("#v [data-i='1']")
    assert "2" in page.inner_text("#v .mpo-strip-tip tr.mpo-strip-active")
    page.evaluate("window.cleanup(); window.cleanup2()")
    assert page.evaluate("Object.values(window.model.handlers).every((h) => h.length === 0)")
    assert page_errors == []


def test_log_channel_colours_by_the_log_and_shows_the_ratio(page, page_errors, open_html):
    """The saved update ratio travels as its natural log (channel info ``log``): tokens are coloured
    by the log, centred at 0 (ratio 1), while the legend ends and the hover show the ratio itself."""
    import math

    logr = [math.log(2.0), math.log(0.5), 0.0, math.log(1.25)]
    p = payload_from_arrays(
        ["a", "b", "c", "d"],
        [1, 1, 0, 1],
        None,
        {"update_ratio": logr, "clipped": [1.0, 0.0, 0.0, 0.0]},
        channel_info={
            "update_ratio": {"label": "ratio after the update (log scale)", "scale": math.log(2.0), "log": True},
            "clipped": {"label": "clipped", "scale": 1.0},
        },
        title="ratios",
    )
    html = (
        f"<!doctype html><meta charset=utf-8><style>{strip_css()}</style><div id=w></div>"
        f"<script type=module>{strip_js()}\n{_MODEL}\n"
        f"window.model = new FakeModel({{payload: {json.dumps(json.dumps(p))}, channel: 'update_ratio'}});\n"
        "window.cleanup = render({ model: window.model, el: document.getElementById('w') });\n"
        "window.ready = true;</script>"
    )
    open_html(html, "log.html")
    # by hand: scale log 2, centre 0 -> the legend's ends are exp(-log 2) = 0.5 and exp(log 2) = 2
    assert page.inner_text("#w .mpo-strip-lo") == "0.5" and page.inner_text("#w .mpo-strip-hi") == "2"
    bg = "[...document.querySelectorAll('#w .mpo-strip-tok:not(.mpo-strip-obs)')].map((t) => t.style.background)"
    # log 2 / log 2 = +1: the blue end; log 0.5 = -1: the red end; log 1.25 / log 2 = 0.32 of the way to blue
    got = page.evaluate(bg)
    assert got[:2] == ["rgb(33, 102, 172)", "rgb(178, 24, 43)"]
    page.hover("#w [data-i='3']")
    rows = page.eval_on_selector_all("#w .mpo-strip-tip tr", "rs => rs.map((r) => r.textContent)")
    assert rows == ["ratio after the update (log scale)1.25", "clipped0"]  # the ratio, not its log
    page.select_option("#w select.mpo-strip-channel", "clipped")
    assert page.inner_text("#w .mpo-strip-hi") == "1"  # a plain channel: no exp
    assert page.evaluate(bg)[0] == "rgb(33, 102, 172)"  # clipped = 1 at scale 1
    page.evaluate("window.cleanup()")
    assert page_errors == []


def test_the_true_advantage_marks_measured_tokens_on_the_credits_scale(page, page_errors, open_html):
    """A payload with a token truth: the rows grow a marker row, each measured token has a bar under it
    (inside its row) coloured by Â_t on the scale of the credit shown, the hover gives Â_t ± 1.96·se,
    an unmeasured action token says so; a patch of the credit's scale recolours the bars."""
    nan = float("nan")
    truth = [0.5, nan, nan, -1.0, nan]
    p = payload_from_arrays(
        ["go", "east", "obs", "take", "key"],
        [1, 1, 0, 1, 1],
        None,
        {"adv_mpo": [0.5, 0.2, nan, 0.3, -0.1], "truth": truth},
        channel_info={
            "adv_mpo": {"label": "advantage (mpo)", "scale": 1.0},
            "truth": {"label": "true advantage", "scale": 1.0},
        },
        title="truth",
    )
    p["truth"] = {"channel": "truth", "se": [0.1, None, None, 0.05, None]}
    html = (
        f"<!doctype html><meta charset=utf-8><style>{strip_css()}</style><div id=w></div>"
        f"<script type=module>{strip_js()}\n{_MODEL}\n"
        f"window.model = new FakeModel({{payload: {json.dumps(json.dumps(p))}, channel: 'adv_mpo'}});\n"
        "window.cleanup = render({ model: window.model, el: document.getElementById('w') });\n"
        "window.ready = true;</script>"
    )
    open_html(html, "truth.html")
    marks = page.evaluate(
        "[...document.querySelectorAll('#w .mpo-strip-mark')].map((m) => [+m.parentNode.dataset.i, m.style.background])"
    )
    # Â = 0.5 at scale 1: halfway to blue, (247 + (33 − 247)/2, ...); Â = −1: the red end
    assert marks == [[0, "rgb(140, 175, 210)"], [3, "rgb(178, 24, 43)"]]
    # the bar lies under its token and inside the row (the marker row), not over the next row
    geo = page.evaluate(
        "(() => { const m = document.querySelector('#w .mpo-strip-mark'); const t = m.parentNode; "
        "const r = t.closest('.mpo-strip-row'); const [a, b, c] = [m, t, r].map((e) => "
        "e.getBoundingClientRect()); return [a.top >= b.bottom - 1, a.bottom <= c.bottom + 0.5, "
        "c.height]; })()"
    )
    assert geo == [True, True, 26]
    assert "2 measured tokens" in page.inner_text("#w .mpo-strip-truthnote")
    page.hover("#w [data-i='0']")
    assert page.inner_text("#w .mpo-strip-tiptruth") == "true advantage Ât = 0.5 ± 0.196 (1.96·se)"
    page.hover("#w [data-i='1']")
    assert page.inner_text("#w .mpo-strip-tiptruth") == "true advantage: not measured"
    # the credit's scale doubles: the bars follow it (Â = 0.5 is a quarter of the way now)
    page.evaluate(
        "window.model.set('patch', JSON.stringify({channels: {}, channel_info: "
        "{adv_mpo: {label: 'advantage (mpo)', center: 0, scale: 2.0}}}))"
    )
    page.wait_for_function("document.querySelector('#w .mpo-strip-mark').style.background !== 'rgb(140, 175, 210)'")
    assert page.evaluate("document.querySelector('#w .mpo-strip-mark').style.background") == "rgb(194, 211, 228)"
    page.evaluate("window.cleanup()")
    assert page_errors == []
