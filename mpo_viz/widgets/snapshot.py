"""Static snapshots of the widgets: one self-contained HTML page built from the page pieces the
report uses (:mod:`mpo_viz.render.page`: its style, figure, strip and table helpers; plotly.js and the
strip inlined, so the page opens offline). Every widget's ``to_html()`` fills a :class:`Snapshot`.
"""

from __future__ import annotations

import datetime as _dt
import html

import pandas as pd
import plotly.graph_objects as go

from mpo_viz.render.page import figure_html, html_table, page_html, strip_html, write_page
from mpo_viz.version import __version__

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
        self.parts.append(html_table([(str(k), v) for k, v in pairs]))
        return self

    def table(self, df: pd.DataFrame, max_rows: int = 200) -> Snapshot:
        """A DataFrame as the report's grid table (first ``max_rows`` rows)."""
        d = df.head(max_rows)
        rows = [tuple(r) for r in d.itertuples(index=False)]
        self.parts.append(html_table(rows, tuple(map(str, d.columns)), "grid"))
        if len(df) > max_rows:
            self.note(f"first {max_rows} of {len(df):,} rows")
        return self

    def strip(self, payload: dict, height: int = 320) -> Snapshot:
        self.parts.append(strip_html(self._id("strip"), payload, height))
        return self

    def figure(self, fig) -> Snapshot:
        fid = self._id("fig")
        self.parts.append(figure_html(go.Figure(fig), fid))
        self.figures.append(fid)
        return self

    def render(self) -> str:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        foot = (
            f"<footer>mpo_viz {html.escape(__version__)} · widget snapshot {stamp} · "
            "self-contained: opens offline</footer>"
        )
        return page_html(self.title, "\n".join(self.parts), footer=foot, figure_ids=self.figures)

    def write(self, path, text: str | None = None) -> str:
        """Write the page (``text``, default :meth:`render`; temporary name, then rename); returns
        the page's text."""
        text = self.render() if text is None else text
        write_page(path, text)
        return text

    def output(self, path=None) -> str:
        """The page's text, also written to ``path`` when given (what a view's ``to_html`` returns)."""
        return self.write(path) if path is not None else self.render()
