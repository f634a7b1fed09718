"""The trainer end to end: run folders the dashboard reads, exact resume, interrupts, refusals."""

import copy
import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, load_model

import mpo_viz.train.update as U
from mpo_viz import load, models
from mpo_viz.advantages import compute
from mpo_viz.advantages.reference import empg as reference_empg
from mpo_viz.train import Trainer
from mpo_viz.train.loop import RESULT_KEYS_VOLATILE
from mpo_viz.train.update import check_loss_inputs
from mpo_viz.widgets.dashboard import TrainingDashboard
from tests.train.train_helpers import tiny


def _stable(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in RESULT_KEYS_VOLATILE}


@pytest.mark.parametrize(
    "estimator, loss, group_size", [("mpo", "turn_ppo", 1), ("grpo", "token_ppo", 2), ("gae", "token_ppo", 1)]
)
def test_three_iterations_write_a_run_folder_the_dashboard_reads(tmp_path, estimator, loss, group_size):
    cfg = tiny(estimator=estimator, loss=loss, group_size=group_size, keep_checkpoints=2)
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    recs = list(tr.iterate())
    assert [r["iteration"] for r in recs] == [1, 2, 3] and tr.iteration == 3
    assert (tr.critic is not None) == (estimator != "grpo")

    dash = TrainingDashboard(tmp_path / "run", live=False)
    assert [r["iteration"] for r in dash.records] == [1, 2, 3]
    assert dash.config["estimator"] == estimator
    assert dash.latest_checkpoint() == "iter=000003"
    assert [f.stem for f in dash.trajectory_files()] == ["iter=000001", "iter=000002", "iter=000003"]
    drawn = {tr_.meta for tr_ in dash.figure.data}
    for key in (
        "success",
        "policy_loss",
        "approx_kl",
        "clipfrac_low",
        "turn_clipfrac",
        "within_turn_shift",
        "timings/rollout",
        "timings/update",
    ):
        assert key in drawn, key
    if estimator != "grpo":
        assert {"value_loss", "values_across", "values_within", "oracle_across"} <= drawn
    assert "eval_success" in dash.records[2] and "eval_success" not in dash.records[0]
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts == ["iter=000002", "iter=000003", "latest"]

    # the saved trajectories are v1 and their advantages are the estimator's on the saved data
    b = load(tmp_path / "run" / "trajectories" / "iter=000002.parquet")
    assert len(b) == cfg.episodes and b.meta["schema"] == "mpo_viz.trajectory/v1"
    assert {"old_logprobs", "rollout_logprobs", "advantages", "returns"} <= b.fields
    assert ("values" in b.fields) == (estimator != "grpo")
    # the critic's explained variance of this iteration (before its update), which the views read
    if estimator == "grpo":
        assert "critic_explained_var" not in b.meta
    else:  # None where it is undefined (returns all equal: NaN in the record)
        ev = recs[1]["critic_explained_var"]
        assert b.meta["critic_explained_var"] == (None if math.isnan(ev) else ev)
    again = compute(b, estimator)
    m = b.mask.bool()
    assert torch.allclose(b.padded("advantages")[m], again.advantages.float()[m], atol=1e-5)
    rec = recs[1]
    assert rec["success"] == pytest.approx(np.mean([json.loads(x)["success"] for x in b.field("extra_json")]))
    assert rec["action_tokens_mean"] == pytest.approx(float(b.mask.sum(1).mean()))
    assert rec["optimizer_steps"] == cfg.epochs * cfg.minibatches


