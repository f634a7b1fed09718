"""The exact Sokoban: rules and text by hand, the solver against an independent breadth-first search,
oracle values by hand and against Monte-Carlo returns of the noisy expert, difficulty errors."""

import random
from collections import deque

import numpy as np
import pytest

from mpo_viz.checks import OptionError
from mpo_viz.envs import ChatLayout, NoisyExpert, Oracle, build_tokenizer, make_env
from mpo_viz.envs.sokoban import SokobanEnv, parse_board, solve

# one box, one corridor: two pushes right solve it
CORRIDOR = """
# # # # # #
# P X _ O #
# # # # # #
"""
# two boxes: right (box onto its target), left, down, right, right = 5 moves; every other order is longer
TWO_BOXES = """
# # # # # # #
# P X O # # #
# _ X _ O # #
# # # # # # #
"""


def env_on(board, **kw):
    env = SokobanEnv(**kw)
    env.reset(seed=0, task=parse_board(board))
    return env


def forward_bfs(task) -> int | None:
    """An independent solver: breadth-first search over (player, boxes) from the start, on the
    printed board's characters and Sokoban's rules as written down (no code shared with the env)."""
    grid = [list(r) for r in task.rows]
    h, w = len(grid), len(grid[0])
    targets = {(r, c) for r in range(h) for c in range(w) if grid[r][c] == "O"}
    start = (divmod(task.player, w), frozenset(divmod(b, w) for b in task.boxes))
    seen, queue = {start}, deque([(start, 0)])
    while queue:
        (p, boxes), k = queue.popleft()
        if boxes == targets:
            return k
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            q = (p[0] + dr, p[1] + dc)
            if grid[q[0]][q[1]] == "#":
                continue
            nb = boxes
            if q in boxes:
                q2 = (q[0] + dr, q[1] + dc)
                if grid[q2[0]][q2[1]] == "#" or q2 in boxes:
                    continue
                nb = (boxes - {q}) | {q2}
            s = (q, nb)
            if s not in seen:
                seen.add(s)
                queue.append((s, k + 1))
    return None


def test_rules_and_text_by_hand():
    env = env_on(CORRIDOR, max_turns=6)
    assert env.turn_limit == 6 and env.task.solution == 2
    assert env.messages[1]["content"].endswith("the board :\n# # # # # #\n# P X _ O #\n# # # # # #")
    assert "within 6 turns" in env.messages[1]["content"]
    assert env.reasoning(env.task, env.state[1]) == "boxes on targets : 0 of 1 . 2 moves to solve . next : right ."
    obs, r, term, trunc, info = env.step("i go up")
    assert (
        obs == "you cannot move up : a wall or a box is in the way . the board :\n# # # # # #\n# P X _ O #\n# # # # # #"
    )
    assert r == pytest.approx(-0.1) and not term and info["valid"]
    obs, r, *_ = env.step("right")
    assert obs.startswith("you pushed a box while you moved right . the board :\n# # # # # #\n# _ P X O #")
    assert r == pytest.approx(-0.1)
    obs, r, *_ = env.step("left")
    assert obs.startswith("you moved left .") and r == pytest.approx(-0.1)
    assert env.reasoning(env.task, env.state[1]) == "boxes on targets : 0 of 1 . 2 moves to solve . next : right ."
    env.step("right")
    obs, r, term, trunc, info = env.step("\\boxed{right}")  # GEM's form is read too
    assert (obs, term, info["success"]) == ("congratulations ! you have solved the sokoban puzzle !", True, True)
    assert r == pytest.approx(-0.1 + 1 + 10)  # the step, a box onto its target, solved
    obs, *_ = env_on(CORRIDOR).step("up please")
    assert obs == "invalid action : expected one of up , down , left , right ."


def test_player_on_a_target_and_boxes_off_targets():
    env = env_on(TWO_BOXES, max_turns=10)
    obs, r, *_ = env.step("[d]")  # TextArena's key for right: the first box onto its target
    assert r == pytest.approx(-0.1 + 1)
    assert "# _ P √ # # #" in obs
    env.step("[left]")
    env.step("down")
    obs, r, *_ = env.step("right")
    assert "# _ P X O # #" in obs
    # pushing the first box off its target again costs the box reward
    env = env_on("# # # # # #\n# P √ _ _ #\n# # # # # #", max_turns=5, boxes=1)
    obs, r, *_ = env.step("right")
    assert r == pytest.approx(-0.1 - 1) and "# _ S X _ #" in obs  # S: the player on a target


def test_solver_is_optimal_on_hand_rooms_and_against_an_independent_bfs():
    assert parse_board(CORRIDOR).solution == 2 and solve(parse_board(CORRIDOR)) == ["right", "right"]
    two = parse_board(TWO_BOXES)
    assert two.solution == 5 and solve(two) == ["right", "left", "down", "right", "right"]
    for boxes, diff in ((1, (1, 12)), (2, (2, 14))):
        env = SokobanEnv(boxes=boxes, difficulty=diff, slack=0)
        for seed in range(40):
            task = env.make_task(seed)
            moves = solve(task)
            assert forward_bfs(task) == task.solution == len(moves) == env.needed_turns(task)
            env.reset(seed=seed, task=task)
            for m in moves:
                *_, info = env.step(m)
            assert info["success"] and env.done


