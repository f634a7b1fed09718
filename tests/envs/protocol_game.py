"""A small third-party-style game that speaks only the protocol (reset/step/fork): no finite model, no
expert unless asked. Importable as ``tests.envs.protocol_game:make_game`` (a factory function whose
options are declared with Option) or ``tests.envs.protocol_game:GuessGame`` (a class).

Like textarena's and gem's games it draws from, and reseeds, the global ``random`` module, so the tests
also show that episodes played side by side keep their own global RNG (replay stays exact)."""

from __future__ import annotations

import copy
import random

from mpo_viz.options import Option

#: the words of every text the game writes (the prompt's "answer" and "<number>" left out on purpose
#: in :data:`PARTIAL_WORDS`, for the [UNK] report)
WORDS = (
    "guess a number from 1 to 2 3 4 5 6 7 8 9 . answer with <number> higher lower correct no hint out of turns say"
).split()
PARTIAL_WORDS = [w for w in WORDS if w not in ("answer", "<number>")]


class GuessGame:
    """Guess the secret number (1..top) in at most ``max_turns`` turns; "higher"/"lower" hints, each
    hidden with probability ``fuzz`` (a draw from the global RNG); a reply one off the secret at the
    turn limit earns partial credit 0.25."""

    name = "guess"
    options = (
        Option("top", 6, kind="int", low=2, high=9, doc="the secret is a number from 1 to top"),
        Option("max_turns", 3, kind="int", low=1, doc="the game's own turn limit"),
        Option("fuzz", 0.0, low=0, high=1, doc="probability that a hint is hidden (drawn from the global RNG)"),
    )

    def __init__(self, top: int = 6, max_turns: int = 3, fuzz: float = 0.0, words=None, expert: bool = False):
        self.top, self.max_turns, self.fuzz = top, max_turns, fuzz
        self.words = list(words) if words is not None else None
        self.with_expert = expert
        self.secret = self.turn = 0
        self.lo, self.hi = 1, top

    def reset(self, seed):
        random.seed(seed)  # as textarena and gem do
        self.secret = random.randint(1, self.top)
        self.turn, self.lo, self.hi = 0, 1, self.top
        return f"guess a number from 1 to {self.top} . answer with guess <number> ."

    def step(self, text):
        self.turn += 1
        words = text.split()
        k = int(words[-1]) if words and words[-1].isdigit() else None
        if k == self.secret:
            return "correct .", 1.0, True, False, {"success": True}
        if k is None:
            hint = "say guess <number> ."
        else:
            hint = "higher ." if k < self.secret else "lower ."
            if k < self.secret:
                self.lo = max(self.lo, k + 1)
            else:
                self.hi = min(self.hi, k - 1)
        if random.random() < self.fuzz:
            hint = "no hint ."
        if self.turn >= self.max_turns:
            close = k is not None and abs(k - self.secret) == 1
            return f"{hint} out of turns .", 0.25 if close else 0.0, False, True, {"success": False}
        return hint, 0.0, False, False, {}

    def fork(self, seed):
        # the whole dynamic state is in these fields and the global RNG, which ProtocolEnv keeps per
        # environment and reseeds on fork
        return copy.copy(self)

    def __getattr__(self, name):
        # vocabulary and expert only when asked for (hasattr is how the toolkit sees them)
        if name == "vocabulary" and self.__dict__.get("words") is not None:
            return lambda: list(self.words)
        if name == "expert" and self.__dict__.get("with_expert"):
            return lambda rng: f"guess {(self.lo + self.hi) // 2}"
        raise AttributeError(name)


def make_game(top: int = 6, max_turns: int = 3, fuzz: float = 0.0):
    """The factory of ``--env tests.envs.protocol_game:make_game`` (byte-level text: no vocabulary)."""
    return GuessGame(top=top, max_turns=max_turns, fuzz=fuzz)


make_game.options = GuessGame.options  # type: ignore[attr-defined]


def make_worded(top: int = 6, max_turns: int = 3, fuzz: float = 0.0):
    """The game with a word list that lacks "answer" and "<number>" (its prompt loses them to [UNK])."""
    return GuessGame(top=top, max_turns=max_turns, fuzz=fuzz, words=PARTIAL_WORDS)


make_worded.options = GuessGame.options  # type: ignore[attr-defined]


def make_expert_game(top: int = 6, max_turns: int = 3, fuzz: float = 0.0):
    """The game with its full vocabulary and a bisecting expert (SFT can imitate it)."""
    return GuessGame(top=top, max_turns=max_turns, fuzz=fuzz, words=WORDS, expert=True)


make_expert_game.options = GuessGame.options  # type: ignore[attr-defined]
