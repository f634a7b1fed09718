"""An environment without a finite model: any object with ``reset``/``step`` (and ``fork``), wrapped.

The protocol (docs/environments.md, "Your own environment"), all text in and out:

* ``reset(seed) -> str`` — start an episode whose task and dynamics are a function of ``seed``;
  returns the first observation (the task prompt, the first user message). ``reset(seed, task_seed)``
  when the task and the dynamics have seeds of their own (then the G samples of a group share the
  task and not the dynamics; with ``reset(seed)`` alone they share both and differ by the policy's
  sampling only).
* ``step(text) -> (observation, reward, terminated, truncated, info)`` — one assistant turn. The
  environment's own turn limit is ``truncated=True``, whatever it pays then (partial credit at the
  limit) is that turn's reward, ``info["success"]`` (default: terminated with a reward > 0)
  says whether the episode succeeded and ``info["valid"]`` (default True) whether the reply was a
  well-formed action.
* ``fork(seed)`` (for the Monte-Carlo truth, ``mpo-viz truth`` and ``critic="mc"``) — an independent
  copy at the current state that copies the *whole* dynamic state, any RNG included, and draws its
  future from a stream seeded by ``seed``.

Optional attributes: ``name``; ``system_prompt`` (a system message before the prompt); ``obs_role``
(``"tool"``, or ``"user"``); ``vocabulary()`` (every word of its texts, for the word-level tokenizer)
or ``tokenizer_kind = "bytes"`` (no vocabulary: bytes are the default); ``expert(rng) -> str`` (a
scripted reply for the current state: SFT and ``generate --policy expert`` imitate it); ``options``
(its keyword options, as :class:`~mpo_viz.options.Option` s, for ``make_env`` and the flags).

:class:`ProtocolEnv` gives such an object the surface of a :class:`~mpo_viz.envs.base.TextEnv` that the
rollout, replay, branch rollouts and the trainer read: ``messages``, ``done``, ``state`` (the turn
index), ``spawn``, ``fork``, ``option_values``; it has no finite model (``finite_model = False``: no
oracle columns, no noisy expert). The Python and numpy global RNGs that a library may draw from (or
reseed) are the wrapped object's own: saved and restored around each of its calls, so that episodes
played side by side do not share them, replay is exact and ``fork`` copies them.
"""

from __future__ import annotations

import copy
import inspect
import random
from collections.abc import Callable
from typing import Any

from mpo_viz.envs.base import TextEnv, tokenizer_kind_of
from mpo_viz.envs.rng import GlobalRNG

__all__ = ["ProtocolEnv", "as_env", "is_protocol", "play_expert", "PROTOCOL", "EXPERT_TURN_CAP"]

#: what the protocol needs, in words (for errors)
PROTOCOL = (
    "an environment: a TextEnv, or an object with reset(seed) -> str and step(text) -> (observation, reward, "
    "terminated, truncated, info), and fork(seed) for the Monte-Carlo truth"
)
#: the turns an expert episode may take before it is said to loop (an environment that never ends)
EXPERT_TURN_CAP = 1000


def is_protocol(obj) -> bool:
    """Whether ``obj`` has the protocol's ``reset`` and ``step``."""
    return callable(getattr(obj, "reset", None)) and callable(getattr(obj, "step", None))


def as_env(env) -> TextEnv:
    """``env`` as the rollout reads environments: a :class:`~mpo_viz.envs.base.TextEnv` as it is, a
    protocol object wrapped in :class:`ProtocolEnv`; anything else is a ``TypeError`` saying what
    an environment needs."""
    if isinstance(env, TextEnv):
        return env
    if is_protocol(env):
        return ProtocolEnv(env)
    raise TypeError(f"env: expected {PROTOCOL}, found {type(env).__name__}")


