"""OpenAI-style chat logs → trajectory/v1, through a local tokenizer's chat template.

Input: JSONL, one conversation a line::

    {"id": "t0", "group_id": "task-3", "reward": 1.0,
     "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "...", "token_ids": [...], "logprobs": [...]},
                  {"role": "tool", "content": "...", "reward": 0.1}, ...]}

* ``messages`` — roles ``system``/``developer``/``user``/``assistant``/``tool``/``function`` as the
  OpenAI chat API has them (``tool_calls``, ``tool_call_id`` and ``tools`` at the row level are passed
  to the template). Any other role (a typo such as ``"asistant"``) is a row problem naming the
  conversation, the message index and the role; with ``unknown_role="observation"`` the message is
  kept, rendered as written, as observation tokens, and counted and named in the report's warnings.
* ``tools`` — the row's tool schemas (OpenAI: ``[{"type": "function", "function": {"name",
  "description", "parameters"}}]``): passed to the chat template (which renders them into the prompt
  when it supports tools: the report says whether it does), kept in ``extra_json["tools"]`` and
  counted by function name in the report.
* ``sample_idx``, ``step``, ``split``, ``policy_version``, ``stop_reason``, ``truncated``,
  ``bootstrap_value`` at the row level go to the v1 fields of the same name; every other key of the
  row goes to ``extra_json``.
* Trajectory id from ``id``/``traj_id``/``trajectory_id`` (else ``"line{n}"``); group from
  ``group_id``/``group``/``uid``/``prompt_id``/``example_id`` (else identical prompt messages);
  outcome reward from ``reward``/``score`` (else NaN).
* An assistant message may carry the ids the model generated — ``token_ids`` (vLLM
  ``return_token_ids``) or ``logprobs.content[*].token`` of the form ``"token_id:N"`` (vLLM
  ``return_tokens_as_token_ids``) — and its log-probs: a list of floats, or OpenAI's
  ``{"content": [{"token", "logprob"}, ...]}``.
* A ``reward`` on an assistant message is that turn's reward (``turn_rewards``); a ``reward`` on a
  tool/user message is an observation's reward: moved to the assistant turn before it and
  counted (``obs_reward='move'``), or refused (``'error'``).

Tokens, tool calls and unknown tokens: :mod:`mpo_viz.adapters.chat_template` (the
:class:`~mpo_viz.adapters.chat_template.ChatEncoder`, the chat-template encoder this converter and
the TRL/ART adapters share).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterator
from pathlib import Path

from mpo_viz.adapters._common import Collector, check_options, dumps, jsonl_lines, run
from mpo_viz.adapters.chat_template import ChatEncoder, TemplateError, message_text
from mpo_viz.data.schema import SCALAR_FIELDS

__all__ = ["from_chat", "iter_chat", "conversation_row", "encoder_for", "KNOWN_ROLES"]

_ID_KEYS = ("id", "traj_id", "trajectory_id")
_GROUP_KEYS = ("group_id", "group", "uid", "prompt_id", "example_id")
_REWARD_KEYS = ("reward", "score")
#: the roles of the OpenAI chat API; any other role is refused or kept as an observation (``unknown_role``)
KNOWN_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
#: v1 scalar fields a chat row may carry under their own name (the adapter computes the others)
_ROW_SCALARS = tuple(
    k for k in SCALAR_FIELDS if k not in ("traj_id", "group_id", "reward", "num_turns", "messages_json", "extra_json")
)


def _tool_name(t: dict) -> str:
    f = t.get("function", t)
    return str(f.get("name")) if isinstance(f, dict) and f.get("name") else "<unnamed>"


def _tool_schemas_ok(tools) -> bool:
    """Whether ``tools`` is a list of schema objects (OpenAI's ``{"type": "function", "function": {...}}``
    or a bare ``{"name", ...}``)."""
    return isinstance(tools, list) and all(isinstance(t, dict) for t in tools)


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


class _RowProblem(Exception):
    """A conversation that cannot be converted: ``(field, expected, found, layout)`` for
    :meth:`~mpo_viz.adapters._common.Collector.problem`."""


def _check_messages(enc: ChatEncoder, messages, tools) -> list[int]:
    """The indexes of the messages whose role is not in :data:`KNOWN_ROLES` (kept as observations);
    :class:`_RowProblem` for a malformed list, an unknown role under ``unknown_role='error'`` or
    malformed ``tools``."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise _RowProblem("messages", "a list of {role, content} messages", type(messages).__name__, True)
    odd = [i for i, m in enumerate(messages) if m["role"] not in KNOWN_ROLES]
    if odd and enc.unknown_role == "error":
        i = odd[0]
        raise _RowProblem(
            f"messages[{i}].role",
            f"one of {', '.join(KNOWN_ROLES)} (or unknown_role='observation', "
            "mpo-viz convert --unknown-role observation, to keep the message as observation tokens)",
            f"{messages[i]['role']!r}",
            False,
        )
    if tools is not None and not _tool_schemas_ok(tools):
        raise _RowProblem(
            "tools",
            "a list of tool schemas {type: function, function: {name, description, parameters}}",
            repr(tools)[:80],
            True,
        )
    return odd


