"""Colour scales, figure/table export, the picker's highlight, the header and the tokenizer decode
of the widgets (no browser: the synced state must hold the numbers)."""

from __future__ import annotations

import base64
import re

import numpy as np
import pandas as pd
import pytest

import mpo_viz as mv
from mpo_viz.render.strip import robust_scale, within_turn_part
from mpo_viz.widgets import EstimatorComparison, TrajectoryExplorer, VarianceView
from mpo_viz.widgets.export_bar import csv_link, static_export_available


@pytest.fixture(scope="module")
def batch():
    return mv.synthetic.make_batch(10, seed=11, turns=(2, 5), turn_len=(3, 14), obs_len=(2, 8))


def _act_abs(a, mask):
    a = a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)
    return np.sort(np.abs(a[np.asarray(mask) != 0].astype(np.float64)))


def test_robust_scale_and_within_turn_part_by_hand():
    # |v| over the masked entries: 1..100 -> the lower order statistic at 0.99*(n-1) = 98.01 -> 99
    v = np.arange(1, 101, dtype=float) * np.where(np.arange(100) % 2, 1, -1)
    assert robust_scale(v) == 99.0
    assert robust_scale(v, np.r_[np.ones(10), np.zeros(90)]) == 9.0  # first ten: 1..10 -> index 8 -> 9
    assert robust_scale([0.0, 0.0]) == 1.0 and robust_scale([np.nan]) == 1.0
    # two turns (ids 0, 1) with an observation token between: A − turn mean on action tokens
    a = np.array([1.0, 3.0, 9.0, 4.0, 6.0, 8.0])
    m = np.array([1, 1, 0, 1, 1, 1])
    t = np.array([0, 0, 0, 1, 1, 1])
    np.testing.assert_allclose(within_turn_part(a, m, t), [-1, 1, 0, -2, 0, 2])


def test_comparison_strips_share_one_absolute_scale(batch):
    names = ["mpo", "gae", "grpo"]
    cmp = EstimatorComparison(batch, names, row=3)
    # absolute: the 99th percentile of |A| over every action token of the batch, largest over estimators
    expected = max(robust_scale(cmp.results[k][0], batch.mask) for k in names)
    for name, w in cmp.strips.items():
        info = w.payload_dict["channel_info"]
        for k in names:
            assert info[f"adv_{k}"]["scale"] == pytest.approx(expected, rel=1e-3), (name, k)
            assert "absolute" in info[f"adv_{k}"]["scale_note"]
    # the number stays when the row and the sliders change (same value -> same colour)
    cmp.select(5)
    cmp.params.set(beta=0.0, lam=0.5, estimator="mpo")
    for w in cmp.strips.values():
        assert w.payload_dict["channel_info"]["adv_mpo"]["scale"] == pytest.approx(expected, rel=1e-3)
    # "shared": recomputed for the trajectory shown, the largest of the estimators' 99th percentiles
    cmp.scale.control.value = "shared"
    row = cmp.row
    n = int(batch.lengths[row])
    m = batch.mask[row, :n].numpy()
    shared = max(robust_scale(cmp.results[k][0][row, :n], m) for k in names)
    scales = {w.payload_dict["channel_info"][f"adv_{k}"]["scale"] for w in cmp.strips.values() for k in names}
    assert len(scales) == 1 and scales.pop() == pytest.approx(shared, rel=1e-3)
    # "own": the strip computes each channel's own scale (no number in the payload)
    cmp.scale.control.value = "own"
    assert all(w.payload_dict["channel_info"]["adv_mpo"]["scale"] is None for w in cmp.strips.values())


def test_explorer_micro_scale_is_absolute_so_beta_shows(batch):
    ex = TrajectoryExplorer(batch, estimators=["mpo", "gae"], row=2)
    a = ex.results["mpo"][0]
    micro = robust_scale(within_turn_part(a, batch.mask, batch.turn_ids), batch.mask)
    assert ex.strip.payload_dict["channel_info"]["micro_mpo"]["scale"] == pytest.approx(micro, rel=1e-3)
    ex.params.set(beta=2.0)  # the within-turn part doubles; its scale does not follow it
    assert ex.strip.payload_dict["channel_info"]["micro_mpo"]["scale"] == pytest.approx(micro, rel=1e-3)
    ch = np.array([np.nan if v is None else v for v in ex.strip.payload_dict["channels"]["micro_mpo"]])
    assert np.nanmax(np.abs(ch)) > 0
    with pytest.raises(ValueError, match="scale: expected one of"):
        TrajectoryExplorer(batch, scale="loud")
    fixed = TrajectoryExplorer(batch, estimators=["mpo"], scale=0.25)
    assert fixed.strip.payload_dict["channel_info"]["adv_mpo"]["scale"] == 0.25


def test_comparison_focuses_the_most_disagreed_turn(batch):
    cmp = EstimatorComparison(batch, ["mpo", "grpo"], row=4)
    tt = cmp.tables()[f"turn_advantages_{batch.traj_ids[4]}"]
    a, g = tt["adv_mpo"].to_numpy(), tt["adv_grpo"].to_numpy()

    def norm(c):  # each estimator in units of its mean |turn advantage| (as is where that is 0)
        m = np.mean(np.abs(c))
        return c / m if m > 0 else c

    spread = np.abs(norm(a) - norm(g))
    assert cmp.strips["mpo"].payload_dict["focus"] == int(tt["start"].iloc[int(np.argmax(spread))])
    with pytest.raises(ValueError, match="empty batch"):
        EstimatorComparison(batch[0:0], ["mpo", "gae"])


