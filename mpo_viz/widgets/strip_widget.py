"""The token strip as an anywidget: the strip ES module (``mpo_viz/render/strip/strip.js``) is the front end,
so the widgets and the report share one token renderer.

Traits (synced with the browser):

* ``payload`` — the strip payload (schema ``mpo_viz.strip/v1``, see :mod:`mpo_viz.render.strip`) as compact
  JSON text (:func:`mpo_viz.render.strip.payload_json`), without its numbers: the channels' values
  (``null`` placeholders in the JSON, keeping the channel order), the mask and the turn ids travel in
  ``arrays``;
* ``arrays`` — those numbers as binary buffers (the comm's binary frames, no JSON):
  ``{"channels": {name: float64}, "mask": uint8, "turn_ids": int32}``, little-endian; a null value
  is NaN. The same numbers as the JSON would carry (the payload's rounded values, exactly), at a
  fraction of the cost to encode and decode: a 50,000-token payload is 3.9 MB of JSON otherwise;
* ``patch`` — channels replaced since that payload was pushed, as compact JSON
  ``{"channels": {name: null}, "channel_info": {name: info}, "focus": int}`` ("" for none; ``focus``
  only when it changed), their values in ``patch_arrays`` (binary float64 buffers, as ``arrays``):
  a slider move sends only the channels it changed instead of the whole payload (tokens, mask,
  every channel), and the strip recolours without laying the tokens out again. It holds every
  channel replaced since the last payload, so a view opened later shows the same as the others
  (``payload`` + ``patch``). :meth:`StripWidget.update_channels` is the one writer of this format
  (the explorer and the comparison view both send through it), ``strip.js``'s ``patch()`` the reader;
* ``patch_arrays`` — ``{name: float64 buffer}``, the values of the patch's channels;
* ``channel`` — the channel shown; the strip's "colour by" menu writes it back;
* ``height`` — viewport height in pixels.
"""

from __future__ import annotations

import json

import anywidget
import numpy as np
import traitlets

from mpo_viz.render.strip import payload_json, payload_lists, strip_css, strip_js

__all__ = ["StripWidget", "apply_patch", "split_payload", "join_payload", "patch_strips"]


def apply_patch(payload: dict, patch: dict | None) -> dict:
    """``payload`` with the channels, channel info and ``focus`` of ``patch`` replaced (a new dict;
    the strip module's ``patch()`` does the same in the browser)."""
    if not patch:
        return payload
    out = dict(payload)
    out["channels"] = {**payload.get("channels", {}), **patch.get("channels", {})}
    out["channel_info"] = {**payload.get("channel_info", {}), **patch.get("channel_info", {})}
    if "focus" in patch:
        out["focus"] = patch["focus"]
    return out


def _buffer(values, dtype: str) -> memoryview:
    """``values`` (an array, or a list with None for a missing float) as a contiguous little-endian
    buffer of ``dtype``; an array of that dtype is not copied."""
    # (numpy's stubs do not declare the buffer protocol its arrays implement)
    return memoryview(np.ascontiguousarray(values, dtype=dtype))  # type: ignore[arg-type]


def split_payload(payload: dict) -> tuple[dict, dict]:
    """``(payload without its numbers, arrays)``: the channels' values (float64, None as NaN), the
    mask (uint8) and the turn ids (int32) as little-endian buffers, for the ``arrays`` trait; the
    payload keeps ``null`` per channel (the channel order) and no mask or turn ids. The numbers may
    be lists or numpy arrays (``strip_payload(..., arrays=True)``); arrays of those dtypes are sent
    as they are (a view of their memory, no copy and no list). A payload without tokens is returned
    whole (:func:`mpo_viz.render.strip.payload_lists`), with no arrays."""
    if not len(payload.get("tokens") or ()):
        return payload_lists(payload), {}
    wire = {k: v for k, v in payload.items() if k not in ("mask", "turn_ids")}
    wire["channels"] = {k: None for k in payload.get("channels", {})}
    arrays = {
        "channels": {k: _buffer(v, "<f8") for k, v in payload.get("channels", {}).items()},
        "mask": _buffer(payload["mask"], "u1"),
        "turn_ids": _buffer(payload["turn_ids"], "<i4"),
    }
    return wire, arrays


def join_payload(wire: dict, arrays: dict | None, *, as_arrays: bool = False) -> dict:
    """The inverse of :func:`split_payload`: lists again (NaN as None), or with ``as_arrays`` numpy
    arrays (float64 channels with NaN, uint8 mask, int32 turn ids), as ``arrays=True`` builds them."""
    if not arrays:
        return wire
    out = dict(wire)
    out["mask"] = np.frombuffer(arrays["mask"], dtype=np.uint8).copy()
    out["turn_ids"] = np.frombuffer(arrays["turn_ids"], dtype="<i4").astype(np.int32)
    out["channels"] = {
        k: np.frombuffer(arrays["channels"][k], dtype="<f8").astype(np.float64) for k in wire.get("channels", {})
    }
    return out if as_arrays else payload_lists(out)


