"""Bad input: a ValueError naming the argument, the first offending row, expected and found."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mpo_viz.advantages as A


def _ok():
    M = np.array([[1, 1, 0, 1, 0], [1, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=np.float32)
    R = np.zeros_like(M)
    R[1, 4] = 1.0
    V = np.ones_like(M)
    return R, V, M


def test_valid_input_passes():
    # the inputs every error test below breaks one way, computed by hand (V = 1 on every token):
    # row 0: rewards 0, turns {0, 1} and {3}; row 1: reward 1 at the end, turns {0} and {2, 3, 4}; row 2: empty
    R, V, M = _ok()
    a, g = A.gae(R, V, M)  # γ = λ = 1: A_t = (rewards to go) − V_t
    np.testing.assert_allclose(a.numpy(), [[-1, -1, 0, -1, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    np.testing.assert_allclose(g.numpy(), [[0, 0, 0, 0, 0], [1, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    # MAE: flat values inside turns give u = 0, so A = A^T_k. Row 0: δ^T_1 = 0 + 0 − 1 = −1,
    # A^T_0 = (0 + 1 − 1) + λ_T·(−1) = −0.9. Row 1: δ^T_1 = 1 + 0 − 1 = 0 and δ^T_0 = 0 + 1 − 1 = 0.
    a, g = A.mae(R, V, M)
    np.testing.assert_allclose(a.numpy(), [[-0.9, -0.9, 0, -1, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]], atol=1e-7)
    np.testing.assert_allclose(g.numpy(), [[0, 0, 0, 0, 0], [1, 0, 1, 1, 1], [0, 0, 0, 0, 0]])  # MC returns


@pytest.mark.parametrize("fn", ["gae", "mae", "turn_gae", "vapo"])
def test_shape_mismatch(fn):
    R, V, M = _ok()
    with pytest.raises(ValueError, match=r"values: expected shape \(3, 5\).*found \(3, 4\)"):
        getattr(A, fn)(R, V[:, :4], M)
    with pytest.raises(ValueError, match=r"rewards: expected shape \(3, 5\).*found \(2, 5\)"):
        getattr(A, fn)(R[:2], V, M)
    with pytest.raises(ValueError, match=r"mask: expected a 2-D"):
        getattr(A, fn)(R, V, M[0])
    with pytest.raises(ValueError, match=r"bootstrap_value: expected shape \(3,\)"):
        getattr(A, fn)(R, V, M, bootstrap_value=np.zeros(2))


def test_mask_not_binary():
    R, V, M = _ok()
    M[1, 2] = 0.5
    with pytest.raises(ValueError, match=r"mask: row 1, position 2: expected 0 or 1, found 0.5"):
        A.gae(R, V, M)
    with pytest.raises(ValueError, match=r"mask: row 1"):
        A.grpo(R, M, ["a", "a", "b"])


def test_nan_values_on_action_tokens_only():
    R, V, M = _ok()
    V[0, 2] = np.nan  # observation token: fine
    V[2, :] = np.inf  # a row without action tokens: fine
    A.gae(R, V, M)
    V[1, 3] = np.inf
    with pytest.raises(
        ValueError, match=r"values: row 1, position 3: expected a finite value on an action token, found .*inf"
    ):
        A.mae(R, V, M)


def test_reward_problems():
    R, V, M = _ok()
    R[0, 2] = 0.3  # observation token
    with pytest.raises(ValueError, match=r"rewards: row 0, position 2: expected 0 on a masked"):
        A.gae(R, V, M)
    with pytest.raises(ValueError, match=r"rewards: row 0, position 2"):
        A.rloo(R, M, [1, 1, 2])
    R, V, M = _ok()
    R[1, 0] = np.nan
    with pytest.raises(ValueError, match=r"rewards: row 1, position 0: expected a finite reward"):
        A.reinforce_pp(R, M)
    R, V, M = _ok()
    R[2, 4] = np.nan  # NaN on a padding token is a non-zero reward there
    with pytest.raises(ValueError, match=r"rewards: row 2, position 4: expected 0 on a masked"):
        A.grpo(R, M, [1, 1, 2])


def test_turn_id_problems():
    R, V, M = _ok()
    T = np.array([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    A.mae(R, V, M, turn_ids=T)
    bad = T.copy()
    bad[1, 3] = 0
    with pytest.raises(
        ValueError,
        match=r"turn_ids: row 1, position 3: expected non-decreasing ids on action "
        r"tokens, found 1 \(position 2\) then 0",
    ):
        A.mae(R, V, M, turn_ids=bad)
    bad = T.copy()
    bad[0, 3:] = 2
    with pytest.raises(ValueError, match=r"turn_ids: row 0, position 3: expected consecutive turn ids"):
        A.turn_gae(R, V, M, turn_ids=bad)
    bad = T + 1
    with pytest.raises(ValueError, match=r"turn_ids: row 0, position 0: expected the first action token in turn 0"):
        A.mae(R, V, M, turn_ids=bad)
    bad = T.copy()
    bad[1, 0] = -1
    with pytest.raises(ValueError, match=r"turn_ids: row 1, position 0: expected ids >= 0 on action tokens, found -1"):
        A.mae(R, V, M, turn_ids=bad)
    with pytest.raises(ValueError, match=r"turn_ids: expected shape \(3, 5\)"):
        A.mae(R, V, M, turn_ids=T[:, :3])
    with pytest.raises(
        ValueError,
        match=r"turn_ids: row 0, position 0: expected an integer id on an action token, "
        r"found 0.5",
    ):
        A.mae(R, V, M, turn_ids=T + 0.5)


@pytest.mark.parametrize("fn", ["mae", "turn_gae", "gigpo", "mae_with_turns"])
def test_turn_ids_on_masked_positions_are_ignored(fn):
    # Only action tokens define turns: -1 padding, a decrease, NaN (float ids) or garbage on masked
    # positions are accepted and change no number.
    R, V, M = _ok()
    T = np.array([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    odd = T.copy()
    odd[0, 2], odd[0, 4] = -1, -7  # observation between the turns, padding after
    odd[1, 1] = 5  # observation inside row 1's first span
    odd[2, :] = -1  # a row with no action token
    oddf = odd.astype(np.float64)
    oddf[0, 4] = np.nan

    def run(tid):
        if fn == "gigpo":
            resp = [[1, 2, 3, 4, 5]] * 3
            return A.gigpo(R, M, ["g", "g", "h"], prompt_ids=[[9]] * 3, response_ids=resp, turn_ids=tid)
        return getattr(A, fn)(R, V, M, turn_ids=tid)

    want = run(T)
    for tid in (odd, oddf, torch.from_numpy(odd)):
        got = run(tid)
        for a, b in zip(want[:2], got[:2]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        if fn == "mae_with_turns":
            for key in ("advantage", "value", "reward", "return", "nturns"):
                np.testing.assert_array_equal(want[2][key], got[2][key])


def test_group_ids_problems():
    R, V, M = _ok()
    with pytest.raises(ValueError, match=r"group_ids: expected 3 ids \(one per row\), found 2"):
        A.grpo(R, M, ["a", "b"])
    with pytest.raises(ValueError, match=r"group_ids: row 1: expected a group id, found None"):
        A.rloo(R, M, ["a", None, "b"])
    with pytest.raises(ValueError, match=r"group_ids: expected 3 ids"):
        A.reinforce_pp_baseline(R, M, torch.arange(4))


def test_option_problems():
    R, V, M = _ok()
    with pytest.raises(ValueError, match=r"within: expected one of .*found 'nope'"):
        A.mae(R, V, M, within="nope")
    with pytest.raises(ValueError, match=r"value_at: expected one of"):
        A.turn_gae(R, V, M, value_at="middle")
    with pytest.raises(ValueError, match=r"lam: expected a value in \[0.0, 1.0\], found 1.5"):
        A.gae(R, V, M, lam=1.5)
    with pytest.raises(ValueError, match=r"critic_target: expected one of"):
        A.mae(R, V, M, critic_target="x")
    with pytest.raises(ValueError, match=r"beta: expected"):
        A.mae(R, V, M, beta=-1)
    with pytest.raises(TypeError):
        A.gae(R, V, M, 1.0)  # options are keyword-only
    # strings and flags are not numbers, even where float() would take them
    with pytest.raises(ValueError, match=r"gamma: expected a number, found '0.9'"):
        A.mae(R, V, M, gamma="0.9")
    with pytest.raises(ValueError, match=r"beta: expected a number, found True"):
        A.mae(R, V, M, beta=True)
    a, _ = A.mae(R, V, M, beta=np.float32(0.5))  # numpy scalars are numbers
    b, _ = A.mae(R, V, M, beta=0.5)
    assert torch.equal(a, b)


def test_renamed_and_new_choices_name_option_expected_and_found():
    R, V, M = _ok()
    g, tok = [0, 0, 1], dict(prompt_ids=[[1]] * 3, response_ids=[[1] * 5] * 3)
    # gigpo's former norm names say what they are now
    with pytest.raises(
        ValueError,
        match=r"norm: expected one of 'mean_std_norm', 'mean_norm', 'step_mean_norm', "
        r"found 'std' \(the former 'std' is norm='mean_std_norm', "
        r"episode_stats='trajectories'\)",
    ):
        A.gigpo(R, M, g, norm="std", **tok)
    with pytest.raises(
        ValueError,
        match=r"found 'mean' \(the former 'mean' is norm='step_mean_norm', "
        r"episode_stats='trajectories'\)",
    ):
        A.gigpo(R, M, g, norm="mean", **tok)
    with pytest.raises(ValueError, match=r"episode_stats: expected one of 'steps', 'trajectories', found 'rows'"):
        A.gigpo(R, M, g, episode_stats="rows", **tok)
    with pytest.raises(
        ValueError,
        match=r"turn_baseline: expected one of 'loo', 'index', 'index_present', "
        r"found 'present'",
    ):
        A.mt_grpo(R, M, g, turn_baseline="present")
    with pytest.raises(ValueError, match=r"turn_ends: expected one of 'turns', 'rewards', found 'eos'"):
        A.bilevel_gae(R, V, M, turn_ends="eos")


def test_gigpo_needs_token_ids():
    R, V, M = _ok()
    with pytest.raises(ValueError, match=r"prompt_ids: GiGPO needs"):
        A.gigpo(R, M, [0, 0, 1], prompt_ids=None, response_ids=[[1] * 5] * 3)
    with pytest.raises(ValueError, match=r"response_ids: expected 3 rows"):
        A.gigpo(R, M, [0, 0, 1], prompt_ids=[[1]] * 3, response_ids=[[1] * 5] * 2)
    with pytest.raises(ValueError, match=r"response_ids: row 1: expected at least 5 tokens"):
        A.gigpo(R, M, [0, 0, 1], prompt_ids=[[1]] * 3, response_ids=[[1] * 5, [1] * 3, []])


def _corrupt(kind):
    R, V, M = _ok()
    T = np.array([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    if kind == "mask":
        M[0, 4] = 2.0
    elif kind == "reward_nan":
        R[1, 2] = np.nan
    elif kind == "reward_inf_masked":
        R[0, 2] = -np.inf
    elif kind == "reward_masked":
        R[2, 4] = 1e-30
    elif kind == "value_nan":
        V[0, 1] = np.nan
    elif kind == "tid_dec":
        T[1, 4] = 0
    elif kind == "tid_neg":
        T[0, 3:] = -1  # on action tokens (on masked ones any id is fine)
    elif kind == "tid_skip":
        T[0, 3:] = 3
    elif kind == "tid_first":
        T[1, :] += 1
    return R, V, M, T


# The fast paths check the tokens inside the estimator kernels (one pass over the data); every kind
# of problem must still surface as the validator's message, for every such kernel.
_KINDS = [
    "mask",
    "reward_nan",
    "reward_inf_masked",
    "reward_masked",
    "value_nan",
    "tid_dec",
    "tid_neg",
    "tid_skip",
    "tid_first",
]
_USES = {
    "gae": {"values"},
    "vapo": {"values"},
    "mae": {"values", "turns"},
    "turn_gae": {"values", "turns"},
    "reinforce_pp": set(),
}
_FUSED_CASES = [
    (fn, kind)
    for fn, uses in _USES.items()
    for kind in _KINDS
    if (not kind.startswith("tid") or "turns" in uses) and (kind != "value_nan" or "values" in uses)
]


@pytest.mark.parametrize("fn,kind", _FUSED_CASES)
def test_fused_kernel_checks(fn, kind):
    R, V, M, T = _corrupt(kind)
    arg = {"mask": "mask", "value_nan": "values"}.get(kind, "turn_ids" if kind.startswith("tid") else "rewards")
    with pytest.raises(ValueError, match=rf"^{arg}: row \d"):
        if fn == "reinforce_pp":
            A.reinforce_pp(R, M)
        elif "turns" in _USES[fn]:
            getattr(A, fn)(R, V, M, turn_ids=T)
        else:
            getattr(A, fn)(R, V, M)
