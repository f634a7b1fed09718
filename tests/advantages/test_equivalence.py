"""Fast estimators == the reference loops, on random batches full of edge cases.

Every random batch has: a row with no action token, a single one-token turn, one-token turns,
single-turn rows, leading observation tokens, observation tokens between turns, right padding,
garbage values on masked tokens, groups of one, bootstrap values (finite and NaN).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mpo_viz.advantages as A
from mpo_viz.advantages import reference as ref
from mpo_viz.data.synthetic import make_batch

CRITIC_CASES = [
    ("gae", {}),
    ("gae", {"gamma": 0.9, "lam": 0.8}),
    ("gae", {"gamma": 1.0, "lam": 1.0, "whiten": True}),
    ("vapo", {}),
    ("vapo", {"gamma": 0.95, "alpha": 0.5}),
    ("turn_gae", {}),
    ("turn_gae", {"turn_gamma": 0.9, "turn_lam": 0.7, "value_at": "last"}),
    ("turn_gae", {"turn_gamma": 1.0, "turn_lam": 1.0, "value_at": "mean", "whiten": True}),
    ("mae", {}),
    ("mae", {"within": "local", "gamma": 0.9, "lam": 0.8, "turn_gamma": 0.95, "beta": 0.5}),
    ("mae", {"within": "global", "value_at": "mean", "critic_target": "turn"}),
    ("mae", {"within": "td", "gamma": 0.97, "value_at": "last", "beta": 2.0, "whiten": True}),
    ("mae", {"within": "intra", "lam": 1.0, "turn_lam": 1.0, "critic_target": "mc", "turn_gamma": 0.8, "gamma": 0.9}),
    # γ < 1 on the one SMDP clock (γ inside turns, γ_T across), every within signal and value_at
    ("turn_gae", {"gamma": 0.7, "turn_gamma": 0.9, "turn_lam": 0.6}),
    ("turn_gae", {"gamma": 0.0, "turn_gamma": 0.5, "value_at": "mean"}),  # γ = 0: only a turn's first reward
    ("mae", {"gamma": 0.8, "lam": 0.9, "turn_gamma": 0.6, "turn_lam": 0.7, "within": "intra", "value_at": "last"}),
    ("mae", {"gamma": 0.8, "lam": 0.9, "turn_gamma": 0.6, "within": "global", "critic_target": "mc"}),
    ("mae", {"gamma": 0.6, "lam": 0.5, "turn_gamma": 0.9, "within": "td", "value_at": "mean"}),
    ("mae", {"gamma": 0.0, "turn_gamma": 0.0, "within": "local"}),
    # γλ = 1 (no decay inside the recurrences) with γ_T < 1 at the boundaries
    ("mae", {"gamma": 1.0, "lam": 1.0, "turn_gamma": 0.9, "turn_lam": 1.0, "within": "local"}),
    ("mae", {"gamma": 1.0, "lam": 1.0, "turn_gamma": 0.9, "within": "global", "critic_target": "turn"}),
    ("gae", {"gamma": 1.0, "lam": 1.0}),
    # the uncentred baseline signal u = V(s_k) − γ^j·V_t: every value_at, γ < 1, γλ = 1, whitening
    ("mae", {"within": "baseline"}),
    ("mae", {"within": "baseline", "gamma": 0.8, "turn_gamma": 0.6, "beta": 0.5, "value_at": "last"}),
    ("mae", {"within": "baseline", "gamma": 0.0, "value_at": "mean", "critic_target": "turn"}),
    ("mae", {"within": "baseline", "gamma": 1.0, "lam": 1.0, "turn_lam": 1.0, "beta": 2.0, "whiten": True}),
    # λ per row: VAPO's length-adaptive rule and AReaL's relative-position rule (ℓ = tokens or turns)
    ("gae", {"lam_rule": "vapo", "alpha": 0.5}),
    ("gae", {"lam_rule": "vapo", "alpha": 1.5, "gamma": 0.9, "whiten": True}),
    ("gae", {"lam_rule": "relative_position", "q": 0.3, "gamma": 0.95}),
    ("turn_gae", {"lam_rule": "vapo", "alpha": 0.6, "turn_gamma": 0.9}),
    ("turn_gae", {"lam_rule": "relative_position", "q": 0.5, "value_at": "mean"}),
    ("mae", {"lam_rule": "relative_position", "q": 0.2, "within": "local", "gamma": 0.9}),
    ("mae", {"lam_rule": "vapo", "alpha": 0.7, "within": "baseline"}),
    ("bilevel_gae", {}),
    ("bilevel_gae", {"gamma": 0.9, "lam": 0.8, "turn_gamma": 0.7, "whiten": False}),
    ("bilevel_gae", {"gamma": 1.0, "lam": 1.0, "turn_gamma": 1.0}),
    # RAGEN's turns: every action token with a non-zero reward ends one (and the row's last action token)
    ("bilevel_gae", {"turn_ends": "rewards"}),
    ("bilevel_gae", {"turn_ends": "rewards", "gamma": 0.9, "lam": 0.8, "turn_gamma": 0.7, "whiten": False}),
]

GROUP_CASES = [
    ("grpo", {}),
    ("grpo", {"norm_by_std": False, "eps": 1e-3}),
    ("drgrpo", {"whiten": True}),
    ("rloo", {}),
    ("rloo", {"whiten": True}),
    ("reinforce_pp_baseline", {}),
    ("reinforce_pp_baseline", {"whiten": False}),
    ("mt_grpo", {}),
    ("mt_grpo", {"turn_coef": 0.5, "whiten": True}),
    ("mt_grpo", {"turn_baseline": "index"}),
    ("mt_grpo", {"turn_baseline": "index", "turn_coef": 2.0, "eps": 1e-6}),
    ("mt_grpo", {"turn_baseline": "index", "turn_coef": 0.5, "whiten": True}),
    ("mt_grpo", {"turn_baseline": "index_present"}),
    ("mt_grpo", {"turn_baseline": "index_present", "turn_coef": 2.0, "eps": 1e-6}),
    ("empg", {}),
    ("empg", {"entropy_k": 2.0, "clarity_k": 0.5, "zeta": 0.3, "center": False}),
    ("empg", {"norm_by_std": False, "whiten": True}),
]


def _check(fast, slow, dtype):
    if dtype == np.float64:
        assert fast.dtype == torch.float64
        np.testing.assert_allclose(fast.numpy(), slow, rtol=1e-10, atol=1e-10)
    else:
        assert fast.dtype == torch.float32
        np.testing.assert_allclose(fast.numpy(), slow, rtol=2e-5, atol=2e-5)


def _call(name, mod, d, opts, turn_ids_given=True):
    kw = dict(opts)
    if name in ("gae", "vapo"):
        return getattr(mod, name)(d["rewards"], d["values"], d["mask"], bootstrap_value=d["bootstrap_value"], **kw)
    if name in ("turn_gae", "mae", "bilevel_gae"):
        tid = d["turn_ids"] if turn_ids_given else None
        return getattr(mod, name)(
            d["rewards"], d["values"], d["mask"], turn_ids=tid, bootstrap_value=d["bootstrap_value"], **kw
        )
    if name == "reinforce_pp":
        return getattr(mod, name)(d["rewards"], d["mask"], **kw)
    if name in ("mt_grpo", "empg"):
        tid = d["turn_ids"] if turn_ids_given else None
        if name == "empg":
            kw["entropy"] = d["entropy"]
        return getattr(mod, name)(d["rewards"], d["mask"], d["group_ids"], turn_ids=tid, **kw)
    if name == "gigpo":
        tid = d["turn_ids"] if turn_ids_given else None
        return getattr(mod, name)(
            d["rewards"],
            d["mask"],
            d["group_ids"],
            prompt_ids=d["prompt_ids"],
            response_ids=d["response_ids"],
            turn_ids=tid,
            **kw,
        )
    return getattr(mod, name)(d["rewards"], d["mask"], d["group_ids"], **kw)


def _compare(name, opts, d, dtype, turn_ids_given=True):
    a, g = _call(name, A, d, opts, turn_ids_given)
    # the reference computes in float64 from the same (possibly float32) inputs
    ra, rg = _call(name, ref, d, opts, turn_ids_given)
    _check(a, ra, dtype)
    _check(g, rg, dtype)
    m = d["mask"] == 0
    assert (a.numpy()[m] == 0).all() and (g.numpy()[m] == 0).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name,opts", CRITIC_CASES)
def test_critic_estimators_match_reference(make_random, name, opts, dtype):
    for seed in range(3):
        d = make_random(seed, B=10, dtype=dtype, adjacent_turns=(seed == 2), obs_inside=(seed == 2))
        _compare(name, opts, d, dtype)


def _degenerate(kind):
    rng = np.random.default_rng(11)
    if kind == "all_masked":
        M = np.zeros((3, 5))
        T = np.zeros((3, 5), dtype=np.int64)
    elif kind == "no_rows":
        M = np.zeros((0, 4))
        T = np.zeros((0, 4), dtype=np.int64)
    elif kind == "no_columns":
        M = np.zeros((2, 0))
        T = np.zeros((2, 0), dtype=np.int64)
    else:  # one_token_turns: every turn one action token, adjacent ids and ids across observations
        M = np.array([[1, 1, 1, 0, 1, 1], [1, 0, 1, 0, 1, 0], [0, 1, 1, 1, 1, 1]], dtype=np.float64)
        T = np.array([[0, 1, 2, 2, 3, 4], [0, 0, 1, 1, 2, 2], [0, 0, 1, 2, 3, 4]])
    R = np.where(M == 1, rng.normal(size=M.shape), 0.0)
    V = np.where(M == 1, rng.normal(size=M.shape), 1e3)
    boot = np.where(rng.random(M.shape[0]) < 0.5, 2.0, np.nan)
    H = np.where(M == 1, rng.random(M.shape), np.nan)
    gid = [f"g{i // 2}" for i in range(M.shape[0])]  # the last row of an odd batch is a group of one
    return {
        "rewards": R,
        "values": V,
        "mask": M,
        "turn_ids": T,
        "bootstrap_value": boot,
        "entropy": H,
        "group_ids": gid,
    }


@pytest.mark.parametrize("kind", ["all_masked", "no_rows", "no_columns", "one_token_turns"])
@pytest.mark.parametrize(
    "name,opts",
    [
        ("gae", {"gamma": 0.9, "lam": 0.7}),
        ("turn_gae", {"gamma": 0.8, "turn_gamma": 0.9, "turn_lam": 0.6, "value_at": "mean"}),
        ("mae", {"gamma": 0.8, "turn_gamma": 0.9, "lam": 0.7, "within": "intra"}),
        ("mae", {"gamma": 0.8, "turn_gamma": 0.9, "lam": 0.7, "within": "local", "value_at": "last"}),
        ("mae", {"gamma": 0.8, "turn_gamma": 0.9, "lam": 0.7, "within": "global"}),
        ("mae", {"gamma": 1.0, "lam": 1.0, "turn_gamma": 0.7, "within": "td", "whiten": True}),
        ("mae", {"gamma": 0.8, "turn_gamma": 0.9, "within": "baseline", "value_at": "mean"}),
        ("mae", {"gamma": 1.0, "lam": 1.0, "turn_lam": 1.0, "within": "baseline", "beta": 1.5}),
        ("gae", {"lam_rule": "relative_position", "q": 0.4}),
        ("turn_gae", {"lam_rule": "vapo", "alpha": 0.8}),
        ("mae", {"lam_rule": "relative_position", "q": 0.6}),
        ("bilevel_gae", {"gamma": 0.9, "lam": 0.8}),
        ("bilevel_gae", {"gamma": 0.9, "lam": 0.8, "turn_ends": "rewards"}),
        ("mt_grpo", {}),
        ("mt_grpo", {"turn_baseline": "index"}),
        ("mt_grpo", {"turn_baseline": "index_present"}),
        ("empg", {}),
    ],
)
@pytest.mark.filterwarnings("ignore:group_ids")
def test_degenerate_batches_match_reference(kind, name, opts):
    d = _degenerate(kind)
    _compare(name, opts, d, np.float64)
    if kind == "one_token_turns" and name in ("turn_gae", "mae"):
        # a one-token turn: R_k = r, Γ_k = γ_T, and MAE gives exactly A^T_k (nothing to centre)
        tg, _ = A.turn_gae(
            d["rewards"],
            d["values"],
            d["mask"],
            turn_ids=d["turn_ids"],
            bootstrap_value=d["bootstrap_value"],
            gamma=0.8,
            turn_gamma=0.9,
            turn_lam=0.6,
        )
        tg1, _ = A.turn_gae(
            d["rewards"],
            d["values"],
            d["mask"],
            turn_ids=d["turn_ids"],
            bootstrap_value=d["bootstrap_value"],
            gamma=0.1,
            turn_gamma=0.9,
            turn_lam=0.6,
        )
        torch.testing.assert_close(tg, tg1, rtol=0, atol=0)  # γ never enters when every turn has one token


@pytest.mark.parametrize("name,opts", [c for c in CRITIC_CASES if c[0] in ("turn_gae", "mae")])
def test_derived_turn_ids_match_reference(make_random, name, opts):
    d = make_random(5, B=10)
    _compare(name, opts, d, np.float64, turn_ids_given=False)
    # and equal to passing the explicit ids (the generator separates turns by observations)
    a1, _ = _call(name, A, d, opts, True)
    a2, _ = _call(name, A, d, opts, False)
    torch.testing.assert_close(a1, a2, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name,opts", GROUP_CASES)
def test_group_estimators_match_reference(make_random, name, opts, dtype):
    for seed in range(3):
        d = make_random(seed, B=12, dtype=dtype, reward_kind=("outcome", "turn_end", "dense")[seed])
        _compare(name, opts, d, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("opts", [{}, {"gamma": 0.9}, {"gamma": 0.99, "whiten": False}])
def test_reinforce_pp_matches_reference(make_random, opts, dtype):
    for seed in range(3):
        d = make_random(seed, B=10, dtype=dtype)
        _compare("reinforce_pp", opts, d, dtype)


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"omega": 0.5, "step_gamma": 1.0},
        {"norm": "step_mean_norm", "episode_stats": "trajectories", "whiten": True},  # the former norm="mean"
        {"norm": "mean_std_norm", "episode_stats": "trajectories"},  # the former default, norm="std"
        {"norm": "mean_norm"},  # verl-agent's config default
        {"norm": "mean_norm", "episode_stats": "trajectories", "omega": 0.5},
        {"norm": "step_mean_norm", "step_gamma": 0.8},
    ],
)
def test_gigpo_matches_reference(make_random, opts):
    for seed in range(4):
        # a tiny observation vocabulary so that anchors repeat and step groups form
        d = make_random(seed, B=12, reward_kind="turn_end", vocab=2, adjacent_turns=(seed == 3))
        _compare("gigpo", opts, d, np.float64)
        _compare("gigpo", opts, d, np.float64, turn_ids_given=(seed == 3))


def test_constant_reward_groups_and_groups_of_one():
    # rows 0-2: a group whose scores are all 0.5 (spread differently over tokens); row 3 alone
    M = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=np.float64)
    R = np.array([[0.25, 0.25, 0, 0], [0, 0, 0.5, 0], [0.5, 0, 0, 0], [0, 2.0, 0, 0]])
    g = ["c", "c", "c", 7]  # ids of mixed types are fine
    for fn in (A.grpo, A.drgrpo, A.rloo):
        a, _ = fn(R, M, g)
        assert (a.numpy()[:3] == 0).all(), fn.__name__
    a, _ = A.reinforce_pp_baseline(R, M, g, whiten=False)
    assert (a.numpy()[:3] == 0).all()
    # group of one: GRPO uses mean 0, std 1 (verl); Dr. GRPO the raw score; RLOO gives 0
    np.testing.assert_allclose(A.grpo(R, M, g)[0].numpy()[3], [2 / (1 + 1e-6)] * 2 + [0, 0])
    np.testing.assert_allclose(A.drgrpo(R, M, g)[0].numpy()[3], [2, 2, 0, 0])
    np.testing.assert_allclose(A.rloo(R, M, g)[0].numpy()[3], [0, 0, 0, 0])


def test_synthetic_batch_matches_reference():
    b = make_batch(12, seed=3, turns=(1, 4), turn_len=(1, 6), obs_len=(1, 5), prompt_len=(2, 4), group_size=3)
    d = {
        "rewards": b.token_rewards.double().numpy(),
        "values": b.values.double().numpy(),
        "mask": b.mask.double().numpy(),
        "turn_ids": b.turn_ids.numpy(),
        "bootstrap_value": b.bootstrap_value.numpy(),
        "group_ids": b.group_ids,
        "prompt_ids": b.field("prompt_ids"),
        "response_ids": b.field("response_ids"),
    }
    for name, opts in CRITIC_CASES[:1] + CRITIC_CASES[5:6] + CRITIC_CASES[8:10] + GROUP_CASES[:1] + [("gigpo", {})]:
        _compare(name, opts, d, np.float64)
    for opts in ({"norm": "mean_norm"}, {"episode_stats": "trajectories"}):
        _compare("gigpo", opts, d, np.float64)
