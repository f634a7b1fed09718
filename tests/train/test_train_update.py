"""The update step: alignment of the teacher-forced forward, micro-batching that leaves the gradient
unchanged (the minibatch normaliser passed as ``scale``), and critic-only updates."""

import copy

import numpy as np
import pytest
import torch

from mpo_viz import models
from mpo_viz.envs import build_tokenizer, make_env
from mpo_viz.losses import policy_loss, value_loss
from mpo_viz.train.sft import expert_rows
from mpo_viz.train.update import (
    forward_critic,
    forward_policy,
    make_micro,
    micro_batches,
    normaliser,
    update_epochs,
)


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
            ref = torch.log_softmax(logits, -1)[P - 1: P + L - 1].gather(1, r.seqs[i][P:, None])[:, 0]
            assert torch.allclose(lp[i, :L], ref, atol=1e-5)
            p = torch.softmax(logits[P - 1: P + L - 1], -1)
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
            assert torch.allclose(v[i, :L], full[P - 1: P + L - 1], atol=1e-5)


def test_micro_batches_respect_the_budget_and_cover_every_row(setup):
    _, _, r = setup
    rows = np.array([5, 0, 3, 1])
    parts = micro_batches(r, rows, 400)
    assert sorted(np.concatenate(parts).tolist()) == sorted(rows.tolist())
    for p in parts:
        size = len(p) * int((r.prompt_len[p] + r.resp_len[p]).max())
        assert size <= 400 or len(p) == 1


@pytest.mark.parametrize("loss, agg", [("turn_ppo", None), ("token_ppo", "seq-mean-token-mean"),
                                       ("turn_ppo", "turn-mean"), ("sao", None)])
def test_micro_batching_leaves_the_step_unchanged(setup, loss, agg):
    """One minibatch in one piece or in many micro-batches: the same AdamW step, because each piece
    is normalised by the whole minibatch's denominator; and both equal one plain policy_loss call."""
    _, pol, r = setup
    opts = {} if agg is None else {"agg": agg}
    results = []
    for budget in (10**6, 300):
        model = copy.deepcopy(pol.model)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        update_epochs(r, policy=model, policy_opt=opt, critic=None, critic_opt=None,
                      generator=torch.Generator().manual_seed(0), epochs=1, minibatches=1,
                      micro_batch_tokens=budget, pad_id=0, device="cpu", loss=loss, loss_options=opts,
                      grad_clip=0.0)
        results.append(model)
    assert len(micro_batches(r, np.arange(len(r)), 300)) > 2
    # the plain reference: one forward of the whole batch, no scale
    model = copy.deepcopy(pol.model)
    model.train()
    lp, _ = forward_policy(model, make_micro(r, np.arange(len(r)), 0, "cpu"))
    ref_loss, _ = policy_loss(loss, lp, r.old_logp, r.advantages, r.mask, turn_ids=r.turn_ids,
                              rollout_logp=r.rollout_logp, **opts)
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
    out = update_epochs(r, policy=None, policy_opt=None, critic=critic, critic_opt=opt,
                        generator=torch.Generator().manual_seed(0), epochs=4, minibatches=2,
                        micro_batch_tokens=4096, pad_id=0, device="cpu", value_clip=None)
    assert out["optimizer_steps"] == 8 and "policy_loss" not in out and out["value_loss"] > 0
    assert vloss() < 0.5 * l0
    for a, b in zip(before, pol.model.parameters()):
        assert torch.equal(a, b)


def test_update_settings_are_the_config_slice_and_the_keyword_call_still_works(setup):
    from mpo_viz.train import Config
    from mpo_viz.train.update import Learners, UpdateSettings

    _, _, r = setup
    cfg = Config(loss="token_ppo", loss_options={"dual_clip": 3.0}, kl_coef=0.1, entropy_coef=0.01, grad_clip=0.5)
    st = UpdateSettings.of(cfg, value_clip=0.2)
    assert (st.epochs, st.minibatches, st.micro_batch_tokens, st.loss, st.loss_options, st.kl_coef, st.entropy_coef,
            st.value_clip, st.grad_clip) == (2, 4, 8192, "token_ppo", {"dual_clip": 3.0}, 0.1, 0.01, 0.2, 0.5)
    assert UpdateSettings.of(cfg, epochs=4).epochs == 4
    kw = dict(generator=torch.Generator().manual_seed(0), pad_id=0, device="cpu")
    assert update_epochs(r, Learners(), UpdateSettings(epochs=0, minibatches=1, micro_batch_tokens=64), **kw) == {
        "optimizer_steps": 0, "update_tokens": 0}
    with pytest.warns(DeprecationWarning, match="Learners"):
        out = update_epochs(r, policy=None, policy_opt=None, critic=None, critic_opt=None, epochs=0, minibatches=1,
                            micro_batch_tokens=64, **kw)
    assert out == {"optimizer_steps": 0, "update_tokens": 0}
