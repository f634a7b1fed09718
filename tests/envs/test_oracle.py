"""Oracle values: hand-computed cases, Monte Carlo checks (3 standard errors), token-level identities."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpo_viz.envs import (
    AutomationEnv,
    ChatLayout,
    NoisyExpert,
    Oracle,
    SearchEnv,
    build_tokenizer,
    make_env,
)
from mpo_viz.envs.automation import AutomationTask
from mpo_viz.envs.search import SearchTask

# One hop: the question asks for the mentor of ritumi (= ripave); three entities, six actions.
TINY = SearchTask(
    chain=("ritumi", "ripave"),
    relations=("mentor",),
    entities=("ritumi", "ripave", "vesano"),
    facts=(("ritumi", (("mentor", "ripave"),)), ("ripave", (("rival", "vesano"),)), ("vesano", (("owner", "ritumi"),))),
)


def tiny_env():
    env = SearchEnv(difficulty=2, max_turns=2, distractors=1)
    env.reset(seed=0, task=TINY)
    return env


def test_hand_computed_search_values():
    # p = 0.3, |A| = 6: expert action prob 0.75, every other action 0.05; turn limit 2.
    env, ex = tiny_env(), NoisyExpert(0.3, reasoning=False)
    orc = Oracle(env, ex)
    assert orc.policy(0) == pytest.approx(
        {
            "search ritumi": 0.75,
            "search ripave": 0.05,
            "search vesano": 0.05,
            "answer ritumi": 0.05,
            "answer ripave": 0.05,
            "answer vesano": 0.05,
        }
    )
    assert orc.value((1, 1)) == pytest.approx(0.75)  # answer ripave with prob .75
    assert orc.value((1, 0)) == pytest.approx(0.05)  # only a lucky random "answer ripave"
    # V(s0) = .75·.75 + 2·.05·.05 + .05·1 = .6175
    assert orc.value((0, 0)) == pytest.approx(0.6175)
    assert orc.q((0, 0), "search ritumi") == pytest.approx(0.75)
    assert orc.q((0, 0), "answer ripave") == pytest.approx(1.0)
    assert orc.q((0, 0), None) == pytest.approx(0.05)  # malformed: a turn spent
    assert orc.advantage((0, 0), "search ritumi") == pytest.approx(0.75 - 0.6175)


def test_hand_computed_partial_turn():
    env, ex = tiny_env(), NoisyExpert(0.3, reasoning=False)
    lay = ChatLayout(build_tokenizer(env))
    orc = Oracle(env, ex, encode=lay.action)
    toks = lay.action("search ritumi")  # [search, ritumi, <|eot|>]
    to = orc.turn((0, 0), toks, "search ritumi")
    # before "search": V(s0); before "ritumi": posterior over the three searches (.75, .05, .05)
    mid = (0.75 * 0.75 + 0.05 * 0.05 + 0.05 * 0.05) / 0.85
    np.testing.assert_allclose(to.values, [0.6175, mid, 0.75])
    assert to.q == pytest.approx(0.75) and to.on_support
    assert to.decisive.tolist() == [True, True, False]
    np.testing.assert_allclose(to.token_adv, [mid - 0.6175, 0.75 - mid, 0.0])
    assert to.token_adv.sum() == pytest.approx(orc.advantage((0, 0), "search ritumi"))
    # with the reasoning prefix, the filler tokens keep V(s0) and the command tokens decide
    ex2 = NoisyExpert(0.3, reasoning=True)
    orc2 = Oracle(env, ex2, encode=lay.action)
    text = ex2.text(env, TINY, 0, "search ritumi")
    to2 = orc2.turn((0, 0), lay.action(text), "search ritumi")
    n = len(to2.values)
    np.testing.assert_allclose(to2.values[: n - 2], 0.6175)
    np.testing.assert_allclose(to2.values[n - 2 :], [mid, 0.75])
    assert to2.decisive.sum() == 2
    # off the expert's support: a model wrote "search vesano please" — after leaving the support the
    # value is Q of the executed (here malformed) action
    to3 = orc.turn((0, 0), lay.action("search vesano please"), None)
    np.testing.assert_allclose(to3.values, [0.6175, mid, 0.05, 0.05])
    assert not to3.on_support


def test_hand_computed_automation_with_slip():
    p, q = 0.2, 0.1
    task = AutomationTask(keys=("red", "blue", "green"), door="blue", route=("north",))
    env = AutomationEnv(difficulty=3, slip=q, max_turns=3)
    env.reset(seed=0, task=task)
    orc = Oracle(env, NoisyExpert(p))
    e = 1 - p + p / 8
    assert orc.value((2, (1, "blue"))) == pytest.approx(e)  # open door, last turn
    assert orc.value((2, (1, "red"))) == pytest.approx(0.0)  # the early mistake is final
    assert orc.value((1, (0, "blue"))) == pytest.approx(e * (1 - q) * e)
    assert orc.q((1, (0, "blue")), "go north") == pytest.approx((1 - q) * e)


def mc_return(env, ex, task, state_seed, n):
    rets = np.empty(n)
    for i in range(n):
        env.reset(seed=state_seed + i, task=task)
        rng = random.Random(10_000 + state_seed + i)
        total = 0.0
        while not env.done:
            _, text = ex.act(env, rng)
            total += env.step(text)[1]
        rets[i] = total
    return rets


@pytest.mark.parametrize(
    "name,kw", [("search", {}), ("tooluse", {}), ("automation", {"slip": 0.2}), ("search", {"shaping": 0.1})]
)
def test_value_matches_monte_carlo(name, kw):
    env = make_env(name, difficulty=4, **kw)
    ex = NoisyExpert(0.3)
    env.reset(seed=3)
    task = env.task
    v0 = Oracle(env, ex).value(env.state)
    rets = mc_return(env, ex, task, 0, 3000)
    se = rets.std(ddof=1) / np.sqrt(len(rets))
    assert abs(rets.mean() - v0) < 3 * se + 1e-12, (rets.mean(), v0, se)


def test_partial_turn_value_matches_monte_carlo():
    # Condition on the first turn's prefix "<reasoning> search": rejection-sample expert turns with
    # that prefix, play on, average the returns; compare with the oracle's posterior value.
    env = make_env("search", difficulty=3)
    ex = NoisyExpert(0.5)
    lay = ChatLayout(build_tokenizer(env))
    env.reset(seed=5)
    task, s0 = env.task, env.state
    orc = Oracle(env, ex, encode=lay.action)
    text = ex.text(env, task, 0, env.expert_action(task, 0))
    toks = lay.action(text)
    j = len(toks) - 2  # before the entity token: the verb "search" is known
    target = orc.turn(s0, toks, env.expert_action(task, 0)).values[j]
    assert target != pytest.approx(orc.value(s0))
    rets = []
    i = 0
    while len(rets) < 3000:
        env.reset(seed=i, task=task)
        rng = random.Random(50_000 + i)
        i += 1
        _, t0 = ex.act(env, rng)
        if lay.action(t0)[:j] != toks[:j]:
            continue
        total = env.step(t0)[1]
        while not env.done:
            total += env.step(ex.act(env, rng)[1])[1]
        rets.append(total)
    rets = np.asarray(rets)
    se = rets.std(ddof=1) / np.sqrt(len(rets))
    assert abs(rets.mean() - target) < 3 * se, (rets.mean(), target, se)


@pytest.mark.parametrize("name", ["search", "tooluse", "automation"])
def test_mean_v0_equals_mean_reward(name):
    # Over many tasks and episodes, E[V(s_0)] = E[return]: check the paired difference within 3 SE.
    env = make_env(name)
    ex = NoisyExpert(0.25)
    diffs = []
    for seed in range(1000):
        env.reset(seed=seed)
        v0 = Oracle(env, ex).value(env.state)
        rng = random.Random(f"expert-{seed}")  # not the task's random stream
        total = 0.0
        while not env.done:
            total += env.step(ex.act(env, rng)[1])[1]
        diffs.append(total - v0)
    d = np.asarray(diffs)
    assert abs(d.mean()) < 3 * d.std(ddof=1) / np.sqrt(len(d))


def test_noise_free_oracle_is_one_and_noise_one_is_uniform():
    env = make_env("tooluse", difficulty=5)
    env.reset(seed=2)
    assert Oracle(env, NoisyExpert(0.0)).value(env.state) == pytest.approx(1.0)
    pol = Oracle(env, NoisyExpert(1.0)).policy(0)
    np.testing.assert_allclose(list(pol.values()), 1 / 25)
    assert len(pol) == 25


def test_long_horizon_is_cheap():
    env = make_env("automation", difficulty=24, slack=4)
    env.reset(seed=0)
    orc = Oracle(env, NoisyExpert(0.3))
    v = orc.value(env.state)
    assert 0.0 < v < 1.0
    assert len(orc._v) < 2000  # memoized on hashable states


@settings(max_examples=15, deadline=None)
@given(
    name=st.sampled_from(["search", "tooluse", "automation"]),
    seed=st.integers(0, 10_000),
    noise=st.floats(0.05, 1.0),
    walk=st.integers(0, 10_000),
)
def test_partial_turn_values_are_a_martingale(name, seed, noise, walk):
    # Along any prefix of the expert's text, the value is the policy-weighted average of the values
    # one token later: Σ_tok P(tok | prefix) V(prefix + tok) = V(prefix) (and V(∅) = V(s), the end = Q).
    env = make_env(name, difficulty=(3, 5))
    env.reset(seed=seed)
    ex = NoisyExpert(noise)
    lay = ChatLayout(build_tokenizer(env))
    orc = Oracle(env, ex, encode=lay.action)
    rng = random.Random(walk)
    for _ in range(rng.randint(0, 2)):  # move to a later state along a random expert path
        if env.done:
            return
        env.step(ex.act(env, rng)[1])
    if env.done:
        return
    state = env.state
    pi, tx = orc.policy(state[1]), orc.texts(state[1])
    for a in pi:
        to = orc.turn(state, tx[a], a)
        assert to.on_support and to.values[0] == pytest.approx(orc.value(state))
        assert to.q == pytest.approx(orc.q(state, a))
        for j in range(len(tx[a])):
            alive = [b for b in pi if tx[b][:j] == tx[a][:j]]
            w = sum(pi[b] for b in alive)
            nxt = {}
            for b in alive:
                nxt.setdefault(tx[b][j], []).append(b)
            avg = 0.0
            for tok, group in nxt.items():
                p_tok = sum(pi[b] for b in group) / w
                v_tok = sum(pi[b] * orc.q(state, b) for b in group) / sum(pi[b] for b in group)
                avg += p_tok * v_tok
                if tok == tx[a][j]:  # the oracle's own next value is this group's posterior value
                    after = to.values[j + 1] if j + 1 < len(tx[a]) else to.q
                    assert after == pytest.approx(v_tok, abs=1e-12)
            assert avg == pytest.approx(to.values[j], abs=1e-12)
