"""Tiny policy and critic: sizes, seeds, bit-identical save/load, critic alignment, local Hugging Face
folders with a chat template, and the errors that name the path."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mpo_viz import models as M
from mpo_viz.envs import build_tokenizer, make_env

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def search():
    env = make_env("search")
    return env, build_tokenizer(env)


def _ids(tok, n=2, t=23, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, len(tok), (n, t), generator=g)


def test_tiny_sizes_vocab_and_seed(search):
    _, tok = search
    counts = {s: M.tiny_policy(tok, s).num_parameters() for s in M.SIZES}
    assert 0.9e6 < counts["1m"] < 1.3e6 and 2.5e6 < counts["3m"] < 3.5e6 and 9e6 < counts["10m"] < 12e6
    p = M.tiny_policy(tok, "1m", seed=3)
    assert type(p.model).__name__ == "LlamaForCausalLM" and p.dtype == torch.float32
    assert p.model.config.vocab_size == len(tok) and p.model.config.eos_token_id == tok.convert_tokens_to_ids("<|eot|>")
    ids = _ids(tok)
    with torch.no_grad():
        a = p.model(ids).logits
        b = M.tiny_policy(tok, "1m", seed=3).model(ids).logits
        c = M.tiny_policy(tok, "1m", seed=4).model(ids).logits
    assert torch.equal(a, b) and not torch.allclose(a, c)
    with pytest.raises(ValueError, match=r"size: expected one of .*found '2m'"):
        M.tiny_policy(tok, "2m")


@pytest.mark.parametrize("init", ["fresh", "policy", "shared"])
def test_save_load_bit_identical(tmp_path, search, init):
    _, tok = search
    pol = M.tiny_policy(tok, seed=1)
    critic = M.make_critic(pol, init, seed=2)
    M.save(tmp_path / "m", pol, critic)
    pol2, critic2 = M.load(tmp_path / "m")
    ids = _ids(tok, 3, 31)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    with torch.no_grad():
        assert torch.equal(pol.model(ids, attention_mask=mask).logits, pol2.model(ids, attention_mask=mask).logits)
        assert torch.equal(critic(ids), critic2(ids))
    assert (critic2.trunk is pol2.model.model) == (init == "shared")
    assert json.loads((tmp_path / "m/critic/config.json").read_text())["shared_trunk"] == (init == "shared")
    # the policy folder is a standard Hugging Face one
    m = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m/policy"), local_files_only=True)
    t = AutoTokenizer.from_pretrained(str(tmp_path / "m/policy"), local_files_only=True)
    assert t.get_vocab() == tok.get_vocab()
    with torch.no_grad():
        assert torch.equal(m(ids).logits, pol.model(ids).logits)


def test_critic_heads_and_trunks(search):
    _, tok = search
    pol = M.tiny_policy(tok, seed=0)
    ids = _ids(tok, 2, 17)
    with torch.no_grad():
        h = pol.model.model(ids).last_hidden_state  # the policy's own trunk, direct
        for init in ("policy", "shared"):
            c = M.make_critic(pol, init, seed=5)
            ref = h @ c.head.weight[0] + c.head.bias[0]
            assert torch.allclose(c(ids), ref, atol=1e-6), init
        fresh = M.make_critic(pol, "fresh", seed=5)
        assert not torch.allclose(fresh(ids), ref)
        assert fresh.trunk.config is not pol.model.config  # its own: a setting changed on one stays there
    shared = M.make_critic(pol, "shared")
    assert {id(p) for p in shared.own_parameters()} == {id(shared.head.weight), id(shared.head.bias)}
    with pytest.raises(ValueError, match="init: expected one of"):
        M.make_critic(pol, "copy")


def test_load_errors_name_the_path(tmp_path, search):
    env, tok = search
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'nope'}: expected a model folder"):
        M.load(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="nope: expected a Hugging Face causal-LM folder"):
        M.load_policy(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: expected a Hugging Face causal-LM folder with config.json"):
        M.load_policy(tmp_path / "empty")
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match=r"bert: expected a causal language model .*found model_type 'bert'"):
        M.load_policy(bert)
    pol = M.tiny_policy(tok)
    M.save(tmp_path / "s", pol, M.make_critic(pol, "shared"))
    M.save(tmp_path / "f", pol, M.make_critic(pol, "fresh"))
    with pytest.raises(ValueError, match="s/critic: expected a critic whose shared trunk is the policy"):
        M.load_critic(tmp_path / "s/critic", M.tiny_policy(tok, seed=9))
    other = M.tiny_policy(build_tokenizer(make_env("tooluse")))
    with pytest.raises(
        ValueError, match=r"f/critic: expected a critic for the tokenizer .*found one saved for another"
    ):
        M.load_critic(tmp_path / "f/critic", other)
    with pytest.raises(ValueError, match="dtype: expected float32 on CPU"):
        M.load_policy(tmp_path / "f/policy", dtype="bfloat16")
    if torch.version.cuda is None:
        with pytest.raises(
            ValueError,
            match=r"^device: expected a device this torch has, found 'cuda' but torch .* is a "
            r"CPU-only build; install a CUDA build of torch: pip install ",
        ):
            M.load_policy(tmp_path / "f/policy", device="cuda")


def test_vocabulary_check_counts_and_names(search):
    env, tok = search
    M.check_vocabulary(tok, env.vocabulary())  # its own tokenizer covers it
    other = build_tokenizer(make_env("tooluse"))
    words = env.vocabulary()
    n_bad = sum(other.unk_token_id in other.encode(w, add_special_tokens=False) for w in words)
    assert n_bad > 50
    with pytest.raises(
        ValueError,
        match=rf"policy x: .*found {n_bad} of {len(words)} mapped to the unknown token "
        r"'\[UNK\]' \(e\.g\. 'question'",
    ):
        M.check_vocabulary(other, words, where="policy x")


def test_local_instruct_folder_uses_its_chat_template(tmp_path):
    env = make_env("tooluse")
    folder = M.tiny_instruct_folder(tmp_path / "inst", env)
    pol = M.load_policy(folder)
    assert isinstance(pol.layout, M.TemplateLayout) and pol.path == str(folder)
    c = pol.model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_key_value_heads, len(pol.tokenizer)) == (2, 64, 2, 400)
    assert pol.tokenizer.chat_template == M.CHATML and pol.tokenizer.eos_token == "<|im_end|>"
    M.check_vocabulary(pol.tokenizer, env.vocabulary())  # byte-level BPE: nothing is unknown
    env.reset(seed=1)
    lay = pol.layout
    prompt = lay.prompt(env.messages)
    action = lay.action("compute 3 plus 4")
    obs = lay.observation("tool", "the result is 7 .", final=False)
    msgs = [
        *env.messages,
        {"role": "assistant", "content": "compute 3 plus 4"},
        {"role": "tool", "content": "the result is 7 ."},
    ]
    full = pol.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert prompt + action + obs == pol.tokenizer.encode(full, add_special_tokens=False)
    assert lay.stop_ids == {pol.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert lay.text(action) == "compute 3 plus 4"


def test_values_source_of_tells_an_untrained_critic():
    pol = M.tiny_policy(build_tokenizer(["a", "b"]), "1m", seed=0)
    critic = M.make_critic(pol, "fresh", seed=1)
    assert M.values_source_of(critic) == M.UNTRAINED_CRITIC == "untrained_critic"
    critic.trunk.layers[0].mlp.up_proj.weight.data += 1.0  # the trunk alone moved: the head is still random
    assert M.values_source_of(critic) == "untrained_critic"
    opt = torch.optim.SGD(critic.head.parameters(), lr=0.1)
    critic(torch.tensor([[1, 2, 3]])).sum().backward()
    opt.step()  # one update of the head: values the critic has learned something for
    assert M.values_source_of(critic) == "critic"
    assert M.values_source_of(object()) == "critic"  # not a mpo_viz critic (e.g. a loaded or external one)
