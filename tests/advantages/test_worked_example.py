"""The worked example of MAE (trajectory A is the one of docs/concepts.md §5), in full: both
trajectories, turn values, turn GAE, token GAE, the intra signal, MAE(intra) and MAE(local); through
the tensor functions (float32 and float64), the reference loops, and compute() on a TrajectoryBatch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mpo_viz.advantages as A
from mpo_viz.advantages import reference as ref
from mpo_viz.data.trajectory import TrajectoryBatch

LAM = dict(lam=0.9, turn_lam=0.9, gamma=1.0, turn_gamma=1.0)
V_A = [0.50, 0.55, 0.60, 0.58, 0.62, 0.80, 0.85]
V_B = [0.40, 0.38, 0.35, 0.20, 0.25, 0.22]
TURNS_A, TURNS_B = [2, 3, 2], [3, 1, 2]

EXPECT = {
    "turn_values": ([0.5, 0.6, 0.8], [0.4, 0.2, 0.25]),
    "turn_gae": ([0.442, 0.38, 0.2], [-0.3575, -0.175, -0.25]),
    "token_gae_A": [0.335299, 0.316998, 0.296665, 0.35185, 0.3465, 0.185, 0.15],
    "intra_u_A": [0.05, 0, 0.016, 0.04, 0, 0.05, 0],
    "mae_intra": (
        [0.467, 0.417, 0.377333, 0.401333, 0.361333, 0.225, 0.175],
        [-0.378833, -0.361833, -0.331833, -0.175, -0.265, -0.235],
    ),
    "mae_local_A": [0.4645, 0.4195, 0.360533, 0.400733, 0.378733, 0.2175, 0.1825],
    # within="baseline", β = 1: A^T_k + (V(s_k) − V_t), not centred (γ = 1, so γ^j = 1).
    # A: u = [.5−.5, .5−.55 | .6−.6, .6−.58, .6−.62 | .8−.8, .8−.85] = [0, −.05 | 0, .02, −.02 | 0, −.05]
    #    A = [.442, .392 | .38, .40, .36 | .2, .15]; the last token: .2 − .05 = 1 − .85 = r − V_t, its own
    #    Monte-Carlo advantage (the V(s_k) of A^T_k cancels at β = 1)
    # B: u = [0, .40−.38, .40−.35 | 0 | 0, .25−.22] = [0, .02, .05 | 0 | 0, .03]
    #    A = [−.3575, −.3375, −.3075 | −.175 | −.25, −.22]
    # turn means are not A^T_k: A's turn 0 has mean .417 ≠ .442
    "mae_baseline": ([0.442, 0.392, 0.38, 0.40, 0.36, 0.2, 0.15], [-0.3575, -0.3375, -0.3075, -0.175, -0.25, -0.22]),
}


def _row(turn_lens, values, reward, obs=2):
    """Turns separated by `obs` observation tokens (whose values are garbage, 9.0)."""
    mask, v = [], []
    it = iter(values)
    for k, n in enumerate(turn_lens):
        mask += [1] * n
        v += [next(it) for _ in range(n)]
        if k < len(turn_lens) - 1:
            mask += [0] * obs
            v += [9.0] * obs
    r = [0.0] * len(mask)
    r[max(i for i, m in enumerate(mask) if m)] = reward
    return r, v, mask


def _tensors(dtype):
    ra, va, ma = _row(TURNS_A, V_A, 1.0)
    rb, vb, mb = _row(TURNS_B, V_B, 0.0, obs=3)
    L = max(len(ma), len(mb)) + 2  # right padding too

    def pad(x):
        return x + [0.0] * (L - len(x))

    R = np.array([pad(ra), pad(rb)], dtype=dtype)
    V = np.array([pad(va), pad(vb)], dtype=dtype)
    M = np.array([pad(ma), pad(mb)], dtype=dtype)
    return R, V, M


def _act(x, M, i):
    x = x.numpy() if isinstance(x, torch.Tensor) else x
    return x[i][M[i] == 1]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_worked_example_tensor_functions(dtype):
    R, V, M = _tensors(dtype)
    tol = dict(atol=6e-7 if dtype == np.float64 else 3e-6, rtol=0)
    out_dtype = torch.float64 if dtype == np.float64 else torch.float32

    tg, tret = A.turn_gae(R, V, M, turn_lam=0.9)
    assert tg.dtype == out_dtype
    for i in range(2):
        per_tok = _act(tg, M, i)
        lens = TURNS_A if i == 0 else TURNS_B
        np.testing.assert_allclose(per_tok, np.repeat(EXPECT["turn_gae"][i], lens), **tol)
        # turn returns G^T_k = A^T_k + V(s_k)
        np.testing.assert_allclose(
            _act(tret, M, i), np.repeat(np.add(EXPECT["turn_gae"][i], EXPECT["turn_values"][i]), lens), **tol
        )

    g, gret = A.gae(R, V, M, gamma=1.0, lam=0.9)
    np.testing.assert_allclose(_act(g, M, 0), EXPECT["token_gae_A"], **tol)
    np.testing.assert_allclose(_act(gret, M, 0), np.add(EXPECT["token_gae_A"], V_A), **tol)

    mi, _ = A.mae(R, V, M, **LAM, within="intra")
    for i in range(2):
        np.testing.assert_allclose(_act(mi, M, i), EXPECT["mae_intra"][i], **tol)
    ml, _ = A.mae(R, V, M, **LAM, within="local")
    np.testing.assert_allclose(_act(ml, M, 0), EXPECT["mae_local_A"], **tol)
    mb, _ = A.mae(R, V, M, **LAM, within="baseline")
    for i in range(2):
        np.testing.assert_allclose(_act(mb, M, i), EXPECT["mae_baseline"][i], **tol)
    assert abs(_act(mb, M, 0)[:2].mean() - EXPECT["turn_gae"][0][0]) > 0.02  # the turn mean is not kept

    # the intra signal itself: centered u = (MAE − turn GAE)/β, and u = 0 at each turn's last token
    centered = _act(mi, M, 0) - _act(tg, M, 0)
    ends = np.cumsum(TURNS_A) - 1
    u = centered - np.repeat(centered[ends], TURNS_A)
    np.testing.assert_allclose(u, EXPECT["intra_u_A"], **tol)

    # the per-turn arrays of mae_with_turns
    _, _, turns = A.mae_with_turns(R, V, M, **LAM)
    for i in range(2):
        np.testing.assert_allclose(turns["value"][i], EXPECT["turn_values"][i], **tol)
        np.testing.assert_allclose(turns["advantage"][i], EXPECT["turn_gae"][i], **tol)
    np.testing.assert_allclose(turns["reward"], [[0, 0, 1], [0, 0, 0]])
    assert turns["nturns"].tolist() == [3, 3]


def test_worked_example_reference_loops():
    R, V, M = _tensors(np.float64)
    tg, _ = ref.turn_gae(R, V, M, turn_lam=0.9)
    np.testing.assert_allclose(_act(tg, M, 1), np.repeat(EXPECT["turn_gae"][1], TURNS_B), atol=6e-7)
    g, _ = ref.gae(R, V, M, lam=0.9)
    np.testing.assert_allclose(_act(g, M, 0), EXPECT["token_gae_A"], atol=6e-7)
    for i in range(2):
        mi, _ = ref.mae(R, V, M, **LAM)
        np.testing.assert_allclose(_act(mi, M, i), EXPECT["mae_intra"][i], atol=6e-7)
    ml, _ = ref.mae(R, V, M, **LAM, within="local")
    np.testing.assert_allclose(_act(ml, M, 0), EXPECT["mae_local_A"], atol=6e-7)
    mb, _ = ref.mae(R, V, M, **LAM, within="baseline")
    for i in range(2):
        np.testing.assert_allclose(_act(mb, M, i), EXPECT["mae_baseline"][i], atol=6e-7)


def test_worked_example_through_compute():
    R, V, M = _tensors(np.float64)
    rows = []
    for i, name in enumerate(["A", "B"]):
        n = int(np.flatnonzero(M[i])[-1]) + 1
        rows.append(
            {
                "traj_id": name,
                "group_id": "g",
                "prompt_ids": [1, 2],
                "response_ids": list(range(100, 100 + n)),
                "loss_mask": M[i, :n].astype(int).tolist(),
                "reward": float(R[i].sum()),
                "values": V[i, :n].tolist(),
            }
        )
    batch = TrajectoryBatch.from_rows(rows)
    res = A.compute(batch, "mpo", lam=0.9)
    assert res.options["turn_lam"] == 0.9 and res.options["lam"] == 0.9 and res.options["within"] == "intra"
    assert res.options["beta"] == 1.0 and res.options["critic_target"] == "mc"
    Mb = batch.mask.numpy()
    for i in range(2):
        np.testing.assert_allclose(_act(res.advantages, Mb, i), EXPECT["mae_intra"][i], atol=3e-6)
    t = res.turns
    assert list(t.columns) == [
        "traj_id",
        "group_id",
        "row",
        "turn",
        "start",
        "end",
        "n_tokens",
        "n_obs_after",
        "reward",
        "value_first",
        "value_mean",
        "value_last",
        "adv_mpo",
        "ret_mpo",
    ]
    assert t["traj_id"].tolist() == ["A"] * 3 + ["B"] * 3
    assert t["n_tokens"].tolist() == TURNS_A + TURNS_B
    np.testing.assert_allclose(t["adv_mpo"], EXPECT["turn_gae"][0] + EXPECT["turn_gae"][1], atol=3e-6)
    np.testing.assert_allclose(t["value_first"], EXPECT["turn_values"][0] + EXPECT["turn_values"][1], atol=3e-6)
    np.testing.assert_allclose(t["reward"], [0, 0, 1, 0, 0, 0])
    np.testing.assert_allclose(t["ret_mpo"], [1, 1, 1, 0, 0, 0])  # the MC return at each turn's first token
    # MC returns (γ = γ_T = 1): the reward-to-go, 1 everywhere in A, 0 in B
    np.testing.assert_allclose(_act(res.returns, Mb, 0), np.ones(7))
    np.testing.assert_allclose(_act(res.returns, Mb, 1), np.zeros(6))
    assert res.wall_time_s > 0 and set(res.timings) == {"inputs", "estimate", "turn_table"}

    tg = A.compute(batch, "turn_gae")
    np.testing.assert_allclose(tg.turns["adv_turn_gae"], EXPECT["turn_gae"][0] + EXPECT["turn_gae"][1], atol=3e-6)
    tok = A.compute(batch, "gae", lam=0.9)
    np.testing.assert_allclose(_act(tok.advantages, Mb, 0), EXPECT["token_gae_A"], atol=3e-6)
    loc = A.compute(batch, "mpo", lam=0.9, within="local")
    np.testing.assert_allclose(_act(loc.advantages, Mb, 0), EXPECT["mae_local_A"], atol=3e-6)
