"""Environments of your own: a plain reset/step/fork object (no finite model) through the rollout, replay
and branch rollouts; the TextEnv hooks for a library's own turn limit, partial credit at the limit and
terminal states; a difficulty no task meets is an error naming the range, never a hang."""

import json
import time

import numpy as np
import pytest

from mpo_viz import models
from mpo_viz.checks import OptionError
from mpo_viz.envs import (
    NoisyExpert,
    Oracle,
    ProtocolEnv,
    TextEnv,
    as_env,
    build_tokenizer,
    make_env,
)
from mpo_viz.envs.base import words_of
from mpo_viz.envs.generate import GenerateConfig, generate
from mpo_viz.envs.registry import env_options, resolve_env
from mpo_viz.rollout import rollout
from mpo_viz.rollout.replay import ReplayError, replay
from mpo_viz.rollout.truth import mc_truth
from tests.envs.protocol_game import GuessGame, make_game

pytestmark = pytest.mark.usefixtures("one_thread")

SPEC = "tests.envs.protocol_game:make_game"


@pytest.fixture(scope="module")
def played():
    """A fuzzy game (hints hidden by draws from the global RNG) played by a fresh byte-level policy,
    8 episodes decoded side by side."""
    env = make_env(SPEC, fuzz=0.5)
    policy = models.tiny_policy(build_tokenizer(env), "1m", seed=0)
    batch = rollout(policy, env, 8, group_size=2, seed=3, max_turn_tokens=6, batch_size=8, progress=False)
    return env, policy, batch


def test_a_spec_builds_a_protocol_environment_with_its_declared_options():
    env = make_env(SPEC, top=4, max_turns=2)
    assert isinstance(env, ProtocolEnv) and not env.finite_model and env.env_id == SPEC
    assert env.option_values() == {"top": 4, "max_turns": 2, "fuzz": 0.0}
    assert env_options(SPEC) == ["top", "max_turns", "fuzz"]
    with pytest.raises(OptionError, match=r"^top: expected an integer >= 2 and <= 9, found 12$"):
        make_env(SPEC, top=12)
    with pytest.raises(
        OptionError,
        match="expected an option of the tests.envs.protocol_game:make_game environment "
        r"\(top, max_turns, fuzz\), found one it does not take",
    ):
        make_env(SPEC, slack=1)
    with pytest.raises(OptionError, match="module 'tests.envs.nowhere' does not"):
        resolve_env("tests.envs.nowhere:make")
    with pytest.raises(OptionError, match="has no 'nothing'"):
        resolve_env("tests.envs.protocol_game:nothing")


def test_the_game_plays_through_the_wrapper_with_its_own_limit_and_partial_credit():
    env = as_env(GuessGame(top=6, max_turns=2))
    first = env.reset(seed=5, task_seed=7)
    assert env.messages == [{"role": "user", "content": first}] and env.state == (0, None)
    secret = env.inner.secret
    near = secret + 1 if secret < 6 else secret - 1
    far = 1 if secret >= 4 else 6
    obs, r, term, trunc, info = env.step(f"guess {far}")
    assert (r, term, trunc, info["success"]) == (0.0, False, False, False) and not env.done
    obs, r, term, trunc, info = env.step(f"guess {near}")  # the game's own limit: truncated, partial credit
    assert (r, term, trunc, info["success"]) == (0.25, False, True, False) and env.done
    assert obs.endswith("out of turns .")
    env.reset(seed=5, task_seed=7)
    assert env.step(f"guess {secret}")[1:] == (
        1.0,
        True,
        False,
        {"success": True, "action": f"guess {secret}", "turn": 0, "valid": True},
    )


def test_rollout_records_no_oracle_and_replay_is_exact_despite_the_global_rng(played):
    env, policy, batch = played
    assert not batch.has("oracle_values") and not batch.has("values")
    info = json.loads(batch.field("extra_json")[0])
    assert info["env"] == SPEC and info["needed_turns"] is None and info["turn_limit"] == 3
    assert batch.meta["generator"]["env"] == SPEC and batch.meta["generator"]["env_options"]["fuzz"] == 0.5
    assert set(batch.field("stop_reason")) <= {"terminated", "turn_limit"}
    # every observation, hidden hints included, replays token for token (episodes played one at a time now)
    states = replay(batch, policy.layout)
    assert [len(s) for s in states] == list(batch.num_turns)
    hidden = sum("no hint" in m["content"] for x in batch.field("messages_json") for m in json.loads(x))
    assert hidden > 0  # the fuzz did draw from the (per-environment) global RNG


def test_monte_carlo_truth_of_a_protocol_environment(played):
    env, policy, batch = played
    sub = batch.select(traj_ids=batch.traj_ids[:2])
    out = mc_truth(sub, policy, m=2, seed=0, progress=False)
    v = out.field("mc_value")
    assert [len(x) for x in v] == list(sub.num_turns)
    assert all(0.0 <= y <= 1.0 for x in v for y in x)
    # the same seed gives the same continuations (forks are seeded, the global RNG is each fork's own)
    again = mc_truth(sub, policy, m=2, seed=0, progress=False)
    for a, b in zip(v, again.field("mc_value")):
        np.testing.assert_array_equal(a, b)


