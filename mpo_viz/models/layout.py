"""How a conversation becomes token ids for a policy: the environments' word-level chat layout, or
the chat template of any Hugging Face tokenizer.

A layout has the interface the rollout needs (all ids are plain ``list[int]``):

* ``prompt(messages)`` — the messages before the first assistant turn, ending with the generation
  prompt (the assistant marker);
* ``observation(role, text, final)`` — an environment reply after an assistant turn that ended with
  a stop token, up to and including the next generation prompt (none when ``final``);
* ``action(text)`` — the ids of a scripted turn (content then the stop token; for the oracle);
* ``stop_ids`` — the ids that end an assistant turn; ``text(ids)`` — the turn's text as the
  environment reads it (stop and special tokens dropped); ``tokens(ids)`` — display strings (each
  token decoded on its own: a byte-level ``Ġthe`` shows as ``" the"``).
"""

from __future__ import annotations

from collections.abc import Callable

from mpo_viz.data.token_text import merged_texts, raw_bytes_of
from mpo_viz.envs.tokenizer import BYTE_CHAT_TEMPLATE, CHAT_TEMPLATE, EOT, ChatLayout, UnknownText

__all__ = ["WordLayout", "TemplateLayout", "layout_for", "FALLBACK_TEMPLATE"]

#: used when a Hugging Face tokenizer has no chat template: one message per block, ended by EOS
FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class WordLayout(ChatLayout):
    """The chat layout of :mod:`mpo_viz.envs.tokenizer` (one id per role marker, ``<|eot|>`` ends a
    turn), with the rollout's interface. ``prompt + response`` equals ``apply_chat_template``."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.stop_ids = frozenset([self.eot])


class TemplateLayout:
    """The layout of a Hugging Face tokenizer's chat template (or :data:`FALLBACK_TEMPLATE`).

    Observation ids are the *delta* of two renderings: a short conversation ending with an
    assistant turn, and the same conversation plus the observation (and the next generation
    prompt). The delta starts right after the assistant turn's stop token, so the action ids stay
    exactly what was sampled and the template's own separators (``"\\n"`` after ``<|im_end|>``, the
    tool-role header) are observation tokens. A template that refuses the ``tool`` role is asked
    with ``user`` instead.
    """

    def __init__(self, tokenizer, *, stop_ids=None, template: str | None = None):
        self.tokenizer = tokenizer
        self.template = template or tokenizer.chat_template or FALLBACK_TEMPLATE
        ids = set(stop_ids or ())
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        if not ids:
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path!r}: expected an EOS token or stop_ids to end a turn, found neither"
            )
        self.stop_ids = frozenset(ids)
        self.eot = int(tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else min(ids)
        self._stop_strs = [tokenizer.decode([i]) for i in sorted(self.stop_ids)]
        self._special = frozenset(tokenizer.all_special_ids)
        self._shown: dict[int, str] = {}  # id -> display string (tokens())
        self._raw: Callable[[int], bytes | None] | None = None  # the tokenizer's raw_bytes_of, looked up on first use
        self._raw_known = False
        self.unk = tokenizer.unk_token_id if getattr(tokenizer, "unk_token", None) is not None else None
        #: text of prompts and observations that became the unknown token (a tokenizer that has one)
        self.unknown = UnknownText()

    def _render(self, messages, gen: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen, chat_template=self.template
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _counted(self, source: str, text: str, parts) -> list[int]:
        """``encode(text)``, its unknown tokens counted under ``source`` (``parts``: the messages'
        own texts, which the examples are cut from)."""
        ids = self.encode(text)
        if self.unk is not None and self.unk in ids:
            for part in parts:
                enc = self.tokenizer(part, add_special_tokens=False, return_offsets_mapping=True)
                self.unknown.add(source, part, enc["input_ids"], enc.get("offset_mapping"), self.unk)
        else:
            self.unknown.texts[source] += len(parts)
        return ids

    def prompt(self, messages: list[dict]) -> list[int]:
        return self._counted("prompt", self._render(messages, True), [str(m.get("content", "")) for m in messages])

    def action(self, text: str) -> list[int]:
        return self.encode(text) + [self.eot]

    def observation(self, role: str, text: str, final: bool) -> list[int]:
        base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        head = self._render(base, False)
        cut = max((head.rfind(s) + len(s) for s in self._stop_strs if s and head.rfind(s) >= 0), default=-1)
        if cut < 0:
            raise ValueError(
                f"tokenizer {self.tokenizer.name_or_path!r}: its chat template does not end an "
                f"assistant turn with a stop token ({self._stop_strs}); cannot place observations"
            )
        for r in (role, "user"):
            try:
                full = self._render([*base, {"role": r, "content": text}], not final)
            except Exception:  # jinja: a template that raises on an unknown role
                continue
            if full.startswith(head[:cut]) and text in full[cut:]:
                return self._counted("observation", full[cut:], [text])
        raise ValueError(
            f"tokenizer {self.tokenizer.name_or_path!r}: its chat template renders neither a "
            f"{role!r} nor a 'user' message after an assistant turn"
        )

    def text(self, ids) -> str:
        return self.tokenizer.decode([i for i in ids if i not in self._special], skip_special_tokens=True)

    def _one(self, i: int) -> str:
        t = self._shown.get(i)
        if t is None:
            t = self._shown[i] = self.tokenizer.decode(
                [i], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        return t

    def tokens(self, ids) -> list[str]:
        """Display strings: each token decoded on its own, so byte-level pieces show their text
        (``" the"``, ``"\\n"``) rather than ``Ġthe``/``Ċ``; special tokens as written; a multi-byte
        character split across tokens shows whole on the token that completes it
        (:func:`mpo_viz.data.token_text.merged_texts`)."""
        if not self._raw_known:
            self._raw, self._raw_known = raw_bytes_of(self.tokenizer), True
        return merged_texts([int(i) for i in ids], self._one, self._raw)[0]


def layout_for(tokenizer, *, stop_ids=None):
    """:class:`WordLayout` for an environment tokenizer (its built-in template, word-level or
    byte-level, and ``<|eot|>``), else :class:`TemplateLayout`."""
    if (
        getattr(tokenizer, "chat_template", None) in (CHAT_TEMPLATE, BYTE_CHAT_TEMPLATE)
        and EOT in tokenizer.get_vocab()
    ):
        return WordLayout(tokenizer)
    return TemplateLayout(tokenizer, stop_ids=stop_ids)
