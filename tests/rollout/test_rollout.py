"""Rollout: log-probs against a plain teacher-forced forward, critic values against a direct critic
forward, determinism across batch sizes, rewards and turns against a replay of the environment."""

import contextlib
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
)

import mpo_viz.rollout as R
import mpo_viz.rollout.engine as RE
import mpo_viz.rollout.play as RP
from mpo_viz import models as M
from mpo_viz.data.turns import turn_ids_from_mask
from mpo_viz.envs import NoisyExpert, Oracle, build_tokenizer, make_env
from mpo_viz.envs.generate import oracle_columns
from mpo_viz.rollout import critic_values, rollout, sample_tokens, task_seeds
from tests.models.model_helpers import make_instruct_folder, teacher_forced_logprobs

ENVS = ["search", "tooluse", "automation"]
SHORT = {"max_turn_tokens": 6}


def _env(name):
    return make_env(name, difficulty=make_env(name).min_difficulty)


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def _policy(name, seed=0):
    env = _env(name)
    pol = M.tiny_policy(build_tokenizer(env), "1m", seed=seed)
    eot = pol.layout.eot
    with torch.no_grad():  # a sharper end-of-turn logit: turns of ragged lengths, some cut at the limit
        pol.model.get_output_embeddings().weight[eot] *= 40.0
    return env, pol


def _rows(batch):
    return [batch.row(i) for i in range(len(batch))]


@pytest.mark.parametrize("name", ENVS)
def test_logprobs_honest_and_batch_size_free(name):
    env, pol = _policy(name)
    out = {bs: rollout(pol, env, 8, group_size=2, seed=3, batch_size=bs, **SHORT) for bs in (1, 16)}
    rows1, rows16 = _rows(out[1]), _rows(out[16])
    turn_lens = set()
    for r1, r16 in zip(rows1, rows16):
        assert r1["response_ids"] == r16["response_ids"]  # same tokens whatever the batch size
        np.testing.assert_allclose(r1["old_logprobs"], r16["old_logprobs"], atol=1e-5)
        for r in (r1, r16):
            m = np.asarray(r["loss_mask"]).astype(bool)
            ref = teacher_forced_logprobs(pol.model, r["prompt_ids"], r["response_ids"]).numpy()
            old, roll = np.asarray(r["old_logprobs"]), np.asarray(r["rollout_logprobs"])
            assert np.array_equal(old, roll)  # T = 1, top_p = 1
            assert np.abs(old[m] - ref[m]).max() < 2e-3
            assert (old[~m] == 0).all()
        tid = np.asarray(r1["turn_ids"])
        turn_lens |= {int(((tid == k) & m).sum()) for k in range(r1["num_turns"])}
    assert len({len(r["response_ids"]) for r in rows1}) > 1 and len(turn_lens) > 2  # ragged


def _replay(name, r):
    """Play the recorded assistant texts again in a fresh environment: observations and rewards."""
    env = _env(name)
    extra = json.loads(r["extra_json"])
    env.reset(seed=extra["seed"], task=env.make_task(extra["task_seed"]))
    msgs = json.loads(r["messages_json"])
    rewards, steps = [], 0
    for m in msgs:
        if m["role"] == "assistant":
            obs, rew, term, trunc, _ = env.step(m["content"])
            rewards.append(rew)
            steps += 1
    return env, msgs, rewards