def _check_rendered(enc: ChatEncoder, messages: list[dict], odd: list[int], tools) -> None:
    """:class:`TemplateError` when the template renders a kept unknown-role message with content as nothing."""
    for i in odd:
        if message_text(messages[i], f"messages[{i}]", None) and not enc.renders_message(
            enc.prepare(messages), i, tools
        ):
            raise TemplateError(
                f"messages[{i}].role: expected a role the chat template renders (a message kept as "
                f"an observation must become tokens), found {messages[i]['role']!r}, which it "
                "renders as nothing"
            )


def _turn_rewards(messages: list[dict], actions: list[int], turn_of: list[int], obs_reward: str, rep):
    """``(turn rewards, whether any message has a reward)``: rewards of assistant messages on their
    turn; of observation messages moved to the turn before (or the first turn), counted in ``rep``;
    :class:`_RowProblem` for a reward that is not a number, or on an observation under ``obs_reward='error'``."""
    turn_r = [0.0] * len(actions)
    has_turn_r = False
    for i, m in enumerate(messages):
        r = m.get("reward")
        if r is not None and not _is_number(r):
            raise _RowProblem(f"messages[{i}].reward", "a number (or null)", repr(r)[:60], False)
        if r is None:
            continue
        has_turn_r = True  # an explicit reward, 0 included, is a reward
        if float(r) == 0:
            continue
        t = turn_of[i]
        if i in actions:
            turn_r[t] += float(r)
        elif obs_reward == "error":
            raise _RowProblem(
                f"messages[{i}].reward",
                "rewards on assistant messages only (obs_reward='error')",
                f"{float(r):g} on a {m['role']} message",
                False,
            )
        elif t >= 0:
            rep.rewards_moved += 1
            turn_r[t] += float(r)
        else:
            rep.rewards_moved_forward += 1
            turn_r[0] += float(r)
    return turn_r, has_turn_r


def conversation_row(
    enc: ChatEncoder,
    col: Collector,
    messages,
    *,
    traj_id: str,
    group_id: str,
    reward,
    actions: list[int] | None = None,
    tools=None,
    line=None,
    row=None,
    obs_reward: str = "move",
    extra: dict | None = None,
    scalars: dict | None = None,
) -> dict | None:
    """One conversation → a v1 row (None, with a problem recorded, if it cannot be converted)."""
    rep = col.report
    try:
        odd = _check_messages(enc, messages, tools)
        if actions is None:
            actions = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        try:
            enc_out = enc.encode(
                messages,
                actions=actions,
                tools=tools,
                report=rep,
                where=f"{'line ' + str(line) if line is not None else 'row ' + str(row)}: ",
            )
            _check_rendered(enc, messages, odd, tools)
        except TemplateError as exc:
            field, _, msg = str(exc).partition(": ")
            exp, _, found = msg.partition(", found ")
            raise _RowProblem(field, exp.removeprefix("expected "), found, True) from None
        if reward is not None and not _is_number(reward):
            raise _RowProblem("reward", "a number (or null: no outcome reward)", repr(reward)[:60], False)
        turn_r, has_turn_r = _turn_rewards(messages, actions, enc_out["turn_of_message"], obs_reward, rep)
    except _RowProblem as exc:
        field, expected, found, layout = exc.args
        col.problem(field, expected, found, line=line, row=row, traj_id=traj_id, layout=layout)
        return None
    enc.record(rep, enc_out, traj_id)
    for i in odd:
        rep.unknown_role(f"{traj_id} messages[{i}] ({messages[i]['role']!r})")
    if tools:
        rep.tool_schemas.update(_tool_name(t) for t in tools)
        rep.tools_rendering = rep.tools_rendering or ("template" if enc.renders_tools else "kept")
        extra = {**(extra or {}), "tools": tools}
    out = {
        **(scalars or {}),
        "traj_id": traj_id,
        "group_id": group_id,
        "prompt_ids": enc_out["prompt_ids"],
        "response_ids": enc_out["response_ids"],
        "loss_mask": enc_out["loss_mask"],
        "turn_ids": enc_out["turn_ids"],
        "reward": math.nan if reward is None else float(reward),
        "num_turns": len(actions),
        "response_tokens": enc.tokens(enc_out["response_ids"]),
        "messages_json": json.dumps(
            [{k: v for k, v in m.items() if k not in ("token_ids", "logprobs")} for m in messages], ensure_ascii=False
        ),
    }
    if has_turn_r:
        out["turn_rewards"] = turn_r
    if enc_out["logprobs"] is not None:
        out["rollout_logprobs"] = enc_out["logprobs"]
    if extra:
        out["extra_json"] = dumps(extra)
    return out


