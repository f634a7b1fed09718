"""The scripted noisy expert: the environment's expert action, or a uniformly random valid action.

Policy at inner state ``s`` with noise support ``A(s)`` (``env.actions``) and expert action ``e(s)``:

    π(a | s) = (1 − p)·[a = e(s)] + p / |A(s)|

(with probability ``p`` the expert draws uniformly from ``A(s)``, which may again be ``e(s)``).
Its text for a turn is a deterministic function of the state and the chosen action: the
environment's state-dependent reasoning (if ``reasoning=True``) followed by the command,
``text(s, a) = reasoning(s) + " " + a``. The reasoning does not depend on the action, so the
tokens that decide the action are the command's own tokens; the others are filler.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mpo_viz.checks import OptionError
from mpo_viz.envs.base import TextEnv

__all__ = ["NoisyExpert"]


@dataclass(frozen=True)
class NoisyExpert:
    """The noisy scripted expert.

    Fields:
        noise: probability ``p`` of acting uniformly at random over the valid actions (0..1).
        reasoning: write the environment's short state-dependent thought before the command.
    """

    noise: float = 0.25
    reasoning: bool = True

    def __post_init__(self):
        if not 0.0 <= self.noise <= 1.0:
            raise OptionError("noise", f"expected 0 <= noise <= 1, found {self.noise}")

    def probs(self, env: TextEnv, task, s) -> dict[str, float]:
        """``{action: π(a | s)}`` over the noise support (insertion order = ``env.actions``)."""
        acts = env.actions(task, s)
        if len(set(acts)) != len(acts):
            raise ValueError(f"{env.name}.actions: expected distinct actions, found duplicates in {acts}")
        e = env.expert_action(task, s)
        if e not in acts:
            raise ValueError(f"{env.name}.expert_action: expected one of actions(), found {e!r}")
        u = self.noise / len(acts)
        d = {a: u for a in acts}
        d[e] += 1.0 - self.noise
        return d

    def text(self, env: TextEnv, task, s, action: str) -> str:
        """The expert's turn text for ``action`` at inner state ``s`` (without the end-of-turn token)."""
        if self.reasoning:
            thought = env.reasoning(task, s)
            if thought:
                return f"{thought} {action}"
        return action

    def act(self, env: TextEnv, rng: random.Random) -> tuple[str, str]:
        """Sample ``(action, text)`` at the environment's current state."""
        task, s = env.task, env.state[1]  # state: (turn, inner state)
        acts = env.actions(task, s)
        a = acts[rng.randrange(len(acts))] if rng.random() < self.noise else env.expert_action(task, s)
        return a, self.text(env, task, s, a)
