"""The calibration of MAE's within-turn signals with exact values (docs/concepts.md §5), checked by
enumeration on a closed-form toy, and the identities at λ = λ_T = 1.

The toy: one turn of n = 3 binary tokens under a fixed random policy, reward R(a_0, a_1, a_2) at the
end, the exact values V(h) = E[R | h] of every prefix as the critic. Over all 8 action sequences
(weighted by their probability) the expected credit of token t given its history h_t and action
a_t is computed from the estimator's own output; the derivation says it is
``(1 + β·c_t)·A^π(h_t, a_t) + b(h_t)`` with ``b`` a function of the history alone (it does not
bias the gradient). Checking that ``E[credit | h_t, a] − (1 + β·c_t)·A^π(h_t, a)`` is the same for
both actions a at every h_t checks the factor ``c_t``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import mpo_viz.advantages as A
from tests.advantages.adv_batches import random_batch

N = 3
LAM = 0.5
BETA = 0.8


def _toy(seed=0):
    rng = np.random.default_rng(seed)
    p1 = {h: rng.uniform(0.2, 0.8) for n in range(N) for h in itertools.product((0, 1), repeat=n)}  # P(a = 1 | h)
    reward = {s: rng.normal() for s in itertools.product((0, 1), repeat=N)}

    def prob(seq):
        return float(np.prod([p1[seq[:t]] if a else 1 - p1[seq[:t]] for t, a in enumerate(seq)]))

    value = {}  # exact V(h) = E[R | h]
    for n in range(N, -1, -1):
        for h in itertools.product((0, 1), repeat=n):
            value[h] = reward[h] if n == N else p1[h] * value[h + (1,)] + (1 - p1[h]) * value[h + (0,)]
    seqs = list(itertools.product((0, 1), repeat=N))
    R = np.zeros((len(seqs), N))
    R[:, -1] = [reward[s] for s in seqs]
    V = np.array([[value[s[:t]] for t in range(N)] for s in seqs])  # V_t: the value before token t
    return seqs, prob, value, R, V


# c_t by hand for n = 3 (j = 0, 1, 2), λ = 0.5:
#   intra: 1 − (1/3)·Σ_{j'≤j} λ^{j−j'} = [1 − 1/3, 1 − 1.5/3, 0 (the last token)] = [2/3, 1/2, 0]
#   local: the same sums, the last token included: [2/3, 1/2, 1 − 1.75/3 = 5/12]
#   td: 1 − 1/n = 2/3 everywhere; baseline: 0 (its correction is a function of the state only)
C = {"intra": [2 / 3, 1 / 2, 0.0], "local": [2 / 3, 1 / 2, 5 / 12], "td": [2 / 3] * 3, "baseline": [0.0] * 3}


@pytest.mark.parametrize("within", sorted(C))
def test_expected_credit_is_one_plus_beta_c_times_the_advantage(within):
    seqs, prob, value, R, V = _toy()
    adv, _ = A.mae(R, V, np.ones_like(R), lam=LAM, beta=BETA, within=within, turn_lam=0.9)
    credit = {s: adv.numpy()[i] for i, s in enumerate(seqs)}
    for t in range(N):
        for h in itertools.product((0, 1), repeat=t):
            offsets = []
            for a in (0, 1):
                ext = [s for s in seqs if s[: t + 1] == h + (a,)]
                w = np.array([prob(s) for s in ext])
                expected = float(w @ np.array([credit[s][t] for s in ext]) / w.sum())
                true_adv = value[h + (a,)] - value[h]  # A^π(h_t, a_t): the values move, no reward inside the turn
                offsets.append(expected - (1 + BETA * C[within][t]) * true_adv)
            assert offsets[0] == pytest.approx(offsets[1], abs=1e-12), (within, t, h)


def test_the_uncentred_slope_is_what_centring_adds():
    # centred intra over-credits token 0 by β·c_0 = 0.8·2/3 of its own advantage; baseline does not
    seqs, prob, value, R, V = _toy(seed=3)
    w = np.array([prob(s) for s in seqs])
    a0 = np.array([value[s[:1]] - value[()] for s in seqs])  # token 0's true advantage
    for within, factor in (("intra", 1 + BETA * 2 / 3), ("baseline", 1.0)):
        adv, _ = A.mae(R, V, np.ones_like(R), lam=LAM, beta=BETA, within=within)
        x = adv.numpy()[:, 0]
        cov = w @ ((x - w @ x) * (a0 - w @ a0))
        assert cov / (w @ (a0 - w @ a0) ** 2) == pytest.approx(factor, rel=1e-12)  # the population slope


@pytest.mark.parametrize("seed", range(6))
def test_identities_at_lambda_one(seed):
    # γ = γ_T = λ = λ_T = 1, rewards at turn ends: MAE(intra) = GAE(λ = 1) + (V̄_k − V(s_k)) and
    # MAE(baseline, β = 1) = GAE(λ = 1): the centring is all that separates the default from token GAE
    d = random_batch(seed, B=8, reward_kind="turn_end", obs_inside=bool(seed % 2))
    one = dict(lam=1.0, turn_lam=1.0, gamma=1.0, turn_gamma=1.0)
    kw = dict(turn_ids=d["turn_ids"], bootstrap_value=d["bootstrap_value"])
    g, _ = A.gae(d["rewards"], d["values"], d["mask"], lam=1.0, bootstrap_value=d["bootstrap_value"])
    intra, _ = A.mae(d["rewards"], d["values"], d["mask"], within="intra", **one, **kw)
    base, _ = A.mae(d["rewards"], d["values"], d["mask"], within="baseline", **one, **kw)
    np.testing.assert_allclose(base.numpy(), g.numpy(), atol=1e-10)
    v = np.asarray(d["values"], dtype=np.float64)
    shift = np.zeros_like(v)
    for i in range(v.shape[0]):
        act = np.flatnonzero(d["mask"][i] == 1)
        for k in np.unique(d["turn_ids"][i][act]):
            pos = act[d["turn_ids"][i][act] == k]
            shift[i, pos] = v[i, pos].mean() - v[i, pos[0]]  # V̄_k − V(s_k)
    np.testing.assert_allclose(intra.numpy(), g.numpy() + shift, atol=1e-10)
