"""The update step: alignment of the teacher-forced forward, micro-batching that leaves the gradient
unchanged (the minibatch normaliser passed as ``scale``), critic-only updates, what an update
left per token (``after_update``), and the critic's pass in a second thread beside the policy's
(``update_with_critic``: the same run bit for bit)."""

import copy
import dataclasses
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import mpo_viz.rollout.play as R
import mpo_viz.train.update as U
from mpo_viz import models
from mpo_viz.envs import build_tokenizer, make_env
from mpo_viz.losses import policy_loss, value_loss
from mpo_viz.train import Trainer
from mpo_viz.train.loop import RESULT_KEYS_VOLATILE
from mpo_viz.train.sft import expert_rows
from mpo_viz.train.update import (
    Learners,
    UpdateSettings,
    after_update,
    forward_critic,
    forward_policy,
    make_micro,
    micro_batches,
    normaliser,
    update_epochs,
)
from tests.train.train_helpers import tiny


@pytest.fixture(scope="module")
def setup():
    env = make_env("search", difficulty=2)
    pol = models.tiny_policy(build_tokenizer(env), "1m", seed=0)
    r, _ = expert_rows(env, pol, n=6, noise=0.5, seeds=list(range(6)))
    g = torch.Generator().manual_seed(0)
    B, L = r.mask.shape
    # rollout-like fields: old log-probs near the policy's, advantages and returns drawn at random
    with torch.no_grad():
        mb = make_micro(r, np.arange(B), 0, "cpu")
        lp, _ = forward_policy(pol.model, mb)
    m = r.mask.float()
    r.old_logp = (lp + 0.05 * torch.randn(B, L, generator=g)) * m
    r.rollout_logp = r.old_logp.clone()
    r.advantages = torch.randn(B, L, generator=g) * m
    r.returns = torch.rand(B, L, generator=g) * m
    r.values = torch.rand(B, L, generator=g) * m
    return env, pol, r


def test_forward_is_the_teacher_forced_log_prob_of_each_row_alone(setup):
    _, pol, r = setup
    mb = make_micro(r, np.arange(len(r)), 0, "cpu")
    with torch.no_grad():
        lp, ent = forward_policy(pol.model, mb, entropy=True)
        for i in range(len(r)):
            P, L = int(r.prompt_len[i]), int(r.resp_len[i])
            logits = pol.model(r.seqs[i][None]).logits[0]
            ref = torch.log_softmax(logits, -1)[P - 1 : P + L - 1].gather(1, r.seqs[i][P:, None])[:, 0]
            assert torch.allclose(lp[i, :L], ref, atol=1e-5)
            p = torch.softmax(logits[P - 1 : P + L - 1], -1)
            assert torch.allclose(ent[i, :L], -(p * p.clamp_min(1e-30).log()).sum(-1), atol=1e-4)


def test_critic_values_are_read_at_position_p_plus_t_minus_1(setup):
    _, pol, r = setup
    critic = models.make_critic(pol, init="fresh", seed=3)
    mb = make_micro(r, np.arange(len(r)), 0, "cpu")
    with torch.no_grad():
        v = forward_critic(critic, mb)
        for i in range(len(r)):
            P, L = int(r.prompt_len[i]), int(r.resp_len[i])
            full = critic(r.seqs[i][None])[0]
            assert torch.allclose(v[i, :L], full[P - 1 : P + L - 1], atol=1e-5)


def test_micro_batches_respect_the_budget_and_cover_every_row(setup):
    _, _, r = setup
    rows = np.array([5, 0, 3, 1])
    parts = micro_batches(r, rows, 400)
    assert sorted(np.concatenate(parts).tolist()) == sorted(rows.tolist())
    for p in parts:
        size = len(p) * int((r.prompt_len[p] + r.resp_len[p]).max())
        assert size <= 400 or len(p) == 1


def _lengths_rows(lengths):
    """Rows whose prompt + response lengths are ``lengths`` (prompt 1 token; only lengths matter)."""
    n = np.asarray(lengths, dtype=np.int64)
    return SimpleNamespace(prompt_len=np.ones(len(n), dtype=np.int64), resp_len=n - 1)


