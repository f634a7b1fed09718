"""The token truth: positions rules on a hand-made case; the expert as the policy agrees with the exact
oracle token advantages within the standard errors (|z| < 3 on >= 95% of the measured decisive tokens,
exactly 0 at the controls) in every environment, and the three estimators agree with one another while
the π-weighted one is the least noisy; a prefix extended inside a turn gives the log-probs of one fed
alone; a model's results do not depend on the batch size or the order of the positions; the fields
round-trip and validate; the CLI; bad input is refused in one line."""

from pathlib import Path

import numpy as np
import pytest
import torch

import mpo_viz as mv
from mpo_viz import models as M
from mpo_viz.checks import OptionError
from mpo_viz.cli import main
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.envs import NoisyExpert, make_env
from mpo_viz.envs.generate import GenerateConfig, generate
from mpo_viz.rollout import inturn, rollout
from mpo_viz.rollout.engine import Engine, sample_excluding, sampling_probs
from mpo_viz.rollout.inturn import (
    expert_token_returns,
    model_token_returns,
    summarize_token_returns,
)
from mpo_viz.rollout.plan import RolloutConfig
from mpo_viz.rollout.positions import choose_positions
from mpo_viz.rollout.replay import replay, word_layout_of
from mpo_viz.rollout.token_truth import MC_TOKEN_FIELDS, mc_token_truth

pytestmark = pytest.mark.usefixtures("one_thread")
START = Path(__file__).resolve().parents[2] / "trajectories" / "starts" / "automation"


def _cat(batch, name):
    return np.concatenate([np.asarray(x, dtype=np.float64) for x in batch.field(name)])


# --------------------------------------------------------------------------------------------- positions


def _hand_batch(with_lp=True, with_dec=True):
    """One row: turn 0 = 5 action tokens, 1 observation; turn 1 = 3 action tokens. Probabilities π chosen
    so that 1 − π is, by token: turn 0: .5 .001 .2 .05 .3 | turn 1: .005 .002 .02."""
    pi = [0.5, 0.999, 0.8, 0.95, 0.7, 1.0, 0.995, 0.998, 0.98]
    row = {
        "traj_id": "a",
        "group_id": "g",
        "prompt_ids": [1],
        "response_ids": [2] * 9,
        "loss_mask": [1, 1, 1, 1, 1, 0, 1, 1, 1],
        "reward": 1.0,
    }
    if with_lp:
        row["old_logprobs"] = np.log(pi).tolist()
    b = TrajectoryBatch.from_rows([row])
    if with_dec:
        b = b.with_token_fields(decisive=[[1, 0, 0, 1, 0, 0, 0, 1, 0]])
    return b


def test_positions_rules_by_hand():
    b = _hand_batch()
    # uncertain, threshold .01, at most 4: turn 0 has .5 .2 .05 .3 (all 4, most uncertain first: cols 0, 4, 2, 3);
    # turn 1 has only .02 (col 8); controls: one of the others per turn
    p = choose_positions(b, "uncertain", threshold=0.01, max_per_turn=4, controls=1, seed=0)
    rule = [(q.turn, q.t, q.col) for q in p if not q.control]
    assert rule == [(0, 0, 0), (0, 2, 2), (0, 3, 3), (0, 4, 4), (1, 2, 8)]
    ctl = [q for q in p if q.control]
    assert [c.turn for c in ctl] == [0, 1] and ctl[0].col == 1 and ctl[1].col in (6, 7)
    # the cap keeps the most uncertain: .5 and .3
    p = choose_positions(b, "uncertain", threshold=0.01, max_per_turn=2, controls=0)
    assert [q.col for q in p] == [0, 4, 8]
    # a higher threshold: only .5, .2, .3 (and no turn-1 token); controls drawn among the rest, reproducibly
    p = choose_positions(b, "uncertain", threshold=0.1, max_per_turn=4, controls=2, seed=3)
    assert [q.col for q in p if not q.control] == [0, 2, 4]
    c1 = [q.col for q in p if q.control]
    assert len(c1) == 4 and set(c1[:2]) <= {1, 3} and set(c1[2:]) <= {6, 7, 8}
    assert c1 == [q.col for q in choose_positions(b, "uncertain", threshold=0.1, controls=2, seed=3) if q.control]
    # decisive: the flagged tokens, plus controls among the others
    p = choose_positions(b, "decisive", controls=1, seed=0)
    assert [q.col for q in p if not q.control] == [0, 3, 7] and sum(q.control for q in p) == 2
    # all: every action token, no controls
    p = choose_positions(b, "all")
    assert [q.col for q in p] == [0, 1, 2, 3, 4, 6, 7, 8] and [q.t for q in p] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert not any(q.control for q in p)


