"""``sokoban``: push every box onto a target — the testbed of RAGEN, verl-agent, GEM and TextArena, as an
exact finite model.

**Room.** A ``size × size`` grid (default 6) walled all round; floor carved by a seeded random walk,
``boxes`` targets (1–3, default 1) on the floor, then a start state — player and boxes, no box on a
target — drawn uniformly among the states whose *optimal* solution takes exactly ``d`` moves, ``d``
drawn from ``difficulty`` (the noise-free expert's turns, an int or an inclusive ``(min, max)``). The
optimal lengths come from one breadth-first search backwards from the solved states (pulls undo
pushes), so the difficulty is exact. A length no room reaches within :data:`ROOM_TRIES` rooms is an
:class:`~mpo_viz.checks.OptionError` naming the range (never a loop without end).

**Moves.** ``up``, ``down``, ``left``, ``right`` (the noise support, in that order). A move walks onto
free floor; into a box it pushes the box one cell if the cell behind is free floor (not a wall, not a
box); otherwise nothing moves (the turn is spent). One move per turn.

**Reward** (per turn, RAGEN's — gym-sokoban's — by default)::

    r = step_reward + shaping · (boxes on targets after − before) + solve_reward · [all boxes on targets]

with ``step_reward = −0.1``, ``shaping = 1`` (a box pushed onto a target +1, off one −1) and
``solve_reward = 10``. Every turn costs ``step_reward``, a bump into a wall and a malformed reply too
(the turn is spent and nothing moves). With ``limit_credit=True`` the turn that reaches the turn limit also gets
``solve_reward · (boxes on targets) / boxes`` (GEM's and TextArena's partial credit). GEM's own
setting is ``shaping=0, step_reward=0, solve_reward=1, limit_credit=True``. ``step_reward`` needs
``shaping ≠ 0``: the toolkit records rewards turn by turn only for a shaped environment, and a step
reward summed into the outcome would sit on the wrong turn.

**Success** = all boxes on targets (the episode terminates; inner state ``"success"``). There is no
failure state: a dead end (a box stuck where no target can be reached) plays on until the turn limit,
``needed + slack`` turns (``slack`` default 2) or a fixed ``max_turns`` (GEM's 6×6 setting: 20).

**Text.** The board as GEM and TextArena print it: one row per line, cells separated by spaces,
``#`` wall, ``_`` floor, ``O`` empty target, ``X`` box, ``√`` box on a target, ``P`` player, ``S``
player on a target (RAGEN's symbol; GEM prints ``P`` there). The prompt states the rules, the symbols,
the turn limit and the board; each observation says what the move did (``you moved up .``, ``you
pushed a box while you moved up .``, ``you cannot move up : a wall or a box is in the way .``) and
shows the board. The command is the last of ``up/down/left/right`` in the reply; GEM's
``\\boxed{up}`` and TextArena's ``[up]``/``[w]`` forms are read too.

**Expert.** The breadth-first solver: from each state, the first move (in the order above) of an
optimal solution; in a dead end, the first move that pushes no box. Its thought names the boxes on
targets, the optimal number of moves left and the move. Inner state: ``(player, boxes)`` with cells
numbered ``row · size + column`` and ``boxes`` sorted, or ``"success"``.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass, field

from mpo_viz.checks import OptionError
from mpo_viz.envs.base import SUCCESS, TextEnv, words_of
from mpo_viz.options import Option

__all__ = ["SokobanEnv", "SokobanTask", "ROOM_TRIES", "solve", "parse_board"]

#: the moves, in the order of the noise support
MOVES = ("up", "down", "left", "right")
#: rooms drawn for one task before the difficulty is declared out of reach
ROOM_TRIES = 300
WALL, FLOOR, TARGET = "#", "_", "O"
BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "X", "√", "P", "S"
_ALIASES = {"w": "up", "a": "left", "s": "down", "d": "right"}
_LIBRARY_FORMS = re.compile(r"\\boxed\{\s*(up|down|left|right)\s*\}|\[\s*(up|down|left|right|w|a|s|d)\s*\]")
# the random walk that carves the floor: cells added around each step (offsets from the walker)
_BRUSHES = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)

_T_PROMPT = (
    "you are solving the sokoban puzzle . you are the player and you need to push all boxes to targets . "
    "when you are right next to a box , you can push it by moving in the same direction . you cannot push "
    "a box through a wall or another box , and you cannot pull a box . you have to complete the puzzle "
    "within {limit} turns . symbols : P you , S you on a target , # wall , X box , O empty target , "
    "√ box on a target , _ empty floor . commands : up , down , left , right . the board :\n{board}"
)
_T_MOVED = "you moved {a} ."
_T_PUSHED = "you pushed a box while you moved {a} ."
_T_BLOCKED = "you cannot move {a} : a wall or a box is in the way ."
_T_SOLVED = "congratulations ! you have solved the sokoban puzzle !"
_T_BOARD = "the board :\n{board}"
_T_REASON = "boxes on targets : {k} of {n} . {d} moves to solve . next : {a} ."
_T_REASON_STUCK = "boxes on targets : {k} of {n} . the puzzle cannot be solved any more . next : {a} ."
_T_INVALID = "expected one of up , down , left , right"


@dataclass(frozen=True)
class SokobanTask:
    """One room and its start: ``rows`` the fixed layout (``#`` wall, ``_`` floor, ``O`` target),
    ``player`` and ``boxes`` (sorted) cell numbers ``row · width + column``, ``solution`` the optimal
    number of moves. Build one from a printed board with :func:`parse_board`."""

    rows: tuple[str, ...]
    player: int
    boxes: tuple[int, ...]
    solution: int
    # the room's model (moves, optimal distances, texts), built on first use; not part of the task's identity
    cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def width(self) -> int:
        return len(self.rows[0])

    @property
    def targets(self) -> tuple[int, ...]:
        w = self.width
        return tuple(r * w + c for r, row in enumerate(self.rows) for c, ch in enumerate(row) if ch == TARGET)

    def model(self) -> _Room:
        m = self.cache.get("room")
        if m is None:
            m = self.cache["room"] = _Room(self.rows)
        return m


class _Room:
    """The fixed part of a room and everything derived from it: the move function, the optimal
    distance of every state that can still be solved (one backward BFS), rendered boards, and the
    outcomes of each (state, move) once asked."""

    def __init__(self, rows: tuple[str, ...]):
        self.rows = rows
        self.h, self.w = len(rows), len(rows[0])
        if any(len(r) != self.w for r in rows):
            raise ValueError(f"rows: expected rows of one width, found widths {[len(r) for r in rows]}")
        w = self.w
        self.floor = [ch != WALL for row in rows for ch in row]
        for i, ok in enumerate(self.floor):
            r, c = divmod(i, w)
            if ok and (r in (0, self.h - 1) or c in (0, w - 1)):
                raise ValueError(f"rows: expected walls all round the room, found floor at row {r} column {c}")
        self.targets = tuple(i for i, ch in enumerate("".join(rows)) if ch == TARGET)
        self.target_set = frozenset(self.targets)
        self.delta = {"up": -w, "down": w, "left": -1, "right": 1}
        self._dist: dict | None = None
        self.boards: dict = {}
        self.outs: dict = {}

    # -- the dynamics
    def move(self, player: int, boxes: tuple[int, ...], action: str):
        """``(player, boxes, pushed)`` after ``action``, or None when nothing moves."""
        d = self.delta[action]
        q = player + d
        if not self.floor[q]:
            return None
        if q in boxes:
            q2 = q + d
            if not self.floor[q2] or q2 in boxes:
                return None
            return q, tuple(sorted(q2 if b == q else b for b in boxes)), True
        return q, boxes, False

    def on_targets(self, boxes) -> int:
        return sum(b in self.target_set for b in boxes)

    # -- optimal distances
    @property
    def dist(self) -> dict:
        """``{(player, boxes): optimal moves to solve}`` for every state that can be solved."""
        if self._dist is None:
            self._dist = self._backward_bfs()
        return self._dist

    def _backward_bfs(self) -> dict:
        goal = self.targets
        dist = {}
        queue: deque = deque()
        for p, ok in enumerate(self.floor):
            if ok and p not in self.target_set:
                dist[(p, goal)] = 0
                queue.append((p, goal))
        floor = self.floor
        deltas = tuple(self.delta.values())
        while queue:
            s = queue.popleft()
            q, boxes = s
            k = dist[s] + 1
            for d in deltas:
                back = q - d  # where the player came from
                if not floor[back] or back in boxes:
                    continue
                prev = (back, boxes)  # a walk from `back` onto q
                if prev not in dist:
                    dist[prev] = k
                    queue.append(prev)
                if q + d in boxes:  # a push from `back`: the box went from q to q + d
                    prev = (back, tuple(sorted(q if b == q + d else b for b in boxes)))
                    if prev not in dist:
                        dist[prev] = k
                        queue.append(prev)
        return dist

    def expert(self, s) -> str:
        """The first move of an optimal solution from ``s``; in a dead end the first move that pushes
        no box (``up`` when every move pushes one)."""
        player, boxes = s
        k = self.dist.get(s)
        for a in MOVES:
            nxt = self.move(player, boxes, a)
            nstate = s if nxt is None else (nxt[0], nxt[1])
            if k is None:
                if nxt is None or not nxt[2]:
                    return a
            elif self.dist.get(nstate, -1) == k - 1:
                return a
        return MOVES[0]

    # -- text
    def board(self, player: int, boxes) -> str:
        key = (player, boxes)
        b = self.boards.get(key)
        if b is None:
            cells = list("".join(self.rows))
            for i in boxes:
                cells[i] = BOX_ON_TARGET if i in self.target_set else BOX
            cells[player] = PLAYER_ON_TARGET if player in self.target_set else PLAYER
            w = self.w
            b = self.boards[key] = "\n".join(" ".join(cells[r * w : (r + 1) * w]) for r in range(self.h))
        return b


def parse_board(text: str) -> SokobanTask:
    """A task from a board as GEM, TextArena or this environment prints it (``#`` ``_`` ``O`` ``X``
    ``√`` ``P`` ``S``, cells separated by spaces or not, one row per line; RAGEN's ``grid`` rendering
    too). The room must be walled all round. ``solution`` is the optimal number of moves (the BFS); a
    room that cannot be solved is a ``ValueError``."""
    lines = [ln.replace(" ", "") for ln in text.strip().splitlines() if ln.strip()]
    fixed, player, boxes = [], None, []
    symbols = {WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET}
    width = len(lines[0]) if lines else 0
    for r, line in enumerate(lines):
        if len(line) != width:
            raise ValueError(f"text: expected rows of {width} cells, found {len(line)} in row {r}")
        row = []
        for c, ch in enumerate(line):
            if ch not in symbols:
                raise ValueError(f"text: expected one of {' '.join(sorted(symbols))}, found {ch!r} at row {r}")
            i = r * width + c
            if ch in (PLAYER, PLAYER_ON_TARGET):
                if player is not None:
                    raise ValueError("text: expected one player, found two")
                player = i
            if ch in (BOX, BOX_ON_TARGET):
                boxes.append(i)
            row.append(TARGET if ch in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET) else WALL if ch == WALL else FLOOR)
        fixed.append("".join(row))
    if player is None:
        raise ValueError("text: expected a player (P or S), found none")
    rows = tuple(fixed)
    room = _Room(rows)
    if len(boxes) != len(room.targets) or not boxes:
        raise ValueError(
            f"text: expected as many boxes as targets (at least one), found {len(boxes)} and {len(room.targets)}"
        )
    state = (player, tuple(sorted(boxes)))
    k = room.dist.get(state)
    if k is None:
        raise ValueError("text: expected a room that can be solved, found one that cannot")
    task = SokobanTask(rows, player, state[1], k)
    task.cache["room"] = room
    return task


def solve(task: SokobanTask) -> list[str]:
    """An optimal solution of ``task`` (the noise-free expert's moves)."""
    room = task.model()
    s = (task.player, task.boxes)
    out = []
    while room.on_targets(s[1]) < len(s[1]):
        a = room.expert(s)
        nxt = room.move(s[0], s[1], a)
        assert nxt is not None
        s = (nxt[0], nxt[1])
        out.append(a)
    return out


def _carve(rng: random.Random, n: int) -> list[list[bool]]:
    """Floor cells of an ``n × n`` room: a random walk of ``1.7 · 2n`` steps inside the wall ring,
    each step painting one brush, turning with probability 0.35."""
    grid = [[False] * n for _ in range(n)]
    dirs = ((-1, 0), (1, 0), (0, -1), (0, 1))
    r, c = rng.randint(1, n - 2), rng.randint(1, n - 2)
    dr, dc = rng.choice(dirs)
    for _ in range(int(1.7 * 2 * n)):
        if rng.random() < 0.35:
            dr, dc = rng.choice(dirs)
        r, c = min(max(r + dr, 1), n - 2), min(max(c + dc, 1), n - 2)
        for a, b in rng.choice(_BRUSHES):
            if 1 <= r + a <= n - 2 and 1 <= c + b <= n - 2:
                grid[r + a][c + b] = True
    return grid


class SokobanEnv(TextEnv):
    """Sokoban (see the module docstring). Extra options: ``size`` (6), ``boxes`` (1), ``step_reward``
    (−0.1), ``solve_reward`` (10), ``limit_credit`` (False); ``shaping`` is the reward of a box pushed
    onto a target (1; −1 off one)."""

    name = "sokoban"
    obs_role = "user"
    verbs = MOVES
    min_difficulty = 1

    options = (
        Option("size", 6, kind="int", low=4, high=10, doc="rows and columns of the room, walls included"),
        Option("boxes", 1, kind="int", low=1, high=3, doc="boxes (and targets) per room"),
        Option("shaping", 1.0, doc="reward of a box pushed onto a target (minus it for one pushed off); RAGEN: 1"),
        Option("step_reward", -0.1, doc="reward of every turn (RAGEN: -0.1; needs shaping != 0 unless 0)"),
        Option("solve_reward", 10.0, doc="reward when every box is on a target (RAGEN: 10, GEM: 1)"),
        Option(
            "limit_credit",
            False,
            kind="bool",
            doc="at the turn limit, solve_reward times the share of boxes on targets (GEM, TextArena)",
        ),
    )

    def __init__(
        self,
        *,
        size: int = 6,
        boxes: int = 1,
        shaping: float = 1.0,
        step_reward: float = -0.1,
        solve_reward: float = 10.0,
        limit_credit: bool = False,
        **kw,
    ):
        super().__init__(shaping=shaping, **kw)
        opts = self.declared_options()
        for name, v in (
            ("size", size),
            ("boxes", boxes),
            ("step_reward", step_reward),
            ("solve_reward", solve_reward),
            ("limit_credit", limit_credit),
        ):
            opts[name].check(v)
        if step_reward != 0 and shaping == 0:
            raise OptionError(
                "step_reward",
                "expected 0 with shaping=0 (rewards are recorded turn by turn only when shaping != 0; "
                f"summed into the outcome a step reward would sit on the last turn), found {step_reward}",
            )
        if self.difficulty[0] < boxes:
            raise OptionError(
                "difficulty", f"expected min >= {boxes} with {boxes} boxes (each needs a push), found {self.difficulty}"
            )
        if (size - 2) ** 2 < boxes + 2:
            raise OptionError(
                "boxes", f"expected at most {(size - 2) ** 2 - 2} boxes in a {size}x{size} room, found {boxes}"
            )
        self.size, self.boxes = int(size), int(boxes)
        self.step_reward, self.solve_reward = float(step_reward), float(solve_reward)
        self.limit_credit = bool(limit_credit)

    # -- task
    def sample_task(self, rng, size):
        n, k = self.size, self.boxes
        for _ in range(ROOM_TRIES):
            grid = _carve(rng, n)
            cells = [r * n + c for r in range(n) for c in range(n) if grid[r][c]]
            if len(cells) < k + 2:
                continue
            targets = set(rng.sample(cells, k))
            rows = tuple(
                "".join(TARGET if r * n + c in targets else FLOOR if grid[r][c] else WALL for c in range(n))
                for r in range(n)
            )
            room = _Room(rows)
            starts = sorted(
                s for s, d in room.dist.items() if d == size and not any(b in room.target_set for b in s[1])
            )
            if starts:
                player, boxes = starts[rng.randrange(len(starts))]
                task = SokobanTask(rows, player, boxes, size)
                task.cache["room"] = room
                return task
        lo, hi = self.difficulty
        raise OptionError(
            "difficulty",
            f"expected optimal solution lengths that {n}x{n} rooms with {k} box(es) reach, found ({lo}, {hi}): "
            f"no room in {ROOM_TRIES} tries had a start {size} moves from solved",
        )

    def needed_turns(self, task):
        return task.solution

    def prompt(self, task):
        return _T_PROMPT.format(limit=self.limit_for(task), board=task.model().board(task.player, task.boxes))

    # -- model
    def initial_state(self, task):
        return (task.player, task.boxes)

    def actions(self, task, s):
        return MOVES

    def outcomes(self, task, s, action):
        room = task.model()
        key = (s, action)
        out = room.outs.get(key)
        if out is None:
            out = room.outs[key] = [self._outcome(room, s, action)]
        return out

    def _outcome(self, room: _Room, s, action: str):
        player, boxes = s
        nxt = room.move(player, boxes, action)
        if nxt is None:
            return (
                1.0,
                s,
                self.step_reward,
                False,
                f"{_T_BLOCKED.format(a=action)} {_T_BOARD.format(board=room.board(player, boxes))}",
            )
        p2, b2, pushed = nxt
        gained = room.on_targets(b2) - room.on_targets(boxes)
        r = self.step_reward + self.shaping * gained
        if gained and room.on_targets(b2) == len(b2):
            return (1.0, SUCCESS, r + self.solve_reward, True, _T_SOLVED)
        said = (_T_PUSHED if pushed else _T_MOVED).format(a=action)
        return (1.0, (p2, b2), r, False, f"{said} {_T_BOARD.format(board=room.board(p2, b2))}")

    def transitions(self, task, state, action, error=""):
        """The base class's outcomes, plus ``step_reward`` on a malformed turn too (every turn costs
        it) and, with ``limit_credit``, the partial credit on the turn that reaches the limit:
        ``solve_reward · (boxes on targets) / boxes``."""
        res = super().transitions(task, state, action, error)
        if action is not None and not self.limit_credit:
            return res
        room = task.model()
        out = []
        for o in res:
            r = o.reward + (self.step_reward if action is None else 0.0)
            if o.truncated and self.limit_credit:
                boxes = o.state[1][1]
                r += self.solve_reward * room.on_targets(boxes) / len(boxes)
            out.append(type(o)(o.prob, o.state, r, o.terminated, o.truncated, o.observation))
        return out

    def expert_action(self, task, s):
        return task.model().expert(s)

    def reasoning(self, task, s):
        room = task.model()
        a = room.expert(s)
        k, n = room.on_targets(s[1]), len(s[1])
        d = room.dist.get(s)
        if d is None:
            return _T_REASON_STUCK.format(k=k, n=n, a=a)
        return _T_REASON.format(k=k, n=n, d=d, a=a)

    def parse(self, task, s, text):
        text = _LIBRARY_FORMS.sub(lambda m: f" {m.group(1) or _ALIASES.get(m.group(2), m.group(2))} ", text.lower())
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
                _T_MOVED,
                _T_PUSHED,
                _T_BLOCKED,
                _T_SOLVED,
                _T_BOARD,
                _T_REASON,
                _T_REASON_STUCK,
                f"invalid action : {_T_INVALID} .",
            )
            + list(MOVES)
            + [WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET]
            + [str(i) for i in range(200)]
        )