def test_resume_is_bit_exact(tmp_path):
    """2 iterations, a fresh process-like resume, 2 more == 4 uninterrupted: metrics (timings aside)
    and final weights, with policy_lag and a KL reference in play."""
    cfg = tiny(estimator="mpo", loss="turn_ppo", epochs=2, policy_lag=1, kl_coef=0.05, iterations=4, eval_interval=2)
    a = Trainer(cfg, tmp_path / "a", quiet=True)
    full = [_stable(r) for r in a.iterate()]
    b = Trainer(cfg, tmp_path / "b", quiet=True)
    first = [_stable(r) for r in b.iterate(2)]
    del b
    b = Trainer.resume(tmp_path / "b", quiet=True)
    assert b.iteration == 2 and len(b.lagged) == 1 and b.reference is not None
    rest = [_stable(r) for r in b.iterate()]
    assert first + rest == full
    assert full[0].get("optimizer_steps") is None and full[1]["optimizer_steps"] == 4  # lag: no update at 1
    for name in ("policy", "critic", "reference"):
        wa = load_file(str(tmp_path / "a" / "checkpoints" / "iter=000004" / f"{name}.safetensors"))
        wb = load_file(str(tmp_path / "b" / "checkpoints" / "iter=000004" / f"{name}.safetensors"))
        assert wa.keys() == wb.keys()
        assert all(torch.equal(wa[k], wb[k]) for k in wa), name
    ma = [_stable(json.loads(x)) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    mb = [_stable(json.loads(x)) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert ma == mb


def test_keyboard_interrupt_abandons_the_iteration_and_leaves_a_resumable_run(tmp_path, monkeypatch):
    cfg = tiny(estimator="grpo", loss="token_ppo", group_size=2, iterations=3, eval_interval=0)
    ref = [_stable(r) for r in Trainer(cfg, tmp_path / "ref", quiet=True).iterate()]
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    real = U.update_epochs
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        out = real(*a, **k)  # the weights move ...
        if calls["n"] == 2:
            raise KeyboardInterrupt  # ... then Ctrl-C, before the iteration's files are written
        return out

    monkeypatch.setattr(U, "update_epochs", flaky)
    got = [_stable(r) for r in tr.iterate()]
    assert tr.interrupted and tr.iteration == 1 and len(got) == 1
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in lines] == [1]
    monkeypatch.setattr(U, "update_epochs", real)
    # the same trainer object went back to the checkpoint: continuing it reproduces the clean run
    got += [_stable(r) for r in tr.iterate()]
    assert got == ref


def test_run_all_evaluates_once_before_rl_without_changing_the_run(tmp_path):
    cfg = tiny(estimator="grpo", loss="token_ppo", group_size=2, iterations=2, eval_interval=2)
    plain = [_stable(r) for r in Trainer(cfg, tmp_path / "plain", quiet=True).iterate()]
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    start = tr.evaluate_one()
    got = [_stable(r) for r in tr.run_all()]
    assert got == plain  # the evaluation draws from no training RNG
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["phase"]) for r in lines] == [(0, "eval"), (1, "rl"), (2, "rl")]
    assert lines[0]["eval_success"] == start["eval_success"]
    assert lines[0]["eval_tokens_mean"] == start["eval_tokens_mean"]  # the same policy on the same tasks
    # a run folder that holds it already (a run stopped before its first iteration) is not evaluated again
    again = Trainer(cfg, tmp_path / "again", quiet=True)
    again.run.append_metrics(lines[0])
    again.run_all(1)
    phases = [json.loads(x)["phase"] for x in (tmp_path / "again" / "metrics.jsonl").read_text().splitlines()]
    assert phases == ["eval", "rl", "eval"]
    # eval_interval = 0: none in between, but both ends of the curve
    ends = Trainer(
        tiny(estimator="grpo", loss="token_ppo", group_size=2, iterations=2, eval_interval=0),
        tmp_path / "ends",
        quiet=True,
    )
    ends.run_all()
    lines = [json.loads(x) for x in (tmp_path / "ends" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["phase"]) for r in lines] == [(0, "eval"), (1, "rl"), (2, "rl"), (2, "eval")]