@pytest.mark.parametrize("name", ENVS)
def test_turns_rewards_and_messages_match_a_replay(name):
    env, pol = _policy(name, seed=1)
    batch = rollout(pol, env, 6, group_size=3, seed=0, **SHORT)
    assert batch.group_ids == [f"{name}-s0-t0000"] * 3 + [f"{name}-s0-t0001"] * 3
    lay = pol.layout
    for r in _rows(batch):
        mask = np.asarray(r["loss_mask"])
        assert r["turn_ids"] == turn_ids_from_mask(mask).tolist()
        renv, msgs, rewards = _replay(name, r)
        assert r["num_turns"] == len(rewards) == sum(m["role"] == "assistant" for m in msgs)
        assert r["reward"] == pytest.approx(sum(rewards))
        assert r["stop_reason"] == ("terminated" if renv.state[1] in ("success", "failure") else "turn_limit")
        # the decoded action tokens are what the environment read; observations are the layout's ids
        ids = np.asarray(r["response_ids"])
        for k, m in enumerate([m for m in msgs if m["role"] == "assistant"]):
            tok = ids[(np.asarray(r["turn_ids"]) == k) & (mask == 1)].tolist()
            assert " ".join(lay.text(tok).split()) == m["content"]
        tool = [m for m in msgs[2:] if m["role"] == env.obs_role]
        expect = list(r["prompt_ids"])
        for k in range(r["num_turns"]):
            expect += ids[(np.asarray(r["turn_ids"]) == k) & (mask == 1)].tolist()
            expect += lay.observation(env.obs_role, tool[k]["content"], final=k == r["num_turns"] - 1)
        assert expect == r["prompt_ids"] + r["response_ids"]


def test_critic_values_bootstrap_and_oracle():
    env, pol = _policy("search", seed=2)
    critic = M.make_critic(pol, "fresh", seed=4)
    batch = rollout(pol, env, 6, group_size=2, critic=critic, seed=1, max_turn_tokens=8, max_total_tokens=90)
    assert batch.meta["values_source"] == "untrained_critic"  # its value head is as make_critic drew it
    reasons = set(batch.field("stop_reason"))
    assert "max_total_tokens" in reasons
    orc = oracle_columns(batch)
    for i, r in enumerate(_rows(batch)):
        seq = torch.tensor([r["prompt_ids"] + r["response_ids"]])
        with torch.no_grad():
            direct = critic(seq)[0].numpy()
        p, n = len(r["prompt_ids"]), len(r["response_ids"])
        np.testing.assert_allclose(r["values"], direct[p - 1 : p + n - 1], atol=1e-5)
        if r["stop_reason"] == "max_total_tokens":
            assert r["truncated"] and r["bootstrap_value"] == pytest.approx(float(direct[-1]), abs=1e-5)
            assert p + n <= 90 or r["loss_mask"][-1] == 0
        else:
            assert np.isnan(r["bootstrap_value"])
        # oracle columns: the first action token carries V(s_0) under the noisy expert
        extra = json.loads(r["extra_json"])
        e = _env("search")
        e.reset(seed=extra["seed"], task=e.make_task(extra["task_seed"]))
        v0 = Oracle(e, NoisyExpert(), gamma=1.0).value(e.state)
        assert float(orc["values"][i, 0]) == pytest.approx(v0, abs=1e-6)


def _episodes_of(batch):
    """The finished episodes of a batch as ``critic_values`` reads them (prompt and response ids)."""
    return [
        SimpleNamespace(
            prompt=list(r["prompt_ids"]),
            ids=list(r["response_ids"]),
            length=len(r["prompt_ids"]) + len(r["response_ids"]),
        )
        for r in _rows(batch)
    ]


@pytest.mark.parametrize("per_sequence", [True, False])
@pytest.mark.parametrize("init", ["fresh", "policy", "shared"])
def test_critic_values_unpadded_and_batched_equal_a_direct_forward(per_sequence, init):
    """The CPU's one unpadded forward per sequence and the padded batches of an accelerator: both the
    direct forward's values at P + t − 1 and its last output; one-token turns (max_turn_tokens=1:
    every action a single token), ragged lengths, batch sizes that do not divide the episodes."""
    env, pol = _policy("automation", seed=5)
    critic = M.make_critic(pol, init, seed=6)
    batch = rollout(pol, env, 5, seed=4, max_turn_tokens=1, max_total_tokens=110, batch_size=3)
    eps = _episodes_of(batch)
    assert len({e.length for e in eps}) > 1
    vals, last = critic_values(critic, eps, 2, pad_id=pol.tokenizer.pad_token_id, per_sequence=per_sequence)
    for e, v, b in zip(eps, vals, last):
        with torch.no_grad():
            direct = critic(torch.tensor([e.prompt + e.ids]))[0].numpy()
        p, n = len(e.prompt), len(e.ids)
        assert v.shape == (n,) and v.dtype == np.float32
        np.testing.assert_allclose(v, direct[p - 1 : p + n - 1], atol=1e-5)
        assert b == pytest.approx(float(direct[-1]), abs=1e-5)


