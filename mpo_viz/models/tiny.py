"""Tiny Llamas built from a config (no download): a policy over an environment's word-level
tokenizer, and a Hugging Face "instruct" folder with a byte-level BPE tokenizer and a ChatML chat
template that stands in for a real pretrained model in smoke runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from mpo_viz.checks import OptionError
from mpo_viz.models.policy import Policy

__all__ = ["CHATML", "SIZES", "tiny_config", "tiny_instruct_folder", "tiny_policy"]

#: a ChatML chat template (SmolLM2's and Qwen's layout: ``<|im_start|>role\ncontent<|im_end|>\n``)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

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
        vocab_size=len(tokenizer),
        **s,
        num_key_value_heads=s["num_attention_heads"],
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos,
        bos_token_id=None,
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


def tiny_instruct_folder(path, env, *, seed: int = 0, template: str | None = CHATML) -> Path:
    """Save to ``path`` a 2-layer Llama (hidden 64) with a byte-level BPE tokenizer (400 ids, trained
    on ``env.vocabulary()``), ``<|im_end|>`` as end of turn and a ChatML chat template: a plain Hugging
    Face folder laid out like SmolLM2-135M-Instruct's, for smoke runs of the pretrained-model path
    (``load_policy``, ``Config(model_dir=...)``) in seconds. Returns ``path``."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    words = env.vocabulary()
    bpe.train_from_iterator([" ".join(words[i : i + 12]) for i in range(0, len(words), 12)] * 3, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=special[1:]
    )
    if template is not None:
        tok.chat_template = template
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    path = Path(path)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path
