"""Text instead of ids: decode ``response_ids`` with a local tokenizer when a batch has no
``response_tokens``.

:func:`load_local_tokenizer` opens a tokenizer folder offline (``local_files_only``; nothing is
downloaded): a Hugging Face folder (``tokenizer.json`` or the files ``AutoTokenizer`` reads), or a
bare ``tokenizer.json`` of the ``tokenizers`` library. :func:`tokenizer_decoder` turns it into the
``ids -> display strings`` callable the strip takes (``tokens=`` of the views, ``--tokenizer`` of
``mpo-viz report``): each token decoded on its own, so byte-level pieces show their text (``" the"``,
``"\\n"``) rather than ``Ġthe``.

Split characters. A byte-level tokenizer may split one multi-byte UTF-8 character (``☀`` is
``e2 98 80``) across tokens; decoded on its own each piece is ``"\\ufffd"``. :func:`merged_texts`
decodes such runs byte by byte (:func:`raw_bytes_of` gives a token's bytes): the character shows
once, whole, on the token that completes it, and the tokens before it show ``""``;
:func:`char_notes` writes the hover note of each such token (the raw pieces: each token's id and
bytes). Tokens that decode to complete text on their own are left exactly as decoded.

Invariant: nothing here reaches the network; :func:`load_local_tokenizer` is the one loader of a
local tokenizer (the views, the chat converters and the environments' saved tokenizers use it).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

from mpo_viz.checks import OptionError

__all__ = [
    "load_local_tokenizer",
    "tokenizer_decoder",
    "merged_texts",
    "raw_bytes_of",
    "char_notes",
    "guess_split_groups",
]

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte fallback
_REPLACEMENT = "\ufffd"


def load_local_tokenizer(path):
    """The tokenizer in folder (or ``tokenizer.json`` file) ``path``, loaded without network — the
    one loader of a local tokenizer (the views' ``tokens=``, the chat converters, the environments'
    saved tokenizers).

    A folder with a ``tokenizer.json`` gives a ``PreTrainedTokenizerFast`` (chat template and special
    tokens from ``tokenizer_config.json``; no model-specific class is needed, and the auto classes'
    imports, seconds, are skipped); another folder whatever ``AutoTokenizer`` makes of it; a bare
    ``tokenizer.json`` file a ``tokenizers.Tokenizer``. Raises :class:`~mpo_viz.checks.OptionError`
    (a ``ValueError``) for ``tokenizer``, naming the path, when it is missing or holds no tokenizer
    that loads.
    """
    # tokenizers and transformers are imported here, not at the top: `import mpo_viz` stays fast
    p = Path(path)
    if not p.exists():
        raise OptionError("tokenizer", f"expected a local tokenizer folder, found no such path {str(p)!r}")
    if p.is_file():
        if p.suffix != ".json":
            raise OptionError(
                "tokenizer", f"expected a local tokenizer folder or a tokenizer.json file, found {str(p)!r}"
            )
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(p))
    try:
        if (p / "tokenizer.json").is_file():
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(str(p), local_files_only=True)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any loading failure is a folder without a usable tokenizer
        files = sorted(x.name for x in p.iterdir())[:8]
        raise OptionError(
            "tokenizer",
            f"expected a tokenizer folder (tokenizer.json, or the files AutoTokenizer "
            f"reads), found {str(p)!r} that does not load: it holds no tokenizer that loads offline "
            f"(files: {files}; {type(exc).__name__}: {str(exc)[:120]})",
        ) from None


def tokenizer_decoder(tokenizer):
    """A callable ``ids -> list of display strings`` from a tokenizer object or a local path (split
    characters joined: :func:`merged_texts`); its ``with_notes(ids)`` also gives the hover notes
    (:func:`char_notes`)."""
    tok = load_local_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
    if hasattr(tok, "convert_ids_to_tokens"):  # transformers tokenizer

        def one(i):
            return tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    elif hasattr(tok, "decode") and hasattr(tok, "id_to_token"):  # tokenizers.Tokenizer

        def one(i):
            return tok.decode([i], skip_special_tokens=False)
    else:
        raise ValueError(
            f"tokenizer: expected a tokenizer (transformers or tokenizers) or a folder, found {type(tok).__name__}"
        )
    seen: dict[int, str] = {}
    raw = raw_bytes_of(tok)

    def cached(i: int) -> str:
        s = seen.get(i)
        if s is None:
            s = seen[i] = one(i)
        return s

    def with_notes(ids) -> tuple[list[str], dict[int, str]]:
        ids = [int(i) for i in ids]
        texts, groups = merged_texts(ids, cached, raw)
        return texts, char_notes(texts, ids, groups, raw)

    def decode(ids):
        return merged_texts([int(i) for i in ids], cached, raw)[0]

    decode.tokenizer = tok
    decode.with_notes = with_notes
    return decode


@cache
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-unicode table (byte-level BPE writes byte b as this character)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def _decoder_types(backend) -> set[str]:
    """The types of a ``tokenizers`` backend's decoder (a Sequence lists its members)."""
    dec = getattr(backend, "decoder", None)
    if dec is None:
        return set()
    try:
        conf = json.loads(dec.__getstate__())
    except Exception:  # noqa: BLE001 - an opaque decoder: no byte view of its tokens
        return set()
    parts = conf.get("decoders", [conf]) if conf.get("type") == "Sequence" else [conf]
    return {str(d.get("type")) for d in parts}