def _best_by_enumeration(lengths, budget, overhead):
    """The reference: every cut of the length-sorted rows into consecutive groups (2^(n-1) of them),
    the cheapest feasible one's cost (rows × longest + overhead per group)."""
    ls = sorted(lengths)
    n = len(ls)
    best = None
    for cuts in range(2 ** (n - 1)):
        bounds = [0] + [k + 1 for k in range(n - 1) if cuts >> k & 1] + [n]
        groups = [ls[a:b] for a, b in zip(bounds, bounds[1:])]
        if any(len(g) * max(g) > budget and len(g) > 1 for g in groups):
            continue
        cost = sum(len(g) * max(g) + overhead for g in groups)
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize(
    "lengths, budget, overhead",
    [
        ([90, 95, 100, 210, 220, 230, 400], 10**6, 192),  # two clear buckets and a long row
        ([120] * 7, 10**6, 192),  # equal lengths: one group
        ([50, 60, 70, 80, 90, 100, 110, 120], 300, 0),  # no overhead: the budget and padding alone
        ([10, 500, 20, 30], 100, 50),  # a row longer than the budget goes alone
        ([64, 65, 300, 301, 302, 900, 901, 2, 3], 4096, 128),
    ],
)
def test_micro_batches_are_the_cheapest_length_buckets(lengths, budget, overhead):
    r = _lengths_rows(lengths)
    rows = np.arange(len(lengths))[::-1].copy()
    parts = micro_batches(r, rows, budget, overhead)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(lengths)))
    size = [np.asarray(lengths)[p] for p in parts]
    assert all(len(g) == 1 or len(g) * g.max() <= budget for g in size)
    assert all(a.max() <= b.min() for a, b in zip(size, size[1:]))  # consecutive in length order
    assert sum(len(g) * int(g.max()) + overhead for g in size) == _best_by_enumeration(lengths, budget, overhead)


def test_micro_batches_of_nothing_one_row_and_a_huge_overhead():
    r = _lengths_rows([30, 40, 500])
    assert micro_batches(r, np.array([], dtype=np.int64), 100) == []
    assert [p.tolist() for p in micro_batches(r, np.array([2]), 100)] == [[2]]
    # an overhead larger than any padding: as few groups as the budget allows
    assert [p.tolist() for p in micro_batches(r, np.arange(3), 10**6, overhead=10**9)] == [[0, 1, 2]]


@pytest.mark.parametrize(
    "loss, agg", [("turn_ppo", None), ("token_ppo", "seq-mean-token-mean"), ("turn_ppo", "turn-mean"), ("sao", None)]
)
def test_micro_batching_leaves_the_step_unchanged(setup, loss, agg):
    """One minibatch in one piece or in many micro-batches: the same AdamW step, because each piece
    is normalised by the whole minibatch's denominator; and both equal one plain policy_loss call."""
    _, pol, r = setup
    opts = {} if agg is None else {"agg": agg}
    results = []
    for budget in (10**6, 300):
        model = copy.deepcopy(pol.model)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        update_epochs(
            r,
            Learners(policy=model, policy_opt=opt),
            UpdateSettings(
                epochs=1, minibatches=1, micro_batch_tokens=budget, loss=loss, loss_options=opts, grad_clip=0.0
            ),
            generator=torch.Generator().manual_seed(0),
            pad_id=0,
            device="cpu",
        )
        results.append(model)
    assert len(micro_batches(r, np.arange(len(r)), 300)) > 2
    # the plain reference: one forward of the whole batch, no scale
    model = copy.deepcopy(pol.model)
    model.train()
    lp, _ = forward_policy(model, make_micro(r, np.arange(len(r)), 0, "cpu"))
    ref_loss, _ = policy_loss(
        loss, lp, r.old_logp, r.advantages, r.mask, turn_ids=r.turn_ids, rollout_logp=r.rollout_logp, **opts
    )
    ref_loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= p.grad
    for a, b, c in zip(results[0].parameters(), results[1].parameters(), model.parameters()):
        assert torch.allclose(a, b, atol=2e-6, rtol=1e-5)
        assert torch.allclose(a, c, atol=2e-6, rtol=1e-5)