def test_critic_in_a_second_thread_gives_the_same_values(monkeypatch):
    """The critic's forwards run in a worker thread as each batch turn's episodes finish (queued
    episodes joining rows, so several hand-ins), or all after the last: the same numbers, bit for
    bit, and those of a direct forward; the bootstrap values too."""
    env, pol = _policy("search", seed=9)
    critic = M.make_critic(pol, "policy", seed=2)
    kw = dict(seed=6, batch_size=3, max_turn_tokens=8, max_total_tokens=90)
    handed = []
    submit = RP.CriticJobs.submit
    monkeypatch.setattr(RP.CriticJobs, "submit", lambda self, eps: handed.append(len(eps)) or submit(self, eps))
    threaded = rollout(pol, env, 7, critic=critic, critic_thread=True, **kw)
    assert len(handed) > 1 and sum(handed) == 7  # episodes handed in over several batch turns
    at_end = rollout(pol, env, 7, critic=critic, critic_thread=False, **kw)
    for a, b in zip(_rows(threaded), _rows(at_end)):
        np.testing.assert_array_equal(a["values"], b["values"])
        assert a["bootstrap_value"] == b["bootstrap_value"] or (
            np.isnan(a["bootstrap_value"]) and np.isnan(b["bootstrap_value"])
        )
        with torch.no_grad():
            direct = critic(torch.tensor([a["prompt_ids"] + a["response_ids"]]))[0].numpy()
        p, n = len(a["prompt_ids"]), len(a["response_ids"])
        np.testing.assert_allclose(a["values"], direct[p - 1 : p + n - 1], atol=1e-5)


def test_critic_values_of_one_episode_and_constant_values():
    """One episode alone; a critic whose head reads nothing (weight 0, bias 0.25): every value 0.25."""
    env, pol = _policy("search", seed=6)
    critic = M.make_critic(pol, "fresh", seed=1)
    with torch.no_grad():
        critic.head.weight.zero_()
        critic.head.bias.fill_(0.25)
    batch = rollout(pol, env, 1, seed=2, critic=critic, **SHORT)
    assert len(batch) == 1
    np.testing.assert_array_equal(batch.row(0)["values"], np.full(len(batch.row(0)["response_ids"]), 0.25, np.float32))


def test_decode_mask_made_here_equals_the_models_own():
    """The one-token step's 4-D mask built by the engine gives the tokens and log-probs of the model's
    own mask builder (the same rollout with the engine's shortcut turned off)."""
    env, pol = _policy("tooluse", seed=7)
    assert pol.model.config._attn_implementation == "sdpa"
    fast = rollout(pol, env, 6, seed=5, batch_size=4, **SHORT)
    init = RE.Engine.__init__

    def plain(self, *a, **k):
        init(self, *a, **k)
        self._mask4 = False

    RE.Engine.__init__ = plain
    try:
        slow = rollout(pol, env, 6, seed=5, batch_size=4, **SHORT)
    finally:
        RE.Engine.__init__ = init
    for a, b in zip(_rows(fast), _rows(slow)):
        assert a["response_ids"] == b["response_ids"]
        np.testing.assert_allclose(a["old_logprobs"], b["old_logprobs"], atol=1e-6)


