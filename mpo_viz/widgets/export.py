"""Getting figures and tables out of the widgets.

In the browser: :class:`ExportBar` (an anywidget) puts "PNG" / "SVG" buttons beside a view that
download every plotly figure of that view with plotly.js's own image export, and CSV links for its
tables (data URIs, so they also work in a static ``to_html`` page). From Python:
:func:`write_tables` (CSV, always available) and :func:`write_figures` (PNG / SVG / PDF through
plotly's static export, which needs a renderer, the ``kaleido`` package; without one it raises a
``RuntimeError`` that says so and what to do instead).
"""

from __future__ import annotations

import anywidget
import traitlets

from mpo_viz.export import (
    FIGURE_FORMATS,
    csv_link,
    static_export_available,
    write_figures,
    write_tables,
)

__all__ = ["ExportBar", "csv_link", "write_tables", "write_figures", "static_export_available", "FIGURE_FORMATS"]

_ESM = r"""
function figuresOf(el) {
  const scope = el.closest(".mpo-view") || el.parentElement || document;
  return [...scope.querySelectorAll(".js-plotly-plot")];
}

async function download(gd, format, filename) {
  const P = window.Plotly;
  if (P && P.downloadImage) return P.downloadImage(gd, { format, filename });
  // the widget's bundled plotly.js is not global: use plotly's own "download plot" modebar button
  const ctx = gd._context || {};
  const old = ctx.toImageButtonOptions;
  ctx.toImageButtonOptions = { ...(old || {}), format, filename };
  const btn = gd.querySelector('.modebar-btn[data-attr="toImage"], .modebar-btn[data-title^="Download"]');
  if (!btn) throw new Error("mpo_viz export: this figure has no plotly export button");
  btn.dispatchEvent(new MouseEvent("click", { bubbles: true }));
  await new Promise((r) => setTimeout(r, 50));
  ctx.toImageButtonOptions = old;
}

function render({ model, el }) {
  const bar = document.createElement("div");
  bar.className = "mpo-export";
  const draw = () => {
    bar.innerHTML = "<span class='mpo-export-label'>export</span>" +
      "<button class='mpo-export-png' title='every figure of this view as PNG (plotly.js export)'>PNG</button>" +
      "<button class='mpo-export-svg' title='every figure of this view as SVG (plotly.js export)'>SVG</button>" +
      (model.get("links") || "");
    bar.querySelector(".mpo-export-png").onclick = () => go("png");
    bar.querySelector(".mpo-export-svg").onclick = () => go("svg");
  };
  const go = async (format) => {
    const figs = figuresOf(el);
    const base = model.get("basename") || "mpo_viz";
    for (let i = 0; i < figs.length; i++) await download(figs[i], format, figs.length > 1 ? `${base}_${i + 1}` : base);
  };
  draw();
  model.on("change:links", draw);
  el.appendChild(bar);
  return () => model.off("change:links", draw);
}
export default { render };
"""

_CSS = """
.mpo-export { display: flex; flex-wrap: wrap; gap: 4px 10px; align-items: center; font-size: 12px; margin: 2px 0; }
.mpo-export-label { color: #666; }
.mpo-export button { font-size: 12px; padding: 1px 8px; cursor: pointer; }
.mpo-export a { color: #1f5fa8; }
.mpo-export-note { color: #666; }
"""


class ExportBar(anywidget.AnyWidget):
    """"export: PNG SVG · <table> (CSV) …": figure downloads through plotly.js for every figure of
    the enclosing view (the nearest element with class ``mpo-view``), and CSV links.

    ``set_tables({name: DataFrame})`` refreshes the CSV links.
    """

    _esm = _ESM
    _css = _CSS
    links = traitlets.Unicode("").tag(sync=True)
    basename = traitlets.Unicode("mpo_viz").tag(sync=True)

    def set_tables(self, tables: dict) -> None:
        self.links = " ".join(csv_link(df, name) for name, df in tables.items())