def test_normaliser_per_aggregation_mode(setup):
    _, _, r = setup
    rows = np.array([0, 2, 4])
    m = r.mask[rows]
    assert normaliser(r, rows, "token-mean") == float(m.sum())
    assert normaliser(r, rows, "seq-mean-token-mean") == 3.0
    assert normaliser(r, rows, "seq-mean-token-sum-norm") == float(r.resp_len[rows].max())
    turns = sum(len(set(r.turn_ids[i][r.mask[i]].tolist())) for i in rows)
    assert normaliser(r, rows, "turn-mean") == float(turns)


def test_critic_only_update_moves_the_critic_towards_the_returns(setup):
    _, pol, r = setup
    critic = models.make_critic(pol, init="policy", seed=0)
    opt = torch.optim.AdamW(critic.own_parameters(), lr=3e-3)
    before = [p.clone() for p in pol.model.parameters()]
    mb = make_micro(r, np.arange(len(r)), 0, "cpu")

    def vloss():
        with torch.no_grad():
            return float(value_loss(forward_critic(critic, mb), None, r.returns, r.mask, clip=None)[0])

    l0 = vloss()
    out = update_epochs(
        r,
        Learners(critic=critic, critic_opt=opt),
        UpdateSettings(epochs=4, minibatches=2, micro_batch_tokens=4096, value_clip=None),
        generator=torch.Generator().manual_seed(0),
        pad_id=0,
        device="cpu",
    )
    assert out["optimizer_steps"] == 8 and "policy_loss" not in out and out["value_loss"] > 0
    assert vloss() < 0.5 * l0
    for a, b in zip(before, pol.model.parameters()):
        assert torch.equal(a, b)


def test_update_settings_are_the_config_slice(setup):
    from mpo_viz.train import Config

    _, _, r = setup
    cfg = Config(loss="token_ppo", loss_options={"dual_clip": 3.0}, kl_coef=0.1, entropy_coef=0.01, grad_clip=0.5)
    st = UpdateSettings.of(cfg, value_clip=0.2)
    assert (
        st.epochs,
        st.minibatches,
        st.micro_batch_tokens,
        st.loss,
        st.loss_options,
        st.kl_coef,
        st.entropy_coef,
        st.value_clip,
        st.grad_clip,
    ) == (2, 4, 8192, "token_ppo", {"dual_clip": 3.0}, 0.1, 0.01, 0.2, 0.5)
    assert UpdateSettings.of(cfg, epochs=4).epochs == 4
    kw = dict(generator=torch.Generator().manual_seed(0), pad_id=0, device="cpu")
    assert update_epochs(r, Learners(), UpdateSettings(epochs=0, minibatches=1, micro_batch_tokens=64), **kw) == {
        "optimizer_steps": 0,
        "update_tokens": 0,
    }
    with pytest.raises(TypeError):  # the former all-keyword call is gone
        update_epochs(
            r,
            policy=None,
            policy_opt=None,
            critic=None,
            critic_opt=None,
            epochs=0,
            minibatches=1,
            micro_batch_tokens=64,
            **kw,
        )


def test_after_update_is_each_rows_own_ratio_however_the_rows_are_cut(setup):
    """after_update's ratio is exp(logπ − old) of each row alone, in the row's place, whether the rows
    go in one forward or in many length-sorted micro-batches; turn entries follow their rows."""
    _, pol, r = setup
    g = torch.Generator().manual_seed(5)  # old log-probs further from the policy's: some clips
    r = dataclasses.replace(r, old_logp=r.old_logp + 0.3 * torch.randn(r.mask.shape, generator=g) * r.mask)
    outs = []
    for budget in (10**6, 300):
        st = UpdateSettings(epochs=1, minibatches=1, micro_batch_tokens=budget, loss="turn_ppo")
        outs.append(after_update(pol.model, r, st, pad_id=0, device="cpu"))
    assert len(micro_batches(r, np.arange(len(r)), 300)) > 2
    one, many = outs
    assert torch.equal(one.clipped, many.clipped) and torch.allclose(one.ratio, many.ratio, rtol=1e-6)
    with torch.no_grad():
        for i in range(len(r)):
            P, L = int(r.prompt_len[i]), int(r.resp_len[i])
            lp = torch.log_softmax(pol.model(r.seqs[i][None]).logits[0], -1)[P - 1 : P + L - 1]
            lp = lp.gather(1, r.seqs[i][P:, None])[:, 0]
            m = r.mask[i, :L]
            want = torch.where(m, torch.exp(lp - r.old_logp[i, :L]), torch.ones(()))
            assert torch.allclose(many.ratio[i, :L], want, rtol=1e-5), i
            assert (many.ratio[i, L:] == 1).all() and (many.clipped[i, L:] == 0).all()
            tid = r.turn_ids[i, :L][m]
            rho = [float(torch.exp(torch.log(want[m][tid == k]).mean())) for k in torch.unique(tid)]
            np.testing.assert_allclose(many.turn_ratio[i], rho, rtol=1e-5)
            np.testing.assert_array_equal(many.turn_ratio[i], one.turn_ratio[i])
            assert many.turn_clipped[i].tolist() == [int(x < 0.8 or x > 1.2) for x in many.turn_ratio[i]]
    assert 0 < int(many.clipped.sum()) < int(r.mask.sum())