def test_sliding_window_models_keep_the_models_own_decode_mask():
    """A model with sliding-window attention (Mistral, window 16, episodes longer than it): the engine
    leaves the one-token step's mask to transformers (the window is in it), so the rollout samples
    what a plain forward with the model's own mask gives; configs without a window keep the shortcut."""
    env = _env("tooluse")
    tok = build_tokenizer(env)
    cfg = MistralConfig(
        vocab_size=len(tok),
        hidden_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=6,
        intermediate_size=128,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        sliding_window=16,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    pol = M.Policy(MistralForCausalLM(cfg).eval(), tok, name="sw")
    assert R.uses_sliding_window(pol.model.config) and not RE.Engine(pol.model, tok.pad_token_id)._mask4
    batch = rollout(pol, env, 2, seed=1, batch_size=2, max_turn_tokens=8, max_total_tokens=200)
    for r in _rows(batch):
        assert len(r["prompt_ids"]) + len(r["response_ids"]) > 16  # past the window
        ref = teacher_forced_logprobs(pol.model, r["prompt_ids"], r["response_ids"]).numpy()
        m = np.asarray(r["loss_mask"]).astype(bool)
        assert np.abs(np.asarray(r["old_logprobs"])[m] - ref[m]).max() < 2e-3
    assert not R.uses_sliding_window(Qwen2Config(sliding_window=16, use_sliding_window=False))
    assert R.uses_sliding_window(Qwen2Config(sliding_window=16, use_sliding_window=True, max_window_layers=0))
    assert not R.uses_sliding_window(None) and not R.uses_sliding_window(LlamaConfig())


def test_grouped_key_value_heads_without_copies_give_the_same_rollout(monkeypatch):
    """A model with 6 query / 2 key/value heads: the rollout through ``_sdpa_grouped`` (key/value
    heads handed to SDPA as they are) samples the tokens and log-probs of transformers' own SDPA path
    (which copies them out), and leaves the model's attention setting as it found it."""
    env = _env("tooluse")
    tok = build_tokenizer(env)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=128,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pol = M.Policy(LlamaForCausalLM(cfg).eval(), tok, name="gqa")
    calls = []
    grouped = RE._sdpa_grouped
    monkeypatch.setattr(RE, "_sdpa_grouped", lambda *a, **k: calls.append(1) or grouped(*a, **k))
    fast = rollout(pol, env, 6, seed=1, batch_size=4, **SHORT)
    assert calls and pol.model.config._attn_implementation == "sdpa"
    monkeypatch.setattr(RP, "grouped_attention", lambda model: contextlib.nullcontext())
    plain = rollout(pol, env, 6, seed=1, batch_size=4, **SHORT)
    for a, b in zip(_rows(fast), _rows(plain)):
        assert a["response_ids"] == b["response_ids"]
        np.testing.assert_allclose(a["old_logprobs"], b["old_logprobs"], atol=1e-6)
        ref = teacher_forced_logprobs(pol.model, a["prompt_ids"], a["response_ids"]).numpy()
        m = np.asarray(a["loss_mask"]).astype(bool)
        assert np.abs(np.asarray(a["old_logprobs"])[m] - ref[m]).max() < 2e-3


def test_a_played_environment_rolls_out_like_a_fresh_one():
    """The environment handed in has played an episode (task, state, messages set): the rollout's
    episodes are those of a fresh instance, and the caller's instance is left as it was."""
    env, pol = _policy("search", seed=8)
    used = _env("search")
    used.reset(seed=11)
    used.step("nonsense words")
    before = (used.task, used.state, list(used.messages))
    a = rollout(pol, used, 4, seed=3, **SHORT)
    b = rollout(pol, env, 4, seed=3, **SHORT)
    for ra, rb in zip(_rows(a), _rows(b)):
        assert ra["response_ids"] == rb["response_ids"] and ra["messages_json"] == rb["messages_json"]
    assert (used.task, used.state, used.messages) == before


def test_a_failed_rollout_leaves_the_policy_in_training_mode(monkeypatch):
    """The rollout decodes in eval mode and puts a policy that was training back in training mode,
    also when it raises: on bad input found after the switch (a prompt longer than
    ``max_total_tokens``) and from inside the decoding loop, there after the critic's thread got an
    episode (its pool is shut down)."""
    env = make_env("search")
    policy = M.tiny_policy(build_tokenizer(env), "1m", seed=0)
    critic = M.make_critic(policy, "policy", seed=0)
    policy.model.train()
    with pytest.raises(RP.OptionError, match="max_total_tokens"):
        rollout(policy, env, 2, max_total_tokens=3)
    assert policy.model.training

    real_step, real_jobs, submitted, pools = RP.step_envs, RP.CriticJobs, [], []

    def step_then_fail(*a, **k):  # the environments step until the critic's thread has an episode
        if submitted:
            raise RuntimeError("environment failed")
        return real_step(*a, **k)

    def jobs(*a, **k):
        j = real_jobs(*a, **k)
        submit = j.submit
        j.submit = lambda eps: (submitted.extend(eps), submit(eps))
        pools.append(j.pool)
        return j

    monkeypatch.setattr(RP, "step_envs", step_then_fail)
    monkeypatch.setattr(RP, "CriticJobs", jobs)
    with pytest.raises(RuntimeError, match="environment failed"):
        rollout(policy, env, 2, critic=critic, batch_size=1, critic_thread=True)
    assert policy.model.training
    assert len(submitted) == 1 and pools[0] is not None and pools[0]._shutdown
    monkeypatch.undo()
    out = rollout(policy, env, 2, critic=critic, max_turn_tokens=8)  # and it still rolls out
    assert policy.model.training and len(out) == 2


def test_temperature_top_p_and_greedy():
    env, pol = _policy("tooluse", seed=3)
    T, top_p = 0.7, 0.8
    b = rollout(pol, env, 4, seed=2, temperature=T, top_p=top_p, **SHORT)
    g = rollout(pol, env, 4, seed=2, temperature=0, **SHORT)
    for r in _rows(b):
        ids = torch.tensor([r["prompt_ids"] + r["response_ids"]])
        with torch.no_grad():
            logits = pol.model(ids).logits[0].double()
        p = len(r["prompt_ids"])
        m = np.asarray(r["loss_mask"]).astype(bool)
        for t in np.nonzero(m)[0]:
            tok = r["response_ids"][t]
            q = torch.softmax(logits[p + t - 1] / T, -1)
            order = torch.argsort(q, descending=True, stable=True)
            before = torch.cumsum(q[order], 0) - q[order]
            nucleus = order[before < top_p]
            assert tok in nucleus.tolist()
            want = float(torch.log(q[tok] / q[nucleus].sum()))
            assert r["rollout_logprobs"][t] == pytest.approx(want, abs=2e-4)
            assert r["old_logprobs"][t] == pytest.approx(float(torch.log_softmax(logits[p + t - 1], -1)[tok]), abs=2e-4)
    for r in _rows(g):
        ids = torch.tensor([r["prompt_ids"] + r["response_ids"]])
        with torch.no_grad():
            am = pol.model(ids).logits[0].argmax(-1).numpy()
        p = len(r["prompt_ids"])
        m = np.asarray(r["loss_mask"]).astype(bool)
        assert (np.asarray(r["response_ids"])[m] == am[p - 1 : -1][m]).all()
        assert (np.asarray(r["rollout_logprobs"]) == 0).all()


def test_sample_tokens_inverts_the_cdf():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0], [3.0, 3.0, -50.0, 0.0]])
    n = 1000
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n  # evenly spread uniforms: exact quantiles
    for row in logits:
        tok, roll, old, _ = sample_tokens(row.expand(n, -1), u, 1.0, 1.0)
        p = torch.softmax(row.double(), -1)
        counts = torch.bincount(tok, minlength=4).double()
        assert (counts - n * p).abs().max() <= 1.0
        assert torch.equal(roll, old)
    p = torch.softmax(logits[0].double(), -1)  # .087 .237 .644 .032
    tok, roll, _, _ = sample_tokens(logits[:1].expand(n, -1), u, 1.0, 0.5)
    assert set(tok.tolist()) == {2} and float(roll.abs().max()) < 1e-6  # the nucleus is the top token alone
    tok, roll, _, _ = sample_tokens(logits[:1].expand(n, -1), u, 1.0, 0.7)  # nucleus {2, 1}
    q = p[[1, 2]] / p[[1, 2]].sum()
    counts = torch.bincount(tok, minlength=4).double()
    assert counts[0] == counts[3] == 0 and (counts[[1, 2]] - n * q).abs().max() <= 1.0
    assert torch.allclose(roll[tok == 1].double(), q[0].log(), atol=1e-6)


