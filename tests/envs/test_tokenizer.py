"""Word-level tokenizer and chat layout: round trips, offline save/reload, the chat template."""

import json
import random

import pytest

from mpo_viz.data.token_text import load_local_tokenizer
from mpo_viz.envs import ChatLayout, NoisyExpert, build_tokenizer, make_env
from mpo_viz.envs.generate import run_episode
from mpo_viz.envs.tokenizer import SPECIAL_TOKENS


@pytest.mark.parametrize("name", ["search", "tooluse", "automation"])
def test_round_trip_and_no_unknown_words(name):
    env = make_env(name, difficulty=(3, 8), **({"slip": 0.3} if name == "automation" else {}))
    tok = build_tokenizer(env)
    lay = ChatLayout(tok)
    ex = NoisyExpert(0.6)
    for seed in range(30):
        env.reset(seed=seed)
        rng = random.Random(seed)
        while not env.done:
            env.step(ex.act(env, rng)[1])
        for m in env.messages:
            ids = lay.encode(m["content"])
            assert lay.unk not in ids, m["content"]
            assert tok.decode(ids) == m["content"]            # text -> ids -> text
            assert lay.encode(tok.decode(ids)) == ids           # ids -> text -> ids
    # malformed words map to [UNK], never raise
    assert lay.encode("zzz search") == [lay.unk, tok.convert_tokens_to_ids("search")]


def test_special_tokens_and_layout():
    tok = build_tokenizer(["a", "b", "a"])
    assert tok.convert_ids_to_tokens(list(range(len(SPECIAL_TOKENS) + 2))) == [*SPECIAL_TOKENS, "a", "b"]
    assert tok.pad_token_id == 0 and tok.eos_token == "<|eot|>"
    lay = ChatLayout(tok)
    msgs = [{"role": "system", "content": "a"}, {"role": "user", "content": "b a"}]
    assert lay.tokens(lay.prompt(msgs)) == ["<|system|>", "a", "<|eot|>", "<|user|>", "b", "a", "<|eot|>",
                                           "<|assistant|>"]
    assert lay.tokens(lay.action("b")) == ["b", "<|eot|>"]
    assert lay.tokens(lay.observation("tool", "a", final=False)) == ["<|tool|>", "a", "<|eot|>", "<|assistant|>"]
    assert lay.tokens(lay.observation("user", "a", final=True)) == ["<|user|>", "a", "<|eot|>"]
    with pytest.raises(ValueError, match="words"):
        build_tokenizer(["two words"])


@pytest.mark.parametrize("name", ["search", "automation"])
def test_saved_tokenizer_reloads_offline_and_matches_chat_template(name, tmp_path):
    env = make_env(name)
    tok = build_tokenizer(env)
    tok.save_pretrained(tmp_path / "tok")
    tok2 = load_local_tokenizer(tmp_path / "tok")
    assert tok2.get_vocab() == tok.get_vocab()
    lay = ChatLayout(tok2)
    ep = run_episode(env, NoisyExpert(0.3), lay, seed=4)
    msgs = json.loads(ep["messages_json"])
    # the whole conversation through the chat template = prompt_ids + response_ids
    ids = tok2.apply_chat_template(msgs, tokenize=True, add_generation_prompt=False)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    assert list(ids) == ep["prompt_ids"] + ep["response_ids"]
    # action tokens: assistant content + <|eot|>; role markers and observations are not
    toks = lay.tokens(ep["response_ids"])
    for t, m in zip(toks, ep["loss_mask"]):
        if t in ("<|assistant|>", "<|tool|>", "<|user|>"):
            assert m == 0
    assert toks[0] != "<|assistant|>" and lay.tokens(ep["prompt_ids"])[-1] == "<|assistant|>"
    with pytest.raises(ValueError, match="path"):
        load_local_tokenizer(tmp_path / "missing")