def test_positions_refuse_what_the_file_cannot_serve():
    with pytest.raises(
        OptionError, match="needs the policy's recorded log-probs.*positions='decisive'.*positions='all'"
    ):
        choose_positions(_hand_batch(with_lp=False), "uncertain")
    with pytest.raises(OptionError, match="needs the oracle's decisive column"):
        choose_positions(_hand_batch(with_dec=False), "decisive")
    for kw, msg in (
        (dict(threshold=1.5), "threshold"),
        (dict(max_per_turn=0), "max_per_turn"),
        (dict(controls=-1), "controls"),
    ):
        with pytest.raises(OptionError, match=msg):
            choose_positions(_hand_batch(), "uncertain", **kw)
    with pytest.raises(OptionError, match="expected one of uncertain, decisive, all"):
        choose_positions(_hand_batch(), "random")


# --------------------------------------------------------------------------------------------- the expert


@pytest.mark.parametrize("name", ["automation", "search", "tooluse"])
def test_the_expert_as_policy_agrees_with_the_exact_oracle(name):
    """At the uncertain defaults (the expert's own π): the measured uncertain tokens are its decisive
    ones; |z| < 3 on >= 95% of them, z = (Â − a*) / se; the controls (filler: π = 1) get Â = 0 exactly."""
    batch = generate(GenerateConfig(env=name, episodes=24, group_size=4, seed=3, noise=0.3))
    out = mc_token_truth(batch, NoisyExpert(noise=0.3), m=32, seed=1, progress=False)
    meas, ctl = _cat(out, "mc_tok_measured") == 1, _cat(out, "mc_tok_control") == 1
    adv, se, orc = _cat(out, "mc_tok_adv"), _cat(out, "mc_tok_adv_se"), _cat(out, "oracle_token_adv")
    dec = _cat(out, "decisive") > 0.5
    rule = meas & ~ctl
    assert rule.sum() > 60 and np.all(dec[rule])  # the expert is uncertain exactly where a token decides
    diff = adv - orc
    z = np.where(np.abs(diff) < 1e-6, 0.0, diff / np.where(se > 0, se, 1e-300))  # the oracle is stored as float32
    assert np.mean(np.abs(z[rule]) < 3) >= 0.95, np.sort(np.abs(z[rule]))[-8:]
    assert abs(np.mean(diff[rule])) < 0.01  # no bias
    assert ctl.sum() >= int(batch.num_turns.sum()) * 0.9  # nearly every turn has a filler token to draw
    np.testing.assert_array_equal(adv[ctl], 0.0)
    np.testing.assert_array_equal(_cat(out, "mc_tok_pi")[ctl], 1.0)
    np.testing.assert_allclose((_cat(out, "mc_tok_adv_a") + _cat(out, "mc_tok_adv_b"))[meas] / 2, adv[meas], atol=1e-12)
    assert np.all(np.isnan(adv[~meas])) and np.all(se[meas] >= 0)
    meta = out.meta["mc_truth"]["tokens"]
    assert meta["positions"] == "uncertain" and meta["m"] == 32 and meta["measured"] == meas.sum()
    assert meta["uncertainty"] == "the expert's own π" and meta["measured_controls"] == ctl.sum()


