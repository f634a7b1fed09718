"""Getting figures and tables out as files: CSV files of tables, images of figures through plotly's
static export (a renderer, the ``kaleido`` package, is needed; without one :func:`write_figures`
raises a ``RuntimeError`` that says so and what to do instead). Used by the report and by the
widgets (whose browser-side buttons are :class:`mpo_viz.widgets.export_bar.ExportBar`); a table's
in-page CSV link is :func:`mpo_viz.render.page.csv_link` (also importable from here).
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from mpo_viz.render.page import MAX_LINK_ROWS, csv_link, slug

__all__ = [
    "csv_link",
    "write_tables",
    "write_figures",
    "static_export_available",
    "FIGURE_FORMATS",
    "MAX_LINK_ROWS",
    "NO_RENDERER",
]

FIGURE_FORMATS = ("png", "svg", "pdf", "jpeg", "webp")


def write_tables(tables: dict, folder) -> list[Path]:
    """Write each ``{name: DataFrame}`` as ``folder/<name>.csv``; returns the paths."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, df in tables.items():
        p = out / f"{slug(name)}.csv"
        df.to_csv(p, index=False)
        paths.append(p)
    return paths


NO_RENDERER = (
    "static figure export needs a renderer: plotly uses the 'kaleido' package, which is not installed "
    "(pip install kaleido). Without it, export from the browser: the PNG / SVG buttons of each view (or the "
    "camera icon of each figure), and the report's PNG / SVG links; tables export as CSV either way "
    "(export_tables(), the CSV links)."
)
"""What :func:`write_figures` raises, and the report's export says, when no renderer is installed."""


def static_export_available() -> bool:
    """Whether plotly's static image export has a renderer here (the ``kaleido`` package)."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return False
    return True


def write_figures(figures: dict, folder, formats=("png", "svg")) -> list[Path]:
    """Write each ``{name: figure}`` as ``folder/<name>.<format>`` with plotly's static export.

    Raises ``ValueError`` for an unknown format, ``RuntimeError`` (:data:`NO_RENDERER`) when no
    renderer is installed, and ``RuntimeError`` naming the figure and format when the renderer is
    there but fails (kaleido 1.x drives a Chrome it must find). In the browser, the view's PNG / SVG
    buttons export the same figures without a renderer.
    """
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    bad = [f for f in formats if f not in FIGURE_FORMATS]
    if bad:
        raise ValueError(f"formats: expected some of {FIGURE_FORMATS}, found {bad}")
    if not static_export_available():
        raise RuntimeError(NO_RENDERER)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures.items():
        for fmt in formats:
            p = out / f"{slug(name)}.{fmt}"
            try:
                go.Figure(fig).write_image(str(p), format=fmt)
            except Exception as exc:  # noqa: BLE001 - the renderer's own errors vary by version
                raise RuntimeError(
                    f"static figure export: the renderer (kaleido) failed on figure {name!r} as {fmt} "
                    f"({type(exc).__name__}: {exc}). kaleido 1.x needs a Chrome or Chromium it can find; the "
                    "browser's PNG / SVG buttons export without it."
                ) from exc
            paths.append(p)
    return paths
