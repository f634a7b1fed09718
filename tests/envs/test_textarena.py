"""TextArena's single-player games through the adapter (``textarena:<id>``): exact replay under foreign
global draws, the caller's global RNG untouched, the turn limit read as truncated, the forgiven invalid
move and lenient mode, success, the missing extra's one line, refused games, and the cross-replay of
TextArena's Sokoban and FrozenLake against the exact ``sokoban`` / ``frozenlake`` models."""

from __future__ import annotations

import importlib.util
import random
import sys

import numpy as np
import pytest

from mpo_viz.checks import OptionError
from mpo_viz.envs import from_textarena, make_env
from mpo_viz.envs.frozenlake import FrozenLakeTask
from mpo_viz.envs.sokoban import parse_board, solve
from mpo_viz.envs.textarena import LENIENT_CAP
from tests.envs.global_rng import global_states, same_global
from tests.envs.gym_sokoban import board_of

needs_ta = pytest.mark.skipif(
    importlib.util.find_spec("textarena") is None,
    reason="the textarena extra is not installed (pip install 'mpo_viz[textarena]')",
)
MOVES = ("up", "down", "left", "right")
DELTA = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def play(env, seed, task_seed, replies, disturb=False):
    out = [env.reset(seed=seed, task_seed=task_seed)]
    for k, text in enumerate(replies):
        if env.done:
            break
        if disturb:
            random.random()
            np.random.random(3)
            random.seed(k)
        obs, r, term, trunc, info = env.step(text)
        out.append((obs, r, term, trunc, info["success"], info["valid"]))
    return out


@needs_ta
def test_replay_is_exact_when_other_code_draws_from_the_global_rngs():
    # 2048 spawns its tiles from the global random
    rng = random.Random(1)
    replies = [f"[{rng.choice(MOVES)}]" for _ in range(40)]
    quiet = play(from_textarena("2048-v0"), 3, 8, replies)
    noisy = play(from_textarena("2048-v0"), 3, 8, replies, disturb=True)
    assert len(quiet) > 5 and quiet == noisy
    others = [play(from_textarena("2048-v0"), s, 8, replies) for s in (4, 5, 6)]
    assert all(o[0] == quiet[0] for o in others)  # the task seed's board
    assert any(o[1:] != quiet[1:] for o in others)  # the seed's dynamics


@needs_ta
def test_the_callers_global_rngs_are_untouched_by_make_reset_step_and_fork():
    random.seed(5)
    np.random.seed(6)
    before = global_states()
    env = from_textarena("2048-v0")
    env.reset(seed=1)
    env.step("[left]")
    fork = env.fork(3)
    fork.step("[up]")
    env.step("[down]")
    assert same_global(before, global_states())


@needs_ta
def test_an_invalid_move_is_forgiven_once_and_the_second_ends_it():
    env = from_textarena("Sokoban-v0")
    env.reset(seed=2)
    obs, r, term, trunc, info = env.step("hmm")
    assert (r, term, trunc, info["valid"]) == (0.0, False, False, False) and not env.done
    assert obs.startswith("You attempted an invalid move.")
    obs, r, term, trunc, info = env.step("still thinking")
    assert (term, trunc, info["valid"], info["success"]) == (True, False, False, False) and env.done
    assert obs.startswith("Invalid Move: The submitted move does not follow the correct format.")


@needs_ta
def test_lenient_forgives_every_invalid_move_up_to_its_cap():
    env = from_textarena("GuessTheNumber-v0", lenient=True, max_turns=3)
    env.reset(seed=2)
    ends = [env.step("no number")[2:4] for _ in range(LENIENT_CAP * 3)]
    assert ends == [(False, False)] * (LENIENT_CAP * 3 - 1) + [(False, True)] and env.done
    assert env.option_values() == {"lenient": True, "game_options": {"max_turns": 3}}


@needs_ta
def test_the_turn_limit_is_truncated_and_a_win_is_success():
    from textarena.envs.GuessTheNumber.env import GuessTheNumberEnv

    env = from_textarena("GuessTheNumber-v0", max_turns=2)
    env.reset(seed=4)
    secret = env.inner.game.state.game_state["game_number"]
    wrong = [g for g in range(1, 21) if g != secret][:3]
    # TextArena checks its limit before counting the turn: max_turns + 1 guesses
    assert env.step(f"[{wrong[0]}]")[1:4] == (0.0, False, False)
    assert env.step(f"[{wrong[1]}]")[1:4] == (0.0, False, False)
    obs, r, term, trunc, info = env.step(f"[{wrong[2]}]")
    assert (term, trunc, info["success"]) == (False, True, False) and "The turn limit has been reached." in obs
    # the partial credit is TextArena's own: the bare game on the same guesses
    bare = GuessTheNumberEnv(min_number=1, max_number=20, max_turns=2)
    bare.reset(num_players=1, seed=4)
    assert [bare.step(f"[{g}]")[0] for g in wrong] == [False, False, True]
    assert r == bare.close()[0][0] and 0.0 <= r < 1.0
    env.reset(seed=4)
    obs, r, term, trunc, info = env.step(f"[{secret}]")
    assert (r, term, trunc, info["success"]) == (1.0, True, False, True)


