"""mpo_viz.render.strip: the payload builder (channels, blanks on observations, escaping) and the shipped JS."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import numpy as np
import pytest
import torch

from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.render.strip import (
    EXPORTS_MARKER,
    payload_from_arrays,
    payload_json,
    strip_css,
    strip_js,
    strip_payload,
)


def _batch():
    rows = [
        {
            "traj_id": "A",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [10, 11, 12, 13, 14, 15],
            "loss_mask": [1, 1, 0, 1, 1, 1],
            "values": [0.5, 0.6, 7.0, 0.2, 0.4, 0.9],
            "reward": 1.0,
            "old_logprobs": [-1.0, -0.5, 0.0, -2.0, -0.1, -0.3],
            "rollout_logprobs": [-1.0, -0.7, 0.0, -2.0, -0.1, -0.2],
            "ref_logprobs": [-1.5, -0.5, 0.0, -2.0, -0.1, -0.3],
            "response_tokens": ["Hi", " </script>", "\n<obs>", "a", "b", "c"],
        },
        {
            "traj_id": "B",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [10, 11],
            "loss_mask": [1, 1],
            "values": [0.1, 0.2],
            "reward": 0.0,
            "old_logprobs": [-1.0, -1.0],
            "rollout_logprobs": [-1.0, -1.0],
            "ref_logprobs": [-1.0, -1.0],
            "response_tokens": ["x", "y"],
        },
    ]
    return TrajectoryBatch.from_rows(rows)


def test_payload_channels_by_hand():
    b = _batch()
    adv = torch.tensor([[1.0, 3.0, 0, -1.0, -2.0, 0.0], [0.5, 0.5, 0, 0, 0, 0]])
    from mpo_viz.analysis import td_error

    assert "td" not in strip_payload(b, 0)["channels"]  # the strip computes no estimator: δ comes from the caller
    p = strip_payload(b, 0, advantages={"mpo": adv}, td=td_error(b))
    assert p["tokens"] == ["Hi", " </script>", "\n<obs>", "a", "b", "c"]
    assert p["mask"] == [1, 1, 0, 1, 1, 1] and p["turn_ids"] == [0, 0, 0, 1, 1, 1]
    ch = p["channels"]
    assert p["channel"] == "adv_mpo"
    assert ch["adv_mpo"] == [1.0, 3.0, None, -1.0, -2.0, 0.0]  # observation tokens are blank
    # the micro part: A minus the turn mean (turn 0 mean 2, turn 1 mean -1)
    assert ch["micro_mpo"] == [-1.0, 1.0, None, 0.0, -1.0, 1.0]
    assert ch["value"] == [0.5, 0.6, None, 0.2, 0.4, 0.9]
    # TD error δ_t = r_t + V_{t+1} − V_t over action tokens (obs skipped), reward 1 at the end, V_after = 0
    np.testing.assert_allclose([x for x in ch["td"] if x is not None], [0.1, -0.4, 0.2, 0.5, 0.1], atol=1e-6)
    assert ch["reward"] == [0.0, 0.0, None, 0.0, 0.0, 1.0]
    assert ch["logprob"][:2] == [-1.0, -0.5]
    assert ch["ratio"][1] == pytest.approx(math.exp(0.2), rel=1e-4) and p["channel_info"]["ratio"]["center"] == 1.0
    assert ch["kl"][0] == pytest.approx(0.5)
    assert p["meta"]["turns"] == 2 and p["meta"]["score"] == 1.0


def test_payload_json_is_safe_inside_a_script_tag():
    p = strip_payload(_batch(), 0)
    s = payload_json(p)
    assert "</script>" not in s and "<!--" not in s
    assert json.loads(s)["tokens"][1] == " </script>"


def test_payload_from_arrays_rounds_and_checks():
    p = payload_from_arrays(["a", "b"], [1, 0], None, {"x": [1 / 3, float("nan")]}, digits=3)
    assert p["channels"]["x"] == [0.333, None] and p["turn_ids"] == [0, 0]
    with pytest.raises(ValueError, match=r"channels\['x'\]: expected 2 values"):
        payload_from_arrays(["a", "b"], [1, 0], None, {"x": [1.0]})
    with pytest.raises(ValueError, match="channel: expected one of"):
        payload_from_arrays(["a"], [1], None, {"x": [1.0]}, channel="y")


def test_token_ids_shown_without_response_tokens():
    rows = [
        {"traj_id": "A", "group_id": "g", "prompt_ids": [1], "response_ids": [7, 8], "loss_mask": [1, 1], "reward": 1.0}
    ]
    p = strip_payload(TrajectoryBatch.from_rows(rows), 0)
    assert p["tokens"] == ["7 ", "8 "] and "value" not in p["channels"]
    p2 = strip_payload(TrajectoryBatch.from_rows(rows), 0, tokens=lambda ids: [f"<{i}>" for i in ids])
    assert p2["tokens"] == ["<7>", "<8>"]


def test_js_module_and_classic_script():
    mod = strip_js()
    assert "export function mount" in mod and "export default { render, mount }" in mod
    # anywidget takes a named `render` export as its deprecated form and warns once per model
    assert "export function render" not in mod and "\nfunction render({ model, el })" in mod
    classic = strip_js(module=False)
    assert "export " not in classic and "window.mpoStrip = { mount, render }" in classic
    assert ".mpo-strip-tok" in strip_css()


def test_round_sig_is_the_string_rounding():
    from mpo_viz.render.strip import round_sig

    # by hand: 5 significant digits, half to even on exact ties (12345.5, 12344.5 are exact binaries)
    got = round_sig([0.123456, 12345.5, 12344.5, -0.000987654, 99999.7, 0.0, math.nan, math.inf, 1e-30], 5)
    np.testing.assert_array_equal(got, [0.12346, 12346.0, 12344.0, -0.00098765, 100000.0, 0.0, np.nan, np.nan, 1e-30])
    # and element for element what float(f"{v:.5g}") gives, over magnitudes, near-ties and powers of ten
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.normal(size=3000) * 10.0 ** rng.integers(-25, 25, 3000),
            np.round(rng.normal(size=1000) * 1e4) + 0.5,
            np.round(rng.normal(size=1000), 5),
            np.nextafter(10.0 ** np.arange(-12, 12), np.inf),
            np.nextafter(10.0 ** np.arange(-12, 12), -np.inf),
        ]
    )
    for sig in (4, 5):
        np.testing.assert_array_equal(round_sig(x, sig), [float(f"{v:.{sig}g}") for v in x.tolist()])


def test_update_channels_ratio_on_a_log_scale_and_clipped():
    """The saved ratio after the update is the ``update_ratio`` channel (its log, flagged ``log`` so
    that the legend and hover show the ratio); ``clipped`` a 0/1 channel of scale 1; neither is
    picked up again as a plain column, and the old/rollout ``ratio`` channel stays what it was."""
    b = _batch().with_token_fields(
        ratio=[[2.0, 0.5, 1.0, 1.0, 1.25, 4.0], [1.0, 1.0]], clipped=[[1, 0, 0, 0, 0, 1], [0, 0]]
    )
    p = strip_payload(b, 0)
    ch, info = p["channels"], p["channel_info"]
    np.testing.assert_allclose(
        [x for x in ch["update_ratio"] if x is not None],
        [math.log(2), math.log(0.5), 0.0, math.log(1.25), math.log(4)],
        rtol=1e-4,
    )
    assert ch["update_ratio"][2] is None  # observation token
    assert info["update_ratio"]["log"] is True and info["update_ratio"]["center"] == 0.0
    assert info["update_ratio"]["label"] == "ratio after the update (log scale)"
    assert ch["clipped"] == [1.0, 0.0, None, 0.0, 0.0, 1.0] and info["clipped"]["scale"] == 1.0
    assert ch["ratio"][1] == pytest.approx(math.exp(0.2), rel=1e-4)  # exp(old − rollout), unchanged
    assert "log" not in info["ratio"] and json.loads(payload_json(p))["channel_info"]["update_ratio"]["log"] is True
    assert "update_ratio" not in strip_payload(_batch(), 0)["channels"]
    # the shipped JS reads the flag: the legend ends and each hover row show exp(v) of a log channel
    js = strip_js()
    assert "fmt(shown(inf, c - s))" in js and "fmt(shown(inf, c + s))" in js and "shown(inf, d.channels[k][i])" in js
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the JS's shown() is not run")
    head = js.split(EXPORTS_MARKER, 1)[0].replace("export function ", "function ")
    probe = (
        "console.log(JSON.stringify([shown({log: true}, Math.log(2)), shown({log: true}, -Math.log(4)), "
        "shown({}, 0.5), shown({log: true}, null), fmt(shown({log: true}, Math.log(1.25)))]));"
    )
    out = subprocess.run(["node", "-e", head + probe], capture_output=True, text=True, timeout=60, check=True).stdout
    got = json.loads(out)
    assert got[0] == pytest.approx(2.0) and got[1] == pytest.approx(0.25) and got[2:] == [0.5, None, "1.25"]


def test_the_token_truth_is_a_channel_with_its_errors():
    """Â_t on the measured tokens (None elsewhere) as the channel ``truth``, its standard errors beside it
    in ``payload["truth"]``; the token truth's own columns are not channels of their own."""
    nan = math.nan
    b = _batch().with_token_fields(
        mc_tok_adv=[[0.2, nan, nan, -0.1, nan, nan], [nan, nan]],
        mc_tok_adv_se=[[0.05, nan, nan, 0.1, nan, nan], [nan, nan]],
        mc_tok_adv_a=[[0.2, nan, nan, -0.1, nan, nan], [nan, nan]],
        mc_tok_adv_b=[[0.2, nan, nan, -0.1, nan, nan], [nan, nan]],
        mc_tok_measured=[[1, 0, 0, 1, 0, 0], [0, 0]],
    )
    p = strip_payload(b, 0, advantages={"mpo": torch.zeros(2, 6)})
    assert p["channels"]["truth"] == [0.2, None, None, -0.1, None, None]
    assert p["truth"] == {"channel": "truth", "se": [0.05, None, None, 0.1, None, None]}
    assert p["channel_info"]["truth"]["label"].startswith("true advantage")
    assert not any(k.startswith("mc_tok") for k in p["channels"])
    assert p["channel"] == "adv_mpo"
    json.loads(payload_json(p))  # JSON-safe (no NaN)
    assert "truth" not in strip_payload(_batch(), 0)
