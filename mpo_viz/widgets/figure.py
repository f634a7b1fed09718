"""The views' plotly figures: ``FigureWidget``, plotly's ``FigureWidget`` with a front end
(``figure.js``) that imports plotly's widget module once per page instead of once per figure, and
that sizes each figure to the width of its output instead of plotly's 700 px.

Why the first: anywidget imports each model's ES module afresh; plotly's is ~5 MB, and reopening a
notebook with a live kernel creates every figure model at once, so models missed anywidget's 2 s
initialization limit ("[anywidget] Failed to initialize model", logged again for each later message
to them, which are dropped). The module's source is synced once per kernel, in one
:class:`PlotlySource` model that every figure refers to: with a copy in each figure, a notebook of
five views held ~26 MB of widget state, and reopening it took longer than JupyterLab waits for a
view's model ("Error displaying widget: model not found"). The Python API is plotly's, unchanged.

:func:`swap_child` puts a new widget in a box and closes the one it replaces (and its children), so
a view that rebuilds its figure does not leave the old one alive in the kernel and the page.
"""

from __future__ import annotations

import functools
from pathlib import Path

import ipywidgets as W
import plotly
import plotly.graph_objects as go
import traitlets

__all__ = ["FigureWidget", "FIGURE_JS", "PlotlySource", "plotly_source", "swap_child", "close_tree"]

FIGURE_JS = (Path(__file__).with_name("figure.js")).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _plotly_widget_module() -> str:
    """The source of plotly's own FigureWidget ES module (shipped with plotly)."""
    path = Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"
    if not path.is_file():
        raise RuntimeError(
            f"plotly's widget module: expected {path} (plotly >= 6), found no such file; "
            f"plotly {plotly.__version__} is installed"
        )
    return path.read_text(encoding="utf-8")


class PlotlySource(W.Widget):
    """plotly's widget module source (``source``, ~5 MB) as one widget model without a view: the
    kernel sends it to the page once, and every :class:`FigureWidget` refers to it."""

    source = traitlets.Unicode().tag(sync=True)


_SHARED: dict[str, PlotlySource] = {}


def plotly_source() -> PlotlySource:
    """The kernel's one :class:`PlotlySource` (made again if it was closed, e.g. by
    ``ipywidgets.Widget.close_all()``)."""
    src = _SHARED.get("plotly")
    if src is None or src.comm is None:
        src = _SHARED["plotly"] = PlotlySource(source=_plotly_widget_module())
    return src


class FigureWidget(go.FigureWidget):
    """plotly's ``FigureWidget`` (same API), sized to its output's width and sharing one import of
    plotly's front end with every other figure on the page. A layout ``width`` still fixes the width."""

    _esm = FIGURE_JS
    _plotly_source = traitlets.Instance(PlotlySource).tag(sync=True, **W.widget_serialization)

    @traitlets.default("_plotly_source")
    def _plotly_source_default(self) -> PlotlySource:
        # a default, not an assignment after __init__: the front end needs the reference in the
        # state the widget opens with (later messages wait until the model is initialized)
        return plotly_source()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # plotly's resize handler is what figure.js calls when the output's width changes
        self._config = {**(self._config or {}), "responsive": True}


def _tree(widget: W.Widget) -> list[W.Widget]:
    """``widget`` and every widget under it (boxes' children), depth first."""
    out = [widget]
    for child in getattr(widget, "children", ()) or ():
        out += _tree(child)
    return out


def close_tree(widget: W.Widget, keep: frozenset[int] = frozenset()) -> None:
    """Close ``widget``, the boxes' children under it and their ``layout`` / ``style`` models (the
    kernel's comms and the page's models), except the widgets whose ``id`` is in ``keep`` and what
    is under them. Shared models a widget only refers to (a figure's :class:`PlotlySource`) stay
    open."""
    if id(widget) in keep:
        return
    for child in getattr(widget, "children", ()) or ():
        close_tree(child, keep)
    for name in ("layout", "style"):
        part = getattr(widget, name, None)
        if isinstance(part, W.Widget) and id(part) not in keep:
            part.close()
    widget.close()


def swap_child(box: W.Box, widget: W.Widget) -> None:
    """Make ``widget`` the only child of ``box`` and close the children it replaces (see
    :func:`close_tree`), except what ``widget`` itself shows: a child that is ``widget``, or
    controls the old and the new view share (an explorer's ``params=``), stay open."""
    tree = _tree(widget)
    keep = frozenset(id(w) for w in tree) | frozenset(
        id(getattr(w, name))
        for w in tree
        for name in ("layout", "style")
        if isinstance(getattr(w, name, None), W.Widget)
    )
    old = [w for w in box.children if w is not widget]
    box.children = (widget,)
    for w in old:
        close_tree(w, keep)
