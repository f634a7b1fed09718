"""TextArena's single-player games as mpo_viz environments: ``make_env("textarena:Sokoban-v0")``.

:func:`from_textarena` (or the name ``textarena:<id>`` wherever an environment name is accepted)
wraps one of TextArena's single-player games (``Sokoban-v0``, ``FrozenLake-v0``, ``GuessTheNumber-v0``,
``Minesweeper-v0``, ``TowerOfHanoi-v0``, ...) on the protocol route
(:class:`~mpo_viz.envs.protocol.ProtocolEnv`), without TextArena's observation wrappers (the
toolkit lays the conversation out in the policy's chat format). What the adapter does with
TextArena's conventions:

* **text**: each observation is the game's messages since the last one (the prompt and board at
  reset; the move's message, the board, an invalid-move notice after a step), one per line — the
  player's own echoed reply left out. The system prompt states the action format (square brackets).
* **rewards**: TextArena pays only at the end (``close()``); every other turn is 0.
* **invalid moves**: TextArena forgives one invalid move (the notice is the observation and no
  turn of the game is spent) and ends the episode on a second in a row (walking into a wall counts)
  with its partial credit; ``info["invalid"]`` marks them. **lenient**: every invalid move is
  forgiven; as they spend no turn of the game, the adapter then ends an episode at
  :data:`LENIENT_CAP` × the game's turn limit replies (``truncated``, reward 0).
* **ends**: TextArena has no truncation flag. ``truncated`` = the game ended without a win and
  without an invalid-move end when its turn counter had reached its ``max_turns`` (a loss on the
  very last turn — FrozenLake's hole at turn 100 — reads as truncated too); else ``terminated``.
* **success**: TextArena has no success flag; the rule is its single-player convention: the
  episode ended with reward exactly 1 (a win pays 1, every other end a share below 1; Set and
  UltimateTexasHoldem pay a score, 1 for finishing).
* **expert**: Sokoban only — the exact solver of :mod:`mpo_viz.envs.sokoban` on TextArena's room.
* Multi-player games are refused (``reset(num_players=1)`` is asserted against), and so are the
  games that need NLTK's word lists (:data:`NEEDS_DATA`) or an LLM game master over the network.

Needs the ``textarena`` extra (``pip install 'mpo_viz[textarena]'``: textarena, MIT, which
hard-depends on ``chess``, GPL-3; and numpy, which its Sokoban imports without declaring it).
"""

from __future__ import annotations

import importlib
from typing import Any

from mpo_viz.checks import OptionError
from mpo_viz.envs.base import TextEnv
from mpo_viz.envs.library import LibraryGame, joined, require, sokoban_move, wrap
from mpo_viz.envs.rng import isolated

__all__ = ["TextArenaGame", "from_textarena", "NEEDS_DATA", "LENIENT_CAP", "SUCCESS_RULE"]

_WORDS = "NLTK's 'words' corpus (TextArena calls nltk.download('words'))"
#: TextArena game folders that need data or services that cannot be had offline -> what they need
NEEDS_DATA = {
    "Codenames": _WORDS,
    "DontSayIt": _WORDS,
    "Hangman": _WORDS,
    "LetterAuction": _WORDS,
    "SpellingBee": _WORDS,
    "WordChains": _WORDS,
    "WordLadder": _WORDS,
    "WordSearch": _WORDS,
    "Wordle": _WORDS,
    "GuessWho": "an LLM game master over the network (OpenRouter)",
    "TwentyQuestions": "an LLM game master over the network (OpenRouter)",
}
#: lenient mode: the replies an episode may take, as a multiple of the game's turn limit (100 without one)
LENIENT_CAP = 2
SUCCESS_RULE = "the episode ended with reward 1 (TextArena's single-player win)"
GAME_ID = -1  # TextArena's sender id of the game's own messages

SYSTEM_PROMPT = (
    "You are playing a game of TextArena, turn by turn. Each turn, reply with exactly one action written "
    "in square brackets as the instructions show (for example [up] or [5]). {ending}"
)


def _spec(env_id: str):
    """TextArena's registry entry of ``env_id``, or an :class:`OptionError` saying why not."""
    require("textarena")
    from textarena.envs.registration import ENV_REGISTRY  # the extra: imported only when a name is used

    if env_id not in ENV_REGISTRY:
        raise OptionError(
            "env", f"expected a TextArena id (e.g. Sokoban-v0, FrozenLake-v0, GuessTheNumber-v0), found {env_id!r}"
        )
    spec = ENV_REGISTRY[env_id]
    entry = spec.entry_point if isinstance(spec.entry_point, str) else ""
    folder = entry.split(".")[2] if entry.startswith("textarena.envs.") else ""
    if folder in NEEDS_DATA:
        raise OptionError(
            "env", f"expected a game that runs offline, found {env_id!r}: it needs {NEEDS_DATA[folder]}, refused"
        )
    return spec


