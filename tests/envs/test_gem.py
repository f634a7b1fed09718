"""GEM's games through the adapter (``gem:<id>``): exact replay under foreign global draws, the caller's
global RNG untouched, GEM's turn limit read as truncated, its format error and lenient mode, success
from the game's state, the missing extra's one line, refused games, and the cross-replay of GEM's
Sokoban against the exact ``sokoban`` model (same room, same moves: same boards, rewards and ends)."""

from __future__ import annotations

import importlib.util
import random
import sys

import numpy as np
import pytest

from mpo_viz.checks import OptionError
from mpo_viz.envs import from_gem, make_env
from mpo_viz.envs.gem import SUCCESS_RULES
from mpo_viz.envs.sokoban import parse_board, solve
from tests.envs.global_rng import global_states, same_global
from tests.envs.gym_sokoban import board_of

needs_gem = pytest.mark.skipif(
    importlib.util.find_spec("gem") is None, reason="the gem extra is not installed (pip install 'mpo_viz[gem]')"
)
MOVES = ("up", "down", "left", "right")


def boxed(move) -> str:
    return f"I move. \\boxed{{{move}}}"


def play(env, seed, task_seed, replies, disturb=False):
    """The observations, rewards and ends of one episode; ``disturb``: unrelated code draws from (and
    reseeds) the global RNGs before every step."""
    out = [env.reset(seed=seed, task_seed=task_seed)]
    for k, text in enumerate(replies):
        if env.done:
            break
        if disturb:
            random.random()
            np.random.random(7)
            if k % 3 == 0:
                random.seed(k)
                np.random.seed(k)
        obs, r, term, trunc, info = env.step(text)
        out.append((obs, r, term, trunc, info["success"]))
    return out


@needs_gem
@pytest.mark.parametrize("game", ["game:Game2048-v0-easy", "game:Minesweeper-v0-easy"])
def test_replay_is_exact_when_other_code_draws_from_the_global_rngs(game):
    # 2048 spawns its tiles and Minesweeper lays its mines from the global random: the dynamics
    rng = random.Random(0)
    if "2048" in game:
        replies = [boxed(rng.choice(MOVES)) for _ in range(60)]
    else:
        replies = [f"\\boxed{{reveal {rng.randrange(5)} {rng.randrange(5)}}}" for _ in range(30)]
    quiet = play(from_gem(game), 11, 5, replies)
    noisy = play(from_gem(game), 11, 5, replies, disturb=True)
    assert len(quiet) > 3 and quiet == noisy
    # the task is the task seed's, the dynamics the seed's too: same first board, another future
    others = [play(from_gem(game), s, 5, replies) for s in (12, 13, 14)]
    assert all(o[0] == quiet[0] for o in others)
    assert any(o[1:] != quiet[1:] for o in others)


@needs_gem
def test_the_callers_global_rngs_are_untouched_by_make_reset_step_and_fork():
    random.seed(123)
    np.random.seed(456)
    np.random.standard_normal()  # a pending Gaussian in numpy's cache too
    before = global_states()
    env = from_gem("game:Game2048-v0-easy")
    env.reset(seed=3)
    env.step(boxed("left"))
    twin = env.fork(7)
    twin.step(boxed("up"))
    env.step(boxed("down"))
    assert same_global(before, global_states())
    # the fork has the state and draws its own future: the same move twice from the fork point
    a, b = env.fork(9), env.fork(9)
    assert a.step(boxed("right")) == b.step(boxed("right"))
    assert same_global(before, global_states())


@needs_gem
def test_the_prompt_does_not_depend_on_the_callers_global_state():
    # a replay in a fresh process rebuilds the prompt (GEM's example action is a random draw)
    prompts = set()
    for s in range(6):
        random.seed(s)
        np.random.seed(s)
        env = from_gem("game:Sokoban-v0-easy")
        prompts.add((env.system_prompt, env.reset(seed=1)))
    assert len(prompts) == 1


@needs_gem
def test_gems_turn_limit_is_truncated_with_its_partial_credit():
    import gem

    env = from_gem("game:GuessTheNumber-v0-easy", max_turns=2)
    env.reset(seed=4)
    game = env.inner.game
    lo, hi, secret = game.min_number, game.max_number, game.game_number
    wrong = [g for g in range(lo, hi + 1) if g != secret][:2]
    assert env.step(f"\\boxed{{{wrong[0]}}}")[1:4] == (0.0, False, False)
    obs, r, term, trunc, info = env.step(f"\\boxed{{{wrong[1]}}}")
    assert (term, trunc, info["success"]) == (False, True, False) and env.done
    assert r == pytest.approx(1 - abs(wrong[1] - secret) / (hi - lo))  # GEM's credit at the limit
    assert obs.startswith("You have reached the maximum number of turns.")
    # GEM itself says terminated and truncated at once
    bare = gem.make("game:GuessTheNumber-v0-easy", max_turns=2)
    bare.reset(seed=4)
    bare.step(f"\\boxed{{{wrong[0]}}}")
    assert bare.step(f"\\boxed{{{wrong[1]}}}")[2:4] == (True, True)


