"""ConversionReport: everything an adapter changed, guessed or refused while converting a log.

One report per conversion. Streaming conversions add the report of every chunk into one
(:meth:`ConversionReport.update`). Every number here is a count of something the adapter did to
the data; nothing is changed without a counter.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from mpo_viz.data.schema import Problem

__all__ = ["ConversionReport", "ConversionWarning"]

_EXAMPLES = 5  # mismatch examples kept for the printed report
_NAMED = 20  # conversations named per warning (the counts cover all of them)

#: share of a field's tokens mapped to the unknown token above which the report warns
UNKNOWN_WARN_SHARE = 0.01
#: share of the action tokens mapped to the unknown token above which a conversion is refused
#: (unless ``allow_unknown=True``): the policy's own turns would be mostly ``[UNK]``
UNKNOWN_REFUSE_SHARE = 0.5
#: the fields whose unknown tokens are counted, in report order
UNKNOWN_FIELDS = ("prompt", "action", "observation")
#: how tool calls became tokens (``ConversionReport.tool_call_rendering``)
TOOL_CALL_RENDERINGS = {
    "template": "by the tokenizer's chat template",
    "plain": "as plain text by mpo_viz (the chat template does not render tool_calls): each call a line "
    '\'<tool_call>{"name": ..., "arguments": ...}</tool_call>\' after the message\'s content '
    "(docs/adapters.md)",
}
#: what became of the rows' ``tools`` schemas (``ConversionReport.tools_rendering``)
TOOLS_RENDERINGS = {
    "template": "rendered into the prompt by the tokenizer's chat template and kept in extra_json['tools']",
    "kept": "kept in extra_json['tools'] only: the chat template does not render tools, so the prompt tokens "
    "do not hold them",
}


class ConversionWarning(UserWarning):
    """A conversion finished, but something in its output needs the user's eye (each of
    :attr:`ConversionReport.warnings`; ``mpo-viz convert`` prints them in its report instead)."""


@dataclass
class ConversionReport:
    """What a conversion did. All counts are over the whole input.

    * ``rows_in`` — input records read (batch rows, generator rows, step records, chat lines,
      Parquet rows).
    * ``trajectories`` — trajectory/v1 rows produced (after rejections).
    * ``rejected`` — every input row that was refused and why (:class:`~mpo_viz.data.schema.Problem`).
    * ``rewards_moved`` — non-zero rewards found on observation tokens (or observation messages)
      and moved to the last action token before them; ``rewards_moved_forward`` — such rewards with
      no action token before them, moved to the first action token after them.
    * ``merged_steps`` — step records merged into multi-turn trajectories; ``kept_as_steps`` —
      step records kept as separate one-turn trajectories, by reason.
    * ``retokenized_messages`` — logged assistant messages whose ids were compared with the chat
      template's; ``retokenization_mismatches`` — how many of them differed (the logged ids are
      kept); ``mismatch_examples`` — where the first few differed.
    * ``fields_mapped`` — source fields carried into v1, with the v1 field they became and how
      (adapters that list every field they read: areal); ``fields_dropped`` — source fields not
      carried into v1, with the reason.
    * ``notes`` — counted guesses and choices (e.g. "group_id from identical prompts").
    * ``tool_calls`` — tool calls of assistant messages rendered into action tokens;
      ``tool_call_rendering`` — how (a key of :data:`TOOL_CALL_RENDERINGS`: ``"template"`` or
      ``"plain"``), None when there were none.
    * ``empty_turns`` — assistant turns with no content token (only end-of-turn or special tokens);
      ``empty_turn_examples`` — where (``"traj_id messages[i]"``), the first :data:`_NAMED`.
    * ``unknown_tokens`` — per field (``prompt``, ``action``, ``observation``) ``[unknown, total]``
      token counts, unknown meaning the tokenizer's unknown token (``unknown_token``);
      ``unknown_examples`` — per field, the first few source words that became it, with the
      conversation (tokenizer adapters only: the others receive ids, not text).
    * ``unknown_roles`` — messages whose role is not an OpenAI chat role, kept as observation tokens
      (``unknown_role='observation'``); ``unknown_role_examples`` — ``"traj_id messages[i] ('role')"``,
      the first :data:`_NAMED`.
    * ``tool_schemas`` — the rows' ``tools`` schemas, counted by function name; ``tools_rendering`` —
      what became of them (a key of :data:`TOOLS_RENDERINGS`), None when there were none.
    * ``missing_rewards`` — trajectories with no reward at all (no finite ``reward``, no
      ``turn_rewards``, no ``token_rewards``) or a non-finite one; ``missing_reward_examples`` —
      ``"traj_id (what was found)"``, the first :data:`_NAMED`.

    :attr:`warnings` turns these counts into sentences; ``str(report)`` prints them first.
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
    fields_mapped: dict[str, str] = field(default_factory=dict)
    fields_dropped: dict[str, str] = field(default_factory=dict)
    notes: Counter = field(default_factory=Counter)
    tool_calls: int = 0
    tool_call_rendering: str | None = None
    empty_turns: int = 0
    empty_turn_examples: list[str] = field(default_factory=list)
    unknown_token: str | None = None
    unknown_tokens: dict[str, list[int]] = field(default_factory=dict)
    unknown_examples: dict[str, list[str]] = field(default_factory=dict)
    missing_rewards: int = 0
    missing_reward_examples: list[str] = field(default_factory=list)
    unknown_roles: int = 0
    unknown_role_examples: list[str] = field(default_factory=list)
    tool_schemas: Counter = field(default_factory=Counter)
    tools_rendering: str | None = None

    def note(self, text: str, n: int = 1) -> None:
        """Count one occurrence of a guess or choice described by ``text``."""
        self.notes[text] += n

    def mapped(self, name: str, to: str) -> None:
        """Record that source field ``name`` became ``to`` (a v1 field and how)."""
        self.fields_mapped.setdefault(name, to)

    def drop(self, name: str, why: str) -> None:
        """Record that source field ``name`` is not carried into v1, and why."""
        self.fields_dropped.setdefault(name, why)

    def mismatch(self, where: str) -> None:
        self.retokenization_mismatches += 1
        if len(self.mismatch_examples) < _EXAMPLES:
            self.mismatch_examples.append(where)

    def empty_turn(self, where: str) -> None:
        """Count an assistant turn without content tokens at ``where`` (``"traj_id messages[i]"``)."""
        self.empty_turns += 1
        if len(self.empty_turn_examples) < _NAMED:
            self.empty_turn_examples.append(where)

    def unknown_role(self, where: str) -> None:
        """Count a message with an unknown role kept as observation tokens, at ``where``."""
        self.unknown_roles += 1
        if len(self.unknown_role_examples) < _NAMED:
            self.unknown_role_examples.append(where)

    def missing_reward(self, traj_id: str, found: str) -> None:
        """Count a trajectory without a (finite) reward; ``found`` says what it had (``"no reward"``,
        ``"reward inf"``)."""
        self.missing_rewards += 1
        if len(self.missing_reward_examples) < _NAMED:
            self.missing_reward_examples.append(f"{traj_id} ({found})")

    def unknown(self, field_name: str, n_unknown: int, n_total: int, words=(), where: str = "") -> None:
        """Count ``n_unknown`` of ``n_total`` tokens of ``field_name`` mapped to the unknown token;
        ``words`` are the source texts that became it (examples kept, ``where`` names the conversation)."""
        c = self.unknown_tokens.setdefault(field_name, [0, 0])
        c[0] += int(n_unknown)
        c[1] += int(n_total)
        ex = self.unknown_examples.setdefault(field_name, [])
        for w in words:
            if len(ex) >= _EXAMPLES:
                break
            text = f"{w!r} ({where})" if where else repr(w)
            if text not in ex:
                ex.append(text)

    def unknown_share(self, field_name: str) -> float:
        """Share of ``field_name``'s tokens that are the unknown token (0 when none were counted)."""
        n_unk, n = self.unknown_tokens.get(field_name, (0, 0))
        return n_unk / n if n else 0.0

    @property
    def warnings(self) -> list[str]:
        """What a user must know before trusting the output, one sentence each (empty when nothing)."""
        out = []
        if self.empty_turns:
            out.append(
                f"{self.empty_turns} assistant turn(s) hold no content token (only the end-of-turn token): "
                f"{', '.join(self.empty_turn_examples)}"
                + (
                    f" and {self.empty_turns - len(self.empty_turn_examples)} more"
                    if self.empty_turns > len(self.empty_turn_examples)
                    else ""
                )
                + "; their message had no content (and no tool call) to train on"
            )
        for name in UNKNOWN_FIELDS:
            share = self.unknown_share(name)
            if share > UNKNOWN_WARN_SHARE:
                n_unk, n = self.unknown_tokens[name]
                ex = self.unknown_examples.get(name) or []
                out.append(
                    f"{n_unk} of {n} {name} tokens ({share:.1%}) are the unknown token {self.unknown_token!r}"
                    + (f", e.g. {', '.join(ex)}" if ex else "")
                    + ": the tokenizer does not cover this text (use the model's own tokenizer)"
                )
        if self.unknown_roles:
            out.append(
                f"{self.unknown_roles} message(s) with a role that is not an OpenAI chat role kept as observation "
                f"tokens (loss_mask 0): {', '.join(self.unknown_role_examples)}"
                + (
                    f" and {self.unknown_roles - len(self.unknown_role_examples)} more"
                    if self.unknown_roles > len(self.unknown_role_examples)
                    else ""
                )
                + "; a misspelt 'assistant' is a model turn lost to the observations"
            )
        if self.missing_rewards:
            out.append(
                f"{self.missing_rewards} trajectories have no finite reward: "
                f"{', '.join(self.missing_reward_examples)}"
                + (
                    f" and {self.missing_rewards - len(self.missing_reward_examples)} more"
                    if self.missing_rewards > len(self.missing_reward_examples)
                    else ""
                )
                + "; estimators count their score as 0 (group estimators warn)"
            )
        return out

    def update(self, other: ConversionReport) -> None:
        """Add the counts of ``other`` (a later chunk of the same conversion) to this report."""
        for name in (
            "rows_in",
            "trajectories",
            "rewards_moved",
            "rewards_moved_forward",
            "merged_steps",
            "retokenized_messages",
            "retokenization_mismatches",
            "tool_calls",
            "empty_turns",
            "missing_rewards",
            "unknown_roles",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.tool_call_rendering = self.tool_call_rendering or other.tool_call_rendering
        self.tools_rendering = self.tools_rendering or other.tools_rendering
        self.tool_schemas.update(other.tool_schemas)
        self.unknown_token = self.unknown_token or other.unknown_token
        for name, (n_unk, n) in other.unknown_tokens.items():
            self.unknown(name, n_unk, n)
            ex = self.unknown_examples.setdefault(name, [])
            ex.extend(e for e in other.unknown_examples.get(name, []) if e not in ex and len(ex) < _EXAMPLES)
        for mine, theirs in (
            (self.empty_turn_examples, other.empty_turn_examples),
            (self.missing_reward_examples, other.missing_reward_examples),
            (self.unknown_role_examples, other.unknown_role_examples),
        ):
            mine.extend(theirs[: max(_NAMED - len(mine), 0)])
        self.rejected.extend(other.rejected)
        self.kept_as_steps.update(other.kept_as_steps)
        self.notes.update(other.notes)
        for k, v in other.fields_mapped.items():
            self.fields_mapped.setdefault(k, v)
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
            "fields_mapped": dict(sorted(self.fields_mapped.items())),
            "fields_dropped": dict(sorted(self.fields_dropped.items())),
            "notes": dict(sorted(self.notes.items())),
            "tool_calls": self.tool_calls,
            "tool_call_rendering": self.tool_call_rendering,
            "empty_turns": self.empty_turns,
            "empty_turn_examples": list(self.empty_turn_examples),
            "unknown_token": self.unknown_token,
            "unknown_tokens": {k: list(v) for k, v in sorted(self.unknown_tokens.items())},
            "unknown_examples": {k: list(v) for k, v in sorted(self.unknown_examples.items())},
            "missing_rewards": self.missing_rewards,
            "missing_reward_examples": list(self.missing_reward_examples),
            "unknown_roles": self.unknown_roles,
            "unknown_role_examples": list(self.unknown_role_examples),
            "tool_schemas": dict(sorted(self.tool_schemas.items())),
            "tools_rendering": self.tools_rendering,
            "warnings": self.warnings,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def __str__(self) -> str:
        d = self.to_dict()
        lines = [
            f"converted {d['source'] or '<in memory>'} ({self.framework})",
            f"  input rows            {self.rows_in}",
            f"  trajectories written  {self.trajectories}",
            f"  rejected rows         {d['rejected_rows']}",
        ]
        lines[1:1] = [f"  WARNING               {w}" for w in self.warnings]
        for p in self.rejected[:10]:
            lines.append(f"    {p}")
        if len(self.rejected) > 10:
            lines.append(f"    ... and {len(self.rejected) - 10} more (--report-json lists all)")
        lines.append(
            f"  rewards moved         {self.rewards_moved} from observation tokens to the action token before"
            + (
                f"; {self.rewards_moved_forward} to the action token after (none before)"
                if self.rewards_moved_forward
                else ""
            )
        )
        if self.merged_steps or self.kept_as_steps:
            lines.append(f"  steps merged          {self.merged_steps} step records into multi-turn trajectories")
            for why, n in sorted(self.kept_as_steps.items()):
                lines.append(f"  kept as one-turn      {n} step records: {why}")
        if self.retokenized_messages or self.retokenization_mismatches:
            lines.append(
                f"  retokenization        {self.retokenization_mismatches} of {self.retokenized_messages} logged "
                "assistant messages differ from the chat template's ids (logged ids kept)"
            )
            for ex in self.mismatch_examples:
                lines.append(f"    {ex}")
        if self.tool_calls:
            lines.append(
                f"  tool calls            {self.tool_calls} rendered into action tokens "
                f"{TOOL_CALL_RENDERINGS.get(self.tool_call_rendering or '', self.tool_call_rendering)}"
            )
        if self.tool_schemas:
            names = ", ".join(f"{k} ({n}x)" for k, n in sorted(self.tool_schemas.items()))
            lines.append(
                f"  tool schemas          {sum(self.tool_schemas.values())} in the rows' tools: {names}; "
                f"{TOOLS_RENDERINGS.get(self.tools_rendering or '', self.tools_rendering)}"
            )
        if self.unknown_tokens:
            shares = ", ".join(
                f"{k} {self.unknown_tokens[k][0]} of {self.unknown_tokens[k][1]}"
                for k in UNKNOWN_FIELDS
                if k in self.unknown_tokens
            )
            lines.append(f"  unknown tokens        {shares} ({self.unknown_token!r})")
        for name, to in sorted(self.fields_mapped.items()):
            lines.append(f"  mapped field          {name} -> {to}")
        for name, why in sorted(self.fields_dropped.items()):
            lines.append(f"  dropped field         {name}: {why}")
        for text, n in sorted(self.notes.items()):
            lines.append(f"  note                  {text} ({n}x)")
        return "\n".join(lines)
