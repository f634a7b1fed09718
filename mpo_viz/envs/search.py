"""``search``: multi-hop question answering over a generated knowledge base.

A task is a chain ``e_0 -r_1-> e_1 -r_2-> ... -r_n-> e_n`` hidden among distractor entities and
facts. The question asks for "the r_n of the ... of the r_1 of e_0". ``search <entity>`` returns that
entity's facts (the chain fact among distractors); ``answer <entity>`` ends the episode (reward 1 if
it is ``e_n``). The expert needs ``n`` searches and one answer: ``difficulty = n + 1`` turns.

Inner state: ``h``, the number of hops resolved in order (the expert searches ``e_h`` next and
ignores facts it found out of order), or ``"success"``/``"failure"`` after an answer. The noise
support is ``search e`` and ``answer e`` for every entity of the knowledge base (2·N actions).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mpo_viz.envs.base import FAILURE, SUCCESS, TextEnv, words_of
from mpo_viz.options import Option

__all__ = ["SearchEnv", "SearchTask", "NAMES", "RELATIONS"]

_SYL = ["ka", "lo", "mi", "re", "tu", "sa", "ve", "no", "di", "pa", "ri", "zo"]


def _names() -> list[str]:
    rng = random.Random(12345)
    out = sorted({a + b + c for a in _SYL for b in _SYL for c in _SYL})
    rng.shuffle(out)
    return out[:200]


#: the entity names any task draws from (fixed, so the vocabulary is fixed)
NAMES: tuple[str, ...] = tuple(_names())
#: relation words
RELATIONS: tuple[str, ...] = (
    "capital",
    "founder",
    "mentor",
    "rival",
    "neighbor",
    "partner",
    "author",
    "owner",
    "leader",
    "parent",
    "student",
    "twin",
)

_T_PROMPT = "question : what is {q} ? use search <entity> to look up an entity and answer <entity> to reply ."
_T_FACT = "the {r} of {a} is {b} ."
_T_RESULTS = "results for {e} :"
_T_REASON_START = "i need the {r} of {e} ."
_T_REASON_MID = "the {r} of {e} is {b} . i need the {r2} of {b} ."
_T_REASON_END = "the {r} of {e} is {b} . that is the answer ."
_T_CORRECT = "correct ."
_T_WRONG = "wrong answer ."
_T_NOENT = "no entry for that entity ."


@dataclass(frozen=True)
class SearchTask:
    """``chain`` e_0..e_n, ``relations`` r_1..r_n, ``entities`` (all, fixed order), ``facts``:
    subject -> tuple of (relation, object) in display order."""

    chain: tuple[str, ...]
    relations: tuple[str, ...]
    entities: tuple[str, ...]
    facts: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]

    @property
    def hops(self) -> int:
        return len(self.relations)

    def facts_of(self, e: str) -> tuple[tuple[str, str], ...]:
        return dict(self.facts).get(e, ())


class SearchEnv(TextEnv):
    """Multi-hop search (see the module docstring). Extra option: ``distractors`` — entities that
    are not on the chain (default 3)."""

    name = "search"
    obs_role = "tool"
    verbs = ("search", "answer")

    options = (Option("distractors", 3, kind="int", low=0, doc="entities that are not on the chain"),)

    def __init__(self, *, distractors: int = 3, **kw):
        super().__init__(**kw)
        self.options[0].check(distractors)
        if self.difficulty[1] + distractors > len(NAMES):
            raise ValueError(f"difficulty: at most {len(NAMES) - distractors} turns with {distractors} distractors")
        self.distractors = int(distractors)

    # -- task
    def sample_task(self, rng, size):
        n = size - 1
        ents = rng.sample(NAMES, n + 1 + self.distractors)
        chain = tuple(ents[: n + 1])
        rels = tuple(rng.choice(RELATIONS) for _ in range(n))
        facts = {e: [] for e in ents}
        for i in range(n):
            facts[chain[i]].append((rels[i], chain[i + 1]))
        for e in ents:  # one or two distractor facts per entity, never clashing with a chain fact
            used = {r for r, _ in facts[e]}
            for _ in range(rng.randint(1, 2)):
                r = rng.choice([x for x in RELATIONS if x not in used])
                used.add(r)
                facts[e].append((r, rng.choice([x for x in ents if x != e])))
            rng.shuffle(facts[e])
        order = sorted(ents)
        return SearchTask(chain, rels, tuple(order), tuple((e, tuple(facts[e])) for e in order))

    def needed_turns(self, task):
        return task.hops + 1

    def prompt(self, task):
        q = task.chain[0]
        for r in task.relations:
            q = f"the {r} of {q}"
        return _T_PROMPT.format(q=q)

    # -- model
    def initial_state(self, task):
        return 0

    def actions(self, task, s):
        return tuple(f"search {e}" for e in task.entities) + tuple(f"answer {e}" for e in task.entities)

    def accepts(self, task, s):
        return self.actions(task, s)

    def parse(self, task, s, text):
        cmd = self.command_words(text)
        if cmd is None:
            return None, self.invalid_message(task, s, "no command found")
        if len(cmd) != 2:
            return None, self.invalid_message(task, s, "expected search <entity> or answer <entity>")
        if cmd[1] not in task.entities:
            return None, _T_NOENT
        return " ".join(cmd), ""

    def outcomes(self, task, s, action):
        verb, e = action.split()
        if verb == "answer":
            ok = e == task.chain[-1]
            return [(1.0, SUCCESS if ok else FAILURE, 1.0 if ok else 0.0, True, _T_CORRECT if ok else _T_WRONG)]
        obs = " ".join([_T_RESULTS.format(e=e)] + [_T_FACT.format(r=r, a=e, b=b) for r, b in task.facts_of(e)])
        if s < task.hops and e == task.chain[s]:
            return [(1.0, s + 1, self.shaping, False, obs)]
        return [(1.0, s, 0.0, False, obs)]

    def expert_action(self, task, s):
        return f"search {task.chain[s]}" if s < task.hops else f"answer {task.chain[-1]}"

    def reasoning(self, task, s):
        c, r = task.chain, task.relations
        if s == 0:
            return _T_REASON_START.format(r=r[0], e=c[0])
        if s < task.hops:
            return _T_REASON_MID.format(r=r[s - 1], e=c[s - 1], b=c[s], r2=r[s])
        return _T_REASON_END.format(r=r[s - 1], e=c[s - 1], b=c[s])

    def invalid_message(self, task, s, reason):
        return f"invalid action : {reason} ."

    def vocabulary(self):
        return (
            self.base_words()
            + words_of(
                _T_PROMPT.replace("<entity>", "{x}"),
                "<entity> the of",
                _T_FACT,
                _T_RESULTS,
                _T_REASON_START,
                _T_REASON_MID,
                _T_REASON_END,
                _T_CORRECT,
                _T_WRONG,
                _T_NOENT,
                "invalid action : expected search <entity> or answer <entity> .",
            )
            + list(RELATIONS)
            + list(NAMES)
        )
