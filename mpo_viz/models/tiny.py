"""A tiny Llama policy built from a config over an environment's word-level tokenizer (no download)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mpo_viz.checks import OptionError
from mpo_viz.models.policy import Policy

__all__ = ["SIZES", "tiny_config", "tiny_policy"]

#: model sizes: hidden size, layers, attention heads, MLP width. Parameters (vocabulary of ~270
#: words, tied embeddings): "1m" ≈ 1.1 M, "3m" ≈ 3.1 M, "10m" ≈ 10.7 M.
SIZES: dict[str, dict[str, Any]] = {
    "1m": {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 512},
    "3m": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 640},
    "10m": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 6, "intermediate_size": 1024},
}

#: the longest sequence (prompt + response) a tiny model is configured for (RoPE: no parameters)
MAX_POSITIONS = 4096


def tiny_config(tokenizer, size: str = "1m") -> LlamaConfig:
    """The ``LlamaConfig`` of a tiny policy of ``size`` for ``tokenizer`` (vocabulary, pad and
    end-of-turn ids taken from it)."""
    if size not in SIZES:
        raise OptionError("size", f"expected one of {sorted(SIZES)}, found {size!r}")
    s = SIZES[size]
    eos = tokenizer.eos_token_id
    return LlamaConfig(
        vocab_size=len(tokenizer), **s, num_key_value_heads=s["num_attention_heads"],
        max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=eos, bos_token_id=None,
        rms_norm_eps=1e-5,
    )


def tiny_policy(tokenizer, size: str = "1m", seed: int = 0) -> Policy:
    """A freshly initialized Llama ``LlamaForCausalLM`` of ``size`` over ``tokenizer`` (float32, CPU,
    eval mode), wrapped with its tokenizer as a :class:`Policy`. The weights are a deterministic
    function of ``(size, len(tokenizer), seed)``; the global RNG is left untouched."""
    cfg = tiny_config(tokenizer, size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    return Policy(model.eval(), tokenizer, name=f"tiny_policy(size={size!r}, seed={seed})")
