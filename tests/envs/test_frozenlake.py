"""The exact FrozenLake: gymnasium's slip table, rules and text by hand, the expert and the oracle by
hand, against an independent finite-horizon value iteration and against Monte-Carlo returns."""

import random
from collections import Counter

import numpy as np
import pytest

from mpo_viz.checks import OptionError
from mpo_viz.envs import NoisyExpert, Oracle, make_env
from mpo_viz.envs.frozenlake import STANDARD_MAPS, FrozenLakeEnv, FrozenLakeTask, slip_table

# gymnasium's table for is_slippery=True, written out (LEFT 0, DOWN 1, RIGHT 2, UP 3): the intended
# move and the two perpendicular ones, 1/3 each
STANDARD_TABLE = {
    "left": {"up": 1 / 3, "left": 1 / 3, "down": 1 / 3},
    "down": {"left": 1 / 3, "down": 1 / 3, "right": 1 / 3},
    "right": {"down": 1 / 3, "right": 1 / 3, "up": 1 / 3},
    "up": {"right": 1 / 3, "up": 1 / 3, "left": 1 / 3},
}
OPEN = FrozenLakeTask.from_rows(["SFF", "FFF", "FFG"])  # no holes: every move lands on ice


def test_slip_table_is_gymnasiums():
    for a, table in STANDARD_TABLE.items():
        got = {way: p for p, way in slip_table(a, True)}
        assert got == pytest.approx(table)
        assert slip_table(a, False) == [(1.0, a)]
    # and the environment's outcomes from the centre of an open lake follow it
    env = FrozenLakeEnv(size=3, max_turns=5)
    centre = {"left": 3, "down": 7, "right": 5, "up": 1}  # the cell each way leads to from cell 4
    for a, table in STANDARD_TABLE.items():
        outs = env.outcomes(OPEN, (4, 0), a)
        assert {o[1][0]: o[0] for o in outs} == pytest.approx({centre[w]: p for w, p in table.items()})


def test_slips_sampled_by_step_match_the_table():
    env = FrozenLakeEnv(size=3, max_turns=5)
    n = 3000
    ways = Counter()
    for seed in range(n):
        env.reset(seed=seed, task=OPEN)
        env.step("right")  # from the corner: right → cell 1, down → cell 3, up → stays at 0
        ways[env.state[1][0]] += 1
    for cell in (0, 1, 3):  # each 1/3, within 4 standard errors
        assert abs(ways[cell] / n - 1 / 3) < 4 * np.sqrt(2 / 9 / n)


def test_rules_and_text_by_hand():
    env = FrozenLakeEnv(size=4, slippery=False, map="standard")
    env.reset(seed=0)
    assert env.task.rows == STANDARD_MAPS[4] and env.task.solution == 6 and env.turn_limit == 16
    prompt = env.messages[1]["content"]
    assert prompt.endswith("you have 16 turns . the lake :\nP F F F\nF H F H\nF F F H\nH F F G")
    assert "slippery" not in prompt
    assert env.reasoning(env.task, env.state[1]) == (
        "i am at row 0 column 0 . the goal is 6 steps away . 16 turns left . next : down ."
    )
    obs, r, term, trunc, info = env.step("let me think . up")
    assert obs == "you moved up . you stay at the edge . the lake :\nP F F F\nF H F H\nF F F H\nH F F G"
    assert (r, term, env.state) == (0.0, False, (1, (0, 1)))
    obs, *_ = env.step("[s]")  # TextArena's key for down
    assert obs.startswith("you moved down . the lake :\nS F F F\nP H F H")
    obs, r, term, trunc, info = env.step("right")
    assert (obs, r, term, info["success"], env.state[1]) == (
        "you moved right . you fell into a hole !",
        0.0,
        True,
        False,
        "failure",
    )
    env.reset(seed=0)
    for a in ["right", "right", "down", "down", "down"]:
        env.step(a)
    obs, r, term, trunc, info = env.step("right")
    assert (obs, r, term, info["success"]) == ("you moved right . you reached the goal !", 1.0, True, True)
    env.reset(seed=0)
    obs, *_ = env.step("left please")
    assert obs == "invalid action : expected one of left , down , right , up ."
    assert env.state == (1, (0, 1))  # a malformed turn is spent; the expert's clock moves with it
    slippery = FrozenLakeEnv(size=4, map="standard")
    slippery.reset(seed=0)
    assert "the ice is slippery" in slippery.messages[1]["content"]


def test_expert_and_oracle_by_hand():
    # S F / H G, slippery, two turns. From (0,1) with one turn left, down, right and left each reach
    # G with 1/3; the tie goes to the smallest expected distance after the move: right (2/3) over down
    # and left (1). From S, down, right and up each reach (0,1) with 1/3; up (into the edge: no hole)
    # has the smallest expected distance. Noise-free: V(S) = 1/3 · 1/3.
    task = FrozenLakeTask.from_rows(["SF", "HG"])
    env = FrozenLakeEnv(size=4, max_turns=2)
    env.reset(seed=0, task=task)
    assert env.expert_action(task, (1, 1)) == "right" and env.expert_action(task, (0, 0)) == "up"
    assert Oracle(env, NoisyExpert(0.0)).value(env.state) == pytest.approx(1 / 9)
    # p = 0.4: the expert's move 0.7, the others 0.1 each. V(t=1, (0,1)) = (.7 + .1 + .1)/3 = 0.3
    # (up reaches nothing); from S only a move onto (0,1) helps: V(S) = (.7 + .1 + .1) · 1/3 · 0.3 = 0.09
    orc = Oracle(env, NoisyExpert(0.4))
    assert orc.value((1, (1, 1))) == pytest.approx(0.3)
    assert orc.value((1, (0, 1))) == 0.0  # still at S with one turn left
    assert orc.value(env.state) == pytest.approx(0.09)