@needs_ta
def test_games_that_cannot_run_here_are_refused_by_name():
    with pytest.raises(OptionError, match=r"Wordle-v0.*needs NLTK's 'words' corpus"):
        make_env("textarena:Wordle-v0")
    with pytest.raises(OptionError, match=r"TwentyQuestions-v0.*LLM game master"):
        make_env("textarena:TwentyQuestions-v0")
    with pytest.raises(OptionError, match=r"expected a single-player TextArena game, found 'TicTacToe-v0'"):
        make_env("textarena:TicTacToe-v0")
    with pytest.raises(OptionError, match=r"expected a TextArena id"):
        make_env("textarena:NoSuchGame-v0")


def test_without_the_extra_the_name_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(OptionError) as err:
        from_textarena("Sokoban-v0")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("env: expected the textarena package for textarena:<id> environments")
    assert msg.endswith("install it with: pip install 'mpo_viz[textarena]'")


# --------------------------------------------------------------------------- cross-replay with the exact models


@needs_ta
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_textarena_sokoban_replays_in_the_exact_model(seed):
    lib = from_textarena("Sokoban-v0", num_boxes=2)
    lib.reset(seed=seed)
    game = lib.inner.game
    task = parse_board(board_of(game))
    exact = make_env("sokoban", boxes=2, shaping=0.0, step_reward=0.0, solve_reward=1.0)
    exact.reset(seed=seed, task=task)
    # the solver's moves, then (odd seeds) random moves that change the state; bumps are TextArena's
    # invalid moves (no turn spent) and a turn in the exact model: left out
    moves = solve(task)
    if seed % 2:
        moves = moves[:-1]
    for m in moves:
        _, r, term, trunc, info = lib.step(f"[{m}]")
        _, r_ex, term_ex, _, info_ex = exact.step(m)
        assert (r, term, info["success"]) == (r_ex, term_ex, info_ex["success"]) and info["valid"]
        if not exact.done:
            assert board_of(game) == exact.task.model().board(*exact.state[1])
    assert lib.done == exact.done == (seed % 2 == 0)
    if seed % 2 == 0:
        assert r == 1.0 and info["success"]


@needs_ta
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_textarena_frozenlake_replays_in_the_exact_model(seed):
    lib = from_textarena("FrozenLake-v0")
    lib.reset(seed=seed)
    st = lib.inner.game.state.game_state
    grid = [["F" if ch == " " else ch for ch in row] for row in st["grid"]]
    grid[0][0] = "S"
    task = FrozenLakeTask.from_rows(grid)
    exact = make_env("frozenlake", slippery=False, max_turns=100)
    exact.reset(seed=seed, task=task)
    rng = random.Random(seed)
    n = task.size
    for k in range(40):
        if exact.done:
            break
        cell = exact.state[1][0]
        r0, c0 = divmod(cell, n)
        # the exact expert's move half the time, else a random move that stays on the lake
        on_lake = [m for m in MOVES if 0 <= r0 + DELTA[m][0] < n and 0 <= c0 + DELTA[m][1] < n]
        m = exact.expert_action(exact.task, exact.state[1]) if k % 2 == 0 else rng.choice(on_lake)
        _, r, term, _, info = lib.step(f"[{m}]")
        _, r_ex, term_ex, _, info_ex = exact.step(m)
        assert (term, info["success"]) == (term_ex, info_ex["success"]), f"turn {k}: {m}"
        if info["success"]:
            assert r == r_ex == 1.0
        if not exact.done:
            assert st["player_pos"] == divmod(exact.state[1][0], n)
    assert lib.done and exact.done


@needs_ta
def test_the_exact_solver_plays_textarenas_sokoban_optimally():
    env = from_textarena("Sokoban-v0", num_boxes=2)
    assert env.has_expert and not from_textarena("FrozenLake-v0").has_expert
    rng = random.Random(0)
    for seed in range(4):
        env.reset(seed=seed)
        optimal = len(solve(parse_board(board_of(env.inner.game))))
        turns = 0
        while not env.done:
            *_, info = env.step(env.expert_text(rng))
            turns += 1
            assert info["valid"]  # the solver never bumps (a bump would be TextArena's invalid move)
        assert (turns, info["success"]) == ((optimal, True) if optimal <= 30 else (31, False))
