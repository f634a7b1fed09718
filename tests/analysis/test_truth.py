"""Credit accuracy against the policy's Monte-Carlo truth: the truth's turn advantage and its
reliability by hand on a toy, and a case with a known answer (an estimator equal to the noise-free
truth: raw correlation lowered by the truth's noise, disattenuated back to 1)."""

import math

import numpy as np
import pytest

from mpo_viz.analysis import credit_accuracy, mc_accuracy, mc_turn_truth
from mpo_viz.analysis.truth import fisher_interval, reliability
from mpo_viz.data.trajectory import TrajectoryBatch


def _batch(turns_per_row, reward, fields):
    """Rows of 2-token turns each followed by one observation token; outcome ``reward`` per row."""
    rows = []
    for i, k in enumerate(turns_per_row):
        mask = [1, 1, 0] * k
        rows.append(
            {
                "traj_id": f"t{i}",
                "group_id": "g",
                "prompt_ids": [1],
                "response_ids": [2] * len(mask),
                "loss_mask": mask,
                "reward": reward[i],
            }
        )
    b = TrajectoryBatch.from_rows(rows)
    return b.with_turn_fields(**fields)


def test_turn_truth_from_values_and_its_split_half_reliability_by_hand():
    # one row, 3 turns, outcome 1 on the last turn: Â_k = R_k + V_{k+1} − V_k, V_3 = 0
    v, va, vb = [0.5, 0.7, 0.9], [0.4, 0.8, 1.0], [0.6, 0.6, 0.8]
    b = _batch([3], [1.0], {"mc_value": [v], "mc_value_se": [[0.1] * 3], "mc_value_a": [va], "mc_value_b": [vb]})
    t = mc_turn_truth(b)
    np.testing.assert_allclose(t["adv"], [0.2, 0.2, 1 - 0.9])
    a = np.array([0.8 - 0.4, 1.0 - 0.8, 1 - 1.0])
    bb = np.array([0.6 - 0.6, 0.8 - 0.6, 1 - 0.8])
    r = np.corrcoef(a, bb)[0, 1]
    assert t["truth"] == "values" and reliability(t) == pytest.approx(2 * r / (1 + r))


def test_turn_truth_from_q_and_its_reliability_from_the_errors():
    b = _batch(
        [2],
        [0.0],
        {
            "mc_value": [[0.5, 0.2]],
            "mc_value_se": [[0.1, 0.1]],
            "mc_value_a": [[0.5, 0.2]],
            "mc_value_b": [[0.5, 0.2]],
            "mc_q": [[0.3, 0.6]],
            "mc_q_se": [[0.1, 0.2]],
        },
    )
    t = mc_turn_truth(b)
    adv = np.array([0.3 - 0.5, 0.6 - 0.2])
    np.testing.assert_allclose(t["adv"], adv)
    assert t["truth"] == "q-v"
    assert reliability(t) == pytest.approx(1 - np.mean([0.01 + 0.01, 0.04 + 0.01]) / np.var(adv, ddof=1))
    assert mc_turn_truth(b, use_q=False)["truth"] == "values"


def test_an_estimator_equal_to_the_noise_free_truth_is_disattenuated_to_one():
    rng = np.random.default_rng(0)
    n_rows, k = 400, 3
    V = rng.uniform(0.1, 0.9, (n_rows, k))
    sd = 0.15  # the noise of each half's mean
    va = V + rng.normal(0, sd, V.shape)
    vb = V + rng.normal(0, sd, V.shape)
    v = (va + vb) / 2
    b = _batch(
        [k] * n_rows,
        [0.0] * n_rows,
        {
            "mc_value": v.tolist(),
            "mc_value_se": np.full(V.shape, sd / 2**0.5).tolist(),
            "mc_value_a": va.tolist(),
            "mc_value_b": vb.tolist(),
        },
    )
    # the noise-free turn advantage A_k = V_{k+1} − V_k (V_K = 0, no reward) as the estimator's credit
    true_adv = np.concatenate([V[:, 1:] - V[:, :-1], -V[:, -1:]], axis=1)
    adv = np.zeros((n_rows, 3 * k))
    for j in range(k):
        adv[:, 3 * j : 3 * j + 2] = true_adv[:, j : j + 1]
    res = mc_accuracy(b, {"exact": adv, "half": adv * 0.5, "noise": rng.normal(size=adv.shape) * np.tile([1, 1, 0], k)})
    ex = res.set_index("estimator").loc["exact"]
    assert ex.turn_corr < 0.97  # the truth's noise lowers the raw correlation
    assert ex.dis_lo <= 1.0 <= ex.dis_hi and ex.turn_corr_dis == pytest.approx(1.0, abs=0.05)
    assert ex.slope_credit_on_truth_dis == pytest.approx(1.0, abs=0.07) and ex.n_turns == n_rows * k
    half = res.set_index("estimator").loc["half"]
    assert half.slope_credit_on_truth_dis == pytest.approx(0.5, abs=0.04) and half.turn_corr == pytest.approx(
        ex.turn_corr
    )
    # the other direction: the truth on the credit is not attenuated by the truth's noise (credit A: slope 1;
    # credit A/2: slope 2), and the two slopes multiply to r²
    assert ex.slope_truth_on_credit == pytest.approx(1.0, abs=0.05)
    assert half.slope_truth_on_credit == pytest.approx(2 * ex.slope_truth_on_credit, rel=1e-9)
    assert ex.slope_truth_on_credit * ex.slope_credit_on_truth == pytest.approx(ex.turn_corr**2, rel=1e-9)
    assert abs(res.set_index("estimator").loc["noise"].turn_corr_dis) < 0.15
    # the dispatcher
    assert credit_accuracy(b, {"exact": adv}, truth="mc").turn_corr.iloc[0] == pytest.approx(ex.turn_corr)
    with pytest.raises(ValueError, match="truth: expected 'expert'"):
        credit_accuracy(b, {"exact": adv}, truth="policy")


def test_missing_truth_and_fisher_interval():
    b = TrajectoryBatch.from_rows(
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
    with pytest.raises(ValueError, match="needs the mc_value, mc_value_a and mc_value_b"):
        mc_turn_truth(b)
    lo, hi = fisher_interval(0.5, 103)
    assert lo == pytest.approx(math.tanh(math.atanh(0.5) - 1.959964 / 10), abs=1e-5)
    assert hi == pytest.approx(math.tanh(math.atanh(0.5) + 1.959964 / 10), abs=1e-5)
