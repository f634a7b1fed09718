"""What a slider move sends: the engine reruns only the estimators whose options changed, and the
strip gets only the changed channels (the ``patch`` trait) instead of a new payload."""

from __future__ import annotations

import json
import math
import struct

import pytest

import mpo_viz as mv
from mpo_viz.strip import payload_from_arrays
from mpo_viz.widgets import AdvantageEngine, TrajectoryExplorer
from mpo_viz.widgets.strip_widget import StripWidget, apply_patch, join_payload, split_payload


@pytest.fixture(scope="module")
def batch():
    return mv.synthetic.make_batch(6, seed=5, turns=(2, 3), turn_len=(3, 8), obs_len=(2, 5))


def test_engine_reruns_only_changed_estimators(batch):
    eng = AdvantageEngine(batch, ["mpo", "gae", "grpo"])
    opts = {"gamma": 1.0, "lam@mpo": 0.95, "lam@gae": 1.0, "beta": 1.0}
    first = eng.compute(opts)
    assert eng.ran == ["mpo", "gae", "grpo"]
    again = eng.compute({**opts, "beta": 0.5})  # β: only mpo takes it
    assert eng.ran == ["mpo"]
    assert again["gae"] is first["gae"] and again["grpo"] is first["grpo"] and again["mpo"] is not first["mpo"]
    eng.compute({**opts, "beta": 0.5, "gamma": 0.9})  # γ: mpo and gae
    assert eng.ran == ["mpo", "gae"]
    eng.compute({**opts, "beta": 0.5, "gamma": 0.9})
    assert eng.ran == []


def test_strip_patch_replaces_channels_only():
    p = payload_from_arrays(["a", "b", "c"], [1, 0, 1], None, {"x": [1.0, 2.0, 3.0], "y": [4.0, 5.0, 6.0]})
    w = StripWidget(p)
    assert w.patch == ""
    w.update_channels({"x": [0.5, None, -1.0]}, {"x": {"label": "x", "center": 0.0, "scale": 2.0}})
    sent = json.loads(w.patch)
    assert sent == {"channels": {"x": [0.5, None, -1.0]}, "channel_info": {"x": {"label": "x", "center": 0.0, "scale": 2.0}}}
    assert join_payload(json.loads(w.payload), w.arrays)["channels"]["x"] == [1.0, 2.0, 3.0]  # not re-sent
    # a second patch keeps the first's channels: payload + patch is the whole state for a new view
    w.update_channels({"y": [7.0, 8.0, 9.0]})
    assert set(json.loads(w.patch)["channels"]) == {"x", "y"}
    for got in (w.payload_dict, w.synced_payload()):
        assert got["channels"] == {"x": [0.5, None, -1.0], "y": [7.0, 8.0, 9.0]}
        assert got["tokens"] == ["a", "b", "c"] and got["channel_info"]["x"]["scale"] == 2.0
    with pytest.raises(ValueError, match="not a channel"):
        w.update_channels({"z": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match="expected 3 values"):
        w.update_channels({"x": [1.0]})
    # a new payload resets the patch
    w.set_payload(p)
    assert w.patch == "" and w.payload_dict["channels"]["x"] == [1.0, 2.0, 3.0]
    assert apply_patch(p, None) is p


def test_slider_move_sends_only_changed_channels(batch):
    ex = TrajectoryExplorer(batch, row=1, estimators=["mpo", "gae", "grpo"])
    payload = ex.strip.payload
    ex.params.set(beta=0.4)
    assert ex.strip.payload == payload  # tokens, mask and the other channels were not sent again
    assert set(json.loads(ex.strip.patch)["channels"]) == {"adv_mpo", "micro_mpo"}
    ex.select(2)  # a pick sends a new payload
    assert ex.strip.patch == "" and ex.strip.payload != payload


def test_payload_numbers_travel_as_binary_buffers():
    p = payload_from_arrays(["a", "b", "c"], [1, 0, 1], [0, 0, 1], {"x": [0.5, None, -2.0], "y": [1.0, 2.0, 3.0]})
    wire, arrays = split_payload(p)
    # the JSON keeps the tokens and the channel order, no numbers
    assert wire["tokens"] == ["a", "b", "c"] and wire["channels"] == {"x": None, "y": None}
    assert "mask" not in wire and "turn_ids" not in wire
    # a missing value (x[1], null in JSON) is NaN in float64, little-endian
    assert bytes(arrays["mask"]) == bytes([1, 0, 1])
    assert bytes(arrays["turn_ids"]) == (0).to_bytes(4, "little") * 2 + (1).to_bytes(4, "little")
    assert bytes(arrays["channels"]["x"])[:8] == struct.pack("<d", 0.5)
    assert math.isnan(struct.unpack("<d", bytes(arrays["channels"]["x"])[8:16])[0])
    assert join_payload(wire, arrays) == p
    # what the widget syncs decodes to the payload
    w = StripWidget(p)
    assert json.loads(w.payload)["channels"] == {"x": None, "y": None} and w.synced_payload() == p
    assert split_payload({"tokens": []}) == ({"tokens": []}, {})
