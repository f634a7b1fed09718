"""The views' plotly figures: ``FigureWidget``, plotly's ``FigureWidget`` with a front end
(``figure.js``) that imports plotly's widget module once per page instead of once per figure, and
that sizes each figure to the width of its output instead of plotly's 700 px.

Why the first: anywidget imports each model's ES module afresh; plotly's is ~5 MB, and reopening a
notebook with a live kernel creates every figure model at once, so models missed anywidget's 2 s
initialization limit ("[anywidget] Failed to initialize model", logged again for each later message
to them, which are dropped). The Python API is plotly's, unchanged.
"""

from __future__ import annotations

import functools
from pathlib import Path

import plotly
import plotly.graph_objects as go
import traitlets

__all__ = ["FigureWidget", "FIGURE_JS"]

FIGURE_JS = (Path(__file__).with_name("figure.js")).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _plotly_widget_module() -> str:
    """The source of plotly's own FigureWidget ES module (shipped with plotly)."""
    path = Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"
    if not path.is_file():
        raise RuntimeError(f"plotly's widget module: expected {path} (plotly >= 6), found no such file; "
                           f"plotly {plotly.__version__} is installed")
    return path.read_text(encoding="utf-8")


class FigureWidget(go.FigureWidget):
    """plotly's ``FigureWidget`` (same API), sized to its output's width and sharing one import of
    plotly's front end with every other figure on the page. A layout ``width`` still fixes the width."""

    _esm = FIGURE_JS
    _plotly_esm = traitlets.Unicode().tag(sync=True)

    @traitlets.default("_plotly_esm")
    def _plotly_esm_default(self) -> str:
        # a default, not an assignment after __init__: the front end needs it in the state the
        # widget opens with (later messages wait until the model is initialized)
        return _plotly_widget_module()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # plotly's resize handler is what figure.js calls when the output's width changes
        self._config = {**(self._config or {}), "responsive": True}
