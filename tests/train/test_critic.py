"""The critic before and during RL: fitting to a held-out gate (train/critic_fit.py), the trainer's
warm-up and its targets, ``critic_epochs``, the oracle critic, ``value_target``. (fit_critic on logs:
tests/train/test_fitted_critic.py.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaModel

import mpo_viz as mv
from mpo_viz.advantages import mc_returns
from mpo_viz.models import Critic
from mpo_viz.train import Trainer
from mpo_viz.train.config import ExpertCriticWarning
from mpo_viz.train.critic_fit import critic_outputs, fit_positions, fit_values, holdout_split
from mpo_viz.train.update import rows_of
from tests.train.critic_helpers import label_batch
from tests.train.train_helpers import register_threesteps, tiny


def _small_critic(vocab: int = 12, seed: int = 0) -> Critic:
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return Critic(LlamaModel(cfg)).eval()


def test_holdout_split_is_seeded_disjoint_and_refuses_too_few():
    tr, ho = holdout_split(10, 0.2, seed=3)
    assert len(ho) == 2 and len(tr) == 8 and not set(tr) & set(ho) and sorted([*tr, *ho]) == list(range(10))
    assert [a.tolist() for a in holdout_split(10, 0.2, seed=3)] == [tr.tolist(), ho.tolist()]
    with pytest.raises(ValueError, match="holdout: a held-out split needs at least 2 trajectories, found 1"):
        holdout_split(1, 0.2, seed=0)
    with pytest.raises(ValueError, match=r"holdout: expected a share in \(0, 1\), found 1.5"):
        holdout_split(10, 1.5, seed=0)


def test_critic_outputs_are_aligned_with_a_direct_forward():
    # the value of response token t is the critic's output at position P + t - 1 (the state before t)
    b = label_batch(4)
    critic = _small_critic()
    got = critic_outputs(critic, rows_of(b), [2, 0, 3], pad_id=0, device="cpu", micro_batch_tokens=9)
    for j, i in enumerate([2, 0, 3]):
        seq = torch.tensor([[*b.field("prompt_ids")[i], *b.field("response_ids")[i]]])
        with torch.no_grad():
            out = critic(seq)[0]
        P, L = len(b.field("prompt_ids")[i]), len(b.field("response_ids")[i])
        np.testing.assert_allclose(got[j, :L].numpy(), out[P - 1 : P + L - 1].numpy(), rtol=1e-5, atol=1e-6)


def test_fit_stops_at_the_gate_on_an_easy_fit():
    b = label_batch()
    critic = _small_critic()
    fit = fit_values(
        critic, b, mc_returns(b), steps=300, lr=3e-3, batch_episodes=16, holdout=0.25, gate=0.9, eval_every=10, seed=0
    )
    assert fit.stop == "gate" and fit.passed and fit.steps < 300
    assert fit.heldout_ev >= 0.9 and fit.n_heldout == 15 and fit.n_train == 45
    assert fit.history[0]["step"] == 0 and fit.history[-1]["step"] == fit.steps
    assert "passed the gate 0.9" in fit.summary()
    # deterministic for a seed
    again = fit_values(
        _small_critic(),
        b,
        mc_returns(b),
        steps=300,
        lr=3e-3,
        batch_episodes=16,
        holdout=0.25,
        gate=0.9,
        eval_every=10,
        seed=0,
    )
    assert again.steps == fit.steps and again.heldout_ev == fit.heldout_ev


def test_fit_at_turn_starts_reads_only_turn_start_positions():
    """positions="turn_start": the loss and the explained variance read each turn's first action
    token only (positions 0 and 3 of the label batch's two turns): changing the targets anywhere
    else changes nothing, bit for bit; changing one at a turn start changes the fit."""
    b = label_batch(24)
    np.testing.assert_array_equal(fit_positions(b, "turn_start")[0].numpy(), [True, False, False, True, False])
    assert torch.equal(fit_positions(b, "all"), b.mask.bool())
    g = mc_returns(b)
    kw = dict(steps=12, lr=3e-3, batch_episodes=8, holdout=0.25, gate=None, eval_every=4, seed=0)

    def fit(targets):
        c = _small_critic()
        f = fit_values(c, b, targets, positions="turn_start", **kw)
        return f, [p.detach().clone() for p in c.parameters()]

    ref, w = fit(g)
    other = g.clone()
    other[:, [1, 4]] += 5.0  # inside turns (and an observation token): not read
    f2, w2 = fit(other)
    assert [h["heldout_ev"] for h in f2.history] == [h["heldout_ev"] for h in ref.history]
    assert all(torch.equal(a, c) for a, c in zip(w, w2))
    moved = g.clone()
    moved[:, 3] += 1.0  # the second turn's first token
    _, w3 = fit(moved)
    assert not all(torch.equal(a, c) for a, c in zip(w, w3))
    with pytest.raises(ValueError, match="positions: expected one of all, turn_start"):
        fit_positions(b, "first")


def test_fit_says_so_when_the_budget_ends_first():
    b = label_batch()
    fit = fit_values(_small_critic(), b, mc_returns(b), steps=3, lr=1e-4, batch_episodes=8, gate=0.99, eval_every=2)
    assert fit.stop == "budget" and not fit.passed and fit.steps == 3
    assert [h["step"] for h in fit.history] == [0, 2, 3]
    assert "the budget of 3 steps ended before the gate 0.99" in fit.summary()
    nogate = fit_values(_small_critic(), b, mc_returns(b), steps=2, lr=1e-4, batch_episodes=8, gate=None, eval_every=2)
    assert nogate.stop == "budget" and "the whole budget of 2 steps, no gate" in nogate.summary()
    assert "nan" not in nogate.summary().split(";")[0].split("(")[1]
    # gate=None: the whole budget, whatever the EV
    assert fit_values(_small_critic(), b, mc_returns(b), steps=4, gate=None, eval_every=2).steps == 4


def test_trainer_warmup_records_why_it_stopped(tmp_path, monkeypatch):
    # a pool with returns to learn (the labelled batch) and a gate the budget cannot reach
    cfg = tiny(estimator="gae", critic_warmup_episodes=12, critic_warmup_steps=2, critic_warmup_ev=1.0)
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    tr.critic = _small_critic(len(tr.policy.tokenizer))
    monkeypatch.setattr(tr, "_rollout", lambda n, **kw: label_batch(n))
    lines = []
    rec = tr.warmup_critic(log=lines.append)
    assert rec["phase"] == "critic_warmup" and rec["warmup_stop"] == "budget" and rec["warmup_passed"] is False
    assert rec["warmup_steps"] == 2 and rec["warmup_episodes"] == 12 and rec["warmup_heldout_episodes"] == 2
    assert rec["warmup_gate"] == 1.0 and "warmup_values_across_within_ratio" in rec and rec["warmup_constant"] is None
    assert lines == [rec["warmup_summary"]] and "the budget of 2 steps ended before the gate 1" in lines[0]
    assert set(rec["seconds"]) == {"warmup_pool", "warmup_fit"} and min(rec["seconds"].values()) >= 0
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["warmup_stop"] == "budget"


def _lose_everywhere_but(n: int, wins) -> mv.TrajectoryBatch:
    """The labelled batch of :func:`label_batch` with the rows ``wins`` winning, the others losing."""
    rows = []
    for i in range(n):
        win = i in set(wins)
        rows.append(
            {
                "traj_id": f"t{i}",
                "group_id": f"g{i}",
                "prompt_ids": [1, 3 if win else 4],
                "response_ids": [5, 6, 7, 8, 9],
                "loss_mask": [1, 1, 0, 1, 1],
                "reward": 1.0 if win else 0.0,
            }
        )
    return mv.TrajectoryBatch.from_rows(rows)


def _no_step(*a, **kw):
    raise AssertionError("a fit whose outcome is fixed took an optimizer step")


def test_fit_on_constant_returns_sets_the_constant_without_a_step(monkeypatch):
    monkeypatch.setattr("mpo_viz.train.critic_fit._fit_step", _no_step)
    b = _lose_everywhere_but(20, range(20))  # every episode wins: the return of every action token is 1
    critic, seen = _small_critic(), []
    fit = fit_values(
        critic,
        b,
        mc_returns(b),
        steps=300,
        gate=0.2,
        eval_every=10,
        seed=0,
        on_eval=lambda step, ev, c: seen.append(step),
    )
    assert (fit.stop, fit.steps, fit.constant, fit.passed, seen) == ("constant", 0, 1.0, False, [0])
    assert np.isnan(fit.heldout_ev) and np.isnan(fit.train_ev) and (fit.n_train, fit.n_heldout) == (16, 4)
    # V = 1 at every position of every row, exactly: the head's weights 0 and its bias 1
    v = critic_outputs(critic, rows_of(b), np.arange(20), pad_id=0, device="cpu")
    assert torch.equal(v[b.mask.bool()], torch.ones(int(b.mask.sum())))
    assert float(critic.head.weight.detach().abs().max()) == 0.0 and float(critic.head.bias.detach()) == 1.0
    assert fit.summary().startswith(
        "critic fit: 0 steps, the critic set to the constant 1 (every return of the 20 episodes is 1: nothing varies"
    )
    # no gate changes nothing: the constant is the exact fit either way
    assert fit_values(_small_critic(), b, mc_returns(b), steps=5, gate=None).stop == "constant"


def test_fit_with_constant_heldout_returns_cannot_pass_a_gate_and_stops(monkeypatch):
    train, held = holdout_split(30, 0.2, seed=4)
    wins = [int(i) for i in train[::3]]  # some training rows win, no held-out row does
    b = _lose_everywhere_but(30, wins)
    g = mc_returns(b)
    # the least-squares constant of the training tokens: their mean return (4 action tokens per row)
    want = len(wins) / len(train)
    monkeypatch.setattr("mpo_viz.train.critic_fit._fit_step", _no_step)
    critic = _small_critic()
    fit = fit_values(critic, b, g, steps=300, gate=0.2, seed=4)
    assert (fit.stop, fit.steps, fit.n_heldout) == ("heldout_constant", 0, 6)
    assert fit.constant == pytest.approx(want, abs=1e-15) and np.isnan(fit.heldout_ev)
    assert abs(fit.train_ev) < 1e-6  # a constant explains nothing of the training returns' variance
    v = critic_outputs(critic, rows_of(b), np.arange(30), pad_id=0, device="cpu")
    assert torch.equal(v[b.mask.bool()], torch.full((int(b.mask.sum()),), want, dtype=torch.float32))
    assert "the returns of the 6 held-out episodes are all equal" in fit.summary()
    assert "the gate 0.2 cannot pass" in fit.summary()
    # without a gate nothing is fixed: the training rows still vary, and the whole budget is used
    monkeypatch.undo()
    assert fit_values(_small_critic(), b, g, steps=3, gate=None, seed=4).steps == 3


def test_trainer_warmup_on_constant_returns_stops_at_once_and_says_so(tmp_path, monkeypatch):
    # the untrained policy wins no episode of its pool: every return is 0, nothing to learn
    monkeypatch.setattr("mpo_viz.train.critic_fit._fit_step", _no_step)
    cfg = tiny(estimator="gae", critic_warmup_episodes=12, critic_warmup_steps=200, iterations=1)
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    lines = []
    tr.run_all(log=lines.append)
    rec = next(r for r in tr.history if r["phase"] == "critic_warmup")
    assert (rec["warmup_stop"], rec["warmup_steps"], rec["warmup_constant"]) == ("constant", 0, 0.0)
    assert rec["warmup_passed"] is False and np.isnan(rec["warmup_explained_var"])
    said = [x for x in lines if x.startswith("critic warm-up")]
    assert said == [
        (
            "critic warm-up: stopped at once (0 steps): every return of the 12 pool episodes is 0, so "
            "there is nothing for a critic to learn and the gate cannot pass; the critic was set to that "
            "constant. RL starts from a critic that predicts that constant, and critic-based advantages "
            "are then the bare returns; what helps: a start that succeeds sometimes (more SFT: "
            "--sft-steps, or --model-dir of a stronger start), a larger pool (--critic-warmup-episodes), "
            "or shaped rewards (per-turn rewards of the environment)"
        )
    ]
    # the first RL iteration read those values: 0 wherever an action token is
    first = mv.load(sorted((tmp_path / "run" / "trajectories").glob("iter=*.parquet"))[0])
    assert float(first.values[first.mask.bool()].abs().max()) == 0.0


def test_trainer_warmup_stops_at_the_gate(tmp_path, monkeypatch):
    # the trainer's warm-up on a pool a critic can fit (the labelled batch stands in for the rollout)
    cfg = tiny(
        estimator="gae", critic_warmup_episodes=60, critic_warmup_steps=400, critic_warmup_ev=0.9, critic_warmup_lr=3e-3
    )
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    tr.critic = _small_critic(len(tr.policy.tokenizer))
    monkeypatch.setattr(tr, "_rollout", lambda n, **kw: label_batch(n))
    rec = tr.warmup_critic()
    assert rec["warmup_stop"] == "gate" and rec["warmup_passed"] and 0 < rec["warmup_steps"] < 400
    assert rec["warmup_explained_var"] >= 0.9 and rec["warmup_heldout_episodes"] == 12
    assert "passed the gate 0.9" in rec["warmup_summary"]


def test_critic_epochs_are_apart_from_the_policys(tmp_path):
    tr = Trainer(
        tiny(estimator="gae", loss="token_ppo", epochs=1, minibatches=2, critic_epochs=3), tmp_path / "r", quiet=True
    )
    rec = next(tr.iterate(1))
    assert rec["optimizer_steps"] == 2  # the policy: 1 epoch × 2 minibatches
    assert rec["critic_optimizer_steps"] == 6  # the critic: 3 epochs × 2 minibatches
    assert "value_loss" in rec and "vf_mse" in rec and "policy_loss" in rec


def test_the_expert_critic_feeds_the_exact_values(tmp_path):
    cfg = tiny(estimator="mpo", critic="expert", oracle_noise=0.3, iterations=1, save_trajectories_every=1)
    with pytest.warns(ExpertCriticWarning, match="scripted expert's exact values, not this policy's"):
        tr = Trainer(cfg, tmp_path / "r", quiet=True)
    assert tr.critic is None and tr.critic_opt is None  # nothing to train
    rec = next(tr.iterate(1))
    assert "critic_explained_var" in rec and "value_loss" not in rec
    b = mv.load(tmp_path / "r" / "trajectories" / "iter=000001.parquet")
    m = b.mask.bool()
    np.testing.assert_array_equal(b.values[m].numpy(), b.padded("oracle_values")[m].numpy())
    with pytest.raises(ValueError, match="warmup_critic: no learned critic to warm up"):
        tr.warmup_critic()


def test_the_mc_critic_reads_the_policys_monte_carlo_values(tmp_path):
    """critic="mc": no critic is trained; each iteration's values are the current policy's
    Monte-Carlo values at turn starts (mc_value broadcast over each turn), the run folder keeps the
    mc_* fields, and the Monte-Carlo phase is timed."""
    cfg = tiny(estimator="turn_gae", critic="mc", mc_samples=2, iterations=1, save_trajectories_every=1)
    tr = Trainer(cfg, tmp_path / "r", quiet=True)
    assert tr.critic is None and tr.critic_opt is None
    rec = next(tr.iterate(1))
    assert rec["timings"]["mc"] > 0 and "value_loss" not in rec
    b = mv.load(tmp_path / "r" / "trajectories" / "iter=000001.parquet")
    assert b.meta["values_source"] == "mc" and b.meta["mc_truth"]["m"] == 2
    for v, t, mc in zip(b.field("values"), b.field("turn_ids"), b.field("mc_value")):
        np.testing.assert_array_equal(v, np.asarray(mc, dtype=np.float32)[t])


def test_holdout_split_keeps_groups_whole():
    groups = [f"g{i // 4}" for i in range(40)]  # 10 groups of 4
    tr, ho = holdout_split(40, 0.2, seed=1, groups=groups)
    assert len(ho) == 8 and len(tr) == 32
    assert not {groups[i] for i in tr} & {groups[i] for i in ho}
    uneven = ["a"] * 9 + ["b"]  # the first group drawn may exceed the share: never all rows held out
    for seed in range(5):
        tr, ho = holdout_split(10, 0.2, seed=seed, groups=uneven)
        assert len(tr) >= 1 and len(ho) >= 1


@pytest.mark.parametrize("value_target", [None, "mc"])
def test_value_target_says_what_the_critic_trains_on(tmp_path, value_target):
    # turn_gae's own returns G^T_k bootstrap on the critic (λ_T = 0.9); value_target="mc" replaces them
    # by the Monte-Carlo returns for the value loss, and every RL line records which it was
    from mpo_viz.train.summary import value_target_line

    cfg = tiny(
        estimator="turn_gae", loss="token_ppo", iterations=1, save_trajectories_every=1, value_target=value_target
    )
    tr = Trainer(cfg, tmp_path / "r", quiet=True)
    rec = next(tr.iterate(1))
    b = mv.load(tmp_path / "r" / "trajectories" / "iter=000001.parquet")
    m = b.mask.bool()
    ret, mc = b.padded("returns")[m].double(), mc_returns(b)[m]
    if value_target == "mc":
        assert rec["value_target"] == "mc"
        torch.testing.assert_close(ret, mc, rtol=1e-6, atol=1e-6)
        assert value_target_line([rec]) == "the critic trained on the Monte-Carlo returns (value_target 'mc')"
    else:
        assert rec["value_target"] == "estimator"  # the default: the estimator's own returns
        assert (ret - mc).abs().max() > 1e-3
        assert value_target_line([rec]).startswith("the critic trained on the estimator's own returns")


def _returns_by_hand(b: mv.TrajectoryBatch, gamma: float, turn_gamma: float) -> torch.Tensor:
    """Row by row, backwards over the action tokens: G = r + d·G', d = γ inside a turn and γ_T across
    (and onto the bootstrap value after the last one)."""
    out = torch.zeros(b.mask.shape, dtype=torch.float64)
    r, m, tid, boot = b.token_rewards.double(), b.mask.bool(), b.turn_ids, b.bootstrap_value
    for i in range(len(b)):
        g, nxt = (0.0 if math.isnan(boot[i]) else float(boot[i])), None
        for t in reversed(torch.nonzero(m[i]).flatten().tolist()):
            d = turn_gamma if nxt is None or tid[i, t] != tid[i, nxt] else gamma
            g = float(r[i, t]) + d * g
            out[i, t], nxt = g, t
    return out


@pytest.mark.parametrize("estimator, options", [("gae", {"gamma": 0.9}), ("mpo", {"gamma": 0.9, "turn_gamma": 0.7})])
def test_the_warmup_fits_the_returns_rl_trains_the_critic_on(tmp_path, monkeypatch, estimator, options):
    # value_target="mc": the warm-up's targets and RL's are the Monte-Carlo returns on one clock, the estimator's
    # (gae: γ on every step; mpo: γ inside turns, γ_T across); a warm-up on γ_T = 1 fitted other returns
    cfg = tiny(
        env=register_threesteps(),
        estimator=estimator,
        estimator_options=options,
        value_target="mc",
        iterations=1,
        eval_interval=0,
        save_trajectories_every=1,
        critic_warmup_episodes=10,
        critic_warmup_steps=1,
    )
    tr = Trainer(cfg, tmp_path / "r", quiet=True)
    seen = {}
    real = fit_values

    def spy(critic, pool, targets, **kw):
        seen.update(pool=pool, targets=targets)
        return real(critic, pool, targets, **kw)

    monkeypatch.setattr("mpo_viz.train.warmup.fit_values", spy)
    tr.warmup_critic()
    next(tr.iterate(1))
    rl = mv.load(tmp_path / "r" / "trajectories" / "iter=000001.parquet")
    g, gt = options["gamma"], options.get("turn_gamma", options["gamma"])
    for b, got in ((seen["pool"], seen["targets"]), (rl, rl.padded("returns").double())):
        m = b.mask.bool()
        assert b.turn_ids[m].max() == 2 and b.token_rewards[m].abs().sum() > 0  # rewarded turns: γ and γ_T are read
        torch.testing.assert_close(got[m], _returns_by_hand(b, g, gt)[m], rtol=1e-6, atol=1e-6)


def test_value_target_is_refused_where_no_critic_is_trained():
    from mpo_viz.checks import OptionError
    from mpo_viz.train.summary import value_target_line

    with pytest.raises(OptionError, match=r"value_target: the estimator 'grpo' uses no critic"):
        tiny(estimator="grpo", loss="token_ppo", group_size=2, value_target="mc")
    for critic in ("expert", "mc"):  # values read, no critic trained
        with pytest.raises(OptionError, match=rf"value_target: critic='{critic}' reads .* and trains no critic"):
            tiny(estimator="mpo", critic=critic, oracle_noise=0.3, value_target="mc")
    assert value_target_line([{"phase": "rl", "iteration": 1}]) is None  # no critic trained: no line