def test_task_seeds_make_episodes_reproducible():
    env, pol = _policy("automation", seed=4)
    both = rollout(pol, env, seeds=[11, 12], group_size=2, seed=5, **SHORT)
    one = rollout(pol, env, seeds=[12], group_size=2, seed=5, **SHORT)
    assert [r["response_ids"] for r in _rows(both)[2:]] == [r["response_ids"] for r in _rows(one)]
    assert [json.loads(x)["task_seed"] for x in one.field("extra_json")] == [12, 12]
    drawn = rollout(pol, env, 2, group_size=1, seed=7, **SHORT)
    assert [json.loads(x)["task_seed"] for x in drawn.field("extra_json")] == task_seeds(7, 2)


def test_bad_input_names_the_argument():
    env, pol = _policy("search")
    with pytest.raises(ValueError, match="n_episodes: expected a positive multiple of group_size=4, found 6"):
        rollout(pol, env, 6, group_size=4)
    with pytest.raises(ValueError, match="n_episodes: expected len.seeds. . group_size = 4 with seeds, found 3"):
        rollout(pol, env, 3, seeds=[1, 2], group_size=2)
    with pytest.raises(ValueError, match="temperature: expected a finite number >= 0"):
        rollout(pol, env, 1, temperature=-1)
    with pytest.raises(ValueError, match=r"top_p: expected a number in \(0, 1\], found 0"):
        rollout(pol, env, 1, top_p=0)
    with pytest.raises(ValueError, match="policy: expected a mpo_viz.models.Policy"):
        rollout(pol.model, env, 1)
    with pytest.raises(ValueError, match="max_total_tokens: expected more than the prompt"):
        rollout(pol, env, 1, max_total_tokens=10)
    other = M.tiny_policy(build_tokenizer(make_env("tooluse")))
    with pytest.raises(
        ValueError,
        match=r"policy tiny_policy\(size='1m', seed=0\) for env 'search': .* mapped to the "
        r"unknown token",
    ):
        rollout(other, env, 1)


