"""A word-level tokenizer from an environment's vocabulary, and the chat layout of trajectories.

Every text the environments produce is lower-case words separated by single spaces (punctuation
is a word of its own), so a ``tokenizers`` ``WordLevel`` model with a whitespace pre-tokenizer
covers it exactly; it is wrapped in ``transformers.PreTrainedTokenizerFast`` so that models, the
rollout and ``save_pretrained``/``from_pretrained`` (local folders, offline) all work with it.

An environment whose texts are not known word by word (a third-party game) asks for a byte-level
tokenizer instead (``tokenizer_kind = "bytes"``): the 256 bytes and the same special tokens, built
locally (a ``tokenizers`` byte-level BPE without merges), so every text tokenizes and decodes back
exactly. Text that a word-level tokenizer maps to ``[UNK]`` is never dropped silently: each
:class:`ChatLayout` counts it per source (:class:`UnknownText`), and the rollout and ``generate``
report it with examples (:class:`UnknownTextWarning`).

Chat layout (one token per role marker, ``<|eot|>`` ends every message)::

    prompt_ids   = <|system|> system… <|eot|> <|user|> task… <|eot|> <|assistant|>
    turn k       = content… <|eot|>                                    loss_mask 1 (action tokens)
    observation  = <|tool|> observation… <|eot|> [<|assistant|>]        loss_mask 0

The role marker of the next assistant turn closes the observation before it (the final
observation has none). The concatenation ``prompt_ids + response_ids`` equals
``tokenizer.apply_chat_template(messages)`` with the built-in template.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE, WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

from mpo_viz.envs.base import tokenizer_kind_of

__all__ = [
    "SPECIAL_TOKENS",
    "ROLE_TOKENS",
    "CHAT_TEMPLATE",
    "BYTE_CHAT_TEMPLATE",
    "build_tokenizer",
    "byte_tokenizer",
    "ChatLayout",
    "UnknownText",
    "UnknownTextWarning",
    "tokenizer_kind_of",
]

PAD, UNK, EOT = "[PAD]", "[UNK]", "<|eot|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>", "tool": "<|tool|>"}
SPECIAL_TOKENS = [PAD, UNK, *ROLE_TOKENS.values(), EOT]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|eot|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
#: the chat template of the byte-level tokenizer: no spaces around the content (spaces are bytes there)
BYTE_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
#: the sources of text :class:`UnknownText` counts
UNKNOWN_SOURCES = ("prompt", "observation")


class UnknownTextWarning(UserWarning):
    """Text of the environment that the policy's tokenizer mapped to its unknown token."""


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer built here (no download): the special tokens (``[PAD]`` = 0, role
    markers, ``<|eot|>``; no ``[UNK]``: nothing is unknown) then the 256 bytes, as a byte-level BPE
    without merges. Any text encodes and decodes back exactly; the chat template is
    :data:`BYTE_CHAT_TEMPLATE`."""
    special = [t for t in SPECIAL_TOKENS if t != UNK]
    vocab = {t: i for i, t in enumerate(special)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(BPE(vocab, [], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(special)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOT,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = BYTE_CHAT_TEMPLATE
    return fast


def build_tokenizer(words: Iterable[str] | object) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``words`` (or an environment: its ``vocabulary()``; an
    environment that asks for bytes, :func:`tokenizer_kind_of`, gets :func:`byte_tokenizer`).

    Ids: the special tokens first (``[PAD]`` = 0, ``[UNK]`` = 1, role markers, ``<|eot|>``), then
    the words in first-seen order, duplicates dropped. Unknown words map to ``[UNK]`` (counted by
    the layout: :class:`UnknownText`).
    """
    is_env = hasattr(words, "vocabulary") or hasattr(words, "tokenizer_kind") or hasattr(words, "step")
    if is_env and tokenizer_kind_of(words) == "bytes":
        return byte_tokenizer()
    listed: Iterable[str] = words.vocabulary() if hasattr(words, "vocabulary") else words  # type: ignore[assignment]
    vocab: dict[str, int] = {}
    for w in [*SPECIAL_TOKENS, *listed]:
        if not isinstance(w, str) or not w or any(c.isspace() for c in w):
            raise ValueError(f"words: expected non-empty strings without whitespace, found {w!r}")
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=UNK,
        pad_token=PAD,
        eos_token=EOT,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