def test_the_estimators_agree_and_the_pi_weighted_one_is_the_least_noisy():
    """plain, crn and pi on the same decisive tokens (automation, 16 episodes, M = 64): each within its
    standard errors of the oracle on average (no bias), and the squared error against the oracle
    ordered pi < crn < plain (the variance reduction of docs/concepts.md §6a)."""
    batch = generate(GenerateConfig(env="automation", episodes=16, group_size=4, seed=5, noise=0.3))
    err = {}
    for est in ("plain", "crn", "pi"):
        out = mc_token_truth(
            batch, NoisyExpert(noise=0.3), m=64, seed=2, positions="decisive", controls=0, estimator=est, progress=False
        )
        meas = _cat(out, "mc_tok_measured") == 1
        d = (_cat(out, "mc_tok_adv") - _cat(out, "oracle_token_adv"))[meas]
        se = _cat(out, "mc_tok_adv_se")[meas]
        assert abs(d.mean()) < 3 * np.sqrt(np.sum(se**2)) / len(d) + 1e-6, est  # the mean error within 3 SE
        err[est] = float(np.mean(d**2))
    assert err["pi"] < err["crn"] < err["plain"], err
    assert err["plain"] / err["pi"] > 4, err


def test_summaries_by_hand():
    q = np.array([0.75, 1.0])
    f = np.array([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    a = np.array([[0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    s = summarize_token_returns(q, f, a, "pi")
    d = 0.25 * np.array([1.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(s["adv"], [d.mean(), 0.0])
    np.testing.assert_allclose(s["se"], [d.std(ddof=1) / 2, 0.0])
    np.testing.assert_allclose(s["a"], [0.125, 0.0])
    np.testing.assert_allclose(s["b"], [0.125, 0.0])
    p = summarize_token_returns(q, f, a, "plain")
    np.testing.assert_allclose(p["adv"], [0.5, 0.0])


def test_sampling_without_a_token_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    q = sampling_probs(logits, 1.0, 1.0)
    np.testing.assert_allclose(q.numpy(), [[0.5, 0.25, 0.125, 0.125]], atol=1e-7)
    np.testing.assert_allclose(sampling_probs(logits, 1.0, 0.7).numpy(), [[2 / 3, 1 / 3, 0, 0]], atol=1e-7)
    np.testing.assert_array_equal(sampling_probs(logits, 0.0, 1.0).numpy(), [[1, 0, 0, 0]])
    # without token 0 the rest is (.5, .25, .25): u = .1 -> 1, .6 -> 2, .9 -> 3
    u = torch.tensor([0.1, 0.6, 0.9], dtype=torch.float64)
    tok, roll, old, _ = sample_excluding(logits.expand(3, -1), u, torch.tensor([0, 0, 0]), 1.0, 1.0)
    assert tok.tolist() == [1, 2, 3]
    np.testing.assert_allclose(roll.numpy(), np.log([0.5, 0.25, 0.25]), atol=1e-6)
    np.testing.assert_allclose(old.numpy(), np.log([0.25, 0.125, 0.125]), atol=1e-6)
    with pytest.raises(ValueError, match="holds all of the sampling distribution's mass"):
        sample_excluding(logits, u[:1], torch.tensor([0]), 0.0, 1.0)


# --------------------------------------------------------------------------------------------- a model


@pytest.fixture(scope="module")
def start_episodes():
    policy, _ = M.load(START)
    batch = rollout(policy, make_env("automation", difficulty=(3, 4)), 4, group_size=2, seed=11, progress=False)
    return policy, batch


def _fed_alone(model, seq):
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq])).logits[0, -1]


def test_a_prefix_extended_inside_a_turn_gives_the_logprobs_of_one_fed_alone(start_episodes):
    """The rows a turn's single forward is cut into (positions t = 0, 3 and the last of one turn, and
    one of another turn, each forced and not) carry the logits of their prefix fed alone, and so do
    they after one more token decoded with the cache."""
    policy, batch = start_episodes
    model = policy.model.eval()
    states = [s for r in replay(batch, policy.layout) for s in r]
    st, st2 = states[1], states[4]
    n = len(st.action_ids)
    cfg = RolloutConfig(batch_size=64)
    out = {"q": np.ones(4), "forced": np.zeros((4, 1)), "alt": np.zeros((4, 1))}
    run = inturn._Run(
        policy,
        Engine(model, policy.tokenizer.pad_token_id),
        1,
        0,
        cfg,
        "crn",
        "free",
        1.0,
        inturn.Timer(),
        inturn._Bar(None),
        out,
    )
    with torch.no_grad():
        rows, logits = run._admit([(0, st, 0), (1, st, 3), (2, st, n - 1), (3, st2, 2)])
        assert len(rows) == 8
        seqs = [list(r_st.prefix) + r.head for r, r_st in zip(rows, [st] * 6 + [st2] * 2)]
        for b, seq in enumerate(seqs):
            torch.testing.assert_close(
                torch.log_softmax(logits[b], -1), torch.log_softmax(_fed_alone(model, seq), -1), atol=1e-4, rtol=1e-4
            )
        tok = torch.tensor([[int(st.action_ids[0])]] * len(rows))
        pos = run.engine.next_pos[:, None].clone()
        run.engine.next_pos = run.engine.next_pos + 1
        step = run.engine.forward(tok, torch.ones(len(rows), 1, dtype=torch.long), pos)
        for b, seq in enumerate(seqs):
            torch.testing.assert_close(
                torch.log_softmax(step[b], -1),
                torch.log_softmax(_fed_alone(model, seq + [int(tok[b, 0])]), -1),
                atol=1e-4,
                rtol=1e-4,
            )
    # the probability of the recorded token at each position is the policy's own (the file's log-probs)
    lp = np.asarray(batch.field("old_logprobs")[st.row])
    for j, t in enumerate((0, 3, n - 1)):
        assert out["q"][j] == pytest.approx(np.exp(lp[st.start + t]), abs=1e-4)


def test_results_do_not_depend_on_batch_size_or_order(start_episodes):
    policy, batch = start_episodes
    states = [s for r in replay(batch, policy.layout) for s in r]
    items = [(states[0], 0), (states[0], 5), (states[2], 1), (states[3], len(states[3].action_ids) - 1), (states[5], 2)]
    gen = batch.meta["generator"]
    res = {}
    for bs, order in ((64, 1), (8, 1), (24, -1)):
        cfg = RolloutConfig(
            batch_size=bs, max_turn_tokens=gen["max_turn_tokens"], max_total_tokens=gen["max_total_tokens"]
        )
        r = model_token_returns(policy, items[::order], 3, seed=4, cfg=cfg, estimator="crn")
        res[bs] = {k: v[::order] for k, v in r.items()}
    for bs in (8, 24):
        np.testing.assert_array_equal(res[bs]["forced"], res[64]["forced"])
        np.testing.assert_array_equal(res[bs]["alt"], res[64]["alt"])
        np.testing.assert_allclose(res[bs]["q"], res[64]["q"], rtol=1e-5)
    assert 0 < res[64]["forced"].mean() < 1


def test_a_model_token_truth_round_trips_and_validates(start_episodes, tmp_path):
    policy, batch = start_episodes
    tm: dict = {}
    out = mc_token_truth(batch, policy, m=2, seed=0, max_per_turn=2, progress=False, timings=tm)
    for f in MC_TOKEN_FIELDS:
        assert [len(x) for x in out.field(f)] == batch.lengths.tolist()
    meas, ctl = _cat(out, "mc_tok_measured") == 1, _cat(out, "mc_tok_control") == 1
    mask = np.concatenate([np.asarray(x) for x in batch.field("loss_mask")]) == 1
    assert meas.any() and np.all(mask[meas]) and np.all(meas[ctl])
    unc = 1 - np.exp(_cat(batch, "old_logprobs"))
    assert np.all(unc[meas & ~ctl] > 0.01) and np.all(unc[ctl] <= 0.01)
    # the continuation policy's π of the recorded token is the file's (the same policy at T = 1)
    np.testing.assert_allclose(_cat(out, "mc_tok_pi")[meas], 1 - unc[meas], atol=1e-4)
    meta = out.meta["mc_truth"]["tokens"]
    assert meta["uncertainty"] == "old_logprobs" and meta["estimator"] == "pi" and meta["seconds"] > 0
    assert tm["tokens"] > 0
    for path in (tmp_path / "t.parquet", tmp_path / "t.jsonl"):
        mv.save(out, path)
        back = mv.load(path)
        for f in MC_TOKEN_FIELDS:
            np.testing.assert_array_equal(_cat(back, f), _cat(out, f))
        assert back.meta["mc_truth"]["tokens"]["m"] == 2
        assert main(["validate", str(path)]) == 0


def test_cli_token_truth(tmp_path, capsys):
    src = tmp_path / "e.parquet"
    mv.save(generate(GenerateConfig(env="search", episodes=4, group_size=2, seed=0)), src)
    out = tmp_path / "t.parquet"
    assert (
        main(
            [
                "truth",
                str(src),
                "-o",
                str(out),
                "--policy",
                "expert",
                "-M",
                "4",
                "--tokens",
                "uncertain",
                "--tokens-M",
                "4",
                "-q",
            ]
        )
        == 0
    )
    said = capsys.readouterr().out
    assert "token truth of the noisy expert" in said and "tokens measured" in said
    back = mv.load(out)
    assert back.has("mc_value") and back.has("mc_tok_adv") and back.meta["mc_truth"]["tokens"]["m"] == 4
    assert back.meta["mc_truth"]["m"] == 4  # the turn-level truth beside it
    only = tmp_path / "only.parquet"
    assert (
        main(
            [
                "truth",
                str(src),
                "-o",
                str(only),
                "--policy",
                "expert",
                "--tokens",
                "decisive",
                "--no-turns",
                "--tokens-M",
                "2",
                "-q",
            ]
        )
        == 0
    )
    b2 = mv.load(only)
    assert b2.has("mc_tok_adv") and not b2.has("mc_value")
    assert main(["truth", str(src), "-o", str(only), "--policy", "expert", "--no-turns", "-q"]) == 2
    assert "--no-turns: expected --tokens" in capsys.readouterr().err
    assert (
        main(["truth", str(src), "-o", str(only), "--policy", "expert", "--tokens", "all", "--tokens-M", "1", "-q"])
        == 1
    )
    assert "--tokens-M: expected at least 2" in capsys.readouterr().err


def test_cli_uncertain_without_logprobs_says_so_in_one_line(tmp_path, capsys):
    """A model on a file without log-probs (an expert file): one line naming decisive and all."""
    src = tmp_path / "e.parquet"
    mv.save(generate(GenerateConfig(env="automation", episodes=2, group_size=2, seed=0, difficulty=(3, 4))), src)
    assert (
        main(
            [
                "truth",
                str(src),
                "-o",
                str(tmp_path / "o.parquet"),
                "--model",
                str(START),
                "--tokens",
                "uncertain",
                "--no-turns",
                "-q",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--tokens uncertain" in err and "log-probs" in err and "'decisive'" in err and "'all'" in err


def test_bad_options_are_refused(start_episodes):
    policy, batch = start_episodes
    with pytest.raises(OptionError, match="at least 2 continuation pairs"):
        mc_token_truth(batch, policy, m=1)
    with pytest.raises(OptionError, match="estimator: expected one of pi, crn, plain"):
        mc_token_truth(batch, policy, estimator="cv")
    with pytest.raises(OptionError, match="expected a mpo_viz.models.Policy or a NoisyExpert"):
        mc_token_truth(batch, "expert")
    # the expert cannot continue a turn it would never write (the model's turns)
    with pytest.raises(OptionError, match="the expert never writes"):
        mc_token_truth(batch, NoisyExpert(noise=0.3), positions="all", m=2, progress=False)


def test_expert_returns_by_hand_on_a_sure_token():
    """A filler token (π = 1): under pi nothing runs and Â = 0; under plain the forced and free
    continuations are the same law, and with shared random numbers (crn) the same draws."""
    batch = generate(GenerateConfig(env="search", episodes=1, group_size=1, seed=2, noise=0.3))
    layout = word_layout_of(make_env("search"))
    st = replay(batch, layout)[0][0]
    dec = np.asarray(batch.field("decisive")[0])[st.start : st.end]
    t = int(np.flatnonzero(dec == 0)[0])
    pi = expert_token_returns(NoisyExpert(noise=0.3), [(st, t)], 8, seed=0, layout=layout, estimator="pi")
    assert pi["q"][0] == 1.0 and not pi["forced"].any() and not pi["alt"].any()
    crn = expert_token_returns(NoisyExpert(noise=0.3), [(st, t)], 8, seed=0, layout=layout, estimator="crn")
    np.testing.assert_array_equal(crn["forced"], crn["alt"])
