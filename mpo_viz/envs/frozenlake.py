"""``frozenlake``: walk from the start to the goal over a frozen lake without falling into a hole —
gymnasium's FrozenLake (RAGEN's "luck vs skill" case when slippery), as an exact finite model.

**Lake.** An ``n × n`` grid (``size``, 4 or 8 as gymnasium's; any 3–12 works) of ``S`` start (top
left), ``F`` frozen, ``H`` hole, ``G`` goal (bottom right). ``map="random"`` (default, as RAGEN) draws
one per task the way gymnasium's ``generate_random_map`` does: every other cell frozen with probability
``frozen`` (0.8), drawn again until a path from ``S`` to ``G`` exists; its shortest path must also take
exactly ``d`` moves, ``d`` drawn from ``difficulty`` (the noise-free expert's turns without slipping,
an int or an inclusive ``(min, max)``; default: any, ``(2(n − 1), n²)``). A length no lake reaches
within :data:`MAP_TRIES` draws is an :class:`~mpo_viz.checks.OptionError` naming the range.
``map="standard"`` is gymnasium's fixed 4×4 or 8×8 map for every task (shortest paths 6 and 14).

**Moves.** ``left``, ``down``, ``right``, ``up`` (gymnasium's actions 0–3, the noise support in that
order). A move off the grid leaves the walker where it is. With ``slippery=True`` (default, as
gymnasium and RAGEN) the walker goes the chosen way with probability 1/3 and each of the two
perpendicular ways with probability 1/3 (gymnasium's table: actions ``a − 1``, ``a``, ``a + 1``
mod 4); otherwise exactly the chosen way.

**Reward, success, turn limit.** 1 on reaching ``G`` (success; the episode terminates), 0 otherwise;
stepping into a hole ends the episode in failure. The turn limit is ``needed + slack`` with ``slack``
10 by default (slippery ice needs room: on random 4×4 lakes the best possible success within the limit
averages 0.05 at slack 2, 0.27 at 10, 0.50 at 20), or a fixed ``max_turns`` (gymnasium's: 100 on
4×4, 200 on 8×8). ``shaping`` is refused: the lake has no reward but the goal's.

**Text.** The lake in gymnasium's letters, one row per line, cells separated by spaces, the walker as
``P``. Each observation says where the move took the walker (``you moved down .``, ``you slipped
left .``, ``you stay at the edge .``, ``you fell into a hole !``, ``you reached the goal !``) and
shows the lake. The command is the last of the four moves in the reply; TextArena's ``[down]`` and
``[s]`` forms are read too.

**Expert.** Finite-horizon value iteration: at each turn the move that maximises the exact
probability of reaching the goal within the turns left (the best any policy can do), ties broken by
the expected shortest-path distance to the goal after the move, then by the order above; without
slipping it walks a shortest path. Its thought names its row and column, the distance to the goal,
the turns left and the move. Inner state: ``(cell, t)`` — the walker's cell ``row · n + column`` and
the turns taken (the expert's horizon; equal to the full state's turn index) — or
``"success"``/``"failure"``.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from mpo_viz.checks import OptionError
from mpo_viz.envs.base import FAILURE, SUCCESS, TextEnv, words_of
from mpo_viz.options import Option

__all__ = ["FrozenLakeEnv", "FrozenLakeTask", "STANDARD_MAPS", "MAP_TRIES", "slip_table"]

#: gymnasium's actions 0..3, the noise support in that order
MOVES = ("left", "down", "right", "up")
_DELTA = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
#: gymnasium's built-in maps (``FrozenLake-v1`` and ``FrozenLake8x8-v1``)
STANDARD_MAPS = {
    4: ("SFFF", "FHFH", "FFFH", "HFFG"),
    8: ("SFFFFFFF", "FFFFFFFF", "FFFHFFFF", "FFFFFHFF", "FFFHFFFF", "FHHFFFHF", "FHFFHFHF", "FFFHFFFG"),
}
#: lakes drawn for one task before the difficulty is declared out of reach
MAP_TRIES = 2000
_ALIASES = {"w": "up", "a": "left", "s": "down", "d": "right"}
_LIBRARY_FORMS = re.compile(r"\[\s*(up|down|left|right|w|a|s|d)\s*\]")

_T_PROMPT = (
    "you are walking on a frozen lake from the start S to the goal G . falling into a hole H ends the walk . "
    "F is frozen ice , P is you . {ice}commands : left , down , right , up . you have {limit} turns . "
    "the lake :\n{board}"
)
_T_SLIPPERY = "the ice is slippery : you go the way you chose one time in three , else to one of its two sides . "
_T_MOVED = "you moved {a} ."
_T_SLIPPED = "you slipped {a} ."
_T_EDGE = "you stay at the edge ."
_T_HOLE = "you fell into a hole !"
_T_GOAL = "you reached the goal !"
_T_LAKE = "the lake :\n{board}"
_T_REASON = "i am at row {r} column {c} . the goal is {d} steps away . {k} turns left . next : {a} ."
_T_INVALID = "expected one of left , down , right , up"


def slip_table(action: str, slippery: bool) -> list[tuple[float, str]]:
    """``[(probability, direction walked)]`` of a chosen move: gymnasium's table — with slipping the
    moves ``a − 1``, ``a``, ``a + 1`` (mod 4, in gymnasium's order left, down, right, up) with 1/3
    each, without it the move itself."""
    a = MOVES.index(action)
    if not slippery:
        return [(1.0, action)]
    return [(1.0 / 3.0, MOVES[(a + k) % 4]) for k in (-1, 0, 1)]


def _shortest(rows: tuple[str, ...]) -> int | None:
    """Moves of a shortest path from ``S`` to ``G`` around the holes (None: no path)."""
    n = len(rows)
    start = next((r, c) for r in range(n) for c in range(n) if rows[r][c] == "S")
    dist = {start: 0}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if rows[r][c] == "G":
            return dist[(r, c)]
        for dr, dc in _DELTA.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < n and 0 <= nc < n and (nr, nc) not in dist and rows[nr][nc] != "H":
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return None


@dataclass(frozen=True)
class FrozenLakeTask:
    """One lake: ``rows`` in gymnasium's letters (``S`` ``F`` ``H`` ``G``), ``solution`` the moves of
    a shortest path from ``S`` to ``G``. ``FrozenLakeTask.from_rows(desc)`` builds one from any
    gymnasium-style map (RAGEN's and TextArena's lakes written that way)."""

    rows: tuple[str, ...]
    solution: int
    cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def from_rows(cls, rows) -> FrozenLakeTask:
        rows = tuple("".join(r) if not isinstance(r, str) else r for r in rows)
        n = len(rows)
        if n < 2 or any(len(r) != n for r in rows) or any(ch not in "SFHG" for r in rows for ch in r):
            raise ValueError(f"rows: expected a square map of S F H G letters, found {rows!r}")
        if "".join(rows).count("S") != 1 or "".join(rows).count("G") != 1:
            raise ValueError("rows: expected one S and one G")
        k = _shortest(rows)
        if k is None:
            raise ValueError("rows: expected a path from S to G around the holes, found none")
        return cls(rows, k)

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def start(self) -> int:
        return "".join(self.rows).index("S")

    def cell(self, i: int) -> str:
        return self.rows[i // self.size][i % self.size]


class FrozenLakeEnv(TextEnv):
    """FrozenLake (see the module docstring). Extra options: ``size`` (4), ``slippery`` (True),
    ``map`` (``"random"``), ``frozen`` (0.8); ``slack`` defaults to 10 here."""

    name = "frozenlake"
    obs_role = "user"
    verbs = MOVES
    min_difficulty = 1

    options = (
        Option("size", 4, kind="int", low=3, high=12, doc="rows and columns of the lake (gymnasium: 4 or 8)"),
        Option("slippery", True, kind="bool", doc="a move goes its way 1/3 of the time, else to a side (gymnasium)"),
        Option(
            "map",
            "random",
            kind="choice",
            choices=("random", "standard"),
            doc="a random lake per task (RAGEN) or gymnasium's fixed 4x4/8x8 map",
        ),
        Option("frozen", 0.8, low=0, high=1, low_open=True, doc="probability that a cell of a random lake is ice"),
        Option(
            "difficulty",
            None,
            kind="any",
            doc="moves of the shortest path: an int or an inclusive (min, max); None: any",
        ),
        Option("slack", 10, kind="int", low=0, doc="extra turns on top of the shortest path before the turn limit"),
    )

    def __init__(
        self,
        *,
        size: int = 4,
        slippery: bool = True,
        map: str = "random",
        frozen: float = 0.8,
        difficulty=None,
        slack: int = 10,
        shaping: float = 0.0,
        **kw,
    ):
        opts = self.declared_options()
        for name, v in (("size", size), ("slippery", slippery), ("map", map), ("frozen", frozen)):
            opts[name].check(v)
        if shaping != 0:
            raise OptionError(
                "shaping", f"expected 0 for frozenlake (its only reward is 1 at the goal), found {shaping}"
            )
        if map == "standard" and size not in STANDARD_MAPS:
            raise OptionError("size", f"expected 4 or 8 with map='standard' (gymnasium's maps), found {size}")
        if difficulty is None:
            difficulty = (2 * (size - 1), size * size)
        super().__init__(difficulty=difficulty, slack=slack, shaping=0.0, **kw)
        self.size, self.slippery, self.map, self.frozen = int(size), bool(slippery), map, float(frozen)

    # -- task
    def make_task(self, seed):
        """The lake of ``seed``: gymnasium's draw (random lakes until one has a path), kept when its
        shortest path lies in the ``difficulty`` range — gymnasium's distribution conditioned on the
        range, not a length drawn first."""
        rng = random.Random(seed)
        lo, hi = self.difficulty
        n = self.size
        if self.map == "standard":
            task = FrozenLakeTask.from_rows(STANDARD_MAPS[n])
            if lo <= task.solution <= hi:
                return task
            raise OptionError(
                "difficulty",
                f"expected a range holding {task.solution} (the shortest path of gymnasium's {n}x{n} "
                f"map), found ({lo}, {hi})",
            )
        for _ in range(MAP_TRIES):
            task = self._draw(rng)
            if lo <= task.solution <= hi:
                return task
        raise OptionError(
            "difficulty",
            f"expected shortest paths that random {n}x{n} lakes have (at least {2 * (n - 1)}), found ({lo}, {hi}): "
            f"no lake in {MAP_TRIES} draws had one in that range",
        )

    def sample_task(self, rng, size):
        """A lake whose shortest path takes exactly ``size`` moves (:meth:`make_task` draws by range)."""
        for _ in range(MAP_TRIES):
            task = self._draw(rng)
            if task.solution == size:
                return task
        raise OptionError(
            "difficulty",
            f"expected a shortest path random {self.size}x{self.size} lakes have, "
            f"found {size}: none in {MAP_TRIES} draws",
        )

    def _draw(self, rng: random.Random) -> FrozenLakeTask:
        """gymnasium's ``generate_random_map``: every cell but S and G ice with probability ``frozen``,
        drawn again until a path from S to G exists."""
        n = self.size
        while True:
            cells = [["F" if rng.random() < self.frozen else "H" for _ in range(n)] for _ in range(n)]
            cells[0][0], cells[n - 1][n - 1] = "S", "G"
            rows = tuple("".join(r) for r in cells)
            k = _shortest(rows)
            if k is not None:
                return FrozenLakeTask(rows, k)

    def needed_turns(self, task):
        return task.solution

    def prompt(self, task):
        return _T_PROMPT.format(
            ice=_T_SLIPPERY if self.slippery else "", limit=self.limit_for(task), board=self._board(task, task.start)
        )

    # -- model
    def initial_state(self, task):
        return (task.start, 0)

    def actions(self, task, s):
        return MOVES

    def _walk(self, task, cell: int, direction: str) -> int:
        n = task.size
        r, c = divmod(cell, n)
        dr, dc = _DELTA[direction]
        return min(max(r + dr, 0), n - 1) * n + min(max(c + dc, 0), n - 1)

    def outcomes(self, task, s, action):
        cell, t = s
        key = ("outcomes", self.slippery, cell, action)
        moves = task.cache.get(key)
        if moves is None:
            merged: dict = {}
            for p, way in slip_table(action, self.slippery):
                c2 = self._walk(task, cell, way)
                said = (_T_MOVED if way == action else _T_SLIPPED).format(a=way)
                kind = task.cell(c2)
                if c2 == cell:
                    res = (cell, 0.0, False, f"{said} {_T_EDGE} {_T_LAKE.format(board=self._board(task, cell))}")
                elif kind == "H":
                    res = (FAILURE, 0.0, True, f"{said} {_T_HOLE}")
                elif kind == "G":
                    res = (SUCCESS, 1.0, True, f"{said} {_T_GOAL}")
                else:
                    res = (c2, 0.0, False, f"{said} {_T_LAKE.format(board=self._board(task, c2))}")
                merged[res] = merged.get(res, 0.0) + p
            moves = task.cache[key] = [(p, *res) for res, p in merged.items()]
        return [(p, c2 if done else (c2, t + 1), r, done, obs) for p, c2, r, done, obs in moves]

    def transitions(self, task, state, action, error=""):
        """The base class's outcomes, with the turn count of the inner state kept equal to the full
        state's also on a malformed turn (the base keeps the inner state as it was)."""
        res = super().transitions(task, state, action, error)
        if action is not None:
            return res
        return [
            type(o)(
                o.prob, (o.state[0], (o.state[1][0], o.state[0])), o.reward, o.terminated, o.truncated, o.observation
            )
            for o in res
        ]

    def _plan(self, task) -> tuple[np.ndarray, np.ndarray]:
        """The expert's finite-horizon value iteration over the task's turn limit ``L``:
        ``W[k, c, a]``, the probability of reaching the goal within ``k`` more turns by move ``a`` from
        cell ``c`` and the best moves after it,

            W[k, c, a] = Σ_w P(w | a) · ([c'_w = G] + [c'_w ice] · max_b W[k − 1, c'_w, b]),   W[0] = 0,

        and ``D[c, a]``, the expected shortest-path distance to the goal after the move (a hole counts
        10⁶), which breaks ties (then the order of the moves)."""
        limit = self.limit_for(task)
        key = ("plan", self.slippery, limit)
        got = task.cache.get(key)
        if got is not None:
            return got
        n2 = task.size**2
        prob = np.zeros((n2, 4, 3))
        nxt = np.zeros((n2, 4, 3), dtype=np.int64)
        for c in range(n2):
            for a, act in enumerate(MOVES):
                for k, (p, way) in enumerate(slip_table(act, self.slippery)):
                    nxt[c, a, k], prob[c, a, k] = self._walk(task, c, way), p
        kinds = np.array([task.cell(c) for c in range(n2)])
        goal = prob * (kinds[nxt] == "G")
        ice = prob * np.isin(kinds[nxt], ("S", "F"))
        w = np.zeros((limit + 1, n2, 4))
        for k in range(1, limit + 1):
            w[k] = (goal + ice * w[k - 1].max(axis=1)[nxt]).sum(axis=2)
        far = np.array([1e6 if kinds[c] == "H" else self._goal_distance(task, c) for c in range(n2)], dtype=float)
        dist = (prob * far[nxt]).sum(axis=2)
        got = task.cache[key] = (w, dist)
        return got

    def expert_action(self, task, s):
        cell, t = s
        w, dist = self._plan(task)
        q = w[max(self.limit_for(task) - t, 0), cell]
        best = np.flatnonzero(q >= q.max() - 1e-12)
        return MOVES[int(best[np.argmin(dist[cell, best])])]

    def _goal_distance(self, task, cell: int) -> int:
        """Moves of a shortest path from ``cell`` to the goal around the holes (0 on the goal)."""
        key = ("distance", cell)
        d = task.cache.get(key)
        if d is None:
            n = task.size
            flat = list("".join(task.rows).replace("S", "F"))
            if flat[cell] == "G":
                d = 0
            else:
                flat[cell] = "S"
                d = _shortest(tuple("".join(flat[r * n : (r + 1) * n]) for r in range(n)))
                d = n * n if d is None else d
            task.cache[key] = d
        return d

    def reasoning(self, task, s):
        cell, t = s
        r, c = divmod(cell, task.size)
        left = self.limit_for(task) - t
        return _T_REASON.format(r=r, c=c, d=self._goal_distance(task, cell), k=left, a=self.expert_action(task, s))

    def _board(self, task, s: int) -> str:
        key = ("board", s)
        b = task.cache.get(key)
        if b is None:
            flat = list("".join(task.rows))
            flat[s] = "P"
            n = task.size
            b = task.cache[key] = "\n".join(" ".join(flat[r * n : (r + 1) * n]) for r in range(n))
        return b

    def parse(self, task, s, text):
        text = _LIBRARY_FORMS.sub(lambda m: f" {_ALIASES.get(m.group(1), m.group(1))} ", text.lower())
        words = self.command_words(text)
        if words is None:
            return None, self.invalid_message(task, s, "no command found")
        if len(words) == 1:
            return words[0], ""
        return None, self.invalid_message(task, s, _T_INVALID)

    def vocabulary(self):
        return (
            self.base_words()
            + words_of(
                _T_PROMPT,
                _T_SLIPPERY,
                _T_MOVED,
                _T_SLIPPED,
                _T_EDGE,
                _T_HOLE,
                _T_GOAL,
                _T_LAKE,
                _T_REASON,
                f"invalid action : {_T_INVALID} .",
            )
            + list(MOVES)
            + ["S", "F", "H", "G", "P"]
            + [str(i) for i in range(300)]
            + ["commands"]  # written after the {ice} placeholder in the prompt, which words_of skips
        )
