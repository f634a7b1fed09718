"""A trajectory picker that scales to 10,000+ rows: a sortable, filterable, paginated list.

Only the current page (``page_size`` rows) is ever sent to the browser; sorting is one
``numpy.argsort`` over the table. The table is a DataFrame with one row per trajectory and a
``row`` column (the index in the batch); every other numeric column can be sorted on.
"""

from __future__ import annotations

import math

import ipywidgets as W
import numpy as np
import pandas as pd

__all__ = ["TrajectoryPicker", "format_cell"]

_NBSP = "\u00a0"
_CSS = """<style>
.mpo-picker select { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
.mpo-picker .mpo-picker-head { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px;
  white-space: pre; color: #555; padding-left: 4px; overflow: hidden; }
</style>"""


def format_cell(v, width: int) -> str:
    """A right-aligned (text: left-aligned) fixed-width cell; non-breaking spaces so browsers keep them."""
    if isinstance(v, str):
        s = v if len(v) <= width else v[: width - 1] + "…"
        return s.ljust(width).replace(" ", _NBSP)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        s = "—"
    elif isinstance(v, (int, np.integer)):
        s = f"{int(v):,}"
    elif isinstance(v, float) and math.isinf(v):
        s = "∞" if v > 0 else "−∞"
    else:
        a = abs(float(v))
        s = f"{v:.2e}" if a and (a < 1e-3 or a >= 1e5) else f"{v:.3f}"
    return s.rjust(width).replace(" ", _NBSP)