def _first(d: dict, keys):
    return next((d[k] for k in keys if d.get(k) is not None), None)


def encoder_for(tokenizer, col: Collector, allow_unknown: bool = False, unknown_role: str = "error") -> ChatEncoder:
    """The :class:`ChatEncoder` of ``tokenizer`` (a folder, a tokenizer or an encoder), its name in
    the output's metadata and its unknown-token refusal among the collector's checks."""
    enc = (
        tokenizer
        if isinstance(tokenizer, ChatEncoder)
        else ChatEncoder(tokenizer, allow_unknown=allow_unknown, unknown_role=unknown_role)
    )
    col.meta.setdefault("tokenizer", Path(str(enc.name)).name)
    col.checks.append(enc.refuse_unknown)
    return enc


def iter_chat(
    src,
    col: Collector,
    *,
    tokenizer=None,
    obs_reward: str = "move",
    allow_unknown: bool = False,
    unknown_role: str = "error",
) -> Iterator[None]:
    enc = encoder_for(tokenizer, col, allow_unknown, unknown_role)
    groups: dict = {}
    items = jsonl_lines(src, col) if isinstance(src, (str, Path)) else ((None, x) for x in src)
    for i, (line, obj) in enumerate(items):
        col.report.rows_in += 1
        row = None if line is not None else i
        if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
            found = f"keys {sorted(obj)}" if isinstance(obj, dict) else type(obj).__name__
            col.problem(
                "messages",
                "one conversation per line with a 'messages' list of {role, content}",
                found,
                line=line,
                row=row,
            )
            yield
            continue
        msgs = obj["messages"]
        tid = _first(obj, _ID_KEYS)
        tid = str(tid) if tid is not None else (f"line{line}" if line is not None else f"row{i}")
        gid = _first(obj, _GROUP_KEYS)
        if gid is None:
            first_a = next(
                (k for k, m in enumerate(msgs) if isinstance(m, dict) and m.get("role") == "assistant"), len(msgs)
            )
            key = dumps(msgs[:first_a])
            gid = groups.setdefault(key, f"prompt{len(groups)}")
            col.report.note("no group id: group_id from identical messages before the first assistant turn")
        scalars = {k: obj[k] for k in _ROW_SCALARS if obj.get(k) is not None}
        extra = {
            k: v
            for k, v in obj.items()
            if k not in ("messages", "tools", *_ID_KEYS, *_GROUP_KEYS, *_REWARD_KEYS, *scalars)
        }
        out = conversation_row(
            enc,
            col,
            msgs,
            traj_id=tid,
            group_id=str(gid),
            reward=_first(obj, _REWARD_KEYS),
            tools=obj.get("tools"),
            line=line,
            row=row,
            obs_reward=obs_reward,
            extra=extra or None,
            scalars=scalars,
        )
        if out is not None:
            col.add(out, line=line, row_index=row)
        yield


def from_chat(
    src,
    *,
    tokenizer,
    obs_reward: str = "move",
    errors: str = "raise",
    source=None,
    allow_unknown: bool = False,
    unknown_role: str = "error",
):
    """Convert OpenAI-style chat JSONL (a path, or a list of dicts) to v1 with a local tokenizer.

    ``tokenizer``: a local folder (``save_pretrained`` layout, with a chat template) or a loaded
    tokenizer. Returns ``(TrajectoryBatch, ConversionReport)``; the report counts retokenization
    mismatches of logged assistant ids, tool calls and how they were rendered, empty turns, unknown
    tokens per field and trajectories without a reward (its ``warnings`` are also emitted as
    :class:`~mpo_viz.adapters.conversion.ConversionWarning`). Most action tokens unknown: an
    :class:`~mpo_viz.checks.OptionError` unless ``allow_unknown=True``. A message whose role is not
    one of :data:`KNOWN_ROLES` is a row problem, or with ``unknown_role="observation"`` kept as
    observation tokens and named in the report's warnings. An input without any conversation is an
    error.
    """
    check_options(obs_reward=obs_reward, errors=errors)
    if source is None and isinstance(src, (str, Path)):
        source = src
    col = Collector("openai", source=source, errors=errors)
    return run(
        iter_chat(
            src, col, tokenizer=tokenizer, obs_reward=obs_reward, allow_unknown=allow_unknown, unknown_role=unknown_role
        ),
        col,
    )
