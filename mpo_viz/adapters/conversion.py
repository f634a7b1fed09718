"""ConversionReport: everything an adapter changed, guessed or refused while converting a log.

One report per conversion. Streaming conversions add the report of every chunk into one
(:meth:`ConversionReport.update`). Every number here is a count of something the adapter did to
the data; nothing is changed without a counter.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from mpo_viz.schema import Problem

__all__ = ["ConversionReport"]

_EXAMPLES = 5  # mismatch examples kept for the printed report


@dataclass
class ConversionReport:
    """What a conversion did. All counts are over the whole input.

    * ``rows_in`` — input records read (batch rows, generator rows, step records, chat lines,
      Parquet rows).
    * ``trajectories`` — trajectory/v1 rows produced (after rejections).
    * ``rejected`` — every input row that was refused and why (:class:`~mpo_viz.schema.Problem`).
    * ``rewards_moved`` — non-zero rewards found on observation tokens (or observation messages)
      and moved to the last action token before them; ``rewards_moved_forward`` — such rewards with
      no action token before them, moved to the first action token after them.
    * ``merged_steps`` — step records merged into multi-turn trajectories; ``kept_as_steps`` —
      step records kept as separate one-turn trajectories, by reason.
    * ``retokenized_messages`` — logged assistant messages whose ids were compared with the chat
      template's; ``retokenization_mismatches`` — how many of them differed (the logged ids are
      kept); ``mismatch_examples`` — where the first few differed.
    * ``fields_dropped`` — source fields not carried into v1, with the reason.
    * ``notes`` — counted guesses and choices (e.g. "group_id from identical prompts").
    """

    framework: str
    source: str | None = None
    rows_in: int = 0
    trajectories: int = 0
    rejected: list[Problem] = field(default_factory=list)
    rewards_moved: int = 0
    rewards_moved_forward: int = 0
    merged_steps: int = 0
    kept_as_steps: Counter = field(default_factory=Counter)
    retokenized_messages: int = 0
    retokenization_mismatches: int = 0
    mismatch_examples: list[str] = field(default_factory=list)
    fields_dropped: dict[str, str] = field(default_factory=dict)
    notes: Counter = field(default_factory=Counter)

    def note(self, text: str, n: int = 1) -> None:
        """Count one occurrence of a guess or choice described by ``text``."""
        self.notes[text] += n

    def drop(self, name: str, why: str) -> None:
        """Record that source field ``name`` is not carried into v1, and why."""
        self.fields_dropped.setdefault(name, why)

    def mismatch(self, where: str) -> None:
        self.retokenization_mismatches += 1
        if len(self.mismatch_examples) < _EXAMPLES:
            self.mismatch_examples.append(where)

    def update(self, other: ConversionReport) -> None:
        """Add the counts of ``other`` (a later chunk of the same conversion) to this report."""
        for name in ("rows_in", "trajectories", "rewards_moved", "rewards_moved_forward", "merged_steps",
                     "retokenized_messages", "retokenization_mismatches"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.rejected.extend(other.rejected)
        self.kept_as_steps.update(other.kept_as_steps)
        self.notes.update(other.notes)
        for k, v in other.fields_dropped.items():
            self.fields_dropped.setdefault(k, v)
        room = _EXAMPLES - len(self.mismatch_examples)
        self.mismatch_examples.extend(other.mismatch_examples[: max(room, 0)])

    def to_dict(self) -> dict:
        """Plain JSON-ready values (sorted keys inside counters, so equal reports dump equally)."""
        return {
            "framework": self.framework,
            "source": self.source,
            "rows_in": self.rows_in,
            "trajectories": self.trajectories,
            "rejected_rows": len({(p.file, p.line, p.row, p.traj_id) for p in self.rejected}),
            "rejected": [p.to_dict() for p in self.rejected],
            "rewards_moved": self.rewards_moved,
            "rewards_moved_forward": self.rewards_moved_forward,
            "merged_steps": self.merged_steps,
            "kept_as_steps": dict(sorted(self.kept_as_steps.items())),
            "retokenized_messages": self.retokenized_messages,
            "retokenization_mismatches": self.retokenization_mismatches,
            "mismatch_examples": list(self.mismatch_examples),
            "fields_dropped": dict(sorted(self.fields_dropped.items())),
            "notes": dict(sorted(self.notes.items())),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def __str__(self) -> str:
        d = self.to_dict()
        lines = [f"converted {d['source'] or '<in memory>'} ({self.framework})",
                 f"  input rows            {self.rows_in}",
                 f"  trajectories written  {self.trajectories}",
                 f"  rejected rows         {d['rejected_rows']}"]
        for p in self.rejected[:10]:
            lines.append(f"    {p}")
        if len(self.rejected) > 10:
            lines.append(f"    ... and {len(self.rejected) - 10} more (--report-json lists all)")
        lines.append(f"  rewards moved         {self.rewards_moved} from observation tokens to the action token before"
                     + (f"; {self.rewards_moved_forward} to the action token after (none before)" if self.rewards_moved_forward else ""))
        if self.merged_steps or self.kept_as_steps:
            lines.append(f"  steps merged          {self.merged_steps} step records into multi-turn trajectories")
            for why, n in sorted(self.kept_as_steps.items()):
                lines.append(f"  kept as one-turn      {n} step records: {why}")
        if self.retokenized_messages or self.retokenization_mismatches:
            lines.append(f"  retokenization        {self.retokenization_mismatches} of {self.retokenized_messages} logged "
                         "assistant messages differ from the chat template's ids (logged ids kept)")
            for ex in self.mismatch_examples:
                lines.append(f"    {ex}")
        for name, why in sorted(self.fields_dropped.items()):
            lines.append(f"  dropped field         {name}: {why}")
        for text, n in sorted(self.notes.items()):
            lines.append(f"  note                  {text} ({n}x)")
        return "\n".join(lines)
