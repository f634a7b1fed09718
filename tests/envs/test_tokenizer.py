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
            assert tok.decode(ids) == m["content"]  # text -> ids -> text
            assert lay.encode(tok.decode(ids)) == ids  # ids -> text -> ids
    # malformed words map to [UNK], never raise
    assert lay.encode("zzz search") == [lay.unk, tok.convert_tokens_to_ids("search")]


def test_special_tokens_and_layout():
    tok = build_tokenizer(["a", "b", "a"])
    assert tok.convert_ids_to_tokens(list(range(len(SPECIAL_TOKENS) + 2))) == [*SPECIAL_TOKENS, "a", "b"]
    assert tok.pad_token_id == 0 and tok.eos_token == "<|eot|>"
    lay = ChatLayout(tok)
    msgs = [{"role": "system", "content": "a"}, {"role": "user", "content": "b a"}]
    assert lay.tokens(lay.prompt(msgs)) == [
        "<|system|>",
        "a",
        "<|eot|>",
        "<|user|>",
        "b",
        "a",
        "<|eot|>",
        "<|assistant|>",
    ]
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


def _onepress_please() -> str:
    """OnePressEnv (tests/train/train_helpers.py) whose prompt starts with a word it does not list."""
    from mpo_viz.envs import available_envs, register_env
    from tests.train.train_helpers import OnePressEnv

    class PleaseEnv(OnePressEnv):
        name = "onepress-please"

        def prompt(self, task):
            return f"please press {task} ."

    if PleaseEnv.name not in available_envs():
        register_env(PleaseEnv.name, PleaseEnv)
    return PleaseEnv.name


def test_a_prompt_word_outside_the_vocabulary_is_counted_and_reported():
    from mpo_viz.envs.generate import GenerateConfig, generate
    from mpo_viz.envs.tokenizer import UnknownTextWarning

    name = _onepress_please()
    # 4 episodes, each prompt = the system message (known words) and "please press x ." (one unknown word)
    with pytest.warns(UnknownTextWarning, match=r"prompt: 4 tokens in 4 of 8 texts \(e\.g\. 'please' \(4\)\)"):
        b = generate(GenerateConfig(env=name, difficulty=1, episodes=4, group_size=1))
    assert b.meta["unknown_text"] == {"prompt": {"tokens": 4, "texts": 4, "of": 8, "examples": {"please": 4}}}
    assert "observation" not in b.meta["unknown_text"]  # "right ." / "wrong ." are listed
    # the shipped environments lose nothing
    b = generate(GenerateConfig(env="search", episodes=4, group_size=1))
    assert "unknown_text" not in b.meta


def _segments(ids, mask):
    """Runs of equal loss_mask: [(mask value, ids)]."""
    out = []
    for i, m in zip(ids, mask):
        if out and out[-1][0] == m:
            out[-1][1].append(i)
        else:
            out.append((m, [i]))
    return out


@pytest.mark.usefixtures("one_thread")
def test_a_byte_level_tokenizer_loses_nothing_and_a_partial_vocabulary_says_what_it_lost():
    from mpo_viz import models
    from mpo_viz.envs.tokenizer import UnknownTextWarning
    from mpo_viz.rollout import rollout

    env = make_env("tests.envs.protocol_game:make_game", fuzz=0.5)  # no vocabulary(): bytes
    tok = build_tokenizer(env)
    assert tok.unk_token is None and len(tok) == 6 + 256
    text = "answer with guess <number> . Ünïcode 🙂 [3,5]\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    policy = models.tiny_policy(tok, "1m", seed=0)
    b = rollout(policy, env, 4, seed=2, max_turn_tokens=6, progress=False)
    assert "unknown_text" not in b.meta
    special = set(tok.all_special_ids)
    for i in range(len(b)):
        msgs = [m for m in json.loads(b.field("messages_json")[i]) if m["role"] != "assistant"]
        row = b.row(i)
        segments = _segments(row["response_ids"], row["loss_mask"])
        obs = [[t for t in ids if t not in special] for m, ids in segments if m == 0]
        prompt = [t for t in row["prompt_ids"] if t not in special]
        # every prompt and observation decodes back to exactly the environment's text
        assert [tok.decode(x) for x in [prompt, *obs]] == [m["content"] for m in msgs]
    worded = make_env("tests.envs.protocol_game:make_worded")
    policy = models.tiny_policy(build_tokenizer(worded), "1m", seed=0)
    with pytest.warns(
        UnknownTextWarning,
        match=r"prompt: 4 tokens in 2 of 2 texts \(e\.g\. 'answer' \(2\), "
        r"'<number>' \(2\)\).*tokenizer_kind = 'bytes'",
    ):
        b = rollout(policy, worded, 2, seed=2, max_turn_tokens=4, progress=False)
    assert b.meta["unknown_text"]["prompt"]["examples"] == {"answer": 2, "<number>": 2}
