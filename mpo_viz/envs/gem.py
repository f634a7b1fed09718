"""GEM's game suite (``gem-llm``) as mpo_viz environments: ``make_env("gem:game:Sokoban-v0-easy")``.

:func:`from_gem` (or the name ``gem:<id>`` wherever an environment name is accepted) wraps one of
GEM's multi-turn games (``game:GuessTheNumber-*``, ``Mastermind``, ``Minesweeper``, ``FifteenPuzzle``,
``Sudoku``, ``TowerofHanoi``, ``Game2048``, ``Sokoban``, ``Crosswords``) on the protocol route
(:class:`~mpo_viz.envs.protocol.ProtocolEnv`). What the adapter does with GEM's conventions:

* **text**: the first observation is GEM's instructions then its ``suffix`` (the board), one per
  line, as GEM's own observation wrapper joins them; each later one is GEM's message then the
  suffix. The system prompt states the action format (the move inside ``\\boxed{}``).
* **ends**: GEM returns ``terminated=True`` together with ``truncated=True`` at its turn limit;
  that is ``truncated`` here (the turn's reward, GEM's partial credit, is kept). A format error
  (GEM pays ``LanguageGameReward.format_error_reward`` = −0.1 and ends the episode, also on the
  last turn) is ``terminated``, ``info["format_error"]``.
* **lenient** (off by default): a format error is an observation instead — GEM's message, the board
  and a line restating the format — at GEM's −0.1, the turn spent (GEM has counted it); at GEM's
  turn limit it is ``truncated``.
* **success**: GEM has no success flag; it is read from the game's state by a rule per game
  (:data:`SUCCESS_RULES`; a game without one is refused, never a silent 0).
* **expert**: Sokoban only — the exact solver of :mod:`mpo_viz.envs.sokoban` on GEM's room (an
  optimal move each turn), so ``generate --policy expert`` and SFT work on it; the others have none.
* Games that need NLTK's word lists (Wordle, Hangman, WordSearch: GEM downloads them in the
  constructor) and the dataset environments (``math:``, ``code:``, ``qa:``, ``logic:``, ``eval:``,
  ``rg:`` — single-turn, most downloading from the Hugging Face hub) are refused with a line naming why.

Needs the ``gem`` extra (``pip install 'mpo_viz[gem]'``; gem-llm is Apache-2.0).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np

from mpo_viz.checks import OptionError
from mpo_viz.envs.base import TextEnv
from mpo_viz.envs.library import LibraryGame, joined, require, sokoban_move, wrap
from mpo_viz.envs.rng import isolated

__all__ = ["GemGame", "from_gem", "SUCCESS_RULES", "NEEDS_DATA"]


def _method(name: str) -> Callable[[Any], bool]:
    """The predicate ``game.<name>()``: a check of GEM's own (private to its class; GEM has no public one)."""
    return lambda game: bool(getattr(game, name)())


#: GEM's game class -> (the rule in words, the predicate on the game after the episode's last step)
SUCCESS_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "GuessTheNumberEnv": ("the secret number is among the guesses", lambda g: g.game_number in g.previous_guesses),
    "MastermindEnv": ("a guess got every peg black", lambda g: g.milestone == g.code_length),
    "MinesweeperEnv": ("every safe cell revealed (GEM's _is_solved)", _method("_is_solved")),
    "FifteenPuzzleEnv": ("the tiles in order (GEM's _is_solved)", _method("_is_solved")),
    "SudokuEnv": ("the grid filled correctly (GEM's _is_puzzle_complete)", _method("_is_puzzle_complete")),
    "TowerofHanoiEnv": (
        "every disk on tower C, largest at the bottom",
        lambda g: g.board["C"] == list(range(g.num_disks, 0, -1)),
    ),
    "Game2048Env": ("the target tile reached (GEM's _has_won)", _method("_has_won")),
    "SokobanEnv": (
        "every box on a target (GEM's _check_if_all_boxes_on_target)",
        _method("_check_if_all_boxes_on_target"),
    ),
    "CrosswordsEnv": ("every letter cell filled (GEM's _is_game_over)", _method("_is_game_over")),
}

#: GEM's game modules that need data that cannot be had offline -> what they need
NEEDS_DATA = {
    "gem.envs.game_env.wordle": "NLTK's 'words' corpus (GEM calls nltk.download('words') when it builds the game)",
    "gem.envs.game_env.hangman": "NLTK's 'words' corpus (GEM calls nltk.download('words') when it builds the game)",
    "gem.envs.game_env.word_search": "NLTK's 'words' corpus (nltk.corpus.words)",
}
_DATASET_PREFIXES = {
    "math": "a single-turn dataset environment (its data comes from the Hugging Face hub)",
    "code": "a single-turn dataset environment (its data comes from the Hugging Face hub)",
    "qa": "a single-turn dataset environment (its data comes from the Hugging Face hub)",
    "logic": "a single-turn dataset environment (its data comes from the Hugging Face hub)",
    "eval": "a single-turn evaluation set (its data comes from the Hugging Face hub)",
    "rg": "a single-turn reasoning-gym task (one answer, no turns to assign credit across)",
}

SYSTEM_PROMPT = (
    "You are playing a game of GEM, turn by turn. Each turn, reply with exactly one action and put it "
    "inside \\boxed{{}} as the instructions show (for example \\boxed{{{example}}}); the last \\boxed{{}} "
    "of your reply is your action. {ending}"
)


