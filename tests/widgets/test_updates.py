"""What a slider move sends: the engine reruns only the estimators whose options changed, and the
strip gets only the changed channels (the ``patch`` trait) instead of a new payload."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz import analysis as an
from mpo_viz.advantages import compute
from mpo_viz.render.strip import payload_from_arrays, payload_json, payload_lists, strip_payload
from mpo_viz.widgets import AdvantageEngine, EstimatorComparison, TrajectoryExplorer
from mpo_viz.widgets.engine import options_of
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
    assert w.patch == "" and w.patch_arrays == {}
    w.update_channels({"x": [0.5, None, -1.0]}, {"x": {"label": "x", "center": 0.0, "scale": 2.0}})
    sent = json.loads(w.patch)
    # the JSON names the channels (null) and their info; the values are float64 buffers, by hand
    assert sent == {"channels": {"x": None}, "channel_info": {"x": {"label": "x", "center": 0.0, "scale": 2.0}}}
    assert set(w.patch_arrays) == {"x"}
    raw = bytes(w.patch_arrays["x"])
    assert raw[:8] == struct.pack("<d", 0.5) and raw[16:] == struct.pack("<d", -1.0)
    assert math.isnan(struct.unpack("<d", raw[8:16])[0])
    assert join_payload(json.loads(w.payload), w.arrays)["channels"]["x"] == [1.0, 2.0, 3.0]  # not re-sent
    # a second patch keeps the first's channels: payload + patch is the whole state for a new view
    w.update_channels({"y": np.array([7.0, 8.0, 9.0])}, focus=2)
    assert set(json.loads(w.patch)["channels"]) == {"x", "y"} and set(w.patch_arrays) == {"x", "y"}
    assert json.loads(w.patch)["focus"] == 2
    for got in (payload_lists(w.payload_dict), w.synced_payload()):
        assert got["channels"] == {"x": [0.5, None, -1.0], "y": [7.0, 8.0, 9.0]}
        assert got["tokens"] == ["a", "b", "c"] and got["channel_info"]["x"]["scale"] == 2.0 and got["focus"] == 2
    with pytest.raises(ValueError, match="not a channel"):
        w.update_channels({"z": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match="expected 3 values"):
        w.update_channels({"x": [1.0]})
    # a new payload resets the patch
    w.set_payload(p)
    assert w.patch == "" and w.patch_arrays == {} and w.payload_dict["channels"]["x"] == [1.0, 2.0, 3.0]
    assert apply_patch(p, None) is p


def test_slider_move_sends_only_changed_channels(batch):
    ex = TrajectoryExplorer(batch, row=1, estimators=["mpo", "gae", "grpo"])
    payload = ex.strip.payload
    ex.params.set(beta=0.4)
    assert ex.strip.payload == payload  # tokens, mask and the other channels were not sent again
    assert set(json.loads(ex.strip.patch)["channels"]) == {"adv_mpo", "micro_mpo"}
    assert set(ex.strip.patch_arrays) == {"adv_mpo", "micro_mpo"}
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
    # the same payload built with arrays (what the widgets build) splits into the same bytes
    pa = payload_from_arrays(
        ["a", "b", "c"], [1, 0, 1], [0, 0, 1], {"x": [0.5, None, -2.0], "y": [1.0, 2.0, 3.0]}, arrays=True
    )
    wa, aa = split_payload(pa)
    assert (
        wa == wire and bytes(aa["mask"]) == bytes(arrays["mask"]) and bytes(aa["turn_ids"]) == bytes(arrays["turn_ids"])
    )
    assert all(bytes(aa["channels"][k]) == bytes(arrays["channels"][k]) for k in ("x", "y"))
    assert payload_lists(pa) == p and payload_json(pa) == payload_json(p)


def _fresh_comparison_payloads(cmp, batch, row):
    """The strip payloads a comparison would push for ``row`` under its current options, built
    independently: advantages from ``mpo_viz.advantages.compute``, ``strip_payload``, the focus and
    the view's colour scale applied as on a pick."""
    n = int(batch.lengths[row])
    opts = cmp.params.options
    adv = {k: compute(batch, k, **options_of(k, opts)).advantages[row : row + 1, :n].numpy() for k in cmp.names}
    sub = batch[[row]]
    fresh = strip_payload(sub, 0, advantages=adv, td=an.td_error(sub))
    fresh["focus"] = cmp.focus_token(adv)
    tid = batch.traj_ids[row]
    payloads = [
        dict(
            fresh,
            channel=f"adv_{k}",
            title=f"{k} · {tid}",
            channel_info={c: dict(i) for c, i in fresh["channel_info"].items()},
        )
        for k in cmp.names
    ]
    cmp.scale.apply(payloads)
    return payloads


