"""``automation``: rooms, keys and a locked exit — an early action decides success many turns later.

The agent starts in room 0 with several keys on the floor; the exit door at the end of a one-way
corridor of ``m`` rooms opens only with the key of the colour the task names. ``take <colour> key``
(room 0 only; holding one key at a time), ``go <direction>`` (the route is given; a correct move
slips with probability ``slip`` and leaves the agent where it was, a turn lost), ``open door`` (in
the last room: the right key wins, any other ends the episode in failure).

Leaving room 0 without the right key is the decisive mistake: nothing later can fix it, yet the
failure only shows at the door, many turns on. Slips make late failures a matter of luck — the
textbook case where group baselines mix luck with skill. The expert takes the right key, walks the
route and opens the door: ``difficulty = m + 2`` turns.

Inner state: ``(room, key)`` with ``key`` ``None`` or a colour, or ``"success"``/``"failure"``.
The noise support is the same 8 actions everywhere: ``take`` each of 3 colours, ``go`` each of 4
directions, ``open door``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpo_viz.envs.base import FAILURE, SUCCESS, TextEnv, words_of
from mpo_viz.options import Option

__all__ = ["AutomationEnv", "AutomationTask"]

COLOURS = ("red", "blue", "green", "yellow")
DIRECTIONS = ("north", "south", "east", "west")

_T_PROMPT = (
    "task : you are in room 0 . keys here : {keys} . the exit door in room {m} opens only "
    "with the {door} key . the way : {route} . commands : take <colour> key , go <direction> , "
    "open door ."
)
_T_TAKE = "you take the {c} key ."
_T_NOKEY = "there is no key here ."
_T_MOVE = "you walk {d} into room {r} . the door closes behind you ."
_T_SLIP = "you slip and stay in room {r} ."
_T_WALL = "you cannot go {d} from room {r} ."
_T_BLOCKED = "the exit door blocks the way ."
_T_NODOOR = "there is no door here ."
_T_OPEN = "the door opens . you are out ."
_T_JAM = "the key does not fit . the door jams for good ."
_T_REASON0 = "the exit needs the {door} key ."
_T_REASON_KEY = "i hold the {c} key ."
_T_REASON_NOKEY = "i hold no key ."
_T_REASON_GO = "i am in room {r} . next : {d} ."
_T_REASON_DOOR = "i am at the exit door ."


@dataclass(frozen=True)
class AutomationTask:
    """``keys`` on the floor of room 0, ``door`` the right colour, ``route`` one direction per room."""

    keys: tuple[str, ...]
    door: str
    route: tuple[str, ...]

    @property
    def rooms(self) -> int:
        return len(self.route)


class AutomationEnv(TextEnv):
    """Rooms, keys and doors (see the module docstring). Extra option: ``slip`` (default 0.1), the
    probability that a correct move fails."""

    name = "automation"
    obs_role = "user"
    verbs = ("take", "go", "open")
    min_difficulty = 3

    options = (Option("slip", 0.1, low=0, high=1, high_open=True, doc="the probability that a correct move fails"),)

    def __init__(self, *, slip: float = 0.1, **kw):
        super().__init__(**kw)
        self.options[0].check(slip)
        self.slip = float(slip)

    def sample_task(self, rng, size):
        m = size - 2
        keys = tuple(rng.sample(COLOURS, 3))
        return AutomationTask(keys, rng.choice(keys), tuple(rng.choice(DIRECTIONS) for _ in range(m)))

    def needed_turns(self, task):
        return task.rooms + 2

    def prompt(self, task):
        return _T_PROMPT.format(keys=" , ".join(task.keys), m=task.rooms, door=task.door, route=" , ".join(task.route))

    def initial_state(self, task):
        return (0, None)

    def actions(self, task, s):
        return tuple(f"take {c} key" for c in task.keys) + tuple(f"go {d}" for d in DIRECTIONS) + ("open door",)

    def accepts(self, task, s):
        return tuple(f"take {c} key" for c in COLOURS) + tuple(f"go {d}" for d in DIRECTIONS) + ("open door",)

    def invalid_message(self, task, s, reason):
        if reason == "unknown command":
            reason = "expected take <colour> key , go <direction> or open door"
        return f"invalid action : {reason} ."

    def outcomes(self, task, s, action):
        room, key = s
        toks = action.split()
        if toks[0] == "take":
            c = toks[1]
            if room == 0 and c in task.keys:
                return [(1.0, (room, c), 0.0, False, _T_TAKE.format(c=c))]
            return [(1.0, s, 0.0, False, _T_NOKEY)]
        if toks[0] == "go":
            d = toks[1]
            if room >= task.rooms:
                return [(1.0, s, 0.0, False, _T_BLOCKED)]
            if d != task.route[room]:
                return [(1.0, s, 0.0, False, _T_WALL.format(d=d, r=room))]
            moved = (1.0 - self.slip, (room + 1, key), self.shaping, False, _T_MOVE.format(d=d, r=room + 1))
            if self.slip == 0.0:
                return [moved]
            return [moved, (self.slip, s, 0.0, False, _T_SLIP.format(r=room))]
        # open door
        if room < task.rooms:
            return [(1.0, s, 0.0, False, _T_NODOOR)]
        if key == task.door:
            return [(1.0, SUCCESS, 1.0, True, _T_OPEN)]
        return [(1.0, FAILURE, 0.0, True, _T_JAM)]

    def expert_action(self, task, s):
        room, key = s
        if room == 0 and key != task.door:
            return f"take {task.door} key"
        if room < task.rooms:
            return f"go {task.route[room]}"
        return "open door"

    def reasoning(self, task, s):
        room, key = s
        held = _T_REASON_NOKEY if key is None else _T_REASON_KEY.format(c=key)
        if room < task.rooms:
            where = _T_REASON_GO.format(r=room, d=task.route[room])
        else:
            where = _T_REASON_DOOR
        return f"{_T_REASON0.format(door=task.door)} {held} {where}"

    def vocabulary(self):
        return (
            self.base_words()
            + words_of(
                _T_PROMPT,
                "<colour> <direction>",
                _T_TAKE,
                _T_NOKEY,
                _T_MOVE,
                _T_SLIP,
                _T_WALL,
                _T_BLOCKED,
                _T_NODOOR,
                _T_OPEN,
                _T_JAM,
                _T_REASON0,
                _T_REASON_KEY,
                _T_REASON_NOKEY,
                _T_REASON_GO,
                _T_REASON_DOOR,
                "invalid action : expected take <colour> key , go <direction> or open door .",
            )
            + list(COLOURS)
            + list(DIRECTIONS)
            + [str(i) for i in range(100)]
        )
