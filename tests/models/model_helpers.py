"""Builders shared by the model and rollout tests: a tiny local "instruct" model folder with a
byte-level BPE tokenizer and a ChatML-style chat template (no download), the same model written as a
GGUF file (as llama.cpp's converter lays out a Llama), and a teacher-forced reference forward."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

import mpo_viz.models as models_mod

CHATML = models_mod.CHATML


def make_instruct_folder(path, env, *, seed: int = 0, template: str | None = CHATML) -> Path:
    """Save a 2-layer Llama with a byte-level BPE tokenizer trained on ``env``'s words to ``path``
    (:func:`mpo_viz.models.tiny_instruct_folder`)."""
    return models_mod.tiny_instruct_folder(path, env, seed=seed, template=template)


def _permute(w, n_head, n_head_kv):
    """llama.cpp's row permutation of q/k projections (convert_hf_to_gguf.py, LlamaModel.permute);
    transformers undoes it when it reads the file."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(folder, path, *, eos="<|im_end|>") -> Path:
    """Write the model folder of :func:`make_instruct_folder` as an F32 GGUF file at ``path``: llama
    metadata, the byte-level BPE tokenizer (``gpt2`` model: tokens, token types, merges), the special
    token ids (``eos`` as end of sequence, ``<|im_start|>`` as beginning, ``<|endoftext|>`` as unknown
    and padding) and the chat template, tensors under llama.cpp's names."""
    import gguf
    from transformers import AutoModelForCausalLM

    folder, path = Path(folder), Path(path)
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    cfg = model.config
    tok = json.loads((folder / "tokenizer.json").read_text())
    added = {a["content"]: a["id"] for a in tok["added_tokens"]}
    tokens = [None] * cfg.vocab_size
    for t, i in {**tok["model"]["vocab"], **added}.items():
        tokens[i] = t
    template = (
        (folder / "chat_template.jinja").read_text()
        if (folder / "chat_template.jinja").is_file()
        else json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny test llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in added else 1 for t in tokens])  # 3: control (special) tokens
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(added["<|im_start|>"])
    w.add_eos_token_id(added[eos])
    w.add_unk_token_id(added["<|endoftext|>"])
    w.add_pad_token_id(added["<|endoftext|>"])
    w.add_chat_template(template)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for name, key in (
            ("attn_norm", "input_layernorm"),
            ("attn_v", "self_attn.v_proj"),
            ("attn_output", "self_attn.o_proj"),
            ("ffn_norm", "post_attention_layernorm"),
            ("ffn_gate", "mlp.gate_proj"),
            ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"),
        ):
            w.add_tensor(f"blk.{i}.{name}.weight", sd[p + key + ".weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], H, H))
        w.add_tensor(f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], H, KV))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def teacher_forced_logprobs(model, prompt_ids, response_ids) -> torch.Tensor:
    """log p(response token t | prompt, response[:t]) from one plain forward of ``prompt + response``
    (no padding, no cache): ``(L,)`` float32."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    p = len(prompt_ids)
    lp = torch.log_softmax(logits[p - 1 : -1], dim=-1)
    return lp.gather(1, torch.tensor(list(response_ids))[:, None])[:, 0]
