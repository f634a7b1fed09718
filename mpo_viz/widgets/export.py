"""Deprecated: this module is :mod:`mpo_viz.widgets.export_bar` (the views' export bar and export
methods), renamed so that it is not mistaken for :mod:`mpo_viz.export` (files out)."""

import warnings

from mpo_viz.widgets.export_bar import (
    FIGURE_FORMATS,
    ExportBar,
    csv_link,
    static_export_available,
    style_widget,
    write_figures,
    write_tables,
)

__all__ = ["ExportBar", "style_widget", "csv_link", "write_tables", "write_figures", "static_export_available",
           "FIGURE_FORMATS"]

warnings.warn("mpo_viz.widgets.export is deprecated: import from mpo_viz.widgets.export_bar", DeprecationWarning,
              stacklevel=2)