# ---------------------------------------------------------------------------------------------
# the critic's pass beside the policy's (update_with_critic), in a trainer's runs


def _stable(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in RESULT_KEYS_VOLATILE}


def test_critic_pass_beside_the_policys_gives_the_sequential_run(tmp_path, monkeypatch):
    """The critic's update in a second thread beside the policy's (a free core, no dropout) and the
    two passes one after the other: the same metrics and weights bit for bit, and the shuffle
    generator left in the same state; with dropout in a model the passes stay sequential."""
    cfg = tiny(estimator="mpo", loss="turn_ppo", epochs=2, minibatches=2, critic_epochs=3, iterations=2)
    calls = []
    ok = U.parallel_ok
    monkeypatch.setattr(U, "parallel_ok", lambda *a: calls.append(ok(*a)) or True)
    a = Trainer(cfg, tmp_path / "a", quiet=True)
    ra = [_stable(r) for r in a.iterate()]
    monkeypatch.setattr(U, "parallel_ok", lambda *a: False)
    b = Trainer(cfg, tmp_path / "b", quiet=True)
    rb = [_stable(r) for r in b.iterate()]
    assert len(calls) == 2 and ra == rb and ra[-1]["critic_optimizer_steps"] == 6
    assert torch.equal(a.generator.get_state(), b.generator.get_state())
    for x, y in zip(
        [*a.policy.model.parameters(), *a.critic.parameters()], [*b.policy.model.parameters(), *b.critic.parameters()]
    ):
        assert torch.equal(x, y)
    # dropout anywhere: sequential
    assert ok(a.policy.model, a.critic, "cpu") == (len(os.sched_getaffinity(0)) >= 2 * torch.get_num_threads())
    a.critic.trunk.config.attention_dropout = 0.1
    assert not ok(a.policy.model, a.critic, "cpu")
    a.critic.trunk.config.attention_dropout = 0.0
    a.critic.head = torch.nn.Sequential(torch.nn.Dropout(0.1), a.critic.head)
    assert not ok(a.policy.model, a.critic, "cpu")
    assert not ok(a.policy.model, b.critic, "cuda")


def test_side_thread_off_runs_everything_in_one_thread(tmp_path, monkeypatch):
    """``side_thread=False``: neither the update nor the rollout starts a second thread (even where
    one would be allowed), and the run's identity is the same as with it on."""
    cfg = tiny(estimator="mpo", loss="turn_ppo", critic_epochs=2, iterations=1, side_thread=False)
    assert cfg.hash() == cfg.replace(side_thread=True).hash() and "side_thread" not in cfg.identity()
    monkeypatch.setattr(U, "parallel_ok", lambda *a: True)
    pools, threads = [], []
    real_pool, real_jobs = U.side_pool, R.CriticJobs
    monkeypatch.setattr(U, "side_pool", lambda: pools.append(1) or real_pool())

    def jobs(*a, thread=False, **k):
        threads.append(thread)
        return real_jobs(*a, thread=thread, **k)

    monkeypatch.setattr(R, "CriticJobs", jobs)
    t = Trainer(cfg, tmp_path / "off", quiet=True)
    list(t.iterate())
    assert pools == [] and threads and not any(threads)
    pools.clear()
    threads.clear()
    t = Trainer(cfg.replace(side_thread=True), tmp_path / "on", quiet=True)
    list(t.iterate())
    assert pools  # the same run with it on does use the second thread for the update
