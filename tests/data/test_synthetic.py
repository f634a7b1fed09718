import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz.data.synthetic import make_batch


def test_deterministic_and_valid():
    a, b = make_batch(12, seed=5), make_batch(12, seed=5)
    assert a.traj_ids == b.traj_ids
    assert np.array_equal(a.values.numpy(), b.values.numpy())
    assert not np.array_equal(make_batch(12, seed=6).values.numpy()[:, :5], a.values.numpy()[:, :5])


def test_shape_options():
    b = make_batch(10, seed=0, turns=3, turn_len=4, obs_len=2, group_size=5)
    assert b.num_turns.tolist() == [3] * 10
    assert b.lengths.tolist() == [3 * 4 + 2 * 2] * 10  # no observation after the last turn
    assert len(set(b.group_ids)) == 2
    t = b.turns()
    assert (t.n_tokens == 4).all() and t.n_obs_after.tolist()[:3] == [2, 2, 0]
    full = make_batch(4, seed=0, turns=None, max_len=1000)
    assert full.lengths.tolist() == [1000] * 4
    assert full.mask.shape == (4, 1000)
    with pytest.raises(ValueError, match="group_size"):
        make_batch(3, group_size=0)


def test_values_vary_more_across_than_within_turns():
    b = make_batch(64, seed=1)
    t = b.to_pandas(columns=["traj_id", "turn_ids", "loss_mask", "values"])
    t = t[t.loss_mask == 1]
    per_turn = t.groupby(["traj_id", "turn_ids"])["values"]
    within = per_turn.var(ddof=0).groupby(level=0).mean()
    across = per_turn.mean().groupby(level=0).var(ddof=0)
    assert (across > within).mean() > 0.7


def test_rewards_are_outcomes():
    b = make_batch(40, seed=2)
    assert set(np.unique(b.outcome_reward)) <= {0.0, 1.0}
    np.testing.assert_allclose(b.token_rewards.sum(1).numpy(), b.outcome_reward)
    assert isinstance(b, mv.TrajectoryBatch)


def test_strip_arrays_spans_and_channels():
    from mpo_viz.data.synthetic import strip_arrays

    toks, mask, ch = strip_arrays(5000, seed=3)
    assert len(toks) == len(mask) == 5000 and mask[0] == 1
    edges = np.flatnonzero(np.diff(np.r_[0, mask, 0]))  # run starts and ends, alternately
    runs = np.diff(edges)[::2]  # assistant spans
    gaps = np.diff(edges)[1::2][:-1]  # tool spans between them
    assert runs[:-1].min() >= 20 and runs.max() < 200 and gaps.min() >= 20 and gaps.max() < 300
    assert set(ch) == {"adv_mpo", "adv_gae", "adv_grpo", "value", "td", "logprob"}
    assert all(v.shape == (5000,) for v in ch.values()) and (ch["logprob"] <= 0).all()
    t2, m2, c2 = strip_arrays(5000, seed=3)
    assert t2 == toks and (m2 == mask).all() and (c2["value"] == ch["value"]).all()
