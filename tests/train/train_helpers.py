"""Shared by the trainer tests: tiny settings (short episodes, few of them, no SFT), a one-turn
environment that a few iterations can learn, and a three-turn one that rewards every turn."""

from mpo_viz.envs import SUCCESS, TextEnv, available_envs, register_env
from mpo_viz.envs.base import words_of
from mpo_viz.train import Config

TINY = dict(
    env="search",
    difficulty=2,
    episodes=4,
    epochs=1,
    minibatches=2,
    sft_steps=0,
    eval_interval=3,
    eval_episodes=2,
    max_turn_tokens=12,
    max_total_tokens=160,
    rollout_batch_size=4,
    iterations=3,
)


def tiny(**changes) -> Config:
    kw = {**TINY, **changes}
    if (
        kw.get("estimator", "mpo") in ("mpo", "gae", "mae", "turn_gae", "vapo")
        and kw.get("critic", "learned") == "learned"
    ):
        kw.setdefault("critic_warmup_steps", 0)
    return Config(**kw)


class OnePressEnv(TextEnv):
    """One turn: press the button the prompt names (a, b or c); reward 1 if right."""

    name = "onepress"
    obs_role = "tool"
    verbs = ("press",)
    min_difficulty = 1

    def sample_task(self, rng, size):
        return rng.choice("abc")

    def needed_turns(self, task):
        return 1

    def prompt(self, task):
        return f"press {task} ."

    def initial_state(self, task):
        return 0

    def actions(self, task, s):
        return ("press a", "press b", "press c")

    def outcomes(self, task, s, action):
        ok = action == f"press {task}"
        return [(1.0, SUCCESS if ok else "failure", 1.0 if ok else 0.0, True, "right ." if ok else "wrong .")]

    def expert_action(self, task, s):
        return f"press {task}"

    def vocabulary(self):
        return self.base_words() + words_of("press a b c . right wrong")


def register_onepress() -> str:
    if "onepress" not in available_envs():
        register_env("onepress", OnePressEnv)
    return "onepress"


class ThreeStepsEnv(TextEnv):
    """Three turns whatever the policy writes (any reply is read as ``step``): reward 0.5 on each
    turn and 1.5 on the last, so every episode's Monte-Carlo returns read both γ and γ_T."""

    name = "threesteps"
    obs_role = "tool"
    verbs = ("step",)
    min_difficulty = 1

    def sample_task(self, rng, size):
        return "x"

    def needed_turns(self, task):
        return 3

    def prompt(self, task):
        return "step ."

    def initial_state(self, task):
        return 0

    def actions(self, task, s):
        return ("step",)

    def parse(self, task, s, text):
        return "step", ""

    def outcomes(self, task, s, action):
        last = s >= 2
        return [(1.0, SUCCESS if last else s + 1, 1.5 if last else 0.5, last, "done ." if last else "next .")]

    def expert_action(self, task, s):
        return "step"

    def vocabulary(self):
        return self.base_words() + words_of("step x . done next")


def register_threesteps() -> str:
    if "threesteps" not in available_envs():
        register_env("threesteps", ThreeStepsEnv)
    return "threesteps"