def _takes_task_seed(reset) -> bool:
    try:
        params = inspect.signature(reset).parameters
    except (TypeError, ValueError):
        return False
    return "task_seed" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class ProtocolEnv(TextEnv):
    """A protocol object (module docstring) with the surface of a :class:`~mpo_viz.envs.base.TextEnv`.

    ``inner``: the object; ``env_id``: the name it was made under (``make_env``: a registered name, an
    entry point's or ``package.module:factory``), recorded in files so that a fresh process rebuilds
    it; ``factory`` and ``options``: how to build another (:meth:`spawn`; without a factory the
    object is deep-copied); ``declared``: the options the factory declares.
    """

    finite_model = False
    shaping = 0.0

    def __init__(
        self,
        inner,
        *,
        env_id: str | None = None,
        factory: Callable | None = None,
        options: dict | None = None,
        declared: dict | None = None,
    ):
        # none of TextEnv's own options (difficulty, slack, ...) apply: its __init__ is not called
        if not is_protocol(inner):
            raise TypeError(f"env: expected {PROTOCOL}, found {type(inner).__name__}")
        self.inner = inner
        self.name = str(getattr(inner, "name", None) or env_id or type(inner).__name__)
        self.env_id = env_id
        self.obs_role = str(getattr(inner, "obs_role", "tool"))
        self.system_prompt = getattr(inner, "system_prompt", None)
        self.tokenizer_kind = tokenizer_kind_of(inner)
        self.factory = factory
        self.options_given = dict(options or {})
        self.declared = dict(declared or {})
        self.task: Any = None
        self.state: Any = None
        self.turn_limit: Any = getattr(inner, "max_turns", None)
        self.messages: list[dict] = []
        self.done = True
        self.difficulty: Any = None
        self._globals: GlobalRNG | None = None
        self._task_seed = _takes_task_seed(inner.reset)

    # ------------------------------------------------------------------ what it offers
    @property
    def can_fork(self) -> bool:
        return callable(getattr(self.inner, "fork", None))

    @property
    def has_expert(self) -> bool:
        return callable(getattr(self.inner, "expert", None))

    def vocabulary(self) -> list[str]:
        voc = getattr(self.inner, "vocabulary", None)
        return list(voc()) if callable(voc) else []

    def needed_turns(self, task):
        return None

    def option_values(self) -> dict[str, Any]:
        """The options it was made with: the declared defaults, then those given (what ``make_env``
        needs to build an identical one)."""
        out = {k: o.default for k, o in self.declared.items() if o.default is not None and _plain(o.default)}
        out.update(self.options_given)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    # ------------------------------------------------------------------ the wrapped object's own RNGs
    def _own_rng(self) -> GlobalRNG:
        """The wrapped object's global RNG states, to be swapped in around a call (``with``;
        :mod:`mpo_viz.envs.rng`)."""
        if self._globals is None:
            self._globals = GlobalRNG("unseeded")
        return self._globals

    # ------------------------------------------------------------------ episodes
    def make_task(self, seed):
        """The task is its seed (the object draws it in ``reset``)."""
        return int(seed) if seed is not None else None

    def spawn(self) -> ProtocolEnv:
        """Another environment with the same options (the factory's, else a deep copy of the object)."""
        inner = self.factory(**self.options_given) if self.factory is not None else copy.deepcopy(self.inner)
        return ProtocolEnv(
            inner, env_id=self.env_id, factory=self.factory, options=self.options_given, declared=self.declared
        )

    def reset(self, seed: int | None = None, *, task_seed: int | None = None, task: Any = None) -> str:
        """Start an episode: ``inner.reset(seed, task_seed)`` (or ``inner.reset(task_seed)``); the
        task is ``task`` (a task seed), else ``task_seed``, else ``seed``."""
        if seed is None:
            seed = random.Random().randrange(2**31)
        ts = task if task is not None else task_seed if task_seed is not None else seed
        self._globals = GlobalRNG(ts, seed)
        with self._own_rng():
            first = (
                self.inner.reset(seed=int(seed), task_seed=int(ts)) if self._task_seed else self.inner.reset(int(ts))
            )
        if not isinstance(first, str):
            raise TypeError(f"{self.name}.reset: expected the first observation as a str, found {type(first).__name__}")
        self.task = int(ts)
        self.turn_limit = getattr(self.inner, "max_turns", self.turn_limit)  # a library may set it at reset
        self.state = (0, None)
        self.done = False
        self.messages = [{"role": "system", "content": str(self.system_prompt)}] if self.system_prompt else []
        self.messages.append({"role": "user", "content": first})
        return first

    def step(self, action_text: str):
        """One turn: ``inner.step(text)``, checked; ``info`` gains ``action`` (the text), ``turn`` and
        ``success``."""
        if self.done:
            raise RuntimeError("step() after the episode ended: call reset() first")
        with self._own_rng():
            out = self.inner.step(action_text)
        if not (isinstance(out, tuple) and len(out) == 5 and isinstance(out[0], str)):
            found = f"a {len(out)}-tuple" if isinstance(out, tuple) else type(out).__name__
            raise TypeError(
                f"{self.name}.step: expected (observation str, reward, terminated, truncated, info), found {found}"
            )
        obs, r, term, trunc, info = out
        info = dict(info or {})
        t = self.state[0]
        self.state = (t + 1, None)
        term, trunc = bool(term), bool(trunc)
        self.done = term or trunc
        self.messages.append({"role": "assistant", "content": " ".join(action_text.split())})
        self.messages.append({"role": self.obs_role, "content": obs})
        success = info.get("success")
        info.update(
            action=action_text,
            turn=t,
            valid=bool(info.get("valid", True)),
            success=bool(success) if success is not None else bool(term and float(r) > 0),
        )
        return obs, float(r), term, trunc, info

    def fork(self, seed) -> ProtocolEnv:
        """An independent copy at the current state: ``inner.fork(seed)``, the conversation copied and
        the global RNGs it draws from reseeded by ``seed``."""
        if not self.can_fork:
            raise TypeError(
                f"environment {self.name} cannot branch: the Monte-Carlo truth needs fork(seed), a copy "
                "at the current state that copies the whole dynamic state (any RNG included) and reseeds "
                "its future from seed (docs/environments.md)"
            )
        other = copy.copy(self)
        with self._own_rng():
            other.inner = self.inner.fork(seed)
        other.messages = [dict(m) for m in self.messages]
        other._globals = GlobalRNG("fork", seed)
        return other

    def expert_text(self, rng: random.Random) -> str:
        """The wrapped object's expert reply at the current state (``inner.expert(rng)``)."""
        if not self.has_expert:
            raise TypeError(f"environment {self.name} has no expert(rng) to imitate")
        with self._own_rng():
            text = self.inner.expert(rng)
        if not isinstance(text, str):
            raise TypeError(f"{self.name}.expert: expected a reply str, found {type(text).__name__}")
        return text


