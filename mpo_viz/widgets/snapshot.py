"""Static snapshots of the widgets: one self-contained HTML page built with the report's machinery
(:mod:`mpo_viz.report`'s page style, figure and table helpers; plotly.js and the strip inlined, so
the page opens offline). Every widget's ``to_html()`` fills a :class:`Snapshot`.
"""

from __future__ import annotations

import datetime as _dt
import html
import json

import pandas as pd

__all__ = ["Snapshot"]


class Snapshot:
    """Collect sections (HTML, tables, strips, figures) and render one offline page."""

    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = []
        self.figures: list[str] = []
        self._n = 0

    def _id(self, kind: str) -> str:
        self._n += 1
        return f"{kind}-{self._n}"

    def heading(self, text: str, level: int = 2) -> Snapshot:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")
        return self

    def note(self, text: str) -> Snapshot:
        self.parts.append(f"<p class=note>{html.escape(text)}</p>")
        return self

    def raw(self, text: str) -> Snapshot:
        self.parts.append(text)
        return self

    def kv(self, pairs) -> Snapshot:
        """A two-column key/value table (the report's summary style)."""
        from mpo_viz.report import _table

        self.parts.append(_table([(str(k), v) for k, v in pairs]))
        return self

    def table(self, df: pd.DataFrame, max_rows: int = 200) -> Snapshot:
        """A DataFrame as the report's grid table (first ``max_rows`` rows)."""
        from mpo_viz.report import _table

        d = df.head(max_rows)
        rows = [tuple(r) for r in d.itertuples(index=False)]
        self.parts.append(_table(rows, tuple(map(str, d.columns)), "grid"))
        if len(df) > max_rows:
            self.note(f"first {max_rows} of {len(df):,} rows")
        return self

    def strip(self, payload: dict, height: int = 320) -> Snapshot:
        from mpo_viz.strip import payload_json

        sid = self._id("strip")
        self.parts.append(f'<div class="strip" id="{sid}" data-payload="{sid}-data" data-height="{int(height)}"></div>'
                          f'<script type="application/json" id="{sid}-data">{payload_json(payload)}</script>')
        return self

    def figure(self, fig) -> Snapshot:
        import plotly.graph_objects as go

        from mpo_viz.report import _figure_html

        fid = self._id("fig")
        self.parts.append(_figure_html(go.Figure(fig), fid))
        self.figures.append(fid)
        return self

    def render(self) -> str:
        import plotly.offline

        import mpo_viz
        from mpo_viz.report import _PAGE_CSS
        from mpo_viz.strip import strip_css, strip_js

        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        title = html.escape(self.title)
        body = "\n".join(self.parts)
        return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{_PAGE_CSS}</style>
<style>{strip_css()}</style>
<script>{plotly.offline.get_plotlyjs()}</script>
<script>{strip_js(module=False)}</script>
</head><body>
<h1>{title}</h1>
{body}
<footer>mpo_viz {html.escape(mpo_viz.__version__)} · widget snapshot {stamp} · self-contained: opens offline</footer>
<script>
(function () {{
  window.mpoStrips = [];
  document.querySelectorAll("div.strip[data-payload]").forEach(function (el) {{
    var p = JSON.parse(document.getElementById(el.dataset.payload).textContent);
    window.mpoStrips.push(window.mpoStrip.mount(el, p, {{ height: +el.dataset.height || 320 }}));
  }});
  window.mpoReportFigures = {json.dumps(self.figures)};
  window.mpoReportReady = true;
}})();
</script>
</body></html>
"""

    def write(self, path, text: str | None = None) -> str:
        """Write the page (``text``, default :meth:`render`; temporary name, then rename); returns
        the page's text."""
        import os
        from pathlib import Path

        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        text = self.render() if text is None else text
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
        return text
