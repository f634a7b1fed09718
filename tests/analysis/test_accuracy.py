"""Calibration slopes of credit_accuracy (tok_slope, dec_slope, turn_slope) on cases with a known slope."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mpo_viz.analysis import accuracy_stats, credit_accuracy, finish_accuracy, merge_accuracy_stats
from mpo_viz.data.moments import pair_sums, slope
from mpo_viz.data.trajectory import TrajectoryBatch


def test_slope_of_an_exact_line_and_degenerate_series():
    y = np.array([-1.0, 0.5, 2.0, 3.0])
    assert slope(pair_sums(2.0 * y + 0.3, y)) == pytest.approx(2.0, rel=1e-12)  # the intercept does not count
    assert slope(pair_sums(-y, y)) == pytest.approx(-1.0, rel=1e-12)
    # x = y + e with e ⟂ y (Σe = 0, Σe·y = 0): the slope is still 1 while the correlation is < 1
    e = np.array([1.0, -1.0, -1.0, 1.0])
    e = e - e @ (y - y.mean()) / ((y - y.mean()) @ (y - y.mean())) * (y - y.mean())
    assert slope(pair_sums(y + e, y)) == pytest.approx(1.0, rel=1e-12)
    assert math.isnan(slope(pair_sums(y, np.ones(4))))  # a constant truth: no slope
    assert math.isnan(slope(pair_sums(y[:1], y[:1])))


def _batch():
    """Two trajectories; every turn has 2 action tokens (observations between turns). Token truth
    a*_t on the decisive tokens only, 0 elsewhere."""
    rows = []
    oracle = [[0.0, 0.4, 0, 0, -0.2, 0.0], [0.3, 0.0, 0, 0.0, 0.1]]
    decisive = [[0, 1, 0, 0, 1, 0], [1, 0, 0, 0, 1]]
    masks = [[1, 1, 0, 0, 1, 1], [1, 1, 0, 1, 1]]
    for i in range(2):
        n = len(masks[i])
        rows.append(
            {
                "traj_id": f"t{i}",
                "group_id": "g",
                "prompt_ids": [1],
                "response_ids": list(range(10, 10 + n)),
                "loss_mask": masks[i],
                "reward": 0.0,
                "oracle_token_adv": oracle[i],
                "decisive": decisive[i],
            }
        )
    return TrajectoryBatch.from_rows(rows)


def test_slopes_of_known_estimators():
    b = _batch()
    o = np.nan_to_num(b.padded("oracle_token_adv").numpy().astype(np.float64))
    m = b.mask.numpy() != 0
    # turns (2 tokens each): A*_k = [.4, −.2 | .3, .1]
    turn_truth = np.array([0.4, -0.2, 0.3, 0.1])
    broadcast = np.zeros_like(o)
    broadcast[0, [0, 1]], broadcast[0, [4, 5]] = 0.4, -0.2
    broadcast[1, [0, 1]], broadcast[1, [3, 4]] = 0.3, 0.1
    adv = {
        "twice": np.where(m, 2.0 * o + 0.3, 0.0),  # 2·a*_t + 0.3: token slopes 2, turn mean 2·A*_k/2 + .3 → 1
        "turn": np.where(m, 3.0 * broadcast, 0.0),  # 3·A*_k on each token: turn slope 3
    }
    df = credit_accuracy(b, adv).set_index("estimator")
    assert df.loc["twice", "tok_slope"] == pytest.approx(2.0, rel=1e-6)
    assert df.loc["twice", "dec_slope"] == pytest.approx(2.0, rel=1e-6)
    assert df.loc["twice", "turn_slope"] == pytest.approx(1.0, rel=1e-6)
    assert df.loc["turn", "turn_slope"] == pytest.approx(3.0, rel=1e-6)
    # the turn-constant estimator on tokens, by hand: decisive tokens carry a* = A*_k exactly here (one
    # decisive token per turn), so on them x = 3·a*: slope 3; over all 8 tokens x = 3·A*_k, y = a*_t
    assert df.loc["turn", "dec_slope"] == pytest.approx(3.0, rel=1e-6)
    x = 3.0 * np.repeat(turn_truth, 2)
    y = np.array([0.0, 0.4, -0.2, 0.0, 0.3, 0.0, 0.0, 0.1])
    by_hand = ((x - x.mean()) @ (y - y.mean())) / ((y - y.mean()) @ (y - y.mean()))
    assert df.loc["turn", "tok_slope"] == pytest.approx(by_hand, rel=1e-6)
    # streamed in two chunks: the same slopes
    merged = finish_accuracy(
        merge_accuracy_stats(
            accuracy_stats(b[:1], {k: v[:1] for k, v in adv.items()}),
            accuracy_stats(b[1:], {k: v[1:, :5] for k, v in adv.items()}),
        )
    )
    np.testing.assert_allclose(
        merged.set_index("estimator").loc[:, ["tok_slope", "dec_slope", "turn_slope"]],
        df.loc[:, ["tok_slope", "dec_slope", "turn_slope"]],
        rtol=1e-9,
    )