def _plain(v) -> bool:
    return isinstance(v, (int, float, str, bool, list, tuple, dict))


def play_expert(env: ProtocolEnv, layout, *, seed: int, task_seed: int | None = None) -> dict:
    """One episode of the environment's own expert (``expert(rng)``), laid out by ``layout``: the keys
    of :func:`mpo_viz.envs.generate.run_episode` without the oracle's (no values)."""
    env.reset(seed=seed, task_seed=task_seed)
    rng = random.Random(f"expert-{seed}")
    prompt = layout.prompt(env.messages)
    ids: list[int] = []
    mask: list[int] = []
    turn_ids: list[int] = []
    rewards: list[float] = []
    trunc = success = False
    while not env.done:
        if len(rewards) >= EXPERT_TURN_CAP:
            raise RuntimeError(
                f"environment {env.name}: the expert's episode (seed {seed}) has not ended after "
                f"{EXPERT_TURN_CAP} turns; does its step() ever return terminated or truncated?"
            )
        k = len(rewards)
        toks = layout.action(env.expert_text(rng))
        obs, r, _, trunc, info = env.step(layout.text(toks))
        otoks = layout.observation(env.obs_role, obs, final=env.done)
        ids += toks + otoks
        mask += [1] * len(toks) + [0] * len(otoks)
        turn_ids += [k] * (len(toks) + len(otoks))
        rewards.append(float(r))
        success = bool(info["success"])
    return {
        "prompt_ids": prompt,
        "response_ids": ids,
        "loss_mask": mask,
        "turn_ids": turn_ids,
        "response_tokens": layout.tokens(ids),
        "rewards": rewards,
        "num_turns": len(rewards),
        "stop_reason": "turn_limit" if trunc else "terminated",
        "truncated": bool(trunc),
        "success": success,
        "messages": env.messages,
    }
