"""``tooluse``: multi-step arithmetic with a calculator tool called one operation at a time.

A task is a start value and ``n`` operations ("add 5", "multiply by 3", ...), every intermediate
value in 0..999. ``calc <x> <op> <c>`` (op one of ``+ - *``, numbers 0..999) returns the result
(or a range error); ``answer <x>`` ends the episode (reward 1 if ``x`` is the final value). The expert
computes step by step and answers: ``difficulty = n + 1`` turns.

Inner state: ``h``, the number of steps done (the expert's next call is ``calc v_h op_{h+1}
c_{h+1}``), or ``"success"``/``"failure"``. A calculation other than the expert's shows its result
but makes no progress. The noise support is ``calc v_h <op> <c>`` for every op and ``c`` in 2..9,
plus ``answer v_h`` (25 actions).
"""

from __future__ import annotations

from dataclasses import dataclass

from mpo_viz.envs.base import FAILURE, SUCCESS, TextEnv, words_of

__all__ = ["ToolUseEnv", "ToolTask"]

MAX_VALUE = 999
OPS = ("+", "-", "*")
CONSTANTS = tuple(range(2, 10))
_OP_WORDS = {"+": "add {c}", "-": "subtract {c}", "*": "multiply by {c}"}

_T_PROMPT = "task : start with {v0} , {steps} . use calc <x> <op> <y> one operation at a time , then answer <number> ."
_T_RESULT = "result : {y} ."
_T_RANGE = "error : result out of range ."
_T_REASON = "the value is {v} . next : {step} ."
_T_REASON_END = "the value is {v} . all steps are done ."
_T_CORRECT = "correct ."
_T_WRONG = "wrong answer ."


@dataclass(frozen=True)
class ToolTask:
    """``values`` v_0..v_n, ``ops`` ((op, c), ...) with v_{i+1} = v_i op c."""

    values: tuple[int, ...]
    ops: tuple[tuple[str, int], ...]

    @property
    def steps(self) -> int:
        return len(self.ops)


def _apply(x: int, op: str, c: int) -> int:
    return x + c if op == "+" else x - c if op == "-" else x * c


class ToolUseEnv(TextEnv):
    """Calculator chains (see the module docstring)."""

    name = "tooluse"
    obs_role = "tool"
    verbs = ("calc", "answer")

    def sample_task(self, rng, size):
        n = size - 1
        v = rng.randint(2, 20)
        values, ops = [v], []
        for _ in range(n):
            choices = [(op, c) for op in OPS for c in CONSTANTS if 0 <= _apply(v, op, c) <= MAX_VALUE]
            op, c = rng.choice(choices)
            v = _apply(v, op, c)
            values.append(v)
            ops.append((op, c))
        return ToolTask(tuple(values), tuple(ops))

    def needed_turns(self, task):
        return task.steps + 1

    def prompt(self, task):
        steps = " , ".join(_OP_WORDS[op].format(c=c) for op, c in task.ops)
        return _T_PROMPT.format(v0=task.values[0], steps=steps)

    def initial_state(self, task):
        return 0

    def actions(self, task, s):
        v = task.values[s]
        return tuple(f"calc {v} {op} {c}" for op in OPS for c in CONSTANTS) + (f"answer {v}",)

    def parse(self, task, s, text):
        cmd = self.command_words(text)
        if cmd is None:
            return None, self.invalid_message(task, s, "no command found")

        def num(w):
            return w.isdigit() and int(w) <= MAX_VALUE and str(int(w)) == w

        if cmd[0] == "calc" and len(cmd) == 4 and num(cmd[1]) and cmd[2] in OPS and num(cmd[3]):
            return " ".join(cmd), ""
        if cmd[0] == "answer" and len(cmd) == 2 and num(cmd[1]):
            return " ".join(cmd), ""
        return None, self.invalid_message(task, s, "expected calc <x> <op> <y> or answer <number>")

    def outcomes(self, task, s, action):
        toks = action.split()
        if toks[0] == "answer":
            ok = int(toks[1]) == task.values[-1]
            return [(1.0, SUCCESS if ok else FAILURE, 1.0 if ok else 0.0, True, _T_CORRECT if ok else _T_WRONG)]
        y = _apply(int(toks[1]), toks[2], int(toks[3]))
        obs = _T_RESULT.format(y=y) if 0 <= y <= MAX_VALUE else _T_RANGE
        if s < task.steps and action == self.expert_action(task, s):
            return [(1.0, s + 1, self.shaping, False, obs)]
        return [(1.0, s, 0.0, False, obs)]

    def expert_action(self, task, s):
        v = task.values[s]
        if s < task.steps:
            op, c = task.ops[s]
            return f"calc {v} {op} {c}"
        return f"answer {v}"

    def reasoning(self, task, s):
        v = task.values[s]
        if s < task.steps:
            op, c = task.ops[s]
            return _T_REASON.format(v=v, step=_OP_WORDS[op].format(c=c))
        return _T_REASON_END.format(v=v)

    def vocabulary(self):
        return (
            self.base_words()
            + words_of(
                _T_PROMPT,
                "<x> <op> <y> <number>",
                _T_RESULT,
                _T_RANGE,
                _T_REASON,
                _T_REASON_END,
                _T_CORRECT,
                _T_WRONG,
                "add subtract multiply by , calc answer",
                "invalid action : expected calc <x> <op> <y> or answer <number> .",
            )
            + list(OPS)
            + [str(i) for i in range(MAX_VALUE + 1)]
        )
