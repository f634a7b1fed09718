"""benchmarks/rollout.py --model-config: the model of a real LM's shape and its padded tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mpo_viz.envs import build_tokenizer, make_env
from mpo_viz.rollout import rollout

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script(ROOT / "benchmarks" / "rollout.py", "bench_rollout")


def test_smollm2_shape_has_its_parameter_count(bench):
    cfg = bench.model_config("smollm2-135m")
    assert (
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
        cfg.vocab_size,
        cfg.tie_word_embeddings,
    ) == (576, 30, 9, 3, 1536, 49152, True)
    with torch.device("meta"):  # no memory: only the shapes
        model = LlamaForCausalLM(cfg)
    # embeddings 49,152 x 576 (tied) + 30 x (attention 576·(576+192+192+576) + MLP 3·576·1536 + 2 norms)
    # + the final norm: SmolLM2-135M's 134,515,008
    per_layer = 576 * (576 + 192 + 192 + 576) + 3 * 576 * 1536 + 2 * 576
    assert sum(p.numel() for p in model.parameters()) == 49152 * 576 + 30 * per_layer + 576 == 134_515_008


def test_config_folder_gives_a_policy_over_the_padded_tokenizer(bench, tmp_path):
    LlamaConfig(
        vocab_size=700,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        tie_word_embeddings=True,
    ).save_pretrained(tmp_path)
    env = make_env("search")
    policy = bench.config_policy(env, str(tmp_path))
    tok = policy.tokenizer
    assert len(tok) == 700 == policy.model.get_input_embeddings().num_embeddings
    base = build_tokenizer(env)
    assert tok.get_vocab() | base.get_vocab() == tok.get_vocab()  # the env's ids are kept, fillers after them
    assert tok.convert_ids_to_tokens(699) == f"<fill-{700 - len(base) - 1}>"
    assert policy.model.config.num_key_value_heads == 2 and policy.model.config.pad_token_id == tok.pad_token_id
    out = rollout(policy, env, 2, seed=0, batch_size=2, max_turn_tokens=4, max_total_tokens=200, oracle=None)
    assert int(out.mask.sum()) > 0


def test_unknown_model_config_is_refused(bench, tmp_path):
    with pytest.raises(SystemExit, match=r"--model-config: expected one of \['smollm2-135m'\] or a folder"):
        bench.model_config(str(tmp_path / "missing"))
    LlamaConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
    ).save_pretrained(tmp_path)
    with pytest.raises(SystemExit, match=r"expected a vocabulary of at least \d+ tokens .*found vocab_size 50"):
        bench.config_policy(make_env("search"), str(tmp_path))