def test_picker_highlights_the_open_trajectory(batch):
    ex = TrajectoryExplorer(batch, page_size=3)
    # the picker sorts by reward; open a row that is not on the first page
    last = int(ex.picker._order[-1])
    ex.select(last)
    assert ex.picker.select.value == last and last in ex.picker.page_rows
    v = VarianceView(batch, estimators=["mpo"], page_size=3)
    v.open_trajectory(batch.traj_ids[last])
    assert v.picker.select.value == last


def test_header_names_the_options_each_estimator_ran_with(batch):
    ex = TrajectoryExplorer(batch, estimators=["mpo", "gae", "grpo"])
    head = ex.status.value
    for k in ("mpo", "gae", "grpo"):
        ran = ex.engine.options_for(k, ex.params.options)
        seg = re.search(rf"<b>{k}</b> ([^;·]*)", head).group(1)
        for opt, val in ran.items():
            text = f"{opt}={val:g}" if isinstance(val, float) else f"{opt}={val}"
            assert text in seg, (k, text, seg)
    # no end-to-end claim: the time is labelled as the kernel's share
    assert "kernel" in head and "updated in" not in head


def test_tables_as_csv_and_figures_need_a_renderer(batch, tmp_path):
    ex = TrajectoryExplorer(batch, estimators=["mpo", "gae"], row=1)
    paths = ex.export_tables(tmp_path / "csv")
    assert {p.name for p in paths} == {f"turns_{batch.traj_ids[1]}.csv", "trajectories.csv"}
    back = pd.read_csv(tmp_path / "csv" / f"turns_{batch.traj_ids[1]}.csv")
    np.testing.assert_allclose(back["adv_mpo"], ex.turn_df["adv_mpo"], rtol=1e-9)
    # the browser's CSV link carries the same table
    link = csv_link(ex.turn_df, "turns")
    data = base64.b64decode(re.search(r"base64,([^']+)'", link).group(1)).decode()
    assert data == ex.turn_df.to_csv(index=False)
    assert f"turns_{batch.traj_ids[1]} (CSV)" in ex.export.links and "trajectories (CSV)" in ex.export.links
    if static_export_available():
        out = ex.export_figures(tmp_path / "img", formats=("svg",))
        assert out and out[0].read_text().lstrip().startswith("<svg")
    else:
        with pytest.raises(RuntimeError, match="kaleido"):
            ex.export_figures(tmp_path / "img")
    with pytest.raises(ValueError, match="formats"):
        ex.export_figures(tmp_path / "img", formats=("bmp",))
    cmp = EstimatorComparison(batch, ["mpo", "gae"])
    names = {p.stem for p in cmp.export_tables(tmp_path / "c")}
    assert "agreement_batch" in names and any(n.startswith("turn_advantages_") for n in names)


def test_accuracy_section_follows_the_options():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    from experiments import (
        credit_accuracy as bench,  # the study's own implementation: an independent check
    )

    b = mv.load(root / "trajectories" / "search.parquet")[:120]
    cmp = EstimatorComparison(b, ["mpo", "gae", "vapo"])
    ref = bench.reference(b)
    for name in ("mpo", "gae", "vapo"):
        got = cmp.accuracy_df.set_index("estimator").loc[name]
        want = bench.metrics(cmp.results[name][0].double().numpy(), ref)
        for col in (
            "turn_corr",
            "turn_sign",
            "tok_corr",
            "within_corr",
            "dec_sign",
            "dec_mass",
            "tok_slope",
            "dec_slope",
            "turn_slope",
        ):
            np.testing.assert_allclose(
                got[col], want[col], rtol=1e-6, atol=1e-9, err_msg=f"{name} {col}"
            )  # float32 oracle sums
    reading = cmp.accuracy_reading
    best = cmp.accuracy_df.loc[cmp.accuracy_df["tok_corr"].idxmax(), "estimator"]
    assert reading.startswith(f"Token credit closest to the oracle: {best} ")
    assert "values_source: oracle" in reading  # the shipped values are the oracle's, and it says so
    assert "accuracy against the oracle" in cmp.metrics.value
    # the slider setting counts: mpo at λ = 0 (within-turn signal = one-step residuals) scores differently
    before = cmp.accuracy_df.set_index("estimator").loc["mpo", "tok_corr"]
    cmp.params.set(**{"lam@mpo": 0.0})
    after = cmp.accuracy_df.set_index("estimator").loc["mpo", "tok_corr"]
    want = bench.metrics(cmp.results["mpo"][0].double().numpy(), ref)["tok_corr"]
    assert after == pytest.approx(want, rel=1e-9) and after != pytest.approx(before, rel=1e-6)
    # without oracle columns: no numbers, a text that says what would tell
    plain = mv.synthetic.make_batch(6, seed=1)
    c2 = EstimatorComparison(plain, ["mpo", "gae"])
    assert c2.accuracy_df is None and "explained variance" in c2.metrics.value and "oracle" in c2.metrics.value