class TextArenaGame(LibraryGame):
    """One of TextArena's single-player games as a protocol object (module docstring); build it
    with :func:`from_textarena`."""

    library = "textarena"

    def _make(self) -> Any:
        spec = _spec(self.env_id)
        entry = spec.entry_point
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module), attr)
        game = entry(**{**spec.kwargs, **self.game_options})
        try:  # single player only: TextArena asserts num_players in its state
            game.reset(num_players=1, seed=0)
        except (AssertionError, ValueError, TypeError) as exc:
            raise OptionError(
                "env",
                f"expected a single-player TextArena game, found {self.env_id!r}: "
                f"reset(num_players=1) refused ({type(exc).__name__}: {exc})",
            ) from None
        ending = (
            "A reply without a valid action is an invalid move: you are told so and try again."
            if self.lenient
            else "An invalid move is forgiven once; a second one in a row ends the game."
        )
        self.system_prompt = SYSTEM_PROMPT.format(ending=ending)
        self._replies = 0
        self._cap: int | None = None
        if type(game).__name__ == "SokobanEnv":  # the exact solver plays it: generate --policy expert, SFT
            self._rooms: dict = {}
            self.expert = self._sokoban_expert
        return game

    def _sokoban_expert(self, rng) -> str:
        """The exact solver's move in TextArena's room, as TextArena reads it (``[move]``)."""
        return f"[{sokoban_move(self.game.room_fixed, self.game.room_state, self._rooms)}]"

    def success_rule(self) -> str:
        return SUCCESS_RULE

    def _messages(self) -> str:
        _, observations = self.game.get_observation()
        return joined(*(str(m) for sender, m, *_ in observations if sender == GAME_ID))

    def _reset(self, task_seed: int) -> str:
        self.game.reset(num_players=1, seed=task_seed)
        state = self.game.state
        self.max_turns = state.max_turns
        if self.lenient:
            state.error_allowance = 1 << 30  # every invalid move forgiven
        self._replies = 0
        self._cap = LENIENT_CAP * (state.max_turns or 100) if self.lenient else None
        return self._messages()

    def _step(self, text: str) -> tuple[str, float, bool, bool, dict]:
        done, _ = self.game.step(text)
        obs = self._messages()
        state = self.game.state
        self._replies += 1
        if not done:
            invalid = state.error_count > 0  # reset to 0 by any valid move
            if self._cap is not None and self._replies >= self._cap:
                cap = f"The episode ends: {self._replies} replies, the adapter's limit in lenient mode."
                return (
                    joined(obs, cap),
                    0.0,
                    False,
                    True,
                    {"success": False, "invalid": invalid, "valid": not invalid, "capped": True},
                )
            return obs, 0.0, False, False, {"success": False, "invalid": invalid, "valid": not invalid}
        rewards, game_info = self.game.close()
        reward = float(rewards.get(0, 0.0)) if isinstance(rewards, dict) else float(rewards[0])
        info0 = game_info.get(0, {}) if isinstance(game_info, dict) else {}
        invalid_end = bool(info0.get("invalid_move", False))
        success = reward == 1.0 and not invalid_end
        at_limit = state.max_turns is not None and state.turn >= state.max_turns
        truncated = at_limit and not success and not invalid_end
        reason = str(info0.get("reason", "") or "")
        return (
            joined(obs, reason),
            reward,
            not truncated,
            truncated,
            {"success": success, "invalid": invalid_end, "valid": not invalid_end},
        )


def from_textarena(env_id: str, *, lenient: bool = False, **game_options: Any) -> TextEnv:
    """TextArena's single-player game ``env_id`` (``"Sokoban-v0"``) as an environment: the same as
    ``make_env(f"textarena:{env_id}", lenient=..., game_options=...)``. ``game_options``: keyword
    arguments of the game's constructor (``num_boxes=2``) over those of its registered id. Without
    textarena: an :class:`~mpo_viz.checks.OptionError` saying ``pip install 'mpo_viz[textarena]'``."""
    kw: dict[str, Any] = {"lenient": lenient}
    if game_options:
        kw["game_options"] = game_options
    return wrap(TextArenaGame, env_id, **kw)


def check_id(env_id: str) -> None:
    """Raise the :class:`OptionError` that ``textarena:<env_id>`` would (missing extra, unknown id,
    data needed), without building the game."""
    with isolated():
        _spec(env_id)