@needs_gem
def test_success_is_read_from_the_games_state():
    env = from_gem("game:GuessTheNumber-v0-easy")
    env.reset(seed=4)
    secret = env.inner.game.game_number
    obs, r, term, trunc, info = env.step(f"\\boxed{{{secret}}}")
    assert (r, term, trunc, info["success"]) == (1.0, True, False, True)
    assert env.inner.success_rule() == "GuessTheNumberEnv: the secret number is among the guesses"
    assert {"SokobanEnv", "Game2048Env", "MinesweeperEnv", "GuessTheNumberEnv"} <= set(SUCCESS_RULES)


@needs_gem
def test_a_format_error_ends_the_episode_unless_lenient():
    env = from_gem("game:Sokoban-v0-easy")
    env.reset(seed=2)
    obs, r, term, trunc, info = env.step("I think I will go up")
    assert (r, term, trunc, info["format_error"], info["valid"], info["success"]) == (
        -0.1,
        True,
        False,
        True,
        False,
        False,
    )
    assert env.done and obs.startswith("At turn 1, your submitted action is not valid.")
    assert env.option_values()["lenient"] is False

    lenient = from_gem("game:Sokoban-v0-easy", lenient=True)
    assert lenient.option_values()["lenient"] is True and "the turn is spent" in lenient.system_prompt
    first = lenient.reset(seed=2)
    assert first == env.messages[1]["content"]  # the same room
    obs, r, term, trunc, info = lenient.step("I think I will go up")
    assert (r, term, trunc, info["format_error"]) == (-0.1, False, False, True) and not lenient.done
    assert "Reply with one action inside \\boxed{}" in obs and "# # # # # #" in obs  # the board again
    obs, *_ = lenient.step(boxed("up"))
    assert obs.startswith("At turn 2, ")  # the malformed reply spent turn 1


@needs_gem
def test_lenient_format_errors_run_into_gems_turn_limit_as_truncated():
    env = from_gem("game:Sokoban-v0-easy", lenient=True, max_turns=3)
    env.reset(seed=2)
    ends = [env.step("no move")[2:4] for _ in range(3)]
    assert ends == [(False, False), (False, False), (False, True)] and env.done


@needs_gem
def test_games_that_cannot_run_here_are_refused_by_name():
    with pytest.raises(OptionError, match=r"needs NLTK's 'words' corpus"):
        make_env("gem:game:Wordle-v0-easy")
    with pytest.raises(OptionError, match=r"math:GSM8K.*single-turn dataset environment.*Hugging Face hub"):
        make_env("gem:math:GSM8K")
    with pytest.raises(OptionError, match=r"expected a GEM game id \(game:"):
        make_env("gem:game:Chess-v0")
    with pytest.raises(OptionError, match=r"^lenient: expected"):
        from_gem("game:Sokoban-v0-easy", lenient="yes")


def test_without_the_extra_the_name_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gem", None)  # `import gem` raises ImportError
    with pytest.raises(OptionError) as err:
        from_gem("game:Sokoban-v0-easy")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("env: expected the gem package for gem:<id> environments")
    assert msg.endswith("install it with: pip install 'mpo_viz[gem]'")
    with pytest.raises(OptionError, match=r"pip install 'mpo_viz\[gem\]'$"):
        make_env("gem:game:Sokoban-v0-medium")


# --------------------------------------------------------------------------- cross-replay with `sokoban`
GEM_SOKOBAN = {"boxes": 2, "shaping": 0.0, "step_reward": 0.0, "solve_reward": 1.0, "limit_credit": True}


def exact_board(env) -> str | None:
    inner = env.state[1]
    return env.task.model().board(*inner) if isinstance(inner, tuple) else None


