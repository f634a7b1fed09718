"""The token strip as an anywidget: the strip ES module (``mpo_viz/strip/strip.js``) is the front end,
so the widgets and the report share one token renderer.

Traits (synced with the browser):

* ``payload`` — the strip payload (schema ``mpo_viz.strip/v1``, see :mod:`mpo_viz.strip`) as compact
  JSON text (:func:`mpo_viz.strip.payload_json`: NaN/inf already mapped to null);
* ``channel`` — the channel shown; the strip's "colour by" menu writes it back;
* ``height`` — viewport height in pixels.
"""

from __future__ import annotations

import json

import anywidget
import traitlets

from mpo_viz.strip import payload_json, strip_css, strip_js

__all__ = ["StripWidget"]


class StripWidget(anywidget.AnyWidget):
    """One trajectory's per-token credit strip (hover: every channel; menu: the colouring)."""

    _esm = strip_js()
    _css = strip_css()
    payload = traitlets.Unicode("{}").tag(sync=True)
    channel = traitlets.Unicode("").tag(sync=True)
    height = traitlets.Int(320).tag(sync=True)

    def __init__(self, payload: dict | None = None, *, height: int = 320, **kwargs):
        super().__init__(height=height, **kwargs)
        if payload is not None:
            self.set_payload(payload)

    def set_payload(self, payload: dict, *, keep_channel: bool = True) -> None:
        """Push a new payload; the shown channel is kept when the new payload has it."""
        ch = self.channel if keep_channel and self.channel in payload.get("channels", {}) else payload.get("channel")
        self._payload = payload
        with self.hold_sync():
            self.payload = payload_json(payload)
            self.channel = ch or ""

    @property
    def payload_dict(self) -> dict:
        """The payload last pushed, as a dict (parsed from the synced JSON when set from outside)."""
        p = getattr(self, "_payload", None)
        return p if p is not None else json.loads(self.payload or "{}")
