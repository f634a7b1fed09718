"""Fused whitening (row moments from the estimator kernels, one rewrite) == the readable paths.

Whitening over the action tokens of the batch: ``A ← (A − mean)/sqrt(var_unbiased + 1e-8)``,
masked positions stay 0, variance 0 with fewer than two action tokens. Three implementations are
checked equal: the fast one the estimators use (``_inputs.whiten_``, with the moments the kernels
write on the way or from ``moments_kernel``), the numpy one it replaced
(``_inputs.whiten_reference``) and the Python loop of ``reference._whiten``; and every estimator's
``whiten=True`` output against ``whiten_reference`` applied to its ``whiten=False`` output.
Edge cases: one action token in the batch, rows without action tokens, a batch without any,
constant advantages, values far from 0, float32 and float64; the spans the kernels record for the
rewrite (gae: the runs of action tokens, more of them than recorded; mae: none, the whole row).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mpo_viz.advantages as A
from mpo_viz.advantages import kernels as K
from mpo_viz.advantages import reference as ref
from mpo_viz.advantages._inputs import (
    WHITEN_SPANS,
    merge_moments,
    whiten_,
    whiten_buffers,
    whiten_reference,
)
from tests.advantages.adv_batches import random_batch

DTYPES = [np.float64, np.float32]


def _tol(dtype):
    return {"rtol": 1e-10, "atol": 1e-10} if dtype == np.float64 else {"rtol": 2e-5, "atol": 2e-5}


def _masks():
    """(name, mask) pairs covering the edge cases, shape (4, 7)."""
    rng = np.random.default_rng(0)
    dense = (rng.random((4, 7)) < 0.6).astype(np.float64)
    dense[0] = 0  # a row without action tokens
    dense[2, 3] = 1
    one = np.zeros((4, 7))
    one[2, 5] = 1
    two = np.zeros((4, 7))
    two[1, 0] = two[3, 6] = 1
    return [
        ("dense", dense),
        ("one_token", one),
        ("two_tokens", two),
        ("all_masked", np.zeros((4, 7))),
        ("all_action", np.ones((4, 7))),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,mask", _masks())
@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_whiten_matches_numpy_and_loop(name, mask, offset, dtype):
    rng = np.random.default_rng(1)
    adv = np.where(mask != 0, offset + rng.normal(size=mask.shape), 0.0).astype(dtype)
    m = mask.astype(dtype)
    a = adv.copy()
    fast = whiten_(a, m)
    assert fast is a  # in place
    slow = whiten_reference(adv.copy(), m)
    loop = ref._whiten(adv.astype(np.float64), m)
    assert fast.dtype == dtype
    np.testing.assert_allclose(fast, slow, **_tol(dtype))
    np.testing.assert_allclose(fast, loop, **_tol(dtype))
    assert (fast[m == 0] == 0).all()
    n = int((m != 0).sum())
    if n == 1:  # variance 0: the single token becomes (x − x)/sqrt(1e-8) = 0
        assert (fast == 0).all()
    if n == 0:
        np.testing.assert_array_equal(fast, adv)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zeros_on_action_tokens_and_values_on_masked_ones(dtype):
    # given the estimator kernels' row moments, the rewrite tests the entries themselves (not the
    # mask) in rows whose non-zeros are exactly the action tokens; a row with an action token
    # holding exactly 0 (or -0.0) must read the mask instead. Without kernel moments (any array)
    # a value on a masked position is kept.
    rng = np.random.default_rng(3)
    m = (rng.random((5, 9)) < 0.6).astype(dtype)
    m[:, 0] = 1
    adv = np.where(m != 0, rng.normal(size=m.shape), 0.0).astype(dtype)
    adv[1, 0] = 0.0  # an action token with advantage 0
    adv[2, 0] = -0.0
    w = np.empty((5, 4))
    K.moments_kernel(adv, m, w)
    expect = whiten_reference(adv.copy(), m)
    got = whiten_(adv.copy(), m, w.copy())  # as from a kernel: masked positions are 0
    np.testing.assert_allclose(got, expect, **_tol(dtype))
    assert got[1, 0] != 0 and got[2, 0] != 0  # the zeros were whitened too
    m[3, 4] = 0
    adv[3, 4] = 5.0  # a value on a masked position: kept as it is
    got = whiten_(adv.copy(), m)
    np.testing.assert_allclose(got, whiten_reference(adv.copy(), m), **_tol(dtype))
    assert got[3, 4] == 5.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_advantages_whiten_to_exactly_zero(dtype):
    m = _masks()[0][1].astype(dtype)
    for c in (0.0, 0.1, -7.3, 1e4 / 3):
        adv = (m * c).astype(dtype)
        fast = whiten_(adv.copy(), m)
        assert (fast == 0).all(), c  # shifted sums: mean == c exactly, M2 == 0
        np.testing.assert_allclose(whiten_reference(adv.copy(), m), 0.0, atol=1e-6)


def test_row_moments_and_merge():
    rng = np.random.default_rng(2)
    m = (rng.random((6, 50)) < 0.5).astype(np.float64)
    m[3] = 0
    m[4] = 0
    m[4, 7] = 1  # one action token in the row
    x = np.where(m != 0, 5e3 + rng.normal(size=m.shape), 0.0)
    w = np.empty((6, 4))
    K.moments_kernel(x, m, w)
    for i in range(6):
        xi = x[i][m[i] != 0]
        assert w[i, 0] == xi.size
        if xi.size:
            np.testing.assert_allclose(w[i, 1], xi.mean(), rtol=1e-14)
            np.testing.assert_allclose(w[i, 2], ((xi - xi.mean()) ** 2).sum(), rtol=1e-9, atol=1e-12)
        else:
            assert w[i, 1] == 0 and w[i, 2] == 0
        assert w[i, 3] == (np.flatnonzero(m[i])[-1] + 1 if xi.size else 0)
    n, mean, std = merge_moments(w)
    xa = x[m != 0]
    assert n == xa.size
    np.testing.assert_allclose(mean, xa.mean(), rtol=1e-14)
    np.testing.assert_allclose(std, np.sqrt(xa.var(ddof=1) + 1e-8), rtol=1e-10)
    assert merge_moments(np.zeros((3, 4))) == (0, 0.0, 1.0)
    assert merge_moments(np.zeros((0, 4))) == (0, 0.0, 1.0)


# ----------------------------------------------------------------------------- the estimators


def _run(name, d, whiten, **opts):
    R, V, M, T = d["rewards"], d["values"], d["mask"], d["turn_ids"]
    if name in ("gae", "vapo"):
        return getattr(A, name)(R, V, M, bootstrap_value=d["bootstrap_value"], whiten=whiten, **opts)
    if name in ("turn_gae", "mae"):
        return getattr(A, name)(R, V, M, turn_ids=T, bootstrap_value=d["bootstrap_value"], whiten=whiten, **opts)
    if name == "reinforce_pp":
        return A.reinforce_pp(R, M, whiten=whiten, **opts)
    if name == "gigpo":
        return A.gigpo(
            R,
            M,
            d["group_ids"],
            prompt_ids=d["prompt_ids"],
            response_ids=d["response_ids"],
            turn_ids=T,
            whiten=whiten,
            **opts,
        )
    return getattr(A, name)(R, M, d["group_ids"], whiten=whiten, **opts)


ESTIMATORS = [
    ("gae", {"gamma": 0.9, "lam": 0.95}),
    ("vapo", {}),
    ("turn_gae", {"turn_lam": 0.8}),
    ("mae", {}),
    ("mae", {"within": "local", "critic_target": "turn", "gamma": 0.9}),
    ("reinforce_pp", {"gamma": 0.95}),
    ("grpo", {}),
    ("rloo", {}),
    ("reinforce_pp_baseline", {}),
    ("gigpo", {}),
]


def _edge_batches(dtype):
    """Random batches (with an empty row and a one-token row), one action token, none at all."""
    out = [
        ("random", random_batch(0, B=9, dtype=dtype)),
        ("random_adjacent", random_batch(1, B=7, dtype=dtype, adjacent_turns=True)),
    ]
    d = random_batch(2, B=5, dtype=dtype)
    one = np.zeros_like(d["mask"])
    one[3, 2] = 1
    out.append(("one_token", _remask(d, one)))
    out.append(("all_masked", _remask(d, np.zeros_like(d["mask"]))))
    return out


def _remask(d, mask):
    d = dict(d)
    d["mask"] = mask.astype(d["mask"].dtype)
    d["rewards"] = np.where(mask != 0, d["rewards"], 0).astype(d["rewards"].dtype)
    d["turn_ids"] = np.zeros_like(d["turn_ids"])
    return d


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,opts", ESTIMATORS)
def test_whiten_true_equals_whitening_the_plain_output(name, opts, dtype):
    for kind, d in _edge_batches(dtype):
        if name == "gigpo" and dtype == np.float32:
            continue  # gigpo's edge cases are covered in float64; its whitening is the shared path
        a, g = _run(name, d, False, **opts)
        w, g2 = _run(name, d, True, **opts)
        torch.testing.assert_close(g, g2, rtol=0, atol=0)  # returns come first, untouched
        assert w.dtype == a.dtype
        m = d["mask"]
        expect = whiten_reference(a.numpy().copy(), m)
        np.testing.assert_allclose(w.numpy(), expect, err_msg=f"{name} {kind}", **_tol(dtype))
        assert (w.numpy()[m == 0] == 0).all()
        if int((m != 0).sum()) <= 1:
            assert (w.numpy() == 0).all(), f"{name} {kind}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_whitening_of_constant_advantages_is_exactly_zero(dtype):
    d = random_batch(3, B=8, dtype=dtype)
    act = d["mask"] != 0
    c = 0.3
    # gae with λ = 0 and values 0: A_t = r_t, the reward c on every action token
    R = np.where(act, c, 0.0).astype(dtype)
    Z = np.zeros_like(R)
    a, _ = A.gae(R, Z, d["mask"], lam=0.0)
    np.testing.assert_allclose(a.numpy()[act], c, rtol=1e-7)
    w, _ = A.gae(R, Z, d["mask"], lam=0.0, whiten=True)
    assert (w.numpy() == 0).all()
    # mae with values 0 and λ_T = 0: A^T_k = R_k, the reward c on each turn's last token; u = 0
    last = np.zeros_like(act)
    for i in range(act.shape[0]):
        pos = np.flatnonzero(act[i])
        for k in np.unique(d["turn_ids"][i, pos]):
            last[i, pos[d["turn_ids"][i, pos] == k][-1]] = True
    R2 = np.where(last, c, 0.0).astype(dtype)
    a, _ = A.mae(R2, Z, d["mask"], turn_ids=d["turn_ids"], turn_lam=0.0)
    np.testing.assert_allclose(a.numpy()[act], c, rtol=1e-7)
    w, _ = A.mae(R2, Z, d["mask"], turn_ids=d["turn_ids"], turn_lam=0.0, whiten=True)
    assert (w.numpy() == 0).all()
    w, _ = A.reinforce_pp(np.where(last, 0.0, 0.0).astype(dtype), d["mask"])  # all returns 0
    assert (w.numpy() == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,opts", [("gae", {"lam": 0.9}), ("mae", {}), ("turn_gae", {}), ("vapo", {})])
def test_whitened_estimators_match_reference_loops(name, opts, dtype):
    # end to end against the Python loops (estimator and whitening both independent of the kernels)
    for seed in range(3):
        d = random_batch(10 + seed, B=8, dtype=dtype)
        w, _ = _run(name, d, True, **opts)
        kw = {"bootstrap_value": d["bootstrap_value"], "whiten": True, **opts}
        if name in ("turn_gae", "mae"):
            kw["turn_ids"] = d["turn_ids"]
        slow, _ = getattr(ref, name)(d["rewards"], d["values"], d["mask"], **kw)
        np.testing.assert_allclose(w.numpy(), slow, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_far_from_zero_are_recomputed_exactly(dtype):
    # advantages 1e3 + noise of 1e-3: Σx² − (Σx)²/n cancels in every row, so the kernel asks for an
    # exact recomputation (M2 = −1) and the result still matches the numpy path
    d = random_batch(5, B=8, dtype=dtype)
    act = d["mask"] != 0
    rng = np.random.default_rng(5)
    R = np.where(act, 1e3 + 1e-3 * rng.normal(size=act.shape), 0.0).astype(dtype)
    Z = np.zeros_like(R)
    B = R.shape[0]
    adv, ret = np.empty_like(R), np.empty_like(R)
    w, wsp, wsn = whiten_buffers(B)
    K.gae_kernel(
        R, Z, d["mask"], np.full(B, np.nan), 1.0, np.zeros(B), np.nan, adv, ret, np.empty(B, np.int64), 1, w, wsp, wsn
    )
    assert (w[act.any(1), 2] == -1).all()
    a, _ = A.gae(R, Z, d["mask"], lam=0.0)
    got, _ = A.gae(R, Z, d["mask"], lam=0.0, whiten=True)
    expect = whiten_reference(a.numpy().copy(), d["mask"])
    # float32 inputs: 1e3 + 1e-3·noise keeps ~4 digits of the noise; compare on that scale
    np.testing.assert_allclose(
        got.numpy(), expect, **({"rtol": 1e-7, "atol": 1e-7} if dtype == np.float64 else {"rtol": 1e-4, "atol": 1e-4})
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["gae", "mae", "reinforce_pp"])
def test_estimators_with_exact_zero_advantages(name, dtype):
    # values 0 and sparse rewards: many action tokens get exactly 0 (gae with λ = 0: A = r; mae:
    # u = 0 and A^T_k = R_k with λ_T = 0; reinforce_pp: returns 0 after the last reward), so the
    # rewrite must read the mask in those rows
    d = random_batch(6, B=10, dtype=dtype)
    act = d["mask"] != 0
    rng = np.random.default_rng(6)
    R = np.where(act & (rng.random(act.shape) < 0.3), rng.normal(size=act.shape), 0.0).astype(dtype)
    Z = np.zeros_like(R)
    kw = {"gae": {"lam": 0.0}, "mae": {"turn_lam": 0.0, "turn_ids": d["turn_ids"]}, "reinforce_pp": {}}[name]
    fn = getattr(A, name)
    args = (R, d["mask"]) if name == "reinforce_pp" else (R, Z, d["mask"])
    a, _ = fn(*args, whiten=False, **kw)
    assert (a.numpy()[act] == 0).any()
    w, _ = fn(*args, whiten=True, **kw)
    np.testing.assert_allclose(w.numpy(), whiten_reference(a.numpy().copy(), d["mask"]), **_tol(dtype))
    assert (w.numpy()[~act] == 0).all()


def _runs(mask_row) -> list[tuple[int, int]]:
    """The maximal runs ``[start, end)`` of action tokens of a row (a plain loop)."""
    out, start = [], None
    for t, x in enumerate(list(mask_row) + [0]):
        if x != 0 and start is None:
            start = t
        elif x == 0 and start is not None:
            out.append((start, t))
            start = None
    return out


def _recorded(wsp, wsn, i) -> list[tuple[int, int]]:
    return sorted((int(a), int(b)) for a, b in wsp[i, : wsn[i]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_record_the_spans_that_hold_the_action_tokens(dtype):
    d = random_batch(7, B=12, dtype=dtype, obs_inside=True)
    m, T = d["mask"], d["turn_ids"]
    B, L = m.shape
    adv, ret = np.empty_like(m), np.empty_like(m)
    w, wsp, wsn = whiten_buffers(B)
    K.gae_kernel(
        d["rewards"],
        d["values"],
        m,
        np.full(B, np.nan),
        1.0,
        np.full(B, 0.9),
        np.nan,
        adv,
        ret,
        np.empty(B, np.int64),
        1,
        w,
        wsp,
        wsn,
    )
    for i in range(B):  # gae: the maximal runs of action tokens
        assert _recorded(wsp, wsn, i) == _runs(m[i]), i
    w, wsp, wsn = whiten_buffers(B)
    e = np.full((B, 0), np.nan)
    K.mae_kernel(
        d["rewards"],
        d["values"],
        m,
        T,
        np.full(B, np.nan),
        1.0,
        0.95,
        1.0,
        np.full(B, 0.9),
        1.0,
        0,
        0,
        0,
        adv,
        ret,
        e,
        e,
        e,
        e,
        np.empty(B, np.int64),
        1,
        w,
        wsp,
        wsn,
    )
    assert (wsn == -1).all()  # mae records none: each row is rewritten whole


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["gae", "mae"])
def test_rows_with_more_spans_than_recorded_are_rewritten_whole(name, dtype):
    # row 1 alternates action and observation tokens: 3 x WHITEN_SPANS runs (and turns), more than
    # the kernel records, so that row is rewritten whole; the others through their spans
    L = 6 * WHITEN_SPANS + 5
    m = np.zeros((3, L), dtype=dtype)
    m[0, 3:40] = 1
    m[1, 0 : 6 * WHITEN_SPANS : 2] = 1
    m[2, [5, 6, 9, 20]] = 1
    T = np.zeros((3, L), dtype=np.int64)
    for i in range(3):
        T[i] = np.maximum(np.cumsum(np.diff(np.concatenate([[0], m[i]])) > 0) - 1, 0)
    rng = np.random.default_rng(8)
    R = np.where(m != 0, rng.normal(size=m.shape), 0.0).astype(dtype)
    V = rng.normal(size=m.shape).astype(dtype)
    kw = {"turn_ids": T} if name == "mae" else {"lam": 0.9}
    fn = getattr(A, name)
    a, _ = fn(R, V, m, **kw)
    w, _ = fn(R, V, m, whiten=True, **kw)
    np.testing.assert_allclose(w.numpy(), whiten_reference(a.numpy().copy(), m), **_tol(dtype))
    B = 3
    wst, wsp, wsn = whiten_buffers(B)
    adv, ret = np.empty_like(m), np.empty_like(m)
    K.gae_kernel(
        R, V, m, np.full(B, np.nan), 1.0, np.full(B, 0.9), np.nan, adv, ret, np.empty(B, np.int64), 1, wst, wsp, wsn
    )
    assert wsn.tolist() == [1, -1, 3]


@pytest.mark.parametrize("dtype", DTYPES)
def test_mae_turns_with_masked_tokens_inside_whiten_like_the_plain_output(dtype):
    # masked tokens inside a turn's span (values garbage there): the rewrite through the runs
    # must leave them 0, with and without exact zeros among the action tokens
    for seed, lam_t in ((20, 0.9), (21, 0.0)):
        d = random_batch(seed, B=10, dtype=dtype, obs_inside=True)
        R, V = d["rewards"], d["values"]
        if lam_t == 0.0:  # values 0, sparse rewards: exact zeros on action tokens
            V = np.zeros_like(V)
            R = np.where(np.random.default_rng(seed).random(R.shape) < 0.3, R, 0.0).astype(dtype)
        a, _ = A.mae(R, V, d["mask"], turn_ids=d["turn_ids"], turn_lam=lam_t)
        w, _ = A.mae(R, V, d["mask"], turn_ids=d["turn_ids"], turn_lam=lam_t, whiten=True)
        np.testing.assert_allclose(w.numpy(), whiten_reference(a.numpy().copy(), d["mask"]), **_tol(dtype))
        assert (w.numpy()[d["mask"] == 0] == 0).all()


def _one_token_turns(dtype):
    """Every turn a single action token, observation tokens between turns (and a row of one turn)."""
    rng = np.random.default_rng(7)
    B, L = 6, 24
    M = np.zeros((B, L))
    T = np.zeros((B, L), dtype=np.int64)
    for i in range(B):
        k, t = 0, int(rng.integers(0, 2))
        while t < L and k < (1 if i == 0 else 6):
            M[i, t] = 1
            T[i, t:] = k
            k, t = k + 1, t + 1 + int(rng.integers(1, 4))
    R = np.where(M != 0, rng.normal(size=(B, L)), 0.0)
    V = rng.normal(size=(B, L))
    return {
        "rewards": R.astype(dtype),
        "values": V.astype(dtype),
        "mask": M.astype(dtype),
        "turn_ids": T,
        "bootstrap_value": np.full(B, np.nan),
        "group_ids": np.arange(B) // 2,
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "name,opts", [("gae", {"lam": 0.9}), ("mae", {}), ("mae", {"within": "local"}), ("turn_gae", {})]
)
def test_whitened_advantages_have_mean_0_and_std_1_over_action_tokens(name, opts, dtype):
    # the fused path against the unfused reference (whiten_reference of the plain output) on the edge
    # cases, and the defining property: mean 0 and (unbiased) std 1 over the batch's action tokens
    cases = [("one-token turns", _one_token_turns(dtype)), *_edge_batches(dtype)]
    for kind, d in cases:
        w, _ = _run(name, d, True, **opts)
        a, _ = _run(name, d, False, **opts)
        w = w.numpy()
        np.testing.assert_allclose(w, whiten_reference(a.numpy().copy(), d["mask"]), err_msg=kind, **_tol(dtype))
        act = d["mask"] != 0
        x = w[act].astype(np.float64)
        assert (w[~act] == 0).all(), kind
        if x.size >= 2 and a.numpy()[act].std() > 1e-3:
            assert abs(x.mean()) < 1e-5, kind
            assert abs(x.std(ddof=1) - 1) < 1e-4, kind  # sqrt(var / (var + 1e-8)): 1 within 1e-8 / var
        elif x.size:
            assert (x == 0).all(), kind  # one action token (or constant advantages): 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_rewrite_in_the_calling_thread_equals_the_parallel_one(dtype):
    # the serial rewrite (a busy machine) and the parallel one give the same bits: runs of action
    # tokens (gae), whole rows (mae), rows past the span capacity, rows without action tokens
    from mpo_viz.advantages._inputs import rewrite_in_parallel

    d = random_batch(6, B=12, dtype=dtype)
    rng = np.random.default_rng(6)
    many = np.zeros((3, 4 * WHITEN_SPANS), dtype=dtype)
    many[:, ::3] = 1  # more runs than recorded (86 > 64)
    R = np.where(many != 0, rng.normal(size=many.shape), 0.0).astype(dtype)
    for r, v, m, t in (
        (d["rewards"], d["values"], d["mask"], d["turn_ids"]),
        (R, R * 0, many, np.zeros(many.shape, int)),
    ):
        B = m.shape[0]
        for kernel in ("gae", "mae"):
            adv, ret = np.empty_like(r), np.empty_like(r)
            w, wsp, wsn = whiten_buffers(B)
            if kernel == "gae":
                K.gae_kernel(
                    r,
                    v,
                    m,
                    np.full(B, np.nan),
                    1.0,
                    np.full(B, 0.9),
                    np.nan,
                    adv,
                    ret,
                    np.empty(B, np.int64),
                    1,
                    w,
                    wsp,
                    wsn,
                )
            else:
                z = np.zeros((B, 0))
                K.mae_kernel(
                    r,
                    v,
                    m,
                    t,
                    np.full(B, np.nan),
                    1.0,
                    0.95,
                    1.0,
                    np.full(B, 0.9),
                    1.0,
                    0,
                    0,
                    0,
                    adv,
                    ret,
                    z,
                    z,
                    z,
                    z,
                    np.empty(B, np.int64),
                    1,
                    w,
                    wsp,
                    wsn,
                )
            par = whiten_(adv.copy(), m, w.copy(), (wsp, wsn), parallel=True)
            ser = whiten_(adv.copy(), m, w.copy(), (wsp, wsn), parallel=False)
            np.testing.assert_array_equal(par, ser)
            np.testing.assert_allclose(ser, whiten_reference(adv.copy(), m), **_tol(dtype))
    assert rewrite_in_parallel(0.5) is False  # the kernel got half a thread: the machine is busy