def best_within(rows, turns) -> float:
    """An independent finite-horizon value iteration: the best probability of reaching G from S
    within ``turns`` moves on a slippery lake (gymnasium's table; written out here, not the env's)."""
    n = len(rows)
    step = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
    w = np.zeros((n, n))
    for _ in range(turns):
        new = np.zeros((n, n))
        for r in range(n):
            for c in range(n):
                if rows[r][c] in "HG":
                    continue
                best = 0.0
                for table in STANDARD_TABLE.values():
                    q = 0.0
                    for way, p in table.items():
                        rr = min(max(r + step[way][0], 0), n - 1)
                        cc = min(max(c + step[way][1], 0), n - 1)
                        q += p * (1.0 if rows[rr][cc] == "G" else 0.0 if rows[rr][cc] == "H" else w[rr, cc])
                    best = max(best, q)
                new[r, c] = best
        w = new
    return float(w[0, 0])


@pytest.mark.parametrize("size, turns", [(4, 16), (4, 100), (8, 40)])
def test_the_noise_free_expert_is_optimal_on_gymnasiums_maps(size, turns):
    env = make_env("frozenlake", size=size, map="standard", max_turns=turns)
    env.reset(seed=0)
    v = Oracle(env, NoisyExpert(0.0)).value(env.state)
    assert v == pytest.approx(best_within(STANDARD_MAPS[size], turns), abs=1e-12)


def test_the_expert_reaches_gymnasiums_stated_optima():
    # gymnasium registers FrozenLake-v1 (100 steps) with "optimum = 0.74" and FrozenLake8x8-v1 (200
    # steps) with "optimum = 0.91"; the noise-free expert's exact values within those limits
    for size, turns, optimum in ((4, 100, 0.74), (8, 200, 0.91)):
        env = make_env("frozenlake", size=size, map="standard", max_turns=turns)
        env.reset(seed=0)
        assert Oracle(env, NoisyExpert(0.0)).value(env.state) == pytest.approx(optimum, abs=0.005)


def test_without_slipping_the_expert_walks_a_shortest_path():
    env = make_env("frozenlake", slippery=False, slack=0)
    for seed in range(20):
        env.reset(seed=seed, task_seed=seed)
        rng = random.Random(0)
        while not env.done:
            *_, info = env.step(NoisyExpert(0.0).act(env, rng)[1])
        assert info["success"] and env.state[0] == env.task.solution


def test_difficulty_filters_lakes_and_an_unreachable_range_is_named():
    env = make_env("frozenlake", size=8, difficulty=(16, 18))
    assert all(16 <= env.make_task(s).solution <= 18 for s in range(20))
    assert make_env("frozenlake", size=8).difficulty == (14, 64)  # default: any lake
    with pytest.raises(OptionError, match=r"difficulty: .*\(30, 40\)"):
        make_env("frozenlake", difficulty=(30, 40)).make_task(0)
    with pytest.raises(OptionError, match=r"difficulty: .*holding 14"):
        make_env("frozenlake", size=8, map="standard", difficulty=(3, 6)).make_task(0)
    with pytest.raises(OptionError, match="shaping"):
        make_env("frozenlake", shaping=0.5)
    with pytest.raises(OptionError, match="size"):
        make_env("frozenlake", size=5, map="standard")
    with pytest.raises(ValueError, match="path"):
        FrozenLakeTask.from_rows(["SH", "HG"])


@pytest.mark.parametrize("kw", [{}, {"size": 8, "slippery": False, "max_turns": 30}])
def test_oracle_matches_monte_carlo_returns_of_the_expert(kw):
    env, expert = make_env("frozenlake", **kw), NoisyExpert(0.3)
    zs = []
    for seed in range(20):
        env.reset(seed=seed)
        rng = random.Random(seed)
        for _ in range(seed % 4):
            if not env.done:
                env.step(expert.act(env, rng)[1])
        if env.done:
            continue
        orc = Oracle(env, expert)
        g = []
        for i in range(300 if not kw else 150):
            e, r = env.fork(f"{seed}-{i}"), random.Random(f"mc-{seed}-{i}")
            total = 0.0
            while not e.done:
                total += e.step(expert.act(e, r)[1])[1]
            g.append(total)
        # returns are 0 or 1: under the oracle's value v their mean has standard error sqrt(v(1 − v)/n)
        v = orc.value(env.state)
        se = np.sqrt(v * (1 - v) / len(g))
        zs.append(0.0 if se == 0 and np.mean(g) == v else (np.mean(g) - v) / se)
    assert len(zs) >= 18 and np.mean(np.abs(zs) < 3) >= 0.94, zs


@pytest.mark.parametrize("options", [{}, {"slippery": False}, {"size": 8}])
def test_every_word_the_lake_writes_is_in_its_vocabulary(options):
    """No text of the environment reaches the policy as the unknown token (the prompt's "commands"
    once did: it follows a placeholder in the template)."""
    from mpo_viz.envs.tokenizer import build_tokenizer

    env = make_env("frozenlake", **options)
    tok = build_tokenizer(env)
    rng = random.Random(0)
    for seed in range(4):
        env.reset(seed=seed)
        while not env.done:
            env.step(NoisyExpert(0.5).act(env, rng)[1])
        for m in env.messages:
            unknown = [w for w in m["content"].split() if tok.unk_token_id in tok.encode(w, add_special_tokens=False)]
            assert not unknown, (m["role"], unknown)
