"""The chat-template encoder: a conversation rendered by a local tokenizer's chat template, split
into prompt, action and observation tokens (:class:`ChatEncoder`; the converters of
:mod:`mpo_viz.adapters.chat`, ``trl`` and ``art`` share it).

Invariant: ``prompt_ids + response_ids`` is the template's rendering of the whole conversation,
token for token, except where an assistant message's logged ids replace the template's (token in,
token out); every response token is an action token (``loss_mask`` 1) of exactly one assistant
message or an observation token (``loss_mask`` 0) of the text between two of them.

Tokens. The conversation is rendered with the tokenizer's chat template one message at a time:
``prompt_ids`` is the rendering of the messages before the first assistant turn with the generation
prompt; each assistant turn's **action tokens** are what its message adds after the generation
prompt; everything between two assistant turns (tool replies, role headers, the next generation
prompt) is observation tokens (``loss_mask`` 0). When an assistant message has logged ids, they
are kept (token in, token out) and compared with the template's: a difference is counted as a
retokenization mismatch (logged ids win); template tokens after the logged ids (e.g. a newline
after the end-of-turn token) become observation tokens. The template must render incrementally
(the text of the first k messages is a prefix of the text of the first k+1); a template that
rewrites earlier turns (e.g. strips earlier reasoning) is refused for that row. Template tokens after
the tokenizer's end-of-sequence token in an assistant turn (ChatML's ``"\n"`` after ``<|im_end|>``)
are observation tokens: the model stops at that token and never generates them.

Tool calls. An assistant message's ``tool_calls`` (OpenAI: ``[{"id", "type": "function", "function":
{"name", "arguments": JSON text}}]``; ``content`` may be null) are part of its action tokens. The
arguments are parsed from JSON text into an object (Hugging Face chat templates expect one). When
the tokenizer's chat template renders tool calls (a probe conversation's call name and argument
appear in its rendering), the template renders them; otherwise mpo_viz renders them as plain text
appended to the content, one call per line::

    <tool_call>{"name": "search", "arguments": {"q": "paris"}}</tool_call>

The report says which (``tool_calls``, ``tool_call_rendering``). A null ``content`` is the empty
string; a list of content parts is their ``text`` joined. An assistant turn left with no content
token (only the end-of-turn token) is counted and named in the report's warnings.

Unknown tokens. Prompt, action and observation tokens that are the tokenizer's unknown token are
counted per field, with the source words that became them; the report warns above 1%, and the
conversion is refused when more than half of the action tokens are unknown (the tokenizer does not
cover the text) unless ``allow_unknown=True``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mpo_viz.adapters.conversion import UNKNOWN_REFUSE_SHARE, ConversionReport
from mpo_viz.checks import OptionError
from mpo_viz.data.token_text import load_local_tokenizer, merged_texts, raw_bytes_of

__all__ = ["ChatEncoder", "TemplateError", "UNKNOWN_ROLE", "message_text", "plain_tool_calls", "tool_calls_of"]

#: what :class:`ChatEncoder` does with a message whose role the OpenAI chat API does not have
UNKNOWN_ROLE = ("error", "observation")


class TemplateError(ValueError):
    """The chat template cannot be split into turns for this conversation."""


# keys of a logged message that are mpo_viz's or the log's, never the template's
_LOG_KEYS = ("token_ids", "logprobs", "reward", "trainable")
_PROBE_NAME, _PROBE_ARG = "mpo_viz_probe_tool", "mpo_viz_probe_arg"
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": _PROBE_NAME,
            "description": "probe",
            "parameters": {"type": "object", "properties": {_PROBE_ARG: {"type": "string"}}},
        },
    }
]


def _arguments(raw):
    """A tool call's ``arguments``: JSON text parsed into an object; anything else as it is."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def tool_calls_of(msg: dict, where: str) -> list[dict]:
    """The message's ``tool_calls`` in the Hugging Face template convention (``{"type": "function",
    "id"?, "function": {"name", "arguments": object}}``); ``[]`` when it has none. A call without a
    function name is a :class:`TemplateError` naming ``where``."""
    calls = msg.get("tool_calls")
    if not calls:
        return []
    if not isinstance(calls, list):
        raise TemplateError(
            f"{where}.tool_calls: expected a list of {{type, function: {{name, arguments}}}}, "
            f"found {type(calls).__name__}"
        )
    out = []
    for j, c in enumerate(calls):
        f = c.get("function", c) if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise TemplateError(
                f"{where}.tool_calls[{j}]: expected {{type, function: {{name, arguments}}}} with a "
                f"function name, found {json.dumps(c)[:80]}"
            )
        call = {"type": "function", "function": {"name": f["name"], "arguments": _arguments(f.get("arguments", {}))}}
        if isinstance(c.get("id"), str):
            call["id"] = c["id"]
        out.append(call)
    return out