def patch_strips(strips, channels: dict, rescale=None, *, focus: int | None = None) -> None:
    """Send the same changed ``channels`` (``{name: (n,) float64}``, e.g.
    :func:`mpo_viz.render.strip.advantage_channels`) to each of ``strips`` (StripWidgets showing one
    trajectory) as a patch. ``rescale(payloads)``, when given, sets the colour scales of the
    payloads with the channels replaced, in place (a view's ``ColourScale.apply``: stacked strips
    share one scale); the ``adv_*`` and ``micro_*`` channel infos it gives are sent with the
    patch. ``focus``: the token a new view of these strips opens at, when it changed."""
    strips = list(strips)
    payloads = []
    for w in strips:
        p = dict(w.payload_dict)
        p["channels"] = {**p["channels"], **channels}
        p["channel_info"] = {k: dict(v) for k, v in p["channel_info"].items()}
        payloads.append(p)
    if rescale is not None:
        rescale(payloads)
    for w, p in zip(strips, payloads):
        info = {k: v for k, v in p["channel_info"].items() if k.startswith(("adv_", "micro_"))}
        w.update_channels(channels, info, focus=focus)


class StripWidget(anywidget.AnyWidget):
    """One trajectory's per-token credit strip (hover: every channel; menu: the colouring)."""

    _esm = strip_js()
    _css = strip_css()
    payload = traitlets.Unicode("{}").tag(sync=True)
    arrays = traitlets.Dict().tag(sync=True)
    patch = traitlets.Unicode("").tag(sync=True)
    patch_arrays = traitlets.Dict().tag(sync=True)
    channel = traitlets.Unicode("").tag(sync=True)
    height = traitlets.Int(320).tag(sync=True)

    def __init__(self, payload: dict | None = None, *, height: int = 320, **kwargs):
        super().__init__(height=height, **kwargs)
        self._patch: dict = {}
        if payload is not None:
            self.set_payload(payload)

    def set_payload(self, payload: dict, *, keep_channel: bool = True) -> None:
        """Push a new payload (numbers as lists or, from ``strip_payload(..., arrays=True)``, numpy
        arrays, which travel as binary buffers without a copy); the shown channel is kept when the
        new payload has it."""
        ch = self.channel if keep_channel and self.channel in payload.get("channels", {}) else payload.get("channel")
        self._payload = payload
        self._patch = {}
        wire, arrays = split_payload(payload)
        with self.hold_sync():
            self.payload = payload_json(wire)
            self.arrays = arrays
            self.patch = ""
            self.patch_arrays = {}
            self.channel = ch or ""

    def update_channels(self, channels: dict, channel_info: dict | None = None, *, focus: int | None = None) -> None:
        """Replace existing channels (``(n,)`` float64 arrays, NaN for no value, or lists as in a
        payload, one value per token) and their ``channel_info``, sending only them (the ``patch``
        and ``patch_arrays`` traits, in one message); tokens, mask and the other channels stay as
        pushed. ``focus``: the token a view opened later scrolls to (the views on screen keep the
        reader's place). ``payload_dict`` is the payload with them replaced."""
        have = self.payload_dict.get("channels", {})
        n = len(self.payload_dict.get("tokens", []))
        vals = {}
        for k, v in channels.items():
            if k not in have:
                raise ValueError(f"channels: {k!r} is not a channel of the payload shown ({', '.join(have)})")
            if len(v) != n:
                raise ValueError(f"channels[{k!r}]: expected {n} values (one per token), found {len(v)}")
            vals[k] = np.ascontiguousarray(v, dtype=np.float64)  # an array of that dtype: not copied
        info = {k: v for k, v in (channel_info or {}).items() if k in have}
        patch: dict = {
            "channels": {**self._patch.get("channels", {}), **vals},
            "channel_info": {**self._patch.get("channel_info", {}), **info},
        }
        if focus is not None:
            patch["focus"] = int(focus)
        elif "focus" in self._patch:
            patch["focus"] = self._patch["focus"]
        self._patch = patch
        self._payload = apply_patch(
            self.payload_dict,
            {"channels": vals, "channel_info": info, **({"focus": int(focus)} if focus is not None else {})},
        )
        with self.hold_sync():
            self.patch = payload_json({**patch, "channels": {k: None for k in patch["channels"]}})
            self.patch_arrays = {k: _buffer(v, "<f8") for k, v in patch["channels"].items()}

    @property
    def payload_dict(self) -> dict:
        """The payload shown, as a dict: the one last pushed with the channels replaced since (parsed
        from the synced traits when set from outside)."""
        p = getattr(self, "_payload", None)
        return p if p is not None else self.synced_payload()

    def synced_payload(self, *, as_arrays: bool = False) -> dict:
        """What the browser holds, decoded from the synced traits: ``payload`` with the numbers of
        ``arrays`` put back and ``patch`` (its values from ``patch_arrays``) applied; lists (NaN as
        None), or with ``as_arrays`` numpy arrays (:func:`join_payload`)."""
        p = join_payload(json.loads(self.payload or "{}"), self.arrays, as_arrays=True)
        patch = json.loads(self.patch) if self.patch else None
        if patch:
            patch["channels"] = {
                k: np.frombuffer(self.patch_arrays[k], dtype="<f8").astype(np.float64)
                if v is None
                else np.array([np.nan if x is None else x for x in v], dtype=np.float64)
                for k, v in patch.get("channels", {}).items()
            }
        p = apply_patch(p, patch)
        return p if as_arrays else payload_lists(p)
