"""VarianceView and EstimatorComparison without a browser."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz import advantages as adv
from mpo_viz.analysis import value_variance
from mpo_viz.widgets import EstimatorComparison, VarianceView
from mpo_viz.widgets.engine import options_of


@pytest.fixture(scope="module")
def batch():
    return mv.synthetic.make_batch(8, seed=5, turns=(2, 4), turn_len=(3, 12), obs_len=(2, 8))


def test_variance_view_click_opens_an_explorer(batch):
    v = VarianceView(batch, estimators=["mpo", "gae"])
    vv = value_variance(batch)
    sc = v.figure.data[0]
    # the scatter holds the trajectories whose statistics are both > 0, with traj_id as text
    keep = vv[(vv["across"] > 0) & (vv["within"] > 0)]
    assert list(sc.text) == list(keep["traj_id"])
    np.testing.assert_allclose(sc.x, keep["within"])
    assert v.explorer is None
    # plotly's click callback: (trace, points, state) with points.point_inds
    v._clicked(sc, SimpleNamespace(point_inds=[2]), None)
    tid = keep["traj_id"].iloc[2]
    assert v.opened == [tid]
    assert v.explorer is not None and v.explorer.row == batch.traj_ids.index(tid)
    assert v.explorer.strip.payload_dict["title"] == f"trajectory {tid}"
    assert v.right.children == (v.explorer,)
    v._clicked(sc, SimpleNamespace(point_inds=[]), None)  # a click on nothing changes nothing
    assert len(v.opened) == 1
    # the selection table opens the same way (by row), and the explorer is reused
    first = v.explorer
    v.picker.pick(5)
    assert v.explorer is first and v.explorer.row == 5 and v.opened[-1] == batch.traj_ids[5]
    assert "fig-" in v.to_html() and batch.traj_ids[5] in v.to_html()


def test_variance_view_needs_values():
    b = mv.TrajectoryBatch.from_rows(
        [
            {
                "traj_id": "a",
                "group_id": "g",
                "prompt_ids": [1],
                "response_ids": [2, 3],
                "loss_mask": [1, 1],
                "reward": 1.0,
            }
        ]
    )
    with pytest.raises(ValueError, match="batch: VarianceView needs values"):
        VarianceView(b)


def test_estimator_comparison_bars_follow_the_sliders(batch):
    names = ["mpo", "gae", "grpo"]
    c = EstimatorComparison(batch, names, row=3)
    assert set(c.strips) == set(names)
    for name, w in c.strips.items():
        assert w.payload_dict["channel"] == f"adv_{name}" and w.channel == f"adv_{name}"

    def check(options):
        tid = batch.traj_ids[c.row]
        got = c.turn_advantages()
        for name in names:
            t = adv.compute(batch, name, **options_of(name, options)).turns
            want = t[t["traj_id"] == tid][f"adv_{name}"].to_numpy()
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-7)

    check(c.params.options)
    c.params.set(beta=0.0, turn_lam=0.5)
    check(c.params.options)
    c.picker.pick(6)
    assert c.row == 6
    check(c.params.options)
    assert c.metrics_df is not None and {"a", "b"} <= set(c.metrics_df.columns)
    assert len(c.metrics_df) == 3  # three pairs
    html = c.to_html()
    assert html.count('class="strip"') == 3


def test_estimator_comparison_one_estimator(batch):
    c = EstimatorComparison(batch, ["gae"])
    assert c.metrics_df is None and "nothing to compare" in c.metrics.value
