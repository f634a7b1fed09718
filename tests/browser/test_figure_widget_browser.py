"""figure.js (the figure widget's front end) around a stand-in for plotly's widget module, in
Chromium: the deltas plotly's view reports to Python after a redraw are sent once the page is quiet
(not before the frames that show the redraw), in the order they were asked for, with their
arguments; a view removed before then (its figure replaced or closed) sends nothing."""

from __future__ import annotations

import json

import pytest

from mpo_viz.widgets.figure import FIGURE_JS

pytestmark = pytest.mark.browser

# plotly's module exports FigureView (whose _sendLayoutDelta / _sendTraceDeltas report to Python)
# and a default {initialize, render}; this stand-in records the calls
_FAKE_PLOTLY = """
export class FigureView {
  _sendLayoutDelta(id) { globalThis.sent.push(['layout', id]); }
  _sendTraceDeltas(id) { globalThis.sent.push(['trace', id]); }
  remove() { globalThis.removed.push(this.name); }
}
export default () => ({ initialize() {}, render() { return () => {}; } });
"""


def test_deltas_to_python_follow_the_frame(page, page_errors, open_html):
    html = (
        "<!doctype html><meta charset=utf-8><div id=f></div><script type=module>\n"
        f"{FIGURE_JS.replace('export default', 'const widget =')}\n"
        "window.sent = []; window.removed = [];\n"
        # the figure's model refers to a PlotlySource model, found through the widget manager
        f"const source = {{ get: (k) => (k === 'source' ? {json.dumps(_FAKE_PLOTLY)} : undefined) }};\n"
        "window.asked = [];\n"
        "const widget_manager = { get_model: async (id) => { window.asked.push(id); return source; } };\n"
        "const model = { get: (k) => (k === '_plotly_source' ? 'IPY_MODEL_abc' : undefined), widget_manager };\n"
        "const w = widget(); await w.initialize({ model });\n"
        "const mod = await globalThis[Symbol.for('mpo_viz.plotly_widget_module')];\n"
        "const view = new mod.FigureView();\n"
        "view._sendTraceDeltas(7); view._sendLayoutDelta(8);\n"
        "window.syncSent = window.sent.length;\n"
        "await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 20)));\n"
        "window.frameSent = window.sent.length;\n"
        "view._sendTraceDeltas(9);  // a second redraw soon after: its report waits with the others\n"
        "const gone = new mod.FigureView(); gone.name = 'gone';\n"
        "gone._sendLayoutDelta(10); gone.remove();  // replaced before the page is quiet: no report\n"
        "window.t0 = performance.now();\n"
        "window.ready = true;</script>"
    )
    open_html(html, "f.html")
    assert page.evaluate("window.syncSent") == 0  # nothing before the frame
    assert page.evaluate("window.frameSent") == 0  # nor right after it (the next frames come first)
    page.wait_for_function("window.sent.length >= 3", timeout=5_000)  # one flush sends every waiting report
    assert page.evaluate("window.sent") == [["trace", 7], ["layout", 8], ["trace", 9]]
    assert page.evaluate("window.removed") == ["gone"]  # plotly's own remove() still runs
    assert page.evaluate("window.asked") == ["abc"]  # the reference, without its IPY_MODEL_ prefix
    assert page_errors == []