def test_difficulty_is_the_optimal_length_and_an_unreachable_range_is_named():
    env = make_env("sokoban", difficulty=(4, 7), boxes=2)
    lengths = {env.make_task(s).solution for s in range(40)}
    assert lengths <= {4, 5, 6, 7} and len(lengths) == 4
    with pytest.raises(OptionError, match=r"difficulty: .*\(40, 45\)"):
        make_env("sokoban", difficulty=(40, 45)).make_task(0)
    with pytest.raises(OptionError, match="difficulty"):
        make_env("sokoban", difficulty=(1, 3), boxes=2)  # two boxes need two pushes at least
    with pytest.raises(OptionError, match="step_reward"):
        make_env("sokoban", shaping=0.0)  # a step reward would be summed into the outcome
    with pytest.raises(OptionError, match="boxes"):
        make_env("sokoban", boxes=4)


def test_board_text_round_trips():
    env = make_env("sokoban", boxes=2, difficulty=(3, 8))
    for seed in range(10):
        env.reset(seed=seed)
        board = env.messages[1]["content"].split("the board :\n")[1]
        assert parse_board(board) == env.task
    with pytest.raises(ValueError, match="walls all round"):
        parse_board("_ P X O #")
    with pytest.raises(ValueError, match="cannot"):
        parse_board("# # # # #\n# P O X #\n# # # # #")  # the box is against the wall: lost


def test_oracle_by_hand_ragen_reward():
    # turn limit 2, p = 0.4: the expert's move has probability 0.7, each other 0.1
    env = env_on(CORRIDOR, max_turns=2)
    orc = Oracle(env, NoisyExpert(0.4, reasoning=False))
    s0 = env.state
    after = (1, (8, (9,)))  # one push right (cells numbered row * 6 + column)
    # V(t=1, pushed) = .7 * (-.1 + 1 + 10) + .3 * (-.1) = 7.60 (the other moves end at the limit)
    assert orc.value(after) == pytest.approx(7.60)
    assert orc.value((1, s0[1])) == pytest.approx(-0.1)  # a turn lost: one move left cannot solve it
    # V(s0) = .7 * (-.1 + 7.60) + .3 * (-.1 - .1) = 5.19
    assert orc.value(s0) == pytest.approx(5.19)
    assert orc.q(s0, "right") == pytest.approx(7.50) and orc.q(s0, None) == pytest.approx(-0.2)


def test_oracle_by_hand_gem_reward_with_partial_credit():
    # GEM's reward: 1 when solved, the share of boxes on targets at the turn limit; limit 1 turn
    env = env_on(TWO_BOXES, max_turns=1, shaping=0.0, step_reward=0.0, solve_reward=1.0, limit_credit=True)
    orc = Oracle(env, NoisyExpert(0.4, reasoning=False))
    assert orc.q(env.state, "right") == pytest.approx(0.5)  # one box of two on its target at the limit
    assert orc.value(env.state) == pytest.approx(0.7 * 0.5)
    obs, r, term, trunc, _ = env.step("right")
    assert (r, term, trunc) == (pytest.approx(0.5), False, True)


def test_token_level_values_decide_on_the_move():
    env = env_on(CORRIDOR, max_turns=3)
    lay = ChatLayout(build_tokenizer(env))
    ex = NoisyExpert(0.4)
    orc = Oracle(env, ex, encode=lay.action)
    text = ex.text(env, env.task, env.state[1], "right")
    to = orc.turn(env.state, lay.action(text), "right")
    # the thought is filler, the move decides: only the last word before <|eot|> rules actions out
    assert to.decisive.tolist() == [False] * (len(to.values) - 2) + [True, False]
    np.testing.assert_allclose(to.values[:-1], orc.value(env.state))
    assert to.token_adv.sum() == pytest.approx(orc.advantage(env.state, "right"))


def returns_from(env, expert, seed, n):
    """Monte-Carlo returns of the noisy expert from the environment's current state (forks)."""
    out = []
    for i in range(n):
        e = env.fork(f"{seed}-{i}")
        rng = random.Random(f"mc-{seed}-{i}")
        total = 0.0
        while not e.done:
            _, text = expert.act(e, rng)
            total += e.step(text)[1]
        out.append(total)
    return np.asarray(out)


@pytest.mark.parametrize("kw", [{"boxes": 1, "difficulty": (2, 6)}, {"boxes": 2, "difficulty": (3, 8), "slack": 4}])
def test_oracle_matches_monte_carlo_returns_of_the_expert(kw):
    env, expert = make_env("sokoban", **kw), NoisyExpert(0.3)
    zs = []
    for seed in range(30):
        env.reset(seed=seed)
        rng = random.Random(seed)
        for _ in range(seed % 3):  # states a few noisy turns in, too
            if not env.done:
                env.step(expert.act(env, rng)[1])
        if env.done:
            continue
        orc = Oracle(env, expert)
        g = returns_from(env, expert, seed, 300)
        se = g.std(ddof=1) / np.sqrt(len(g))
        if se < 1e-9:  # every return the same (a lost room): exact, up to the sums' rounding
            assert g.mean() == pytest.approx(orc.value(env.state))
            se = np.inf
        zs.append((g.mean() - orc.value(env.state)) / se)
    zs = np.abs(zs)
    assert len(zs) >= 25 and np.mean(zs < 3) >= 0.95, zs
