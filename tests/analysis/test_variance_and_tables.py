"""mpo_viz.analysis against hand-computed numbers (docs/concepts.md §7.8, worked example) and reference loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpo_viz import analysis as an
from mpo_viz.data.trajectory import TrajectoryBatch

# docs/concepts.md §7.3 worked example, with observation tokens (2 each) between the turns; their values (9.0)
# must never enter any statistic.
VA = [0.50, 0.55, 0.60, 0.58, 0.62, 0.80, 0.85]  # turns of 2, 3, 2 tokens
VB = [0.40, 0.38, 0.35, 0.20, 0.25, 0.22]  # turns of 3, 1, 2 tokens


def _row(traj_id, group, turn_lens, vals, reward, obs=2):
    mask, values, k = [], [], 0
    for i, n in enumerate(turn_lens):
        mask += [1] * n
        values += vals[k : k + n]
        k += n
        if i < len(turn_lens) - 1:
            mask += [0] * obs
            values += [9.0] * obs
    return {
        "traj_id": traj_id,
        "group_id": group,
        "prompt_ids": [1, 2],
        "response_ids": list(range(3, 3 + len(mask))),
        "loss_mask": mask,
        "values": values,
        "reward": reward,
    }


@pytest.fixture
def toy():
    return TrajectoryBatch.from_rows([_row("A", "g", [2, 3, 2], VA, 1.0), _row("B", "g", [3, 1, 2], VB, 0.0)])


def test_value_variance_worked_example(toy):
    df = an.value_variance(toy)
    assert list(df["traj_id"]) == ["A", "B"]
    a, b = df.iloc[0], df.iloc[1]
    # A: turn means .525 .6 .825 (mean .65); turn variances .000625, .0008/3, .000625
    assert a["across"] == pytest.approx((0.125**2 + 0.05**2 + 0.175**2) / 3, rel=1e-5)  # 0.01625
    assert a["within"] == pytest.approx((0.000625 + 0.0008 / 3 + 0.000625) / 3, rel=1e-4)
    assert a["ratio"] == pytest.approx(0.01625 / ((0.00125 + 0.0008 / 3) / 3), rel=1e-4)
    m = 4.5 / 7
    assert a["across_w"] == pytest.approx(
        (2 * (0.525 - m) ** 2 + 3 * (0.6 - m) ** 2 + 2 * (0.825 - m) ** 2) / 7, rel=1e-4
    )
    assert a["within_w"] == pytest.approx((2 * 0.000625 + 0.0008 + 2 * 0.000625) / 7, rel=1e-4)
    # B: one-token turn contributes 0 within
    mb = [(0.40 + 0.38 + 0.35) / 3, 0.20, 0.235]
    mm = sum(mb) / 3
    assert b["across"] == pytest.approx(sum((x - mm) ** 2 for x in mb) / 3, rel=1e-4)
    vb0 = sum((x - mb[0]) ** 2 for x in [0.40, 0.38, 0.35]) / 3
    assert b["within"] == pytest.approx((vb0 + 0 + 0.015**2) / 3, rel=1e-4)
    # the length-weighted pair sums to the variance of all action-token values
    for r, vals in ((a, VA), (b, VB)):
        assert r["across_w"] + r["within_w"] == pytest.approx(np.var(vals), rel=1e-4)
    assert list(df["n_turns"]) == [3, 3] and list(df["n_tokens"]) == [7, 6]
    assert list(df["reward"]) == [1.0, 0.0]


def test_observation_values_are_ignored(toy):
    v = toy.values.clone()
    v[toy.mask == 0] = -123.0
    d1 = an.value_variance(toy)
    d2 = an.value_variance(toy, v)
    np.testing.assert_allclose(d1[["across", "within"]].to_numpy(), d2[["across", "within"]].to_numpy())


def test_edge_cases_inf_nan_and_summary():
    mask = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.float32)
    x = torch.tensor([[1.0, 0, 3.0, 0], [2.0, 2.0, 0, 0], [0, 0, 0, 0], [1.0, 2.0, 3.0, 0]])
    s = an.variance_split(x, mask)
    # row 0: two one-token turns 1 and 3 -> across 1, within 0 -> inf
    assert s["across"][0] == 1.0 and s["within"][0] == 0.0 and s["ratio"][0] == math.inf
    # row 1: one constant turn -> nothing varies -> NaN ratio
    assert s["across"][1] == 0.0 and s["within"][1] == 0.0 and math.isnan(s["ratio"][1])
    # row 2: no action token -> NaN everything
    assert math.isnan(s["across"][2]) and s["n_turns"][2] == 0
    # row 3: one turn [1,2,3] -> across 0, within 2/3
    assert s["across"][3] == 0.0 and s["within"][3] == pytest.approx(2 / 3) and s["ratio"][3] == 0.0
    df = __import__("pandas").DataFrame({**s, "traj_id": list("abcd")})
    summ = an.variance_summary(df)
    assert summ["n_traj"] == 4 and summ["n_valid"] == 3
    assert summ["n_inf_ratio"] == 1 and summ["n_flat"] == 1
    assert summ["median_ratio"] == 0.0  # the only finite ratio
    assert summ["share_across_gt_within"] == pytest.approx(1 / 3)
    assert summ["mean_within"] == pytest.approx((0 + 0 + 2 / 3) / 3)


def test_given_turn_ids_split_an_action_run():
    # one run of 4 action tokens split in two turns by explicit ids
    x = np.array([[1.0, 3.0, 10.0, 14.0]])
    mask = np.ones((1, 4))
    s = an.variance_split(x, mask, np.array([[0, 0, 1, 1]]))
    assert s["across"][0] == pytest.approx(((2 - 7) ** 2 + (12 - 7) ** 2) / 2)
    assert s["within"][0] == pytest.approx(2.5)  # (1 + 4) / 2


def test_bad_input_names_argument():
    with pytest.raises(ValueError, match="x: row 0, token 1"):
        an.variance_split(np.array([[1.0, np.nan]]), np.array([[1, 1]]))
    with pytest.raises(ValueError, match="mask"):
        an.variance_split(np.zeros((2, 3)), np.ones((2, 4)))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_variance_split_matches_reference_loop(seed):
    rng = np.random.default_rng(seed)
    B, L = int(rng.integers(1, 5)), int(rng.integers(1, 12))
    mask = (rng.random((B, L)) < 0.6).astype(np.float32)
    x = rng.normal(size=(B, L)).round(2)
    if rng.random() < 0.3:
        x[:] = 0.5  # constant: flat rows
    fast, ref = an.variance_split(x, mask), an.variance_split_reference(x, mask)
    for k in ref:
        np.testing.assert_allclose(fast[k], ref[k], rtol=1e-9, atol=1e-12, err_msg=k)


def test_turn_table_values_and_rewards(toy):
    adv = torch.zeros(toy.mask.shape)
    adv[0, :2] = torch.tensor([1.0, 3.0])  # turn 0 of A -> mean 2
    tt = an.turn_table(toy, {"x": adv})
    a = tt[tt.traj_id == "A"].reset_index(drop=True)
    assert list(a["turn"]) == [0, 1, 2]
    assert list(a["n_tokens"]) == [2, 3, 2]
    assert list(a["start"]) == [0, 4, 9] and list(a["end"]) == [1, 6, 10]
    np.testing.assert_allclose(a["value_first"], [0.50, 0.60, 0.80], rtol=1e-6)
    np.testing.assert_allclose(a["value_last"], [0.55, 0.62, 0.85], rtol=1e-6)
    np.testing.assert_allclose(a["value_mean"], [0.525, 0.6, 0.825], rtol=1e-6)
    np.testing.assert_allclose(a["reward"], [0, 0, 1.0])  # outcome reward on the last action token
    np.testing.assert_allclose(a["adv_x"], [2.0, 0, 0])
    ref = an.turn_table_reference(toy, {"x": adv})
    np.testing.assert_allclose(
        tt[["start", "end", "n_tokens", "reward", "adv_x"]].to_numpy(float),
        ref[["start", "end", "n_tokens", "reward", "adv_x"]].to_numpy(float),
    )
    # a trainer's turn fields (what its update did) come along as columns of their own name
    assert "turn_ratio" not in tt.columns
    seen = toy.with_turn_fields(turn_ratio=[[1.1, 0.7, 1.0], [0.95, 1.3, 1.0]], turn_clipped=[[0, 1, 0], [0, 1, 0]])
    tt = an.turn_table(seen, {"x": adv})
    assert tt["turn_ratio"].tolist() == [1.1, 0.7, 1.0, 0.95, 1.3, 1.0]
    assert tt["turn_clipped"].tolist() == [0, 1, 0, 0, 1, 0]


def _two_traj_batch():
    # trajectory P: 3 turns of 2 tokens; Q: 2 turns of 1 token (pairs never cross trajectories)
    rows = [
        {
            "traj_id": "P",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": list(range(8)),
            "loss_mask": [1, 1, 0, 1, 1, 0, 1, 1],
            "reward": 1.0,
        },
        {
            "traj_id": "Q",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": list(range(3)),
            "loss_mask": [1, 0, 1],
            "reward": 0.0,
        },
    ]
    b = TrajectoryBatch.from_rows(rows)
    a = torch.zeros(2, 8)
    c = torch.zeros(2, 8)
    # P turn means: a = (1, -1, 2), c = (3, 1, 2); each turn's two tokens are equal
    a[0] = torch.tensor([1, 1, 0, -1, -1, 0, 2, 2.0])
    c[0] = torch.tensor([3, 3, 0, 1, 1, 0, 2, 2.0])
    # Q: a = (1, 2), c = (2, 1) -> one discordant pair
    a[1, :3] = torch.tensor([1, 0, 2.0])
    c[1, :3] = torch.tensor([2, 0, 1.0])
    return b, {"a": a, "c": c}


def test_compare_estimators_hand_numbers():
    b, adv = _two_traj_batch()
    row = an.compare_estimators(b, adv).iloc[0]
    assert (row["a"], row["b"]) == ("a", "c")
    # tokens: a = 1 1 -1 -1 2 2 1 2, c = 3 3 1 1 2 2 2 1
    ta = np.array([1, 1, -1, -1, 2, 2, 1, 2.0])
    tc = np.array([3, 3, 1, 1, 2, 2, 2, 1.0])
    assert row["token_corr"] == pytest.approx(np.corrcoef(ta, tc)[0, 1])
    assert row["sign_agreement"] == pytest.approx(6 / 8)  # the two tokens of P's turn 1 differ
    assert row["sign_opposite"] == pytest.approx(2 / 8) and row["sign_one_zero"] == 0.0
    # P: pairs (0,1) concordant, (0,2) discordant, (1,2) concordant; Q: (0,1) discordant -> 2/4
    assert row["turn_rank_agreement"] == pytest.approx(0.5)
    assert row["n_sign_flips"] == 1 and row["n_turns"] == 5
    assert row["turn_sign_agreement"] == pytest.approx(4 / 5)
    flips = an.sign_flips(b, adv)
    assert flips[["traj_id", "turn"]].values.tolist() == [["P", 1]]
    assert flips["adv_a"].iloc[0] == -1.0 and flips["adv_b"].iloc[0] == 1.0
    dis = an.disagreement(b, adv)
    np.testing.assert_allclose(dis, [1 / 3, 0.0])


def test_sign_agreement_beside_no_flip_is_zeros_and_within_turn_disagreement():
    """Low token sign agreement with no turn flip: one estimator 0 on a whole turn (a group estimator in a
    group that scores alike), and tokens of opposite signs inside a turn whose means agree."""
    rows = [
        {
            "traj_id": "A",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [2] * 5,
            "loss_mask": [1, 1, 0, 1, 1],
            "reward": 0.0,
        }
    ]
    b = TrajectoryBatch.from_rows(rows)
    x = torch.tensor([[0.0, 0.0, 0.0, 0.3, -0.1]])  # turn 0: all 0; turn 1: mean 0.1, its tokens of both signs
    y = torch.tensor([[0.5, 0.2, 0.0, 0.2, 0.2]])
    row = an.compare_estimators(b, {"x": x, "y": y}).iloc[0]
    assert row["n_sign_flips"] == 0
    assert row["sign_agreement"] == pytest.approx(1 / 4)  # only token 3 agrees
    assert row["sign_one_zero"] == pytest.approx(2 / 4) and row["sign_opposite"] == pytest.approx(1 / 4)


def test_compare_needs_two():
    b, adv = _two_traj_batch()
    with pytest.raises(ValueError, match="at least two"):
        an.compare_estimators(b, {"a": adv["a"]})


def test_critic_quality_hand_numbers():
    rows = [
        {
            "traj_id": "A",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [1, 2, 3, 4],
            "loss_mask": [1, 0, 1, 1],
            "values": [1.0, 5.0, 2.0, 3.0],
            "reward": 1.0,
        }
    ]
    b = TrajectoryBatch.from_rows(rows)
    g = torch.tensor([[1.0, 0.0, 2.0, 4.0]])
    q = an.critic_quality(b, g)
    # Var(G) over action tokens = 42/27, Var(G - V) = 2/9 -> EV = 1 - 6/42
    assert q.explained_variance == pytest.approx(1 - 6 / 42)
    assert q.mse == pytest.approx(1 / 3) and q.bias == pytest.approx(-1 / 3)
    assert q.per_turn["turn"].tolist() == [0, 1]
    np.testing.assert_allclose(q.per_turn["error"], [0.0, 0.0])  # value_first == return_first
    g2 = torch.tensor([[0.5, 0.0, 2.5, 4.0]])
    np.testing.assert_allclose(an.critic_quality(b, g2).per_turn["error"], [0.5, -0.5])


def test_compare_stats_add_up_over_chunks():
    import mpo_viz as mv

    b = mv.synthetic.make_batch(12, seed=3, turns=(1, 4), turn_len=(1, 6), obs_len=(0, 3))
    rng = np.random.default_rng(0)
    adv = {k: torch.from_numpy(rng.normal(size=tuple(b.mask.shape))).float() * b.mask for k in "xyz"}
    whole = an.compare_estimators(b, adv)
    acc = None
    for sl in (slice(0, 5), slice(5, 12)):
        part = b[list(range(12))[sl]]
        L = part.mask.shape[1]
        acc = an.merge_compare_stats(acc, an.compare_stats(part, {k: v[sl, :L] for k, v in adv.items()}))
    chunked = an.finish_compare(acc)
    num = [
        "token_corr",
        "sign_agreement",
        "sign_opposite",
        "sign_one_zero",
        "turn_corr",
        "turn_sign_agreement",
        "turn_rank_agreement",
        "n_sign_flips",
        "n_turns",
    ]
    np.testing.assert_allclose(whole[num].to_numpy(float), chunked[num].to_numpy(float), rtol=1e-9)
    assert len(whole) == 3


def test_turn_table_with_estimator_names_matches_mae_turn_advantage(toy):
    # MAE's turn mean is exactly A^T_k (docs/concepts.md §7.3 worked example, λ = λ_T = 0.9, γ = 1)
    tt = an.turn_table(toy, "mpo", lam=0.9, turn_lam=0.9)
    np.testing.assert_allclose(tt["adv_mpo"], [0.442, 0.38, 0.2, -0.3575, -0.175, -0.25], atol=1e-6)


def test_identical_values_with_round_off_count_as_zero_within():
    # 0.1 three times: the float mean is not exactly 0.1, yet the turn does not vary
    x = np.array([[0.1, 0.1, 0.1, 0.7, 0.7, 0.7]])
    mask = np.array([[1, 1, 1, 0, 1, 1]])
    s = an.variance_split(x, mask)
    assert s["within"][0] == 0.0 and s["ratio"][0] == math.inf
    assert s["across"][0] == pytest.approx(0.09)
    r = an.variance_split_reference(x, mask)
    assert r["within"][0] == 0.0 and r["ratio"][0] == math.inf


def test_disagreement_cache_follows_changed_tensors():
    b, adv = _two_traj_batch()
    d = an.Disagreement(b)
    np.testing.assert_allclose(d(adv), [1 / 3, 0.0])  # P: turn 1 of 3 flips sign; Q: none
    kept = d._means["c"]
    # a new tensor for "a" (P's turn 1 now positive, as c's): recomputed; "c" is the same object: kept
    a2 = adv["a"].clone()
    a2[0, 3:5] = 1.0
    np.testing.assert_allclose(d({"a": a2, "c": adv["c"]}), [0.0, 0.0])
    assert d._means["c"] is kept and d._means["a"][0] is a2
    # equal to the plain function (a tensor changed in place would keep its old means: the engine
    # returns new tensors from every run)
    np.testing.assert_allclose(d({"a": a2, "c": adv["c"]}), an.disagreement(b, {"a": a2, "c": adv["c"]}))