def _spec(env_id: str):
    """GEM's registry entry of ``env_id``, or an :class:`OptionError` saying why it is not a game here."""
    require("gem")
    from gem.envs.registration import ENV_REGISTRY  # the extra: imported only when a gem name is used

    prefix = env_id.split(":", 1)[0]
    if env_id not in ENV_REGISTRY:
        games = sorted(k for k in ENV_REGISTRY if k.startswith("game:"))
        raise OptionError("env", f"expected a GEM game id ({', '.join(games)}), found {env_id!r}")
    if prefix != "game":
        why = _DATASET_PREFIXES.get(prefix, "not one of GEM's multi-turn games")
        raise OptionError(
            "env", f"expected one of GEM's multi-turn games (game:<name>), found {env_id!r}: {why}; refused"
        )
    spec = ENV_REGISTRY[env_id]
    module = spec.entry_point.split(":")[0] if isinstance(spec.entry_point, str) else ""
    if module in NEEDS_DATA:
        raise OptionError(
            "env", f"expected a game that runs offline, found {env_id!r}: it needs {NEEDS_DATA[module]}, refused"
        )
    return spec


class GemGame(LibraryGame):
    """One of GEM's games as a protocol object (module docstring); build it with :func:`from_gem`."""

    library = "gem"

    def _make(self) -> Any:
        _spec(self.env_id)  # the extra imported (or its one-line hint), the id checked
        import gem  # the extra, imported by _spec

        game = gem.make(self.env_id, **self.game_options)  # it resets (and draws): LibraryGame isolates it
        kind = type(game).__name__
        if kind not in SUCCESS_RULES:
            raise OptionError(
                "env",
                f"expected a GEM game with a success rule ({', '.join(sorted(SUCCESS_RULES))}), "
                f"found {self.env_id!r} ({kind}); refused rather than reporting success as 0",
            )
        from gem.utils.constants import LanguageGameReward

        self._format_error = float(LanguageGameReward.format_error_reward)
        self._rule = SUCCESS_RULES[kind]
        ending = (
            "A reply without a valid \\boxed{} action is an invalid action: the turn is spent (reward -0.1)."
            if self.lenient
            else "A reply without a valid \\boxed{} action ends the game (reward -0.1)."
        )
        self.system_prompt = SYSTEM_PROMPT.format(example=_example(game), ending=ending)
        if kind == "SokobanEnv":  # the exact solver plays it: generate --policy expert, SFT
            self._rooms: dict = {}
            self.expert = self._sokoban_expert
        return game

    def _sokoban_expert(self, rng) -> str:
        """The exact solver's move in GEM's room, as GEM reads it (``\\boxed{move}``)."""
        return f"\\boxed{{{sokoban_move(self.game.room_fixed, self.game.room_state, self._rooms)}}}"

    def success_rule(self) -> str:
        return f"{type(self.game).__name__}: {self._rule[0]}"

    def _reset(self, task_seed: int) -> str:
        text, info = self.game.reset(seed=task_seed)
        self.max_turns = getattr(self.game, "max_turns", None)
        return joined(text, info.get("suffix", ""))

    def _step(self, text: str) -> tuple[str, float, bool, bool, dict]:
        obs, reward, term, trunc, info = self.game.step(text)
        reward, term, trunc = float(reward), bool(term), bool(trunc)
        suffix = info.get("suffix", "") if isinstance(info, dict) else ""
        format_error = term and reward == self._format_error
        at_limit = bool(self.max_turns) and self.game.turn_count >= self.max_turns
        if format_error:
            if self.lenient:
                hint = "Reply with one action inside \\boxed{}, as the instructions show."
                obs = joined(obs, hint)
                term, trunc = False, at_limit
            else:
                term, trunc = True, False  # the format error ends it, on the last turn too
        elif term and trunc:  # GEM's turn limit: truncated, not terminated
            term = False
        done = term or trunc
        success = bool(self._rule[1](self.game)) if done else False
        out = {"success": success, "format_error": format_error, "valid": not format_error}
        return joined(obs, suffix), reward, term, trunc, out


def _example(game) -> str:
    """An example action for the system prompt: GEM's own sample, drawn from global RNGs seeded
    here (the prompt must not depend on the caller's global state: a replay in a fresh process
    rebuilds it), the caller's put back."""
    with isolated():
        random.seed(0)
        np.random.seed(0)
        try:
            sample = str(game.sample_random_action())
        except Exception:  # a game without samples: a neutral example
            return "..."
    inner = sample.partition("\\boxed{")[2].rpartition("}")[0]
    return inner or "..."


def from_gem(env_id: str, *, lenient: bool = False, **game_options: Any) -> TextEnv:
    """GEM's game ``env_id`` (``"game:Sokoban-v0-easy"``) as an environment: the same as
    ``make_env(f"gem:{env_id}", lenient=..., game_options=...)``. ``game_options``: keyword
    arguments of GEM's game constructor (``max_turns=30``) over those of its registered id. Without
    gem-llm: an :class:`~mpo_viz.checks.OptionError` saying ``pip install 'mpo_viz[gem]'``."""
    kw: dict[str, Any] = {"lenient": lenient}
    if game_options:
        kw["game_options"] = game_options
    return wrap(GemGame, env_id, **kw)


def check_id(env_id: str) -> None:
    """Raise the :class:`OptionError` that ``gem:<env_id>`` would (missing extra, unknown id, a
    dataset environment, data needed), without building the game."""
    with isolated():  # importing gem imports reasoning-gym and friends
        _spec(env_id)
