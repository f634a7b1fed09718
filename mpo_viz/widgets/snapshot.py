"""Static snapshots of the widgets: one self-contained HTML page built with the report's machinery
(:mod:`mpo_viz.report`'s page style, figure and table helpers; plotly.js and the strip inlined, so
the page opens offline). Every widget's ``to_html()`` fills a :class:`Snapshot`.
"""

from __future__ import annotations

import datetime as _dt
import html

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
        from mpo_viz.report import html_table

        self.parts.append(html_table([(str(k), v) for k, v in pairs]))
        return self

    def table(self, df: pd.DataFrame, max_rows: int = 200) -> Snapshot:
        """A DataFrame as the report's grid table (first ``max_rows`` rows)."""
        from mpo_viz.report import html_table

        d = df.head(max_rows)
        rows = [tuple(r) for r in d.itertuples(index=False)]
        self.parts.append(html_table(rows, tuple(map(str, d.columns)), "grid"))
        if len(df) > max_rows:
            self.note(f"first {max_rows} of {len(df):,} rows")
        return self

    def strip(self, payload: dict, height: int = 320) -> Snapshot:
        from mpo_viz.report import strip_html

        self.parts.append(strip_html(self._id("strip"), payload, height))
        return self

    def figure(self, fig) -> Snapshot:
        import plotly.graph_objects as go

        from mpo_viz.report import figure_html

        fid = self._id("fig")
        self.parts.append(figure_html(go.Figure(fig), fid))
        self.figures.append(fid)
        return self

    def render(self) -> str:
        from mpo_viz.report import page_html
        from mpo_viz.version import __version__

        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        foot = f"<footer>mpo_viz {html.escape(__version__)} · widget snapshot {stamp} · self-contained: opens offline</footer>"
        return page_html(self.title, "\n".join(self.parts), footer=foot, figure_ids=self.figures)

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
