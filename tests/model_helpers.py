"""Builders shared by the model and rollout tests: a tiny local "instruct" model folder with a
byte-level BPE tokenizer and a ChatML-style chat template (no download), and a teacher-forced
reference forward."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_instruct_folder(path, env, *, seed: int = 0, template: str | None = CHATML) -> Path:
    """Save a 2-layer Llama with a byte-level BPE tokenizer trained on ``env``'s words to ``path``."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    words = env.vocabulary()
    bpe.train_from_iterator([" ".join(words[i:i + 12]) for i in range(0, len(words), 12)] * 3, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=special[1:])
    if template is not None:
        tok.chat_template = template
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=False,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    path = Path(path)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def teacher_forced_logprobs(model, prompt_ids, response_ids) -> torch.Tensor:
    """log p(response token t | prompt, response[:t]) from one plain forward of ``prompt + response``
    (no padding, no cache): ``(L,)`` float32."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    p = len(prompt_ids)
    lp = torch.log_softmax(logits[p - 1:-1], dim=-1)
    return lp.gather(1, torch.tensor(list(response_ids))[:, None])[:, 0]