@pytest.mark.parametrize("scale", ["absolute", "shared"])
def test_comparison_slider_move_sends_patches(batch, scale):
    cmp = EstimatorComparison(batch, ["mpo", "gae", "grpo"], row=3, scale=scale)
    sent = {k: (w.payload, dict(w.arrays)) for k, w in cmp.strips.items()}
    cmp.params.set(beta=0.3)  # β: only mpo reruns
    for name, w in cmp.strips.items():
        # no new payload: tokens, mask and the unchanged channels were not sent again
        assert w.payload == sent[name][0] and w.arrays.keys() == sent[name][1].keys()
        assert all(w.arrays["channels"][k] is sent[name][1]["channels"][k] for k in w.arrays["channels"])
        patch = json.loads(w.patch)
        assert set(patch["channels"]) == {"adv_mpo", "micro_mpo"} == set(w.patch_arrays)
        assert all(v is None for v in patch["channels"].values())  # the values travel as buffers
    cmp.params.set(gamma=0.9)  # γ: mpo and gae; the patch holds every channel replaced since the payload
    for w in cmp.strips.values():
        assert set(json.loads(w.patch)["channels"]) == {"adv_mpo", "micro_mpo", "adv_gae"}
    # the patched payload (what the browser holds, decoded from the synced traits) equals a fresh one
    for w, want in zip(cmp.strips.values(), _fresh_comparison_payloads(cmp, batch, 3)):
        assert w.synced_payload() == payload_lists(want)
        assert payload_lists(w.payload_dict) == payload_lists(want)
    # a pick sends new payloads and resets the patches
    cmp.select(4)
    for w, want in zip(cmp.strips.values(), _fresh_comparison_payloads(cmp, batch, 4)):
        assert w.patch == "" and w.patch_arrays == {} and w.synced_payload() == payload_lists(want)


def test_comparison_scale_change_is_a_patch_of_channel_info(batch):
    cmp = EstimatorComparison(batch, ["mpo", "gae"], row=2)
    cmp.params.set(beta=0.5)
    payloads = {k: w.payload for k, w in cmp.strips.items()}
    cmp.scale.control.value = "own"
    for k, w in cmp.strips.items():
        assert w.payload == payloads[k]
        info = json.loads(w.patch)["channel_info"]
        assert info["adv_mpo"]["scale"] is None and info["adv_gae"]["scale"] is None
    for w, want in zip(cmp.strips.values(), _fresh_comparison_payloads(cmp, batch, 2)):
        assert w.synced_payload() == payload_lists(want)


def test_channel_values_travel_as_arrays_end_to_end(batch, monkeypatch):
    """A pick and a slider move, in both views, build the strip's channels as float64 arrays and
    send those very arrays as the binary buffers (the buffers are views of them: no list and no
    copy on the way); the JSON traits carry no per-token number."""
    import mpo_viz.render.strip as strip_mod

    real = strip_mod._floats

    def no_lists(x, sig):  # the per-token list rounding of the JSON form must not run
        if np.size(x) > 1:
            raise AssertionError("per-token values went through a Python list (strip._floats)")
        return real(x, sig)

    monkeypatch.setattr(strip_mod, "_floats", no_lists)
    ex = TrajectoryExplorer(batch, row=1, estimators=["mpo", "gae", "grpo"])
    cmp = EstimatorComparison(batch, ["mpo", "gae", "grpo"], row=1)
    for w in [ex.strip, *cmp.strips.values()]:
        p = w.payload_dict
        assert isinstance(p["mask"], np.ndarray) and p["mask"].dtype == np.uint8
        for k, v in p["channels"].items():
            assert isinstance(v, np.ndarray) and v.dtype == np.float64
            assert w.arrays["channels"][k].obj is v  # the buffer sent is the array itself
        assert all(v is None for v in json.loads(w.payload)["channels"].values())
    ex.params.set(beta=0.7)
    cmp.params.set(beta=0.7)
    for w in [ex.strip, *cmp.strips.values()]:
        p = w.payload_dict
        for k, buf in w.patch_arrays.items():
            assert isinstance(p["channels"][k], np.ndarray) and buf.obj is p["channels"][k]
        assert all(v is None for v in json.loads(w.patch)["channels"].values())
    ex.select(2)
    assert all(ex.strip.arrays["channels"][k].obj is v for k, v in ex.strip.payload_dict["channels"].items())
    # the arrays the views send are exactly the numbers of the JSON form (5 significant digits)
    n = int(batch.lengths[2])
    opts = ex.params.options
    adv = {k: compute(batch, k, **options_of(k, opts)).advantages[2:3, :n].numpy() for k in ex.names}
    monkeypatch.setattr(strip_mod, "_floats", real)
    want = strip_payload(batch[[2]], 0, advantages=adv, td=an.td_error(batch[[2]]))
    assert payload_lists(ex.strip.payload_dict)["channels"] == want["channels"]
