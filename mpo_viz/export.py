"""Getting figures and tables out: CSV files and data-URI links for tables, images of figures
through plotly's static export (a renderer, the ``kaleido`` package, is needed; without one
:func:`write_figures` raises a ``RuntimeError`` that says so and what to do instead). Used by the
report and by the widgets (whose browser-side buttons are :class:`mpo_viz.widgets.export.ExportBar`).
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pandas as pd

__all__ = ["csv_link", "write_tables", "write_figures", "static_export_available", "FIGURE_FORMATS", "MAX_LINK_ROWS"]

FIGURE_FORMATS = ("png", "svg", "pdf", "jpeg", "webp")
MAX_LINK_ROWS = 5000
"""A table with more rows gets no CSV link in the browser (it would travel on every update); use
:func:`write_tables`."""


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("_") or "table"


def csv_link(df: pd.DataFrame, name: str) -> str:
    """An ``<a download>`` link with the table as a CSV data URI (empty string past
    :data:`MAX_LINK_ROWS` rows)."""
    if len(df) > MAX_LINK_ROWS:
        return (f"<span class='mpo-export-note'>{html.escape(name)}: {len(df):,} rows, too many for a link — "
                "use export_tables()</span>")
    data = base64.b64encode(df.to_csv(index=False).encode("utf-8")).decode("ascii")
    fn = _slug(name) + ".csv"
    return f"<a class='mpo-csv' download='{fn}' href='data:text/csv;base64,{data}'>{html.escape(name)} (CSV)</a>"


def write_tables(tables: dict, folder) -> list[Path]:
    """Write each ``{name: DataFrame}`` as ``folder/<name>.csv``; returns the paths."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, df in tables.items():
        p = out / f"{_slug(name)}.csv"
        df.to_csv(p, index=False)
        paths.append(p)
    return paths


def static_export_available() -> bool:
    """Whether plotly's static image export has a renderer here (the ``kaleido`` package)."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return False
    return True


def write_figures(figures: dict, folder, formats=("png", "svg")) -> list[Path]:
    """Write each ``{name: figure}`` as ``folder/<name>.<format>`` with plotly's static export.

    Raises ``ValueError`` for an unknown format and ``RuntimeError`` when no renderer is installed
    (in the browser, the view's PNG / SVG buttons export the same figures without one).
    """
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    bad = [f for f in formats if f not in FIGURE_FORMATS]
    if bad:
        raise ValueError(f"formats: expected some of {FIGURE_FORMATS}, found {bad}")
    if not static_export_available():
        raise RuntimeError(
            "static figure export needs a renderer: plotly uses the 'kaleido' package, which is not installed "
            "(pip install kaleido). Without it, export from the browser: the view's PNG / SVG buttons, or the "
            "camera icon of each figure; tables export as CSV with export_tables() either way.")
    import plotly.graph_objects as go

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures.items():
        for fmt in formats:
            p = out / f"{_slug(name)}.{fmt}"
            go.Figure(fig).write_image(str(p), format=fmt)
            paths.append(p)
    return paths