def test_refusals(tmp_path):
    cfg = tiny(estimator="grpo", loss="token_ppo", group_size=2, iterations=1, eval_interval=0)
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    list(tr.iterate())
    with pytest.raises(ValueError, match="already holds a run"):
        Trainer(cfg, tmp_path / "run")
    with pytest.raises(ValueError) as e:
        Trainer.resume(tmp_path / "run", cfg.replace(seed=3, episodes=8, iterations=5))
    assert "episodes: 4 != 8" in str(e.value) and "seed: 0 != 3" in str(e.value)
    assert Trainer.resume(tmp_path / "run", cfg.replace(iterations=5), quiet=True).cfg.iterations == 5
    with pytest.raises(ValueError, match="no such folder"):
        Trainer.resume(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        Trainer.resume(tmp_path / "empty")
    b = load(tmp_path / "run" / "trajectories" / "iter=000001.parquet")
    stripped = type(b).from_rows([{k: v for k, v in r.items() if k != "rollout_logprobs"} for r in b.rows()])
    with pytest.raises(ValueError, match="'sao'.*rollout_logprobs"):
        check_loss_inputs(stripped, "sao")
    check_loss_inputs(stripped, "token_ppo")


def _rows_logp(model, b) -> list:
    """log π(response token t) of each saved row under ``model``, one row at a time (no batching)."""
    out = []
    with torch.no_grad():
        for p, resp in zip(b.field("prompt_ids"), b.field("response_ids")):
            ids = torch.tensor(np.concatenate([p, resp]), dtype=torch.int64)[None]
            logits = model(input_ids=ids).logits[0].double()
            P = len(p)
            out.append(
                torch.log_softmax(logits, -1)[P - 1 : P - 1 + len(resp)].gather(1, ids[0, P:, None])[:, 0].numpy()
            )
    return out


def _clip_rule(loss, r, a, tid, act):
    """The loss's rule, written out with its defaults (ε 0.2 / 0.2; turn_ppo's token band 2 and its
    turn ratio the geometric mean; sao's band (0.7, 6.0) whatever A's sign): per token clipped, per
    turn ρ_k and whether it lies outside [1 − ε_low, 1 + ε_high]."""
    rho = {k: math.exp(np.mean(np.log(r[act & (tid == k)]))) for k in np.unique(tid[act])}
    ks = sorted(rho)
    lo, hi = (0.7, 6.0) if loss == "sao" else (0.8, 1.2)
    if loss == "token_ppo":
        tok = ((a > 0) & (r > 1.2)) | ((a < 0) & (r < 0.8))
    elif loss == "sao":
        tok = (r <= 0.7) | (r >= 6.0)
    else:
        rt = np.array([rho.get(k, 1.0) for k in tid])
        tok = ((a > 0) & ((rt > 1.2) | (r > 2.0))) | ((a < 0) & ((rt < 0.8) | (r < 0.5)))
    return tok & act, [rho[k] for k in ks], [int(rho[k] < lo or rho[k] > hi) for k in ks]


@pytest.mark.parametrize("estimator, loss", [("mpo", "turn_ppo"), ("gae", "token_ppo"), ("gae", "sao")])
def test_saved_trajectories_carry_what_the_update_did(tmp_path, estimator, loss):
    """ratio / clipped / turn_ratio / turn_clipped in trajectories/iter=1.parquet are what the saved
    checkpoint (the policy after the update) and the saved old log-probs give, row by row."""
    cfg = tiny(estimator=estimator, loss=loss, iterations=1, eval_interval=0, policy_lr=3e-3)
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    rec = next(iter(tr.iterate()))
    assert rec["timings"]["after_update"] > 0
    b = load(tmp_path / "run" / "trajectories" / "iter=000001.parquet")
    assert {"ratio", "clipped", "turn_ratio", "turn_clipped"} <= b.fields
    model = models.tiny_policy(tr.policy.tokenizer, size=cfg.model_size, seed=123).model
    load_model(model, str(tmp_path / "run" / "checkpoints" / "iter=000001" / "policy.safetensors"))
    new = _rows_logp(model.eval(), b)
    n_clipped, n_act, turns = 0, 0, []
    for i in range(len(b)):
        act = b.field("loss_mask")[i] != 0
        base = b.field("rollout_logprobs" if loss == "sao" else "old_logprobs")[i]  # the loss's own ratio
        r = np.where(act, np.exp(new[i] - base), 1.0)
        np.testing.assert_allclose(b.field("ratio")[i], r, rtol=1e-5, atol=1e-6)
        tok, rho, out = _clip_rule(loss, r, b.field("advantages")[i], b.field("turn_ids")[i], act)
        assert b.field("clipped")[i].tolist() == tok.astype(int).tolist()
        np.testing.assert_allclose(b.field("turn_ratio")[i], rho, rtol=1e-5)
        assert b.field("turn_clipped")[i].tolist() == out
        n_clipped, n_act, turns = n_clipped + int(tok.sum()), n_act + int(act.sum()), turns + out
    assert 0 < n_clipped < n_act  # the update reached the clip on some tokens, not on all
    t = b.turns()
    assert t["turn_ratio"].tolist() == pytest.approx(np.concatenate(b.field("turn_ratio")).tolist())
    assert t["turn_clipped"].tolist() == turns


def test_no_update_view_where_the_saved_rollout_was_not_trained_on(tmp_path):
    """policy_lag = 1: iteration 2 trains on iteration 1's rollout and saves its own, which no update
    has seen yet: no ratio fields, and no forward for them; a rollout not saved gets none either."""
    tr = Trainer(tiny(iterations=2, policy_lag=1, eval_interval=0), tmp_path / "lag", quiet=True)
    recs = list(tr.iterate())
    assert all("after_update" not in r["timings"] for r in recs)
    assert "ratio" not in load(tmp_path / "lag" / "trajectories" / "iter=000002.parquet").fields
    tr = Trainer(tiny(iterations=2, save_trajectories_every=2, eval_interval=0), tmp_path / "every2", quiet=True)
    recs = list(tr.iterate())
    assert ["after_update" in r["timings"] for r in recs] == [False, True]


def test_empg_trains_on_the_entropy_its_rollout_records(tmp_path):
    """estimator="empg" runs an iteration on freshly rolled-out episodes: the saved entropy is, on
    every action token, that of the policy before the update (a teacher-forced forward of each row),
    0 on observation tokens, and the saved advantages are the plain-loop EMPG of the saved data."""
    cfg = tiny(estimator="empg", loss="token_ppo", group_size=2, iterations=1, eval_interval=0)
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    before = copy.deepcopy(tr.policy.model).eval()  # policy_lag 0: the rollout's policy
    rec = next(iter(tr.iterate()))
    assert rec["iteration"] == 1 and math.isfinite(rec["policy_loss"])
    b = load(tmp_path / "run" / "trajectories" / "iter=000001.parquet")
    assert "entropy" in b.fields and len(b) == cfg.episodes
    vocab = before.get_output_embeddings().weight.shape[0]
    with torch.no_grad():
        for p, resp, m, ent in zip(
            b.field("prompt_ids"), b.field("response_ids"), b.field("loss_mask"), b.field("entropy")
        ):
            ids = torch.tensor(np.concatenate([p, resp]), dtype=torch.int64)[None]
            lp = torch.log_softmax(before(input_ids=ids).logits[0].double(), -1)[len(p) - 1 : -1]
            want = -(lp.exp() * lp).sum(-1).numpy()
            act = m != 0
            assert np.isfinite(ent[act]).all() and (ent[act] > 0).all() and (ent[act] <= math.log(vocab) + 1e-5).all()
            np.testing.assert_allclose(ent[act], want[act], atol=1e-5, rtol=0)
            assert (ent[~act] == 0).all()
    want_adv, _ = reference_empg(
        b.token_rewards.numpy(),
        b.mask.numpy(),
        b.group_ids,
        entropy=b.padded("entropy").numpy(),
        turn_ids=b.turn_ids.numpy(),
    )
    mask = b.mask.bool().numpy()
    np.testing.assert_allclose(b.padded("advantages").numpy()[mask], np.asarray(want_adv)[mask], atol=1e-5)
