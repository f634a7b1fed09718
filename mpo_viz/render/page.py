"""The pieces of a self-contained HTML page, shared by the offline report and the widgets' static
snapshots: the page shell (:func:`page_html`: the CSS, the strip's script and plotly.js inlined, so
the page opens offline), tables (:func:`html_table`, with a CSV download link, :func:`csv_link`),
embedded figures (:func:`figure_html`) and token strips (:func:`strip_html`), and
:func:`write_page` (temporary name, then rename).
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.offline

from mpo_viz.render.plots import FIGURE_CONFIG
from mpo_viz.render.strip import payload_json, strip_css, strip_js

__all__ = [
    "PAGE_CSS",
    "MAX_LINK_ROWS",
    "csv_link",
    "format_value",
    "html_table",
    "figure_html",
    "strip_html",
    "page_html",
    "write_page",
    "slug",
]


def slug(name: str) -> str:
    """``name`` as a file name: runs of anything but letters, digits, ``.``, ``_``, ``-`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("_") or "table"


MAX_LINK_ROWS = 5000
"""A table with more rows gets no CSV link in the browser (it would travel on every update); use
:func:`mpo_viz.render.export.write_tables`."""


def csv_link(df: pd.DataFrame, name: str) -> str:
    """An ``<a download>`` link with the table as a CSV data URI (empty string past
    :data:`MAX_LINK_ROWS` rows)."""
    if len(df) > MAX_LINK_ROWS:
        return (
            f"<span class='mpo-export-note'>{html.escape(name)}: {len(df):,} rows, too many for a link — "
            "use export_tables()</span>"
        )
    data = base64.b64encode(df.to_csv(index=False).encode("utf-8")).decode("ascii")
    fn = slug(name) + ".csv"
    return f"<a class='mpo-csv' download='{fn}' href='data:text/csv;base64,{data}'>{html.escape(name)} (CSV)</a>"


def format_value(v) -> str:
    """A table cell: numbers to 4 significant digits (scientific when tiny or huge), NaN and None as
    "—", infinities as "∞", integers with thousands separators, text escaped."""
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
        link = (
            "<div class=export>"
            + csv_link(pd.DataFrame([tuple(r) for r in rows], columns=list(map(str, header))), csv)
            + "</div>"
        )
    h = ""
    if header:
        h = "<tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in header) + "</tr>"
    body = "".join(
        "<tr>"
        + "".join(f"<td>{c if isinstance(c, str) and c.startswith('<') else format_value(c)}</td>" for c in r)
        + "</tr>"
        for r in rows
    )
    return f'<table class="{cls}">{h}{body}</table>{link}'


def figure_html(fig, div_id: str) -> str:
    """A plotly figure (no plotly.js: the page inlines it once) and its "PNG · SVG" export links
    (plotly.js's own image export, wired by :func:`page_html`)."""
    links = (
        f'<div class=export>export <a href="#" data-fig="{div_id}" data-fmt="png">PNG</a> · '
        f'<a href="#" data-fig="{div_id}" data-fmt="svg">SVG</a></div>'
    )
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=FIGURE_CONFIG) + links


def strip_html(element_id: str, payload: dict, height: int = 320, *, payload_id: str | None = None) -> str:
    """A strip placeholder plus its JSON payload (in a script tag with id ``payload_id``, default
    ``<element_id>-data``); :func:`page_html`'s script mounts it."""
    pid = payload_id or f"{element_id}-data"
    return (
        f'<div class="strip" id="{element_id}" data-payload="{pid}" data-height="{int(height)}"></div>'
        f'<script type="application/json" id="{pid}">{payload_json(payload)}</script>'
    )


def page_html(title: str, body: str, *, footer: str, figure_ids: list[str]) -> str:
    """The self-contained page shell shared by the report and widget snapshots.

    Inlines the page CSS, the strip's CSS and script and plotly.js (no CDN: opens offline), then
    mounts every strip placed with :func:`strip_html`. Sets ``window.mpoStrips``,
    ``window.mpoReportFigures`` (``figure_ids``) and ``window.mpoReportReady`` for tests.
    """
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
      Plotly.downloadImage(document.getElementById(a.dataset.fig),
      {{ format: a.dataset.fmt, filename: a.dataset.fig }});
    }});
  }});
  window.mpoReportReady = true;
}})();
</script>
</body></html>
"""


def write_page(path, text: str) -> Path:
    """Write a page's ``text`` to ``path`` (temporary name, then rename; folders made); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)
    return p


PAGE_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto; max-width: 1200px;
       padding: 0 16px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin-bottom: 6px; } h3 small { color: #666; font-weight: normal; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
td, th { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: left; font-variant-numeric: tabular-nums; }
table.kv td:first-child { color: #555; } table.grid th { background: #f6f6f6; }
.note { color: #555; font-size: 13px; } .warn { font-size: 13px; background: #fdf3e7; padding: 6px 10px;
  border-left: 3px solid #c0661f; } .reading { font-size: 14px; background: #f3f7fb; padding: 6px 10px;
  border-left: 3px solid #1f5fa8; } section.traj { margin: 18px 0 30px; }
.export { font-size: 12px; color: #666; margin: 2px 0 10px; } .export a { color: #1f5fa8; margin-right: 6px; }
footer { margin-top: 40px; color: #888; font-size: 12px; }
"""