@needs_gem
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_gem_sokoban_replays_in_the_exact_model(seed):
    lib = from_gem("game:Sokoban-v0-easy")
    lib.reset(seed=seed)
    game = lib.inner.game
    task = parse_board(board_of(game))
    exact = make_env("sokoban", max_turns=game.max_turns, **GEM_SOKOBAN)
    exact.reset(seed=seed, task=task)
    assert exact_board(exact) == board_of(game)
    rng = random.Random(seed)
    # even seeds: the solver's optimal moves (solved); odd: random moves to GEM's 20-turn limit
    moves = solve(task) if seed % 2 == 0 else [rng.choice(MOVES) for _ in range(game.max_turns)]
    for k, m in enumerate(moves):
        _, r_lib, term_lib, trunc_lib, info_lib = lib.step(boxed(m))
        _, r_ex, term_ex, trunc_ex, info_ex = exact.step(m)
        assert (r_lib, term_lib, trunc_lib, info_lib["success"]) == pytest.approx(
            (r_ex, term_ex, trunc_ex, info_ex["success"])
        ), f"turn {k}: {m}"
        if not exact.done:
            assert exact_board(exact) == board_of(game), f"turn {k}: {m}"
    assert lib.done and exact.done
    if seed % 2 == 0:
        assert info_lib["success"] and r_lib == 1.0 and term_lib
    else:
        assert trunc_lib or term_lib  # random play: the limit (partial credit) or, rarely, solved


# --------------------------------------------------------------------------- the command line
TINY = ["--max-turn-tokens", "4", "--max-total-tokens", "1400"]
TRAIN = [
    "--sft-steps", "0", "--estimator", "grpo", "--loss", "token_ppo", "--group-size", "2", "--episodes", "2",
    "--minibatches", "1", "--epochs", "2", "--eval-episodes", "2", "--rollout-batch-size", "2",
]  # fmt: skip


@needs_gem
@pytest.mark.usefixtures("one_thread")
def test_generate_truth_and_train_take_a_gem_name(tmp_path, capsys):
    import json

    import mpo_viz as mv
    from mpo_viz.cli import main

    env = "gem:game:Sokoban-v0-easy"
    g, t, m, run = tmp_path / "g.parquet", tmp_path / "t.parquet", tmp_path / "m", tmp_path / "run"
    argv = ["generate", "--env", env, "--lenient", "--episodes", "2", "--group-size", "2", *TINY]
    assert main([*argv, "--save-model", str(m), "--out", str(g)]) == 0
    b = mv.load(g)
    assert b.meta["generator"]["env"] == env and b.meta["generator"]["env_options"] == {"lenient": True}
    assert all(json.loads(x)["turn_limit"] == 20 for x in b.field("extra_json"))
    assert (b.num_turns >= 2).all()  # lenient: an untrained model's gibberish does not end it at turn 1
    # the truth replays every episode (exactly, or it raises) and forks every turn state
    assert main(["truth", str(g), "-o", str(t), "--model", str(m), "-M", "2", "-q"]) == 0
    assert [len(v) for v in mv.load(t).field("mc_value")] == list(b.num_turns)
    capsys.readouterr()
    assert main(["train", "--env", env, *TINY, *TRAIN, "--iterations", "1", "--run-dir", str(run)]) == 0
    assert "iter 1/1" in capsys.readouterr().out
    assert json.loads((run / "config.json").read_text())["env"] == env
    # not lenient: the untrained model's first reply is a format error, the end of each episode
    argv = ["generate", "--env", env, "--policy", "model", "--episodes", "2", "--group-size", "2", *TINY]
    assert main([*argv, "--out", str(g)]) == 0
    b = mv.load(g)
    assert (b.num_turns == 1).all() and (b.outcome_reward == -0.1).all()


@needs_gem
def test_the_exact_solver_plays_gems_sokoban_optimally():
    env = from_gem("game:Sokoban-v0-easy")
    assert env.has_expert and not from_gem("game:Game2048-v0-easy").has_expert
    rng = random.Random(0)
    for seed in range(6):
        env.reset(seed=seed)
        optimal = len(solve(parse_board(board_of(env.inner.game))))  # GEM's room read independently
        turns = 0
        while not env.done:
            *_, info = env.step(env.expert_text(rng))
            turns += 1
        limit = env.inner.game.max_turns
        assert (turns, info["success"]) == ((optimal, True) if optimal <= limit else (limit, False))


@needs_gem
def test_generate_plays_the_expert_on_gems_sokoban():
    from mpo_viz.envs.generate import GenerateConfig, generate

    b = generate(GenerateConfig(env="gem:game:Sokoban-v0-easy", episodes=4, group_size=2, seed=1))
    assert len(b) == 4 and not b.has("oracle_values") and b.meta["values_source"] == "none"
    solved = b.outcome_reward == 1.0
    assert solved.sum() >= 3 and (b.num_turns[solved] <= 20).all()
