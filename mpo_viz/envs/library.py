"""What the adapters of game libraries share (:mod:`mpo_viz.envs.gem`, :mod:`mpo_viz.envs.textarena`).

An adapter is a protocol object (:mod:`mpo_viz.envs.protocol`: ``reset(seed, task_seed)``,
``step(text)``, ``fork(seed)``) that :class:`~mpo_viz.envs.protocol.ProtocolEnv` wraps; every call
into the library runs on the environment's own global RNG states (:class:`~mpo_viz.envs.rng.GlobalRNG`,
swapped in by ``ProtocolEnv``). This module holds the optional-extra import with its one-line hint,
the names ``gem:<id>`` / ``textarena:<id>``, the options both take and the base class.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import logging
import random
from types import ModuleType
from typing import Any

import numpy as np

from mpo_viz.checks import OptionError
from mpo_viz.envs.protocol import ProtocolEnv
from mpo_viz.envs.rng import isolated
from mpo_viz.envs.sokoban import SokobanTask
from mpo_viz.options import Option

__all__ = ["LIBRARIES", "LibraryGame", "library_of", "require", "OPTIONS", "wrap", "joined", "sokoban_move"]

#: prefix of an environment name -> (the module to import, the extra that installs it)
LIBRARIES = {"gem": ("gem", "gem"), "textarena": ("textarena", "textarena")}

#: the options every adapter takes (``make_env``, the ``--lenient`` / ``--game-options`` flags)
OPTIONS = (
    Option(
        "lenient",
        False,
        kind="bool",
        doc="a malformed reply is an observation that costs the turn instead of the end of the episode "
        "(for training from scratch); off: the library's own rule",
    ),
    Option(
        "game_options",
        None,
        kind="dict",
        optional=True,
        doc="keyword arguments of the library's game constructor, over those of its registered id",
    ),
)


def library_of(name: object) -> str | None:
    """``"gem"`` or ``"textarena"`` when ``name`` reads ``gem:<id>`` / ``textarena:<id>``, else None."""
    if not isinstance(name, str):
        return None
    prefix, sep, rest = name.partition(":")
    return prefix if sep and rest and prefix in LIBRARIES else None


def require(library: str) -> ModuleType:
    """The library's module, imported; missing, an :class:`~mpo_viz.checks.OptionError` (option
    ``env``) in one line naming the extra that installs it. The import leaves the caller's global
    RNGs and root logger as they were (gem sets the root logger to INFO when imported)."""
    module, extra = LIBRARIES[library]
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        with isolated():  # an import that seeds or draws leaves the caller's global RNGs as they were
            return importlib.import_module(module)
    except ImportError as exc:
        raise OptionError(
            "env",
            f"expected the {library} package for {library}:<id> environments, found it missing "
            f"({type(exc).__name__}: {exc}); install it with: pip install 'mpo_viz[{extra}]'",
        ) from None
    finally:  # gem configures the root logger at import (logging.basicConfig at INFO): put it back
        root.handlers[:] = handlers
        root.setLevel(level)


def _seed32(*words: object) -> int:
    return int.from_bytes(hashlib.sha256("-".join(map(str, words)).encode()).digest()[:4], "little")


class LibraryGame:
    """Base of an adapter: a library game as a protocol object, text in and text out.

    Subclasses set ``library`` and implement ``_make`` (the game), ``_reset`` (the first observation,
    after the game's seeded reset) and ``_step``; this class seeds the dynamics, forks, and holds
    the options. ``env_id``: the library's id; ``lenient``; ``game_options``: the constructor's
    keyword arguments over the registered ones.

    Seeds: the task (board, secret, room) is the library's own seeded reset with ``task_seed``;
    after it, the global ``random`` and ``numpy.random`` the game draws its dynamics from (2048's
    tiles, Minesweeper's mines) are reseeded from ``(task_seed, seed)``, so the G samples of a group
    share the task and not the dynamics. Both calls run on the environment's own RNG states.
    """

    library = ""
    tokenizer_kind = "bytes"  # the libraries write free English: bytes lose nothing
    obs_role = "user"  # the game's text is the user's turn (gem's own chat layout)
    options = OPTIONS

    def __init__(self, env_id: str, lenient: bool = False, game_options: dict | None = None):
        if not isinstance(env_id, str) or not env_id:
            raise OptionError("env", f"expected {self.library}:<id> with a {self.library} id, found {env_id!r}")
        self.env_id = env_id
        self.lenient = bool(lenient)
        self.game_options = dict(game_options or {})
        self.name = f"{self.library}:{env_id}"
        self.seeds: tuple[int, int] | None = None
        self.turn = 0
        self.max_turns: int | None = None
        self.system_prompt: str | None = None
        with isolated():  # a constructor may draw from (or reseed) the global RNGs: not the caller's
            self.game: Any = self._make()

    # the library's side ---------------------------------------------------------------------------
    def _make(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _reset(self, task_seed: int) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _step(self, text: str) -> tuple[str, float, bool, bool, dict]:  # pragma: no cover - abstract
        raise NotImplementedError

    # the protocol ---------------------------------------------------------------------------------
    def reset(self, seed: int, task_seed: int | None = None) -> str:
        """A new episode: the task from ``task_seed`` (default ``seed``), the dynamics from both."""
        ts = seed if task_seed is None else task_seed
        first = self._reset(int(ts))
        random.seed(f"{self.library}-dynamics-{ts}-{seed}")
        np.random.seed(_seed32(self.library, "dynamics", ts, seed))
        self.seeds = (int(ts), int(seed))
        self.turn = 0
        return first

    def step(self, text: str) -> tuple[str, float, bool, bool, dict]:
        """One reply: the library's step, its ends told apart (``terminated`` / ``truncated``) and
        ``info`` with ``success`` (the rule of :meth:`success`), ``format_error`` and ``lenient``."""
        if self.seeds is None:
            raise RuntimeError(f"{self.name}: step() before reset()")
        self.turn += 1
        obs, reward, term, trunc, info = self._step(text)
        info.setdefault("lenient", self.lenient)
        return obs, reward, term, trunc, info

    def fork(self, seed: int) -> LibraryGame:
        """An independent copy at the current state (the game deep-copied; ``ProtocolEnv`` reseeds
        the copy's global RNG states from ``seed``)."""
        return copy.deepcopy(self)

    def metadata(self) -> dict[str, Any]:
        """What an episode was made with: library, id, options, the success rule, the seeds."""
        return {
            "library": self.library,
            "env_id": self.env_id,
            "lenient": self.lenient,
            "game_options": dict(self.game_options),
            "success_rule": self.success_rule(),
            "seeds": {"task_seed": self.seeds[0], "seed": self.seeds[1]} if self.seeds else None,
        }

    def success_rule(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError


def joined(*parts: str) -> str:
    """``parts`` joined one per line (empty ones left out), as gem's own observation wrapper does."""
    return "\n".join(p.rstrip("\n") for p in parts if p)


def wrap(cls: type[LibraryGame], env_id: str, **options: Any) -> ProtocolEnv:
    """``cls(env_id, **options)`` checked against :data:`OPTIONS` and wrapped as the environment
    ``make_env(f"{cls.library}:{env_id}", **options)`` returns."""
    declared = {o.name: o for o in OPTIONS}
    for k, v in options.items():
        if k not in declared:
            raise OptionError(
                k, f"expected an option of the {cls.library}:<id> environments ({', '.join(declared)}), found {k!r}"
            )
        declared[k].check(v)
    factory = functools.partial(cls, env_id)
    return ProtocolEnv(
        factory(**options), env_id=f"{cls.library}:{env_id}", factory=factory, options=options, declared=declared
    )


def sokoban_move(room_fixed, room_state, rooms: dict) -> str:
    """The exact solver's move (:mod:`mpo_viz.envs.sokoban`: the first move of an optimal solution;
    in a dead end the first move that pushes no box) in a gym-sokoban room as GEM and TextArena hold
    it: ``room_fixed`` (0 wall, 1 floor, 2 target) and ``room_state`` (3 box on a target, 4 box, 5
    the player). ``rooms``: a cache of each room's model (its breadth-first search) by layout."""
    rows = tuple("".join("#" if f == 0 else "O" if f == 2 else "_" for f in row) for row in room_fixed)
    width = len(rows[0])
    player, boxes = -1, []
    for r, row in enumerate(room_state):
        for c, v in enumerate(row):
            if v == 5:
                player = r * width + c
            elif v in (3, 4):
                boxes.append(r * width + c)
    if player < 0:
        raise ValueError("room_state: expected the player (5), found none")
    state = (player, tuple(sorted(boxes)))
    task = rooms.get(rows)
    if task is None:
        task = rooms[rows] = SokobanTask(rows, player, state[1], 0)
    return task.model().expert(state)