def plain_tool_calls(calls: list[dict]) -> str:
    """The plain rendering of tool calls (in :func:`tool_calls_of`'s form): one line per call,
    ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, joined by newlines."""
    return "\n".join(
        "<tool_call>"
        + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False)
        + "</tool_call>"
        for c in calls
    )


def message_text(msg: dict, where: str, report) -> str:
    """The text of a message: null is ``""``, a list of parts is their ``text`` joined."""
    c = msg.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        texts = [str(p["text"]) for p in c if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if len(texts) != len(c) and report is not None:
            report.note("content parts without text (images, audio) left out of the tokens (kept in messages_json)")
        return "".join(texts)
    raise TemplateError(
        f"{where}.content: expected text, null or a list of {{type, text}} parts, found {type(c).__name__}"
    )


def _logged(msg: dict):
    """(token ids or None, log-probs or None) logged with an assistant message."""
    ids = msg.get("token_ids")
    lp = msg.get("logprobs")
    lps = None
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        content = lp["content"]
        lps = [float(c["logprob"]) for c in content]
        if (
            ids is None
            and content
            and all(isinstance(c.get("token"), str) and c["token"].startswith("token_id:") for c in content)
        ):
            ids = [int(c["token"].split(":", 1)[1]) for c in content]
    elif isinstance(lp, list):
        lps = [float(x) for x in lp]
    return (None if ids is None else [int(x) for x in ids]), lps


@dataclass
class _Layout:
    """A response being laid out: ids, loss mask, turn ids, log-probs (0 where none); the indexes of
    empty assistant messages; per field ``[unknown, total, words]`` token counts."""

    resp: list = field(default_factory=list)
    mask: list = field(default_factory=list)
    tids: list = field(default_factory=list)
    lps: list = field(default_factory=list)
    have_lp: bool = True
    empty: list = field(default_factory=list)
    unknown: dict = field(
        default_factory=lambda: {"prompt": [0, 0, []], "action": [0, 0, []], "observation": [0, 0, []]}
    )

    def add(self, ids: list, mask: int, turn: int, lp: list | None = None) -> None:
        self.resp += ids
        self.mask += [mask] * len(ids)
        self.tids += [turn] * len(ids)
        self.lps += lp if lp is not None else [0.0] * len(ids)


class ChatEncoder:
    """Splits a conversation rendered by a chat template into prompt, action and observation tokens."""

    def __init__(self, tokenizer, *, allow_unknown: bool = False, unknown_role: str = "error"):
        if unknown_role not in UNKNOWN_ROLE:
            raise OptionError("unknown_role", f"expected one of {list(UNKNOWN_ROLE)}, found {unknown_role!r}")
        self.unknown_role = unknown_role
        if tokenizer is None:
            raise OptionError(
                "tokenizer",
                "expected a local tokenizer folder with a chat template (text must become token ids), found none",
            )
        self.tok = load_local_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
        if not getattr(self.tok, "chat_template", None):
            raise OptionError(
                "tokenizer",
                "expected a tokenizer with a chat template, found one without "
                "(tokenizer_config.json has no chat_template)",
            )
        self.name = getattr(self.tok, "name_or_path", None) or type(self.tok).__name__
        self.allow_unknown = bool(allow_unknown)
        self.unk = self.tok.unk_token_id
        self.eos = self.tok.eos_token_id
        self._special = frozenset(self.tok.all_special_ids)
        self._shown: dict[int, str] = {}  # id -> display string (tokens())
        #: how tool calls become tokens: "template" (the chat template renders them) or "plain"
        self.tool_call_rendering = "template" if self._renders_tool_calls() else "plain"
        #: whether the chat template renders a row's ``tools`` schemas into the prompt
        self.renders_tools = self._renders_tools()
        self._raw = raw_bytes_of(self.tok)

    def _renders_tool_calls(self) -> bool:
        """Whether the chat template renders an assistant message's tool call (name and arguments)."""
        probe = [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "id": "call_0",
                        "function": {"name": _PROBE_NAME, "arguments": {_PROBE_ARG: 7}},
                    }
                ],
            },
        ]
        try:
            text = self.tok.apply_chat_template(probe, tokenize=False)
        except Exception:  # noqa: BLE001 - a template that raises on tool calls does not render them
            return False
        return _PROBE_NAME in text and _PROBE_ARG in text

    def _renders_tools(self) -> bool:
        """Whether the chat template renders ``tools`` schemas (a probe function's name appears)."""
        try:
            text = self.tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, tools=_PROBE_TOOLS)
        except Exception:  # noqa: BLE001 - a template that raises on tools does not render them
            return False
        return _PROBE_NAME in text

    def renders_message(self, clean: list[dict], i: int, tools=None) -> bool:
        """Whether adding message ``i`` of ``clean`` (as :meth:`prepare` gives them) changes the
        rendering (a template may skip roles it does not know)."""
        return self.render(clean[: i + 1], gen=False, tools=tools) != self.render(clean[:i], gen=False, tools=tools)

    def render(self, messages, *, gen: bool, tools=None) -> str:
        kw = {"tools": tools} if tools else {}
        try:
            return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kw)
        except Exception as exc:  # noqa: BLE001 - jinja errors of any kind: the template refuses this conversation
            raise TemplateError(
                f"messages: expected a conversation the chat template renders, found it raises "
                f"{type(exc).__name__}: {str(exc)[:120]}"
            ) from None

    def ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"]) if text else []

    def unknown_words(self, text: str, ids) -> list[str]:
        """The pieces of ``text`` that became the unknown token in ``ids`` (its encoding)."""
        if self.unk is None or self.unk not in ids:
            return []
        try:
            enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        except (NotImplementedError, ValueError):  # slow tokenizers have no offsets
            return []
        return [text[a:b] for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if i == self.unk]

    def is_empty(self, ids) -> bool:
        """Whether action ``ids`` hold no content: only special tokens (the unknown token is content the
        tokenizer did not know, not nothing), or text that is all whitespace."""
        rest = [i for i in ids if i not in self._special or i == self.unk]
        return not rest or not self.tok.decode(rest).strip()

    def prepare(self, messages: list[dict], report=None) -> list[dict]:
        """The messages as the template gets them: log keys dropped, content as text, tool calls in the
        template convention or (``tool_call_rendering == "plain"``) appended to the content as text."""
        out = []
        for i, m in enumerate(messages):
            where = f"messages[{i}]"
            c = {k: v for k, v in m.items() if k not in _LOG_KEYS}
            c["content"] = message_text(m, where, report)
            calls = tool_calls_of(m, where)
            c.pop("tool_calls", None)
            if calls:
                if report is not None:
                    report.tool_calls += len(calls)
                    report.tool_call_rendering = self.tool_call_rendering
                if self.tool_call_rendering == "template":
                    c["tool_calls"] = calls
                else:
                    c["content"] += ("\n" if c["content"] else "") + plain_tool_calls(calls)
            out.append(c)
        return out

    def refuse_unknown(self, report: ConversionReport) -> None:
        """Raise when most action tokens converted so far are the unknown token (unless ``allow_unknown``)."""
        share = report.unknown_share("action")
        if self.allow_unknown or share <= UNKNOWN_REFUSE_SHARE:
            return
        n_unk, n = report.unknown_tokens["action"]
        ex = ", ".join(report.unknown_examples.get("action") or [])
        raise OptionError(
            "tokenizer",
            f"expected a tokenizer that covers the conversations' text, found {n_unk} of {n} "
            f"action tokens ({share:.0%}) mapped to its unknown token {self.tok.unk_token!r}"
            + (f" (e.g. {ex})" if ex else "")
            + "; use the model's own tokenizer, or convert anyway "
            "with allow_unknown=True (mpo-viz convert --allow-unknown-tokens)",
        )

    def encode(self, messages: list[dict], *, actions: list[int], tools=None, report=None, where: str = ""):
        """Token layout of ``messages`` whose assistant messages at indexes ``actions`` are the policy's.

        Returns ``dict(prompt_ids, response_ids, loss_mask, turn_ids, logprobs or None,
        turn_of_message, empty, unknown)`` — ``turn_of_message[i]`` is the turn whose observation (or
        action) message ``i`` is, -1 before the first turn; ``empty`` the indexes of assistant
        messages with no content token; ``unknown[field] = (n_unknown, n_tokens, words)`` for
        ``prompt``, ``action`` and ``observation``.
        """
        clean = self.prepare(messages, report)
        if not actions:
            raise TemplateError("messages: expected at least one assistant message, found none")
        prompt_text, pieces = self._pieces(clean, actions, tools)
        out = _Layout()
        prompt_ids = self.ids(prompt_text)
        self._count(out, "prompt", prompt_ids, prompt_text)
        for piece in pieces:
            ids = self.ids(piece[1])
            if piece[0] == "obs":
                self._count(out, "observation", ids, piece[1])
                out.add(ids, 0, piece[2])
            else:
                self._action(out, ids, piece[1], messages, piece[3], piece[2], report, where)
        turn_of = []
        t = -1
        act_set = {a: j for j, a in enumerate(actions)}
        for i in range(len(messages)):
            t = act_set.get(i, t)
            turn_of.append(t)
        if not out.have_lp and report is not None and any(_logged(messages[a])[1] is not None for a in actions):
            report.note("log-probs logged for some assistant messages only: rollout_logprobs left out for the row")
        return {
            "prompt_ids": prompt_ids,
            "response_ids": out.resp,
            "loss_mask": out.mask,
            "turn_ids": out.tids,
            "logprobs": out.lps if out.have_lp else None,
            "turn_of_message": turn_of,
            "empty": out.empty,
            "unknown": {k: tuple(v) for k, v in out.unknown.items()},
        }

    def _pieces(self, clean: list[dict], actions: list[int], tools) -> tuple[str, list[tuple]]:
        """The prompt's text and the pieces after it, in order: ``("act", text, turn, message
        index)`` for an assistant message of the policy, ``("obs", text, turn)`` for the text the
        template puts between two of them (and after the last) — each piece the difference of two
        renderings of the conversation (``TemplateError`` when the template does not render it
        incrementally). ``clean``: the messages as :meth:`prepare` gives them."""
        pieces: list[tuple] = []
        g0 = self.render(clean[: actions[0]], gen=True, tools=tools)
        prev_end = g0
        for j, a in enumerate(actions):
            gen = self.render(clean[:a], gen=True, tools=tools) if j else g0
            end = self.render(clean[: a + 1], gen=False, tools=tools)
            if not gen.startswith(prev_end):
                raise TemplateError(
                    f"messages[{a}]: expected the chat template to render the conversation "
                    f"incrementally, found the text before message {a} changed when it was added"
                )
            if not end.startswith(gen):
                raise TemplateError(
                    f"messages[{a}]: expected the rendering with message {a} to start with the "
                    "generation prompt, found it does not (template adds or strips text)"
                )
            if j:
                pieces.append(("obs", gen[len(prev_end) :], j - 1))
            pieces.append(("act", end[len(gen) :], j, a))
            prev_end = end
        full = self.render(clean, gen=False, tools=tools)
        if not full.startswith(prev_end):
            raise TemplateError(
                f"messages[{actions[-1] + 1}]: expected the chat template to render the conversation "
                "incrementally, found the text of the last turn changed when later messages were added"
            )
        pieces.append(("obs", full[len(prev_end) :], len(actions) - 1))
        return g0, pieces

    def _count(self, out: _Layout, name: str, ids: list[int], text: str | None = None) -> None:
        """Add ``ids``' unknown tokens to ``out.unknown[name]`` (``prompt``, ``action`` or
        ``observation``; and the words that became them, from ``text``, once the field has any)."""
        u = out.unknown[name]
        u[0] += sum(1 for i in ids if i == self.unk) if self.unk is not None else 0
        u[1] += len(ids)
        if text is not None and u[0]:
            u[2] += self.unknown_words(text, ids)

    def _action(
        self, out: _Layout, ids: list[int], text: str, messages: list[dict], a: int, turn: int, report, where: str
    ) -> None:
        """Add assistant message ``a`` (its rendered ``text`` and ``ids``): its logged ids and
        log-probs when it has them, else the ids up to the tokenizer's end-of-sequence token (the
        model stops there); the template's tokens after them as observation tokens."""
        logged, lp = _logged(messages[a])
        act, rest = ids, []
        if logged is None and self.eos is not None and self.eos in ids[:-1]:
            k = ids.index(self.eos) + 1  # the model stops at its end-of-sequence token
            act, rest = ids[:k], ids[k:]
        if logged is not None:
            if report is not None:
                report.retokenized_messages += 1
            if ids[: len(logged)] == logged:
                act, rest = logged, ids[len(logged) :]
                if rest and report is not None:
                    report.note("template tokens after an assistant message's logged ids kept as observation tokens", 1)
            else:
                first = next((p for p, (x, y) in enumerate(zip(logged, ids)) if x != y), min(len(logged), len(ids)))
                if report is not None:
                    report.mismatch(
                        f"{where}messages[{a}]: logged {len(logged)} ids, the chat template gives "
                        f"{len(ids)} (first difference at token {first})"
                    )
                act = logged
        if not act:
            raise TemplateError(f"messages[{a}]: expected an assistant message with at least one token, found none")
        if self.is_empty(act):
            out.empty.append(a)
        self._count(out, "action", act, text if logged is None else None)
        self._count(out, "observation", rest)
        if lp is not None and len(lp) != len(act):
            if report is not None:
                report.note("log-probs whose count differs from the message's tokens: rollout_logprobs left out")
            lp = None
        out.have_lp = out.have_lp and lp is not None
        out.add(act, 1, turn, lp)
        out.add(rest, 0, turn)

    def record(self, report: ConversionReport, enc_out: dict, traj_id: str) -> None:
        """Add one conversation's empty turns and unknown tokens to ``report``, naming ``traj_id``."""
        report.unknown_token = report.unknown_token or self.tok.unk_token
        for i in enc_out["empty"]:
            report.empty_turn(f"{traj_id} messages[{i}]")
        for name, (n_unk, n, words) in enc_out["unknown"].items():
            report.unknown(name, n_unk, n, words, where=traj_id)

    def _one(self, i: int) -> str:
        t = self._shown.get(i)
        if t is None:
            t = self._shown[i] = self.tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return t

    def tokens(self, ids) -> list[str]:
        """``response_tokens``: each token decoded on its own (a byte-level ``Ġthe`` shows as ``" the"``,
        a word-level token as its word), special tokens as written; a multi-byte character split
        across byte-level tokens shows whole on the token that completes it, ``""`` on the tokens
        before (:func:`mpo_viz.data.token_text.merged_texts`)."""
        return merged_texts([int(i) for i in ids], self._one, self._raw)[0]
