"""A word-level tokenizer from an environment's vocabulary, and the chat layout of trajectories.

Every text the environments produce is lower-case words separated by single spaces (punctuation
is a word of its own), so a ``tokenizers`` ``WordLevel`` model with a whitespace pre-tokenizer
covers it exactly; it is wrapped in ``transformers.PreTrainedTokenizerFast`` so that models, the
rollout and ``save_pretrained``/``from_pretrained`` (local folders, offline) all work with it.

Chat layout (one token per role marker, ``<|eot|>`` ends every message)::

    prompt_ids   = <|system|> system… <|eot|> <|user|> task… <|eot|> <|assistant|>
    turn k       = content… <|eot|>                                    loss_mask 1 (action tokens)
    observation  = <|tool|> observation… <|eot|> [<|assistant|>]        loss_mask 0

The role marker of the next assistant turn closes the observation before it (the final
observation has none). The concatenation ``prompt_ids + response_ids`` equals
``tokenizer.apply_chat_template(messages)`` with the built-in template.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

__all__ = ["SPECIAL_TOKENS", "ROLE_TOKENS", "CHAT_TEMPLATE", "build_tokenizer", "ChatLayout"]

PAD, UNK, EOT = "[PAD]", "[UNK]", "<|eot|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>",
               "tool": "<|tool|>"}
SPECIAL_TOKENS = [PAD, UNK, *ROLE_TOKENS.values(), EOT]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|eot|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(words: Iterable[str] | object) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``words`` (or an environment: its ``vocabulary()``).

    Ids: the special tokens first (``[PAD]`` = 0, ``[UNK]`` = 1, role markers, ``<|eot|>``), then
    the words in first-seen order, duplicates dropped. Unknown words map to ``[UNK]``.
    """
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
        tokenizer_object=tok, unk_token=UNK, pad_token=PAD, eos_token=EOT,
        additional_special_tokens=list(ROLE_TOKENS.values()), clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


class ChatLayout:
    """Token ids of the chat layout (module docstring) for one tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast):
        self.tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer
        def ids(token: str) -> int:
            return int(tokenizer.convert_tokens_to_ids(token))  # type: ignore[arg-type]  # one token: one id

        self.eot = ids(EOT)
        self.unk = ids(UNK)
        self.role = {r: ids(t) for r, t in ROLE_TOKENS.items()}

    def encode(self, text: str) -> list[int]:
        """Word ids of ``text`` (no special tokens added)."""
        return self._backend.encode(text, add_special_tokens=False).ids

    def action(self, text: str) -> list[int]:
        """An assistant turn: its content then ``<|eot|>`` (all action tokens)."""
        return self.encode(text) + [self.eot]

    def prompt(self, messages: list[dict]) -> list[int]:
        """The messages before the first assistant turn, then ``<|assistant|>``."""
        out: list[int] = []
        for m in messages:
            out += [self.role[m["role"]], *self.encode(m["content"]), self.eot]
        return out + [self.role["assistant"]]

    def observation(self, role: str, text: str, final: bool) -> list[int]:
        """An environment reply (observation tokens), closed by the next ``<|assistant|>`` unless final."""
        out = [self.role[role], *self.encode(text), self.eot]
        return out if final else out + [self.role["assistant"]]

    def tokens(self, ids) -> list[str]:
        """The token strings of ``ids`` (for ``response_tokens``)."""
        return list(self.tokenizer.convert_ids_to_tokens(list(ids)))
