"""The environment interface: a finite, exactly-known model behind a gym-like text API (docs/environments.md).

Every environment here is a *finite model* that both the game loop and the oracle read, so the
oracle values are exact for the very dynamics the game runs:

* a **task** (immutable, sampled once per episode from a seed: a knowledge base, a calculation, a
  house of rooms) and a per-task **turn limit**;
* a hashable **state** ``(t, s)``: the turn index ``t`` (turns already taken) and the
  environment's inner state ``s`` (search progress, calculator progress, room and key, ...);
* ``outcomes(task, s, action)``: the exact distribution of ``(next inner state, reward, done,
  observation text)`` after a *canonical* action string (``"search velora"``);
* ``actions(task, s)``: the noise support — the small set of valid actions the noisy expert draws
  from when it acts at random;
* ``expert_action(task, s)`` and an optional ``reasoning(task, s)`` (state-dependent text the
  expert writes before its command);
* ``parse(task, s, text)``: free text -> a canonical action, or ``None`` plus an in-game error.

A subclass implements those hooks (plus ``prompt``, ``sample_task``, ``vocabulary``); this base class
turns them into ``reset(seed) -> observation`` and ``step(text) -> (observation, reward, terminated,
truncated, info)``, keeps the conversation as OpenAI-style ``messages``, spends a turn on a
malformed action (never an exception) and truncates at the turn limit. What the limit is, what
truncation is worth and which terminal states count as success are hooks too (``limit_for``,
``truncation_reward``, ``succeeded``, ``limit_message``). ``docs/environments.md`` walks through
writing one; an environment without a finite model (plain reset/step) is wrapped by
:class:`mpo_viz.envs.protocol.ProtocolEnv` instead.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from mpo_viz.checks import OptionError
from mpo_viz.options import Option

__all__ = [
    "Outcome",
    "TextEnv",
    "words_of",
    "parse_difficulty",
    "TURN_LIMIT_MESSAGE",
    "SUCCESS",
    "FAILURE",
    "TOKENIZER_KINDS",
    "DRAW_TRIES",
    "tokenizer_kind_of",
]

TURN_LIMIT_MESSAGE = "the turn limit is reached ."
#: inner states after termination (every environment ends in one of these two)
SUCCESS, FAILURE = "success", "failure"
#: how an environment's texts become tokens (``TextEnv.tokenizer_kind``): a word-level tokenizer over its
#: ``vocabulary()``, or a byte-level one that loses nothing (``mpo_viz.envs.tokenizer.build_tokenizer``)
TOKENIZER_KINDS = ("words", "bytes")
#: the draws :meth:`TextEnv.draw_task` makes before it says that no task meets the difficulty
DRAW_TRIES = 10_000
SYSTEM_PROMPT = "you are an agent . think briefly , then end your reply with exactly one command ."


@dataclass(frozen=True)
class Outcome:
    """One possible result of a turn, with its exact probability.

    ``state`` is the full next state ``(t + 1, inner)``; ``reward`` the reward of this turn;
    ``terminated`` the task ended (success or failure); ``truncated`` the turn limit was reached
    without termination (the episode ends, no further reward).
    """

    prob: float
    state: tuple
    reward: float
    terminated: bool
    truncated: bool
    observation: str


def words_of(*texts: str) -> list[str]:
    """The whitespace-separated words of template strings (``{placeholders}`` dropped), in order."""
    out: list[str] = []
    seen = set()
    for text in texts:
        for w in text.split():
            if "{" in w or w in seen:
                continue
            seen.add(w)
            out.append(w)
    return out


def _check_difficulty(difficulty) -> tuple[int, int]:
    if isinstance(difficulty, (int,)) and not isinstance(difficulty, bool):
        lo = hi = int(difficulty)
    else:
        try:
            lo, hi = (int(x) for x in difficulty)
        except (TypeError, ValueError):
            raise OptionError(
                "difficulty", f"expected an int or a (min, max) pair of expert turns, found {difficulty!r}"
            ) from None
    return lo, hi


def tokenizer_kind_of(env) -> str:
    """``"words"`` or ``"bytes"``: what an environment asks for (its ``tokenizer_kind``; an
    environment without a ``vocabulary`` gets bytes)."""
    kind = getattr(env, "tokenizer_kind", None)
    if kind is None:
        kind = "words" if callable(getattr(env, "vocabulary", None)) else "bytes"
    if kind not in TOKENIZER_KINDS:
        raise ValueError(
            f"tokenizer_kind: expected 'words' or 'bytes', found {kind!r} on {getattr(env, 'name', type(env).__name__)}"
        )
    return kind


def parse_difficulty(text: str) -> int | list[int]:
    """``"4"`` -> 4, ``"3-6"`` -> [3, 6]: the text form of ``difficulty`` (the ``--difficulty`` flags),
    ``ValueError`` saying what was expected."""
    try:
        if "-" in text:
            lo, hi = text.split("-", 1)
            return [int(lo), int(hi)]
        return int(text)
    except ValueError:
        raise ValueError(f"expected N or MIN-MAX (expert turns), found {text!r}") from None


class TextEnv:
    """Base class of the multi-turn text environments (gym habit, text in and out).

    Parameters (keyword-only), declared in :attr:`options` (a subclass declares its own extra
    keyword options there too; :meth:`declared_options` gathers them along the class's bases, and
    ``make_env`` refuses an option that is not declared):
        difficulty: the number of turns the noise-free expert needs, an int or an inclusive
            ``(min, max)`` range sampled per task (default ``(3, 6)``; values of 20 and more work).
        slack: extra turns on top of the expert's need before the turn limit (default 2).
        max_turns: a fixed turn limit instead of ``needed + slack``.
        shaping: reward added on each turn that makes progress (default 0: sparse outcome reward).
        seed: seeds the task and the dynamics when ``reset`` is called without a seed.

    State, after ``reset``: ``task``, ``state`` (``(t, inner)``), ``turn_limit``, ``messages``
    (OpenAI-style dicts), ``done``.
    """

    name = "base"
    #: role of the environment's replies in ``messages`` (and the chat layout's marker).
    obs_role = "tool"
    #: the verbs that start a command; ``parse`` reads the text from the last verb on.
    verbs: tuple[str, ...] = ()
    #: the smallest ``difficulty`` the environment can build.
    min_difficulty = 2
    #: the largest ``difficulty`` the environment can build (None: no bound); a larger one is refused
    #: when the environment is made, naming the range
    max_difficulty: int | None = None
    #: ``"words"``: the word-level tokenizer over :meth:`vocabulary`; ``"bytes"``: a byte-level one
    #: (every text tokenizes, nothing becomes ``[UNK]``; about five times as many tokens)
    tokenizer_kind = "words"
    #: the text appended to the observation of a turn that reaches the turn limit (None: nothing)
    limit_message: str | None = TURN_LIMIT_MESSAGE
    #: whether ``actions``/``outcomes``/``expert_action`` describe a finite model (the oracle and the
    #: noisy expert need one; :class:`~mpo_viz.envs.protocol.ProtocolEnv` has none)
    finite_model = True
    #: the name the environment was made under (``make_env`` sets it: a registered name, an entry
    #: point's or ``package.module:factory``); what files record so that a fresh process rebuilds it
    env_id: str | None = None
    #: the keyword options of ``__init__`` this class adds (the base's: difficulty, slack,
    #: max_turns, shaping, seed); see :meth:`declared_options`
    options: tuple[Option, ...] = (
        Option("difficulty", (3, 6), kind="any", doc="expert turns per task: an int or an inclusive (min, max)"),
        Option("slack", 2, kind="int", low=0, doc="extra turns on top of the expert's need before the turn limit"),
        Option("max_turns", None, kind="int", low=1, optional=True, doc="a fixed turn limit instead of needed + slack"),
        Option("shaping", 0.0, doc="reward added on each turn that makes progress (0: sparse outcome reward)"),
        Option("seed", None, kind="any", doc="seeds the task and the dynamics when reset is called without a seed"),
    )

    @classmethod
    def declared_options(cls) -> dict[str, Option]:
        """Every keyword option of this environment, by name: the :attr:`options` of the class, then
        of its bases."""
        out: dict[str, Option] = {}
        for c in cls.__mro__:
            for o in c.__dict__.get("options", ()):
                out.setdefault(o.name, o)
        return out

    def __init__(
        self,
        *,
        difficulty=(3, 6),
        slack: int = 2,
        max_turns: int | None = None,
        shaping: float = 0.0,
        seed: int | None = None,
    ):
        lo, hi = _check_difficulty(difficulty)
        top = self.max_difficulty
        if lo < self.min_difficulty or hi < lo or (top is not None and hi > top):
            upper = f" <= {top}" if top is not None else ""
            raise OptionError(
                "difficulty", f"expected {self.min_difficulty} <= min <= max{upper} for {self.name}, found ({lo}, {hi})"
            )
        opts = TextEnv.declared_options()
        opts["slack"].check(slack)
        opts["max_turns"].check(max_turns)
        self.difficulty = (lo, hi)
        self.slack = int(slack)
        self.max_turns = max_turns
        self.shaping = float(shaping)
        self.seed = seed
        self.task: Any = None
        self.state: Any = None  # (turn, inner state): hashable
        self.turn_limit = 0
        self.messages: list[dict] = []
        self.done = True
        self._rng = random.Random(seed)

    # ------------------------------------------------------------------ hooks for subclasses
    def sample_task(self, rng: random.Random, size: int) -> Any:
        """A new immutable task whose noise-free expert solution takes exactly ``size`` turns (None:
        there is none; :meth:`make_task` then says so). A sampler that draws tasks until one fits
        uses :meth:`draw_task`, which stops."""
        raise NotImplementedError

    def draw_task(self, rng: random.Random, size: int, draw, *, tries: int = DRAW_TRIES) -> Any:
        """Rejection sampling with a bound: ``draw(rng)`` until a task whose :meth:`needed_turns` is
        ``size``; after ``tries`` draws an :class:`~mpo_viz.checks.OptionError` naming the difficulty
        range (never a loop without end)."""
        for _ in range(tries):
            task = draw(rng)
            if self.needed_turns(task) == size:
                return task
        lo, hi = self.difficulty
        raise OptionError(
            "difficulty",
            f"expected a difficulty the {self.name} environment can build, found "
            f"({lo}, {hi}): no task needing {size} turns in {tries} draws",
        )

    def needed_turns(self, task) -> int:
        """Turns the noise-free expert needs on ``task``."""
        raise NotImplementedError

    def prompt(self, task) -> str:
        """The task description (the first user message)."""
        raise NotImplementedError

    def initial_state(self, task) -> Hashable:
        """The inner state at the start (hashable)."""
        raise NotImplementedError

    def actions(self, task, s) -> tuple[str, ...]:
        """The noise support: canonical valid actions, in a fixed order, distinct."""
        raise NotImplementedError

    def outcomes(self, task, s, action: str) -> list[tuple[float, Hashable, float, bool, str]]:
        """``[(prob, next_inner, reward, done, observation), ...]`` for a canonical action."""
        raise NotImplementedError

    def expert_action(self, task, s) -> str:
        """The scripted expert's action (one of ``actions(task, s)``)."""
        raise NotImplementedError

    def reasoning(self, task, s) -> str:
        """The expert's short thought before its command (state-dependent; '' for none)."""
        return ""

    def parse(self, task, s, text: str) -> tuple[str | None, str]:
        """Free text -> ``(canonical action, "")`` or ``(None, error observation)``.

        Default: lower-case, read from the last verb of ``self.verbs``, and accept the command if it
        is one of ``self.accepts(task, s)`` (by default ``actions(task, s)``).
        """
        words = self.command_words(text)
        if words is None:
            return None, self.invalid_message(task, s, "no command found")
        cmd = " ".join(words)
        if cmd in self.accepts(task, s):
            return cmd, ""
        return None, self.invalid_message(task, s, "unknown command")

    def command_words(self, text: str) -> list[str] | None:
        """The lower-cased words of ``text`` from its last verb of ``self.verbs`` on (what comes before
        is reasoning), or None when no verb occurs."""
        toks = text.lower().split()
        starts = [i for i, w in enumerate(toks) if w in self.verbs]
        return toks[starts[-1] :] if starts else None

    def accepts(self, task, s) -> Sequence[str]:
        """Commands ``parse`` accepts (default: the noise support)."""
        return self.actions(task, s)

    def invalid_message(self, task, s, reason: str) -> str:
        return f"invalid action : {reason} ."

    def vocabulary(self) -> list[str]:
        """Every word any prompt, observation or expert turn of this environment can contain."""
        raise NotImplementedError

    def truncation_reward(self, task, s) -> float:
        """The reward added on the turn that reaches the turn limit from inner state ``s`` (partial
        credit at the limit; default 0). The oracle sums it like any reward."""
        return 0.0

    def succeeded(self, task, s) -> bool:
        """Whether the terminal inner state ``s`` is a success (``info["success"]``; default
        ``s == SUCCESS``)."""
        return s == SUCCESS

    # ------------------------------------------------------------------ the model, full states
    def limit_for(self, task) -> int:
        """The turn limit of ``task``: ``max_turns``, else the expert's need plus ``slack``; override it
        for a limit of your own (a library's)."""
        return self.max_turns if self.max_turns is not None else self.needed_turns(task) + self.slack

    def transitions(self, task, state, action: str | None, error: str = "") -> list[Outcome]:
        """Exact outcomes of one turn from the full state ``(t, inner)``.

        ``action=None`` is a malformed action: the turn is spent, nothing else changes, and the
        observation is ``error``. Reaching the turn limit without termination truncates: the turn's
        reward gains :meth:`truncation_reward` and its observation :attr:`limit_message`.
        """
        t, s = state
        limit = self.limit_for(task)
        raw = [(1.0, s, 0.0, False, error)] if action is None else self.outcomes(task, s, action)
        res = []
        for p, s2, r, done, obs in raw:
            trunc = (not done) and t + 1 >= limit
            if trunc:
                r = float(r) + float(self.truncation_reward(task, s2))
                if self.limit_message:
                    obs = f"{obs} {self.limit_message}"
            res.append(Outcome(float(p), (t + 1, s2), float(r), bool(done), trunc, obs))
        return res

    def full_initial_state(self, task):
        return (0, self.initial_state(task))

    # ------------------------------------------------------------------ gym-like API
    def make_task(self, seed: int | None):
        """The task of ``seed`` (its difficulty drawn from the range, then :meth:`sample_task`); a
        difficulty the environment cannot build is an :class:`~mpo_viz.checks.OptionError` naming
        the range."""
        rng = random.Random(seed)
        lo, hi = self.difficulty
        size = rng.randint(lo, hi)
        task = self.sample_task(rng, size)
        if task is None:
            raise OptionError(
                "difficulty",
                f"expected a difficulty the {self.name} environment can build, found "
                f"({lo}, {hi}): it has no task needing {size} turns",
            )
        return task

    def spawn(self) -> TextEnv:
        """A new environment with this one's options, for one more episode (reset it before use):
        a deep copy of the options, not of the episode this one last played (its task, state and
        messages are left out: copying them cost ~30 ms per episode after a trainer's SFT)."""
        blank = copy.copy(self)
        blank.task, blank.state, blank.messages = None, None, []
        return copy.deepcopy(blank)

    def reset(self, seed: int | None = None, *, task_seed: int | None = None, task: Any = None) -> str:
        """Start an episode; returns the first observation (the task prompt).

        ``seed`` seeds the dynamics (slips) and, unless ``task_seed`` or ``task`` is given, the task.
        Group sampling: the same ``task_seed`` with different ``seed``\\ s.
        """
        if seed is None:
            seed = self._rng.randrange(2**63)
        # the dynamics draw from their own stream, so that the same seed does not correlate the
        # task's features with the slips of the episode
        self._rng = random.Random(f"dynamics-{seed}")
        if task is None:
            task = self.make_task(seed if task_seed is None else task_seed)
        self.task = task
        self.turn_limit = self.limit_for(task)
        self.state = self.full_initial_state(task)
        self.done = False
        obs = self.prompt(task)
        self.messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": obs},
        ]
        return obs

    def step(self, action_text: str):
        """Play one turn: ``(observation, reward, terminated, truncated, info)``.

        A malformed action is answered in-game (an error observation, the turn spent). Calling
        ``step`` after the episode ended is a usage error (``RuntimeError``).
        """
        if self.done:
            raise RuntimeError("step() after the episode ended: call reset() first")
        action, error = self.parse(self.task, self.state[1], action_text)
        outs = self.transitions(self.task, self.state, action, error)
        u = self._rng.random()
        acc = 0.0
        out = outs[-1]
        for o in outs:
            acc += o.prob
            if u < acc:
                out = o
                break
        prev = self.state
        self.state = out.state
        self.done = out.terminated or out.truncated
        self.messages.append({"role": "assistant", "content": " ".join(action_text.split())})
        self.messages.append({"role": self.obs_role, "content": out.observation})
        info = {
            "action": action,
            "valid": action is not None,
            "turn": prev[0],
            "prev_state": prev,
            "success": bool(out.terminated and self.succeeded(self.task, out.state[1])),
        }
        return out.observation, out.reward, out.terminated, out.truncated, info

    # ------------------------------------------------------------------ replay and branching
    def option_values(self) -> dict[str, Any]:
        """The keyword options this environment was built with, by name (every declared option;
        ``make_env(env.name, **env.option_values())`` builds an identical one). Recorded in the files
        the toolkit writes so that their episodes can be replayed."""
        out = {}
        for name in self.declared_options():
            v = getattr(self, name)
            out[name] = list(v) if isinstance(v, tuple) else v
        return out

    def fork(self, seed) -> TextEnv:
        """A copy at the current state that plays on independently: the task shared (immutable),
        the conversation copied, and the dynamics drawing from a new stream seeded by ``seed`` (any
        hashable: ints, strings). The copy's future is a fresh sample of the same dynamics, since an
        outcome depends only on the state and the action (``transitions``); this environment is left
        as it is. Branch rollouts (``mpo_viz.rollout.truth``) continue a policy from such copies;
        an environment of your own takes part by providing ``fork`` (docs/environments.md)."""
        other = copy.copy(self)
        other.messages = [dict(m) for m in self.messages]
        other._rng = random.Random(f"fork-{seed}")
        return other

    # ------------------------------------------------------------------ helpers
    def base_words(self) -> list[str]:
        """Words every environment uses (system prompt, errors, turn limit)."""
        return words_of(SYSTEM_PROMPT, TURN_LIMIT_MESSAGE, "invalid action : no command found unknown .")