def raw_bytes_of(tok) -> Callable[[int], bytes | None] | None:
    """``id -> the token's bytes`` for a byte-level BPE (``ByteLevel`` decoder) or byte-fallback
    (``<0xNN>`` tokens) tokenizer — a transformers tokenizer or a ``tokenizers.Tokenizer`` — else
    None. Added and special tokens give their text's bytes; a token with no byte view gives None."""
    backend = getattr(tok, "backend_tokenizer", None) or (tok if hasattr(tok, "id_to_token") else None)
    kinds = _decoder_types(backend) if backend is not None else set()
    byte_level, fallback = "ByteLevel" in kinds, "ByteFallback" in kinds
    if not (byte_level or fallback):
        return None
    to_str = tok.convert_ids_to_tokens if hasattr(tok, "convert_ids_to_tokens") else backend.id_to_token  # type: ignore[union-attr]
    added = getattr(tok, "added_tokens_decoder", None)
    if added is None and hasattr(backend, "get_added_tokens_decoder"):
        added = backend.get_added_tokens_decoder()  # type: ignore[union-attr]
    added_ids = set(added or {})
    table = _byte_decoder()

    def raw(i: int) -> bytes | None:
        s = to_str(int(i))
        if s is None:
            return None
        if int(i) in added_ids:
            return s.encode("utf-8")
        m = _BYTE_TOKEN.fullmatch(s) if fallback else None
        if m:
            return bytes([int(m.group(1), 16)])
        if byte_level:
            try:
                return bytes(table[c] for c in s)
            except KeyError:
                return None
        return None

    return raw


def merged_texts(
    ids: Sequence[int], one: Callable[[int], str], raw: Callable[[int], bytes | None] | None
) -> tuple[list[str], list[tuple[int, int]]]:
    """Display texts of ``ids`` (``one``: a token decoded on its own) with split characters joined.

    Tokens whose own decoding holds ``"\\ufffd"`` and that have bytes (``raw``) are fed to an
    incremental UTF-8 decoder; every other token feeds its decoded text. A token shows the
    characters it completes (``""`` while it only starts one); bytes that never form a character
    show as ``"\\ufffd"`` on the token where that becomes known (the last token for a cut-off tail).
    Returns ``(texts, groups)``: ``groups`` lists ``(first, last)`` token indexes of every character
    that took bytes from more than one token (``last`` shows it). Without such tokens ``texts`` is
    ``[one(i) for i in ids]`` exactly.
    """
    solo = [one(i) for i in ids]
    if raw is None or not any(_REPLACEMENT in t for t in solo):
        return solo, []
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    texts: list[str] = []
    groups: list[tuple[int, int]] = []
    start = None  # the token whose bytes the decoder holds, incomplete
    for k, (i, t) in enumerate(zip(ids, solo)):
        b = raw(i) if _REPLACEMENT in t else None
        out = dec.decode(b if b is not None else t.encode("utf-8"))
        if start is not None and out and start < k and not out.startswith(_REPLACEMENT):
            groups.append((start, k))
        held = dec.getstate()[0]
        start = (start if not out and start is not None else k) if held else None
        texts.append(out)
    tail = dec.decode(b"", final=True)
    if tail and texts:
        texts[-1] += tail
    return texts, groups


def guess_split_groups(texts: Sequence[str]) -> list[tuple[int, int]]:
    """:func:`merged_texts`' groups recovered from its texts alone (e.g. a stored ``response_tokens``):
    each run of ``""`` tokens directly followed by a token whose text starts with a non-ASCII
    character."""
    groups, k, n = [], 0, len(texts)
    while k < n:
        if texts[k] == "":
            j = k
            while j < n and texts[j] == "":
                j += 1
            if j < n and texts[j] and ord(texts[j][0]) > 127:
                groups.append((k, j))
            k = j + 1
        else:
            k += 1
    return groups


def char_notes(texts: Sequence[str], ids: Sequence[int], groups, raw=None) -> dict[int, str]:
    """Hover notes of split characters: ``{token index: note}`` for every token of every group.

    The token that shows the character lists the raw pieces (``#index id N`` and, with ``raw``,
    the token's bytes in hex); the tokens before it point to it."""
    notes: dict[int, str] = {}
    for a, b in groups:

        def piece(k: int) -> str:
            by = raw(ids[k]) if raw is not None else None
            return f"#{k} id {int(ids[k])}" + (f" bytes {by.hex(' ')}" if by else "")

        shown = texts[b]
        notes[b] = f"{shown!r}: one character split across {b - a + 1} tokens, shown on the last: " + "; ".join(
            piece(k) for k in range(a, b + 1)
        )
        for k in range(a, b):
            notes[k] = f"part of {shown!r} (shown whole on token #{b}): {piece(k)}"
    return notes