class UnknownText:
    """Text a tokenizer mapped to its unknown token, counted per source (``"prompt"``: the messages
    before the first turn; ``"observation"``: the environment's replies).

    Per source: ``texts`` (texts tokenized), ``hit`` (texts with an unknown token), ``tokens``
    (unknown tokens) and ``words`` (a ``Counter`` of the pieces of text that became them). A layout
    keeps one for its life; :meth:`copy` and :meth:`since` give what one rollout added."""

    def __init__(self):
        self.texts: Counter = Counter()
        self.hit: Counter = Counter()
        self.tokens: Counter = Counter()
        self.words: dict[str, Counter] = {s: Counter() for s in UNKNOWN_SOURCES}

    def add(self, source: str, text: str, ids, offsets, unk: int | None) -> None:
        """Count one encoded text (``offsets``: each id's character span in ``text``)."""
        self.texts[source] += 1
        if unk is None:
            return
        bad = [j for j, i in enumerate(ids) if i == unk]
        if not bad:
            return
        self.hit[source] += 1
        self.tokens[source] += len(bad)
        words = self.words.setdefault(source, Counter())
        for j in bad:
            a, b = offsets[j] if offsets is not None and j < len(offsets) else (0, 0)
            words[text[a:b] or "?"] += 1

    def copy(self) -> UnknownText:
        out = UnknownText()
        out.texts, out.hit, out.tokens = Counter(self.texts), Counter(self.hit), Counter(self.tokens)
        out.words = {s: Counter(c) for s, c in self.words.items()}
        return out

    def since(self, mark: UnknownText) -> UnknownText:
        """What was counted after ``mark`` (a :meth:`copy` taken earlier)."""
        out = UnknownText()
        out.texts, out.hit, out.tokens = self.texts - mark.texts, self.hit - mark.hit, self.tokens - mark.tokens
        out.words = {s: c - mark.words.get(s, Counter()) for s, c in self.words.items()}
        return out

    def __bool__(self) -> bool:
        return sum(self.tokens.values()) > 0

    def summary(self, examples: int = 5) -> dict:
        """Per source with unknown tokens: ``tokens``, ``texts`` (with one), ``of`` (texts seen) and
        ``examples`` (the most frequent pieces, with their counts) — the ``unknown_text`` metadata."""
        return {
            s: {
                "tokens": int(self.tokens[s]),
                "texts": int(self.hit[s]),
                "of": int(self.texts[s]),
                "examples": dict(self.words.get(s, Counter()).most_common(examples)),
            }
            for s in UNKNOWN_SOURCES
            if self.tokens[s]
        }

    def line(self, tokenizer_name: str = "the tokenizer") -> str:
        """One line: where text was lost, how much, examples, and what to do about it."""
        parts = []
        for s, d in self.summary().items():
            ex = ", ".join(f"{w!r} ({n})" for w, n in d["examples"].items())
            parts.append(f"{s}: {d['tokens']} tokens in {d['texts']} of {d['of']} texts (e.g. {ex})")
        return (
            f"{tokenizer_name} mapped text of the environment to its unknown token: "
            + "; ".join(parts)
            + ". The policy cannot read it: add the words to the environment's vocabulary(), or set its "
            "tokenizer_kind = 'bytes' (docs/environments.md)"
        )


class ChatLayout:
    """Token ids of the chat layout (module docstring) for one tokenizer; ``unknown`` counts the text
    of prompts and observations that became the unknown token (:class:`UnknownText`)."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast):
        self.tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer

        def ids(token: str) -> int:
            return int(tokenizer.convert_tokens_to_ids(token))  # type: ignore[arg-type]  # one token: one id

        self.eot = ids(EOT)
        self.unk = tokenizer.unk_token_id if tokenizer.unk_token is not None else None
        self.role = {r: ids(t) for r, t in ROLE_TOKENS.items()}
        self.bytes = tokenizer.chat_template == BYTE_CHAT_TEMPLATE
        self.unknown = UnknownText()
        self._special = frozenset(tokenizer.all_special_ids)

    def encode(self, text: str) -> list[int]:
        """Word ids of ``text`` (no special tokens added)."""
        return self._backend.encode(text, add_special_tokens=False).ids

    def _counted(self, source: str, text: str) -> list[int]:
        enc = self._backend.encode(text, add_special_tokens=False)
        ids = enc.ids
        self.unknown.add(source, text, ids, enc.offsets if self.unk in ids else None, self.unk)
        return ids

    def action(self, text: str) -> list[int]:
        """An assistant turn: its content then ``<|eot|>`` (all action tokens)."""
        return self.encode(text) + [self.eot]

    def text(self, ids) -> str:
        """The text of ``ids`` as the environment reads it (special tokens dropped)."""
        return str(self.tokenizer.decode([i for i in ids if i not in self._special]))

    def prompt(self, messages: list[dict]) -> list[int]:
        """The messages before the first assistant turn, then ``<|assistant|>``."""
        out: list[int] = []
        for m in messages:
            out += [self.role[m["role"]], *self._counted("prompt", m["content"]), self.eot]
        return out + [self.role["assistant"]]

    def observation(self, role: str, text: str, final: bool) -> list[int]:
        """An environment reply (observation tokens), closed by the next ``<|assistant|>`` unless final."""
        out = [self.role[role], *self._counted("observation", text), self.eot]
        return out if final else out + [self.role["assistant"]]

    def tokens(self, ids) -> list[str]:
        """The token strings of ``ids`` (for ``response_tokens``; a byte-level tokenizer's decoded
        one by one, so a space shows as ``" "`` rather than ``Ġ``)."""
        if self.bytes:
            return [str(self.tokenizer.decode([int(i)], clean_up_tokenization_spaces=False)) for i in ids]
        return list(self.tokenizer.convert_ids_to_tokens(list(ids)))