def test_local_instruct_model_with_chat_template(tmp_path):
    env = _env("tooluse")
    pol = M.load_policy(make_instruct_folder(tmp_path / "inst", env))
    batch = rollout(pol, env, 4, group_size=2, seed=0, max_turn_tokens=8, batch_size=3)
    for r in _rows(batch):
        m = np.asarray(r["loss_mask"]).astype(bool)
        ref = teacher_forced_logprobs(pol.model, r["prompt_ids"], r["response_ids"]).numpy()
        assert np.abs(np.asarray(r["old_logprobs"])[m] - ref[m]).max() < 2e-3
        msgs = json.loads(r["messages_json"])
        text = pol.tokenizer.decode(r["prompt_ids"])
        assert text == pol.tokenizer.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
        assert "<|im_start|>tool\n" in pol.tokenizer.decode(r["response_ids"])


def test_only_last_position_logits_are_kept():
    # bounded memory: no forward of the rollout returns more than one position of logits per row
    env, pol = _policy("search", seed=5)
    shapes = []
    hook = pol.model.register_forward_hook(lambda mod, args, out: shapes.append(tuple(out.logits.shape)))
    try:
        rollout(pol, env, 6, group_size=2, batch_size=4, **SHORT)
    finally:
        hook.remove()
    assert shapes and all(s[1] == 1 and s[0] <= 4 for s in shapes)
    assert max(s[0] for s in shapes) == 4