def test_an_environment_without_fork_cannot_branch_and_says_what_fork_must_copy(played):
    _, policy, batch = played

    class NoFork(GuessGame):
        fork = None

    with pytest.raises(
        ReplayError,
        match=r"needs fork\(seed\), a copy at its current state that copies the whole "
        r"dynamic state \(any RNG included\)",
    ):
        mc_truth(batch, policy, m=2, env=NoFork(fuzz=0.5), progress=False)


def test_replay_mismatch_names_the_trajectory_and_the_turn(played):
    _, policy, batch = played
    with pytest.raises(ReplayError, match=r"trajectory '.*-0': turn 0: the replayed (prompt|observation) differs"):
        replay(batch, policy.layout, env=make_game(top=9))


def test_an_environments_own_expert_generates_without_values():
    b = generate(GenerateConfig(env="tests.envs.protocol_game:make_expert_game", episodes=4, group_size=2, seed=1))
    assert len(b) == 4 and b.meta["values_source"] == "none" and not b.has("values") and not b.has("oracle_values")
    assert (b.outcome_reward == 1.0).all()  # bisection finds 1..6 in 3 guesses
    with pytest.raises(OptionError, match="no finite model .* and no expert.* of its own; play it with a model"):
        generate(GenerateConfig(env=SPEC, episodes=2, group_size=1))


class LimitEnv(TextEnv):
    """One button of three; the library's own rules: one turn, 0.5 at the limit, "won" is the success."""

    name = "limitenv"
    verbs = ("press",)
    min_difficulty = 1
    max_difficulty = 3
    limit_message = None

    def sample_task(self, rng, size):
        return rng.choice("abc")

    def needed_turns(self, task):
        return 1

    def limit_for(self, task):
        return 1

    def truncation_reward(self, task, s):
        return 0.5

    def succeeded(self, task, s):
        return s == "won"

    def prompt(self, task):
        return f"press {task} ."

    def initial_state(self, task):
        return 0

    def actions(self, task, s):
        return ("press a", "press b", "press c")

    def outcomes(self, task, s, action):
        if action == f"press {task}":
            return [(1.0, "won", 1.0, True, "right .")]
        return [(1.0, s, 0.0, False, "nothing .")]

    def expert_action(self, task, s):
        return f"press {task}"

    def vocabulary(self):
        return self.base_words() + words_of("press a b c . right nothing")


def test_turn_limit_truncation_reward_and_success_are_the_environments():
    env = LimitEnv(difficulty=1)
    env.reset(seed=0)
    # hand value: the expert at p = 0.3 presses right w.p. 0.7 + 0.1 = 0.8 (reward 1), else the limit pays 0.5
    assert Oracle(env, NoisyExpert(0.3)).value(env.state) == pytest.approx(0.8 * 1.0 + 0.2 * 0.5)
    wrong = next(a for a in env.actions(env.task, 0) if a != env.expert_action(env.task, 0))
    obs, r, term, trunc, info = env.step(wrong)
    assert (obs, r, term, trunc, info["success"]) == ("nothing .", 0.5, False, True, False)
    env.reset(seed=0)
    assert env.step(env.expert_action(env.task, 0))[4]["success"] is True
    with pytest.raises(OptionError, match=r"^difficulty: expected 1 <= min <= max <= 3 for limitenv, found \(2, 5\)$"):
        LimitEnv(difficulty=(2, 5))


class PickyEnv(LimitEnv):
    """A rejection sampler: tasks need 1 or 2 turns, never more."""

    name = "picky"
    max_difficulty = None

    def sample_task(self, rng, size):
        return self.draw_task(rng, size, lambda r: (r.choice("abc"), r.randint(1, 2)))

    def needed_turns(self, task):
        return task[1]


def test_a_difficulty_no_task_meets_is_an_error_naming_the_range_not_a_hang():
    env = PickyEnv(difficulty=(1, 2))
    assert env.make_task(3)[1] in (1, 2)
    t0 = time.perf_counter()
    with pytest.raises(
        OptionError,
        match=r"^difficulty: expected a difficulty the picky environment can build, found "
        r"\(4, 5\): no task needing [45] turns in 10000 draws$",
    ):
        PickyEnv(difficulty=(4, 5)).make_task(0)
    assert time.perf_counter() - t0 < 10

    class NoneEnv(LimitEnv):
        max_difficulty = None

        def sample_task(self, rng, size):
            return None if size > 2 else "a"

    with pytest.raises(OptionError, match=r"found \(3, 3\): it has no task needing 3 turns"):
        NoneEnv(difficulty=3).make_task(0)