class TrajectoryPicker(W.VBox):
    """Pick one trajectory from a table (one row per trajectory).

    ``table``: DataFrame with a ``row`` column (batch index), a ``traj_id`` column and any other
    columns to show. ``sort_by``: initial sort column; ``descending``; ``page_size`` rows per page.
    ``on_pick(callback)`` calls ``callback(row)`` when the user (or :meth:`pick`) selects a row.
    """

    def __init__(
        self,
        table: pd.DataFrame,
        *,
        sort_by: str | None = None,
        descending: bool = True,
        page_size: int = 15,
        widths: dict | None = None,
    ):
        for col in ("row", "traj_id"):
            if col not in table.columns:
                raise ValueError(f"table: expected a {col!r} column, found {list(table.columns)}")
        if page_size < 1:
            raise ValueError(f"page_size: expected >= 1, found {page_size}")
        self.table = table.reset_index(drop=True)
        self.page_size = int(page_size)
        tid_w = int(min(28, max([8, *map(len, self.table["traj_id"].astype(str).head(2000))])))
        self.widths = {"traj_id": tid_w, **(widths or {})}
        self._callbacks: list = []
        self._order = np.arange(len(self.table))
        self._busy = False
        cols = [c for c in self.table.columns if c != "row"]
        self.sort_by = W.Dropdown(
            options=cols,
            value=sort_by if sort_by in cols else cols[0],
            description="sort by",
            style={"description_width": "50px"},
            layout=W.Layout(width="220px"),
        )
        self.descending = W.ToggleButton(
            value=descending,
            description="desc" if descending else "asc",
            tooltip="descending / ascending",
            layout=W.Layout(width="60px"),
        )
        self.filter = W.Text(placeholder="filter traj_id…", layout=W.Layout(width="140px"))
        self.prev = W.Button(description="◀", tooltip="previous page", layout=W.Layout(width="36px"))
        self.next = W.Button(description="▶", tooltip="next page", layout=W.Layout(width="36px"))
        self.page_label = W.Label(layout=W.Layout(min_width="150px"))
        self.head = W.HTML()
        self.head.add_class("mpo-picker-head")
        self.select = W.Select(
            options=[], rows=min(self.page_size, max(1, len(self.table))), layout=W.Layout(width="100%")
        )
        self.select.add_class("mpo-picker-list")
        self.page = 0
        self.sort_by.observe(lambda _: self._resort(), names="value")
        self.descending.observe(self._toggle, names="value")
        self.filter.observe(lambda _: self._resort(), names="value")
        self.prev.on_click(lambda _: self.goto(self.page - 1))
        self.next.on_click(lambda _: self.goto(self.page + 1))
        self.select.observe(self._selected, names="value")
        ctl = W.HBox([self.sort_by, self.descending, self.filter, self.prev, self.page_label, self.next])
        super().__init__([W.HTML(_CSS), ctl, self.head, self.select])
        self.add_class("mpo-picker")
        self._resort()

    # --- table ------------------------------------------------------------------------------------
    @property
    def columns(self) -> list[str]:
        return [c for c in self.table.columns if c != "row"]

    @property
    def n_pages(self) -> int:
        return max(1, math.ceil(len(self._order) / self.page_size))

    def set_column(self, name: str, values) -> None:
        """Replace (or add) a column, e.g. estimator disagreement after the sliders moved."""
        self.table[name] = np.asarray(values)
        if name not in self.sort_by.options:
            self.sort_by.options = self.columns
        if self.sort_by.value == name:
            self._resort(keep_page=True)
        else:
            self._render()

    def _toggle(self, change):
        self.descending.description = "desc" if change["new"] else "asc"
        self._resort()

    def _resort(self, keep_page: bool = False) -> None:
        t = self.table
        idx = np.arange(len(t))
        q = (self.filter.value or "").strip()
        if q:
            idx = idx[t["traj_id"].astype(str).str.contains(q, regex=False).to_numpy()]
        col = t[self.sort_by.value].to_numpy()[idx]
        if col.dtype.kind in "fiub":
            key = col.astype(np.float64)
            key = np.where(np.isnan(key), -np.inf if self.descending.value else np.inf, key)  # NaN last
            o = np.argsort(-key if self.descending.value else key, kind="stable")
        else:
            o = np.argsort(col.astype(str), kind="stable")
            if self.descending.value:
                o = o[::-1]
        self._order = idx[o]
        if not keep_page:
            self.page = 0
        self._render()

    def goto(self, page: int) -> None:
        """Show page ``page`` (0-based, clamped)."""
        self.page = int(min(max(page, 0), self.n_pages - 1))
        self._render()

    def _label(self, i: int) -> str:
        return self._labels([i])[0]

    def _labels(self, rows) -> list[str]:
        """The option labels of table rows ``rows`` (positions): each column's cells of those rows
        taken at once (numpy scalars of the column's dtype, as a row of the table gives them), not row
        by row."""
        page = self.table.iloc[list(rows)]
        cols = [(page[c].to_numpy(), self.widths.get(c, 9)) for c in self.columns]
        return [_NBSP.join(format_cell(v[j], w) for v, w in cols) for j in range(len(page))]

    def _render(self) -> None:
        self.page = min(self.page, self.n_pages - 1)
        a = self.page * self.page_size
        rows = self._order[a : a + self.page_size]
        cur = self.select.value
        opts = list(zip(self._labels(rows), self.table["row"].to_numpy()[rows].astype(int).tolist()))
        self._busy = True
        try:
            self.select.options = opts
            self.select.value = cur if cur in [v for _, v in opts] else None
        finally:
            self._busy = False
        self.head.value = _NBSP.join(
            (c if len(c) <= self.widths.get(c, 9) else c[: self.widths.get(c, 9)]).rjust(self.widths.get(c, 9))
            if c != "traj_id"
            else c.ljust(self.widths[c])
            for c in self.columns
        ).replace(" ", _NBSP)
        self.page_label.value = f"page {self.page + 1}/{self.n_pages} · {len(self._order):,} of {len(self.table):,}"

    @property
    def page_rows(self) -> list[int]:
        """Batch rows on the current page, in display order."""
        return [v for _, v in self.select.options]

    # --- picking ------------------------------------------------------------------------------------
    def on_pick(self, callback) -> None:
        self._callbacks.append(callback)

    def _selected(self, change):
        if self._busy or change["new"] is None:
            return
        for cb in self._callbacks:
            cb(int(change["new"]))

    def show(self, row: int) -> None:
        """Highlight batch row ``row`` without firing: move to its page (clearing a filter that
        hides it) and select it, so the open trajectory is always visible in the list."""
        pos = np.flatnonzero(self.table["row"].to_numpy() == row)
        if not len(pos):
            return
        where = np.flatnonzero(self._order == pos[0])
        if not len(where):
            self.filter.value = ""
            where = np.flatnonzero(self._order == pos[0])
        page = int(where[0]) // self.page_size
        if page != self.page:
            self.goto(page)
        self._busy = True
        try:
            self.select.value = int(row)
        finally:
            self._busy = False

    def pick(self, row: int) -> None:
        """Select batch row ``row``: moves to its page (clearing a filter that hides it) and fires."""
        pos = np.flatnonzero(self.table["row"].to_numpy() == row)
        if not len(pos):
            raise ValueError(f"row: {row} is not in the picker's table")
        where = np.flatnonzero(self._order == pos[0])
        if not len(where):
            self.filter.value = ""
            where = np.flatnonzero(self._order == pos[0])
        self.goto(int(where[0]) // self.page_size)
        if self.select.value == row:
            for cb in self._callbacks:
                cb(int(row))
        else:
            self.select.value = row
