"""The token strip as an anywidget: the strip ES module (``mpo_viz/strip/strip.js``) is the front end,
so the widgets and the report share one token renderer.

Traits (synced with the browser):

* ``payload`` — the strip payload (schema ``mpo_viz.strip/v1``, see :mod:`mpo_viz.strip`) as compact
  JSON text (:func:`mpo_viz.strip.payload_json`), without its numbers: the channels' values
  (``null`` placeholders in the JSON, keeping the channel order), the mask and the turn ids travel in
  ``arrays``;
* ``arrays`` — those numbers as binary buffers (the comm's binary frames, no JSON):
  ``{"channels": {name: float64}, "mask": uint8, "turn_ids": int32}``, little-endian; a null value
  is NaN. The same numbers as the JSON would carry (the payload's rounded values, exactly), at a
  fraction of the cost to encode and decode: a 50,000-token payload is 3.9 MB of JSON otherwise;
* ``patch`` — channels replaced since that payload was pushed, as compact JSON
  ``{"channels": {name: values}, "channel_info": {name: info}}`` ("" for none): a slider move sends
  only the channels it changed instead of the whole payload (tokens, mask, every channel), and the
  strip recolours without laying the tokens out again. It holds every channel replaced since the
  last payload, so a view opened later shows the same as the others (``payload`` + ``patch``);
* ``channel`` — the channel shown; the strip's "colour by" menu writes it back;
* ``height`` — viewport height in pixels.
"""

from __future__ import annotations

import json

import anywidget
import numpy as np
import traitlets

from mpo_viz.strip import payload_json, strip_css, strip_js

__all__ = ["StripWidget", "apply_patch", "split_payload", "join_payload"]


def apply_patch(payload: dict, patch: dict | None) -> dict:
    """``payload`` with the channels and channel info of ``patch`` replaced (a new dict; the strip
    module's ``patch()`` does the same in the browser)."""
    if not patch:
        return payload
    out = dict(payload)
    out["channels"] = {**payload.get("channels", {}), **patch.get("channels", {})}
    out["channel_info"] = {**payload.get("channel_info", {}), **patch.get("channel_info", {})}
    return out


def split_payload(payload: dict) -> tuple[dict, dict]:
    """``(payload without its numbers, arrays)``: the channels' values (float64, None as NaN), the
    mask (uint8) and the turn ids (int32) as little-endian bytes, for the ``arrays`` trait; the
    payload keeps ``null`` per channel (the channel order) and no mask or turn ids. A payload without
    tokens is returned whole, with no arrays."""
    if not payload.get("tokens"):
        return payload, {}
    wire = {k: v for k, v in payload.items() if k not in ("mask", "turn_ids")}
    wire["channels"] = {k: None for k in payload.get("channels", {})}
    # (numpy's stubs do not declare the buffer protocol its arrays implement)
    arrays = {"channels": {k: memoryview(np.asarray(v, dtype="<f8"))  # type: ignore[arg-type]
                           for k, v in payload.get("channels", {}).items()},
              "mask": memoryview(np.asarray(payload["mask"], dtype=np.uint8)),  # type: ignore[arg-type]
              "turn_ids": memoryview(np.asarray(payload["turn_ids"], dtype="<i4"))}  # type: ignore[arg-type]
    return wire, arrays


def join_payload(wire: dict, arrays: dict | None) -> dict:
    """The inverse of :func:`split_payload` (lists again, NaN as None)."""
    if not arrays:
        return wire
    out = dict(wire)
    out["mask"] = np.frombuffer(arrays["mask"], dtype=np.uint8).astype(np.int64).tolist()
    out["turn_ids"] = np.frombuffer(arrays["turn_ids"], dtype="<i4").astype(np.int64).tolist()
    out["channels"] = {k: [None if v != v else v for v in np.frombuffer(arrays["channels"][k], dtype="<f8").tolist()]
                       for k in wire.get("channels", {})}
    return out


class StripWidget(anywidget.AnyWidget):
    """One trajectory's per-token credit strip (hover: every channel; menu: the colouring)."""

    _esm = strip_js()
    _css = strip_css()
    payload = traitlets.Unicode("{}").tag(sync=True)
    arrays = traitlets.Dict().tag(sync=True)
    patch = traitlets.Unicode("").tag(sync=True)
    channel = traitlets.Unicode("").tag(sync=True)
    height = traitlets.Int(320).tag(sync=True)

    def __init__(self, payload: dict | None = None, *, height: int = 320, **kwargs):
        super().__init__(height=height, **kwargs)
        self._patch: dict = {}
        if payload is not None:
            self.set_payload(payload)

    def set_payload(self, payload: dict, *, keep_channel: bool = True) -> None:
        """Push a new payload; the shown channel is kept when the new payload has it."""
        ch = self.channel if keep_channel and self.channel in payload.get("channels", {}) else payload.get("channel")
        self._payload = payload
        self._patch = {}
        wire, arrays = split_payload(payload)
        with self.hold_sync():
            self.payload = payload_json(wire)
            self.arrays = arrays
            self.patch = ""
            self.channel = ch or ""

    def update_channels(self, channels: dict, channel_info: dict | None = None) -> None:
        """Replace existing channels (lists as in a payload, one value per token) and their
        ``channel_info``, sending only them (the ``patch`` trait); tokens, mask and the other
        channels stay as pushed. ``payload_dict`` is the payload with them replaced."""
        have = self.payload_dict.get("channels", {})
        n = len(self.payload_dict.get("tokens", []))
        for k, v in channels.items():
            if k not in have:
                raise ValueError(f"channels: {k!r} is not a channel of the payload shown ({', '.join(have)})")
            if len(v) != n:
                raise ValueError(f"channels[{k!r}]: expected {n} values (one per token), found {len(v)}")
        info = {k: v for k, v in (channel_info or {}).items() if k in have}
        self._patch = {"channels": {**self._patch.get("channels", {}), **channels},
                       "channel_info": {**self._patch.get("channel_info", {}), **info}}
        self._payload = apply_patch(self.payload_dict, {"channels": channels, "channel_info": info})
        self.patch = payload_json(self._patch)

    @property
    def payload_dict(self) -> dict:
        """The payload shown, as a dict: the one last pushed with the channels replaced since (parsed
        from the synced JSON when set from outside)."""
        p = getattr(self, "_payload", None)
        return p if p is not None else self.synced_payload()

    def synced_payload(self) -> dict:
        """What the browser holds, decoded from the synced traits: ``payload`` with the numbers of
        ``arrays`` put back (NaN as None) and ``patch`` applied."""
        p = join_payload(json.loads(self.payload or "{}"), self.arrays)
        return apply_patch(p, json.loads(self.patch) if self.patch else None)
