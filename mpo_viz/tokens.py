"""Deprecated: this module is :mod:`mpo_viz.token_text` (display text of token ids), renamed so that
it is not mistaken for the environments' tokenizer (:mod:`mpo_viz.envs.tokenizer`)."""

import warnings

from mpo_viz.token_text import load_local_tokenizer, tokenizer_decoder

__all__ = ["load_local_tokenizer", "tokenizer_decoder"]

warnings.warn("mpo_viz.tokens is deprecated: import from mpo_viz.token_text", DeprecationWarning, stacklevel=2)
