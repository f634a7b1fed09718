"""The one Monte-Carlo returns of a batch (mpo_viz.advantages.returns): by hand, the default γ_T,
and each estimator's clock."""

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz.advantages import compute, estimator_clock, mc_returns


def _two_turns() -> mv.TrajectoryBatch:
    rows = [
        {
            "traj_id": "a",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [5, 6, 7, 8],
            "loss_mask": [1, 1, 0, 1],
            "reward": 2.0,
            "turn_rewards": [0.5, 0.0],
        }
    ]
    return mv.TrajectoryBatch.from_rows(rows)


def test_mc_returns_by_hand():
    b = _two_turns()
    # rewards: 0.5 on turn 0's last token (position 1), 2.0 on the last action token (position 3)
    np.testing.assert_allclose(mc_returns(b)[0].numpy(), [2.5, 2.5, 0.0, 2.0])
    # γ = 0.5 inside turns, γ_T = 0.25 across the boundary: G_3 = 2, G_1 = 0.5 + 0.25·2 = 1, G_0 = 0.5·1
    np.testing.assert_allclose(mc_returns(b, gamma=0.5, turn_gamma=0.25)[0].numpy(), [0.5, 1.0, 0.0, 2.0])


def test_turn_gamma_left_out_is_gamma():
    # the one default: plain γ-discounted returns, γ on every step (G_1 = 0.5 + 0.5·2, G_0 = 0.5·1.5)
    b = _two_turns()
    np.testing.assert_allclose(mc_returns(b, gamma=0.5)[0].numpy(), [0.75, 1.5, 0.0, 2.0])
    np.testing.assert_array_equal(mc_returns(b, gamma=0.5).numpy(), mc_returns(b, gamma=0.5, turn_gamma=0.5).numpy())


def test_estimator_clock_fills_in_each_estimators_defaults():
    assert estimator_clock("gae", {"gamma": 0.9}) == {"gamma": 0.9, "turn_gamma": 0.9}  # no turn discount: γ
    assert estimator_clock("vapo") == {"gamma": 1.0, "turn_gamma": 1.0}
    assert estimator_clock("mpo", {"gamma": 0.9}) == {"gamma": 0.9, "turn_gamma": 1.0}  # mae's own γ_T default
    assert estimator_clock("turn_gae", {"gamma": 0.9, "turn_gamma": 0.8}) == {"gamma": 0.9, "turn_gamma": 0.8}
    assert estimator_clock("bilevel_gae") == {"gamma": 1.0, "turn_gamma": 0.95}
    assert estimator_clock("grpo") == {"gamma": 1.0, "turn_gamma": 1.0}  # no discount at all


@pytest.mark.parametrize(
    "estimator, options",
    [("mpo", {"gamma": 0.9, "turn_gamma": 0.8}), ("mpo", {"gamma": 0.7}), ("gae", {"gamma": 0.9, "lam": 1.0})],
)
def test_the_returns_on_an_estimators_clock_are_its_own_mc_returns(estimator, options):
    # mae's returns (critic_target="mc") and gae's at λ = 1 are Monte-Carlo returns, whatever the values:
    # the clock estimator_clock gives reproduces them
    b = mv.synthetic.make_batch(12, seed=3)
    res = compute(b, estimator, **options)
    m = b.mask.bool()
    got = mc_returns(b, **estimator_clock(estimator, options))
    np.testing.assert_allclose(got[m].numpy(), res.returns.double()[m].numpy(), rtol=1e-5, atol=1e-5)
