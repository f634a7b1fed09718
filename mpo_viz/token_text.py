"""Text instead of ids: decode ``response_ids`` with a local tokenizer when a batch has no
``response_tokens``.

:func:`load_local_tokenizer` opens a tokenizer folder offline (``local_files_only``; nothing is
downloaded): a Hugging Face folder (``tokenizer.json`` or the files ``AutoTokenizer`` reads), or a
bare ``tokenizer.json`` of the ``tokenizers`` library. :func:`tokenizer_decoder` turns it into the
``ids -> display strings`` callable the strip takes (``tokens=`` of the views, ``--tokenizer`` of
``mpo-viz report``): each token decoded on its own, so byte-level pieces show their text (``" the"``,
``"\\n"``) rather than ``Ġthe``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["load_local_tokenizer", "tokenizer_decoder"]


def load_local_tokenizer(path):
    """The tokenizer in folder (or ``tokenizer.json`` file) ``path``, loaded without network.

    Raises ``ValueError`` naming the path when it is not a folder or file, or holds no tokenizer.
    """
    p = Path(path)
    if not p.exists():
        raise ValueError(f"tokenizer: expected a local tokenizer folder, found no such path {str(p)!r}")
    if p.is_file():
        if p.suffix != ".json":
            raise ValueError(f"tokenizer: expected a folder or a tokenizer.json file, found {str(p)!r}")
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(p))
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - fall back to a bare tokenizer.json, else say what is missing
        if (p / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(p / "tokenizer.json"))
        files = sorted(x.name for x in p.iterdir())[:8]
        raise ValueError(f"tokenizer: {str(p)!r} holds no tokenizer that loads offline (files: {files}); "
                         f"expected a Hugging Face tokenizer folder or a tokenizer.json ({type(exc).__name__}: {exc})") from None


def tokenizer_decoder(tokenizer):
    """A callable ``ids -> list of display strings`` from a tokenizer object or a local path."""
    tok = load_local_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
    if hasattr(tok, "convert_ids_to_tokens"):  # transformers tokenizer
        def one(i):
            return tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    elif hasattr(tok, "decode") and hasattr(tok, "id_to_token"):  # tokenizers.Tokenizer
        def one(i):
            return tok.decode([i], skip_special_tokens=False)
    else:
        raise ValueError(f"tokenizer: expected a tokenizer (transformers or tokenizers) or a folder, found "
                         f"{type(tok).__name__}")
    cache: dict[int, str] = {}

    def decode(ids):
        out = []
        for i in ids:
            i = int(i)
            s = cache.get(i)
            if s is None:
                s = cache[i] = one(i)
            out.append(s)
        return out

    decode.tokenizer = tok
    return decode
