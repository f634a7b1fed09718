"""Monte-Carlo truth: the expert as the policy agrees with the exact oracle within its standard
errors; a prefix fed once and duplicated gives the log-probs of prefixes fed one by one; results do
not depend on the batch size or on prefix sharing; the fields round-trip and validate; bad input is
refused."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import mpo_viz as mv
from mpo_viz import models as M
from mpo_viz.checks import OptionError
from mpo_viz.cli import main
from mpo_viz.envs import NoisyExpert, make_env
from mpo_viz.envs.generate import GenerateConfig, generate
from mpo_viz.rollout import rollout
from mpo_viz.rollout.branch import turn_return
from mpo_viz.rollout.engine import Engine
from mpo_viz.rollout.truth import mc_truth, summarize_returns

pytestmark = pytest.mark.usefixtures("one_thread")
START = Path(__file__).resolve().parents[2] / "trajectories" / "starts" / "automation"


@pytest.fixture(scope="module")
def start_episodes():
    policy, _ = M.load(START)
    env = make_env("automation", difficulty=(3, 4))
    batch = rollout(policy, env, 6, group_size=2, seed=11, progress=False)
    return policy, batch


def test_summaries_by_hand():
    g = np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    s = summarize_returns(g)
    np.testing.assert_allclose(s["mean"], [0.75, 0.0])
    np.testing.assert_allclose(s["se"], [np.sqrt(0.25 / 4), 0.0])  # std(ddof=1) of 1,0,1,1 = 0.5
    np.testing.assert_allclose(s["a"], [0.5, 0.0])
    np.testing.assert_allclose(s["b"], [1.0, 0.0])
    assert turn_return([0.0, 0.5, 1.0], 0.9) == pytest.approx(0.9 * 0.5 + 0.81) and turn_return([]) == 0.0


@pytest.mark.parametrize("name", ["automation", "search", "tooluse"])
def test_the_expert_as_policy_agrees_with_the_exact_oracle(name):
    """|z| < 3 on >= 95% of turns, z = (V̂ − V) / SE with the exact binomial SE sqrt(V(1 − V)/M) of
    0/1 returns; the same for Q̂ after the recorded turn."""
    batch = generate(GenerateConfig(env=name, episodes=24, group_size=4, seed=3, noise=0.3))
    m = 48
    out = mc_truth(batch, NoisyExpert(noise=0.3), m=m, seed=1, q=True, progress=False)
    orc = [json.loads(x)["oracle"] for x in batch.field("extra_json")]
    for field, key in (("mc_value", "turn_v"), ("mc_q", "turn_q")):
        est = np.concatenate(out.field(field))
        true = np.concatenate([o[key] for o in orc])
        se = np.sqrt(np.clip(true * (1 - true), 1e-4, None) / m)
        z = (est - true) / se
        assert len(z) == int(batch.num_turns.sum()) > 60
        assert np.mean(np.abs(z) < 3) >= 0.95, (field, np.sort(np.abs(z))[-5:])
        assert abs(np.mean(z)) < 0.5  # no bias
    se_hat = np.concatenate(out.field("mc_value_se"))
    halves = np.concatenate(out.field("mc_value_a")) + np.concatenate(out.field("mc_value_b"))
    np.testing.assert_allclose(halves / 2, np.concatenate(out.field("mc_value")), atol=1e-12)
    assert np.all(se_hat >= 0)
    meta = out.meta["mc_truth"]
    assert meta["policy"] == "expert(noise=0.3)" and meta["m"] == m and meta["q"] and meta["boundaries"] == len(z)


def test_a_duplicated_prefix_gives_the_logprobs_of_prefixes_fed_alone(start_episodes):
    """Engine level: one row fed a prefix, its keys and values duplicated 3 times, then three
    different tokens; against three rows each fed the prefix; and rows appended from another engine
    of a different width against rows fed together."""
    policy, batch = start_episodes
    model = policy.model.eval()
    pad = policy.tokenizer.pad_token_id
    r0, r1 = batch.row(0), batch.row(1)
    pre = list(r0["prompt_ids"]) + list(r0["response_ids"])[:30]
    other = list(r1["prompt_ids"]) + list(r1["response_ids"])[:9]
    toks = torch.tensor([[int(pre[5])], [int(pre[6])], [int(pre[7])]])

    def feed(engine, seqs):
        w = max(map(len, seqs))
        ids = torch.full((len(seqs), w), pad)
        msk = torch.zeros((len(seqs), w), dtype=torch.long)
        pos = torch.zeros((len(seqs), w), dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, w - len(s) :] = torch.tensor(s)
            msk[b, w - len(s) :] = 1
            pos[b, w - len(s) :] = torch.arange(len(s))
        engine.next_pos = msk.sum(1)
        return engine.forward(ids, msk, pos)

    def step(engine, tok):
        col = torch.ones(len(tok), 1, dtype=torch.long)
        pos = engine.next_pos[:, None].clone()
        engine.next_pos = engine.next_pos + 1
        return engine.forward(tok, col, pos)

    with torch.no_grad():
        shared = Engine(model, pad)
        shared.add_rows(1)
        first = feed(shared, [pre])
        shared.keep_rows([0, 0, 0])
        a = step(shared, toks)
        alone = Engine(model, pad)
        alone.add_rows(3)
        first3 = feed(alone, [pre] * 3)
        b = step(alone, toks)
        torch.testing.assert_close(first3, first.expand(3, -1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.log_softmax(a, -1), torch.log_softmax(b, -1), atol=1e-5, rtol=1e-5)
        # rows of another engine appended (their widths differ: left padding) = rows fed together
        e1, e2 = Engine(model, pad), Engine(model, pad)
        e1.add_rows(1)
        e2.add_rows(1)
        feed(e1, [pre])
        feed(e2, [other])
        e1.append(e2)
        together = Engine(model, pad)
        together.add_rows(2)
        feed(together, [pre, other])
        t2 = toks[:2]
        torch.testing.assert_close(
            torch.log_softmax(step(e1, t2), -1), torch.log_softmax(step(together, t2), -1), atol=1e-5, rtol=1e-5
        )


def test_branch_results_do_not_depend_on_batch_size_or_prefix_sharing(start_episodes):
    from mpo_viz.rollout.branch import branch_returns
    from mpo_viz.rollout.plan import RolloutConfig
    from mpo_viz.rollout.replay import replay

    policy, batch = start_episodes
    states = [s for r in replay(batch, policy.layout) for s in r]
    cfg = batch.meta["generator"]
    out = {}
    for bs, share in ((64, True), (8, True), (64, False)):
        rc = RolloutConfig(
            batch_size=bs, max_turn_tokens=cfg["max_turn_tokens"], max_total_tokens=cfg["max_total_tokens"]
        )
        tm: dict = {}
        out[bs, share] = (branch_returns(policy, states, 4, seed=2, cfg=rc, timings=tm), tm["tokens"])
    ref, tokens = out[64, True]
    assert ref.shape == (len(states), 4) and 0 < ref.mean() < 1  # the start succeeds sometimes
    for key, (g, n) in out.items():
        np.testing.assert_array_equal(g, ref, err_msg=str(key))
        assert n == tokens
    # the order of the boundaries and which others are computed change nothing
    rev = branch_returns(
        policy,
        states[::-1][:5],
        4,
        seed=2,
        cfg=RolloutConfig(
            batch_size=16, max_turn_tokens=cfg["max_turn_tokens"], max_total_tokens=cfg["max_total_tokens"]
        ),
    )
    np.testing.assert_array_equal(rev, ref[::-1][:5])


def test_mc_truth_of_a_policy_writes_fields_that_round_trip(start_episodes, tmp_path):
    policy, batch = start_episodes
    tm: dict = {}
    out = mc_truth(batch, policy, m=4, seed=0, q=True, progress=False, timings=tm)
    k = batch.num_turns
    for f in ("mc_value", "mc_value_se", "mc_value_a", "mc_value_b", "mc_q", "mc_q_se"):
        assert [len(x) for x in out.field(f)] == k.tolist()
    meta = out.meta["mc_truth"]
    assert meta["policy"] == policy.name and meta["m"] == 4 and meta["seed"] == 0 and meta["seconds"] > 0
    assert meta["max_total_tokens"] == batch.meta["generator"]["max_total_tokens"] and tm["tokens"] > 0
    # V at the last turn of a terminated episode: Q of its recorded last turn is its reward (the episode ends)
    path = tmp_path / "t.parquet"
    mv.save(out, path)
    back = mv.load(path)
    for f in ("mc_value", "mc_q_se"):
        for a, b in zip(out.field(f), back.field(f)):
            np.testing.assert_array_equal(a, b)
    assert back.meta["mc_truth"]["m"] == 4
    assert main(["validate", str(path)]) == 0


def test_bad_input_is_refused(start_episodes, tmp_path, capsys):
    policy, batch = start_episodes
    with pytest.raises(OptionError, match="at least 2 continuations"):
        mc_truth(batch, policy, m=1)
    with pytest.raises(OptionError, match="expected a mpo_viz.models.Policy or a NoisyExpert"):
        mc_truth(batch, "expert", m=4)
    rows = [batch.row(i) for i in range(len(batch))]
    for r in rows:
        r.pop("extra_json")
    path = tmp_path / "noseeds.parquet"
    mv.save(mv.TrajectoryBatch.from_rows(rows, meta=batch.meta), path)
    assert main(["truth", str(path), "-o", str(tmp_path / "o.parquet"), "--policy", "expert", "-q"]) == 1
    assert "extra_json has no task_seed and seed" in capsys.readouterr().err
    assert main(["truth", str(path), "-o", str(tmp_path / "o.parquet"), "--policy", "expert", "-M", "1"]) == 1
    assert "-M: expected at least 2" in capsys.readouterr().err
    assert main(["truth", str(path), "-o", str(tmp_path / "o.parquet")]) == 2


def test_cli_truth_with_the_expert(tmp_path, capsys):
    src = tmp_path / "e.parquet"
    mv.save(generate(GenerateConfig(env="search", episodes=4, group_size=2, seed=0)), src)
    out = tmp_path / "t.jsonl"
    assert main(["truth", str(src), "-o", str(out), "--policy", "expert", "--noise", "0.25", "-M", "4", "-q"]) == 0
    said = capsys.readouterr().out
    assert "Monte-Carlo truth of the noisy expert (noise 0.25)" in said and "wrote" in said
    back = mv.load(out)
    assert back.has("mc_value") and not back.has("mc_q") and back.meta["mc_truth"]["m"] == 4


def _fields_and_meta(path):
    b = mv.load(path)
    fields = {f: [np.asarray(x).tolist() for x in b.field(f)] for f in sorted(b.fields)}
    meta = json.loads(json.dumps(b.meta, default=str))
    for m in (meta["mc_truth"], meta["mc_truth"].get("tokens", {})):
        m.pop("seconds", None)  # the one number that is not the same
    return fields, meta


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_cli_truth_chunk_by_chunk_is_the_whole_files(start_episodes, tmp_path, capsys, suffix):
    """--max-tokens 1: every episode its own chunk, across the two files of a folder; the fields, the
    metadata's counts and the printed totals are those of one pass over the whole input."""
    policy, batch = start_episodes
    src = tmp_path / "in"
    mv.save(batch[:2], src / "a.parquet")
    mv.save(batch[2:], src / "b.parquet")
    base = ["truth", str(src), "--model", str(START), "-M", "2", "--tokens", "decisive", "--tokens-M", "2", "-q"]
    said = {}
    for name, chunk in (("whole", "10000000"), ("cut", "1")):
        # each output in a folder of its own (JSONL files of a folder share one _meta.json)
        assert main([*base, "-o", str(tmp_path / name / f"out{suffix}"), "--max-tokens", chunk]) == 0
        said[name] = [line for line in capsys.readouterr().out.splitlines() if "standard error" in line]
    whole, cut = (_fields_and_meta(tmp_path / name / f"out{suffix}") for name in ("whole", "cut"))
    assert cut[1] == whole[1] and cut[0].keys() == whole[0].keys()
    for f in whole[0]:
        if f.startswith("mc_tok_") and f not in ("mc_tok_measured", "mc_tok_control"):
            # the token's pi comes from a batched forward: the same to float rounding
            for a, b in zip(cut[0][f], whole[0][f]):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9, err_msg=f)
        else:  # the turn truth, the flags and the input's fields: bit for bit
            assert cut[0][f] == whole[0][f] or np.array_equal(
                np.asarray(cut[0][f], dtype=object), np.asarray(whole[0][f], dtype=object)
            ), f
    assert whole[1]["mc_truth"]["boundaries"] == int(batch.num_turns.sum())
    assert whole[1]["mc_truth"]["tokens"]["measured"] == sum(map(sum, whole[0]["mc_tok_measured"])) > 0
    assert [s.split(", ")[:2] for s in said["cut"]] == [s.split(", ")[:2] for s in said["whole"]]
    assert len(said["whole"]) == 2 and said["whole"][0].startswith(f"{batch.num_turns.sum()} turn starts")


def test_cli_truth_on_an_empty_file_says_so(tmp_path, capsys):
    src = tmp_path / "e.parquet"
    mv.save(generate(GenerateConfig(env="search", episodes=2, group_size=2, seed=0))[:0], src)
    assert main(["truth", str(src), "-o", str(tmp_path / "o.parquet"), "--policy", "expert", "-q"]) == 1
    assert "no trajectories to measure (0 rows)" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists() and not list(tmp_path.glob("*.parts.tmp"))
    (tmp_path / "a.jsonl").write_text("")  # a .jsonl output beside other JSONL files: refused at once
    assert main(["truth", str(src), "-o", str(tmp_path / "o.jsonl"), "--policy", "expert", "-q"]) == 2
    assert "share _meta.json, and a.jsonl already use it" in capsys.readouterr().err
