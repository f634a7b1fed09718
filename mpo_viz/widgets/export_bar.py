"""Getting figures and tables out of the widgets: the export bar and the views' export methods.

In the browser: :class:`ExportBar` (an HTML widget) puts "PNG" / "SVG" buttons beside a view that
download every plotly figure of that view with plotly.js's own image export, and CSV links for its
tables (data URIs, so they also work in a static ``to_html`` page). From Python, every view is an
:class:`Exportable`: ``tables()`` / ``figures()`` and ``export_tables(folder)`` (CSV, always
available), ``export_figures(folder)`` (PNG / SVG / PDF through plotly's static export,
:func:`mpo_viz.render.export.write_figures`, which needs a renderer, the ``kaleido`` package; without one
it raises a ``RuntimeError`` that says so and what to do instead).
"""

from __future__ import annotations

import html

import ipywidgets as W

from mpo_viz.render.export import (
    FIGURE_FORMATS,
    csv_link,
    static_export_available,
    write_figures,
    write_tables,
)

__all__ = [
    "ExportBar",
    "Exportable",
    "style_widget",
    "csv_link",
    "write_tables",
    "write_figures",
    "static_export_available",
    "FIGURE_FORMATS",
]

_DOWNLOAD_JS = (
    "(async function(btn, format){"
    "const scope = btn.closest('.mpo-view') || document;"
    "const figs = [...scope.querySelectorAll('.js-plotly-plot')];"
    "const base = btn.dataset.base || 'mpo_viz';"
    "for (let i = 0; i < figs.length; i++) {"
    " const gd = figs[i]; const filename = figs.length > 1 ? base + '_' + (i + 1) : base;"
    " const P = window.Plotly;"
    " if (P && P.downloadImage) { await P.downloadImage(gd, {format, filename}); continue; }"
    # the widget's bundled plotly.js is not global: use plotly's own "download plot" modebar button
    " const ctx = gd._context || {}; const old = ctx.toImageButtonOptions;"
    " ctx.toImageButtonOptions = Object.assign({}, old || {}, {format, filename});"
    " const b = gd.querySelector('.modebar-btn[data-attr=\\'toImage\\'], .modebar-btn[data-title^=\\'Download\\']');"
    " if (b) b.dispatchEvent(new MouseEvent('click', {bubbles: true}));"
    " await new Promise((r) => setTimeout(r, 50)); ctx.toImageButtonOptions = old; }"
    "})(this, '%s'); return false;"
)

_CSS = (
    ".mpo-export "
    "{ display: flex; flex-wrap: wrap; gap: 4px 10px; align-items: center; font-size: 12px; margin: 2px 0; }"
    ".mpo-export-label { color: #666; } .mpo-export button { font-size: 12px; padding: 1px 8px; cursor: pointer; }"
    ".mpo-export a { color: #1f5fa8; } .mpo-export-note { color: #666; }"
)


def style_widget(css: str) -> W.HTML:
    """A hidden HTML widget holding a ``<style>`` (it applies to the page while the widget is shown).
    Views keep their CSS in one of these, set once, instead of inside HTML they replace on every
    update: each ``<style>`` element put into the page makes the browser rebuild its style rules
    (about 10 ms in JupyterLab, whose own stylesheets are large)."""
    return W.HTML(f"<style>{css}</style>", layout=W.Layout(display="none"))


class ExportBar(W.VBox):
    """ "export: PNG SVG · <table> (CSV) …": the buttons download every figure of the enclosing view
    (the nearest element with class ``mpo-view``) with plotly.js's own image export; the links are
    the view's tables as CSV. Plain HTML widgets (no extra front-end module): the bar, and its
    stylesheet in a hidden one set once (:func:`style_widget`).

    ``set_tables({name: DataFrame})`` refreshes the CSV links; ``value`` is the bar's HTML.
    """

    def __init__(self, basename: str = "mpo_viz"):
        self.basename = basename
        self.links = ""
        self.bar = W.HTML()
        super().__init__([style_widget(_CSS), self.bar])
        self._draw()

    @property
    def value(self) -> str:
        return self.bar.value

    def _draw(self) -> None:
        b = html.escape(self.basename, quote=True)
        self.bar.value = (
            f"<div class='mpo-export'><span class='mpo-export-label'>export</span>"
            f"<button class='mpo-export-png' data-base='{b}' title='every figure of this view as PNG "
            f'(plotly.js export)\' onclick="{_DOWNLOAD_JS % "png"}">PNG</button>'
            f"<button class='mpo-export-svg' data-base='{b}' title='every figure of this view as SVG "
            f'(plotly.js export)\' onclick="{_DOWNLOAD_JS % "svg"}">SVG</button>{self.links}</div>'
        )

    def set_tables(self, tables: dict) -> None:
        self.links = " ".join(csv_link(df, name) for name, df in tables.items())
        self._draw()


class Exportable:
    """The export methods the views share. A view defines :meth:`tables` and :meth:`figures`."""

    def tables(self) -> dict:
        """The view's tables, ``{name: DataFrame}``."""
        raise NotImplementedError

    def figures(self) -> dict:
        """The view's figures, ``{name: figure}``."""
        raise NotImplementedError

    def export_tables(self, folder) -> list:
        """Write :meth:`tables` as CSV files into ``folder``; returns the paths."""
        return write_tables(self.tables(), folder)

    def export_figures(self, folder, formats=("png", "svg")) -> list:
        """Write :meth:`figures` as images (plotly's static export; needs the ``kaleido`` renderer,
        else a ``RuntimeError`` says so); returns the paths."""
        return write_figures(self.figures(), folder, formats)
