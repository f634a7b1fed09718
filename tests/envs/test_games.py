"""The three environments: determinism, expert success, malformed actions, a hand-checked KB."""

import random

import pytest

from mpo_viz.envs import (
    FAILURE,
    SUCCESS,
    AutomationEnv,
    NoisyExpert,
    SearchEnv,
    TextEnv,
    ToolUseEnv,
    available_envs,
    make_env,
    register_env,
)
from mpo_viz.envs.automation import AutomationTask
from mpo_viz.envs.search import SearchTask
from mpo_viz.envs.tooluse import ToolTask

ENVS = ["search", "tooluse", "automation"]


def play(env, expert, seed, **reset_kw):
    env.reset(seed=seed, **reset_kw)
    rng = random.Random(seed + 1)
    total = 0.0
    while not env.done:
        _, text = expert.act(env, rng)
        _, r, _, _, info = env.step(text)
        total += r
    return total, info, list(env.messages)


def test_registry():
    assert set(ENVS) <= set(available_envs())
    assert isinstance(make_env("search"), SearchEnv)
    with pytest.raises(ValueError, match="name: expected one of"):
        make_env("chess")
    with pytest.raises(ValueError, match="already registered"):
        register_env("search", SearchEnv)
    with pytest.raises(ValueError, match="difficulty"):
        make_env("automation", difficulty=2)  # automation needs at least 3 turns
    with pytest.raises(ValueError, match="difficulty"):
        make_env("search", difficulty=(5, 3))


@pytest.mark.parametrize("name", ENVS)
def test_deterministic_under_seed(name):
    kw = {"slip": 0.3} if name == "automation" else {}
    a = play(make_env(name, **kw), NoisyExpert(0.4), seed=7)
    b = play(make_env(name, **kw), NoisyExpert(0.4), seed=7)
    c = play(make_env(name, **kw), NoisyExpert(0.4), seed=8)
    assert a == b
    assert a[2] != c[2]


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("difficulty", [3, 6, 12, 24])
def test_expert_always_succeeds_without_noise(name, difficulty):
    kw = {"slip": 0.0} if name == "automation" else {}
    env = make_env(name, difficulty=difficulty, slack=0, **kw)
    for seed in range(5):
        total, info, msgs = play(env, NoisyExpert(0.0), seed)
        assert total == 1.0 and info["success"]
        assert env.state[0] == difficulty == env.needed_turns(env.task)  # exactly the expert's turns
        assert len(msgs) == 2 + 2 * difficulty


@pytest.mark.parametrize("name", ENVS)
def test_malformed_actions_spend_a_turn(name):
    env = make_env(name, difficulty=3, slack=1)
    env.reset(seed=0)
    assert env.turn_limit == 4
    inner = env.state[1]
    for t, text in enumerate(["", "hello there", "search", "calc 1 +", "take", "answer 1 2 3"]):
        if env.done:
            break
        obs, r, term, trunc, info = env.step(text)
        assert not info["valid"] and r == 0.0 and not term
        assert obs.startswith(("invalid action", "no entry"))
        assert env.state == (t + 1, inner)
    assert env.done and trunc and obs.endswith("the turn limit is reached .")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("answer x")


def test_search_hand_checked_kb():
    env = SearchEnv(difficulty=3)
    task = SearchTask(
        chain=("kalo", "mire", "tusa"),
        relations=("mentor", "capital"),
        entities=("kalo", "mire", "tusa", "veno"),
        facts=(
            ("kalo", (("rival", "veno"), ("mentor", "mire"))),
            ("mire", (("capital", "tusa"),)),
            ("tusa", ()),
            ("veno", (("owner", "kalo"),)),
        ),
    )
    assert env.prompt(task).startswith("question : what is the capital of the mentor of kalo ?")
    env.reset(seed=0, task=task)
    assert env.turn_limit == 5 and env.state == (0, 0)
    obs, r, *_ = env.step("i think . search veno")  # a distractor: no progress
    assert obs == "results for veno : the owner of veno is kalo ." and env.state == (1, 0)
    obs, r, *_ = env.step("search kalo")
    assert obs == "results for kalo : the rival of kalo is veno . the mentor of kalo is mire ."
    assert env.state == (2, 1)
    obs, *_ = env.step("search nobody")
    assert obs == "no entry for that entity ." and env.state == (3, 1)
    assert env.expert_action(task, 1) == "search mire"
    assert env.reasoning(task, 1) == "the mentor of kalo is mire . i need the capital of mire ."
    obs, r, term, trunc, info = env.step("answer tusa")
    assert (obs, r, term, trunc, info["success"]) == ("correct .", 1.0, True, False, True)
    assert env.state == (4, SUCCESS)
    env.reset(seed=0, task=task)
    obs, r, term, _, info = env.step("answer mire")
    assert (obs, r, term, info["success"], env.state) == ("wrong answer .", 0.0, True, False, (1, FAILURE))
    assert len(env.actions(task, 0)) == 8


def test_tooluse_hand_checked():
    env = ToolUseEnv(difficulty=3)
    task = ToolTask(values=(7, 12, 36), ops=(("+", 5), ("*", 3)))
    assert env.prompt(task).startswith("task : start with 7 , add 5 , multiply by 3 .")
    env.reset(seed=0, task=task)
    assert env.step("calc 7 * 5")[0] == "result : 35 ." and env.state == (1, 0)  # not the step: no progress
    assert env.step("calc 7 - 9")[0] == "error : result out of range ." and env.state == (2, 0)
    assert env.step("calc 7 + 5")[0] == "result : 12 ." and env.state == (3, 1)
    assert env.step("calc 1000 + 1")[0].startswith("invalid action") and env.state == (4, 1)
    assert env.actions(task, 1)[-1] == "answer 12" and len(env.actions(task, 1)) == 25


def test_automation_hand_checked_and_slip():
    task = AutomationTask(keys=("red", "blue", "green"), door="blue", route=("north",))
    env = AutomationEnv(difficulty=3, slip=0.0)
    env.reset(seed=0, task=task)
    assert env.step("take red key")[0] == "you take the red key ." and env.state == (1, (0, "red"))
    assert env.step("go east")[0] == "you cannot go east from room 0 ." and env.state == (2, (0, "red"))
    assert env.step("go north")[0].startswith("you walk north into room 1") and env.state == (3, (1, "red"))
    obs, r, term, trunc, info = env.step("open door")  # the wrong key chosen in turn 0 decides now
    assert (r, term, info["success"], env.state[1]) == (0.0, True, False, FAILURE)
    # slip probability: the correct move fails about `slip` of the time
    env = AutomationEnv(difficulty=3, slip=0.3, max_turns=50)
    slips = 0
    for seed in range(400):
        env.reset(seed=seed, task=task)
        env.step("go north")
        slips += env.state[1][0] == 0
    assert abs(slips / 400 - 0.3) < 3 * (0.3 * 0.7 / 400) ** 0.5


def test_text_env_hooks_required():
    class Bare(TextEnv):
        name = "bare"

    with pytest.raises(NotImplementedError):
        Bare().reset(seed=0)
