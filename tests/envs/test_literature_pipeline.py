"""Sokoban and FrozenLake through the toolkit: generate (expert and model), replay, truth, train
(SFT + one RL iteration) at a tiny size."""

import json

import numpy as np
import pytest
import torch

from mpo_viz import models
from mpo_viz.envs import NoisyExpert, build_tokenizer, make_env
from mpo_viz.envs.generate import GenerateConfig, generate, oracle_columns
from mpo_viz.rollout import rollout
from mpo_viz.rollout.replay import env_of, replay, word_layout_of
from mpo_viz.rollout.truth import mc_truth
from mpo_viz.train import Config, Trainer

CASES = {
    "sokoban": dict(difficulty=(2, 4), env_options={"boxes": 1}),
    "sokoban-2": dict(difficulty=(3, 6), env_options={"boxes": 2, "slack": 3}),
    "frozenlake": dict(difficulty=(6, 8), env_options={}),
    "frozenlake-8": dict(difficulty=(14, 16), env_options={"size": 8, "slippery": False}),
}


def _env(case):
    return case.split("-")[0]


@pytest.mark.parametrize("case", list(CASES))
def test_expert_files_carry_exact_oracle_columns_and_replay(case):
    c = CASES[case]
    kw = {"difficulty": c["difficulty"]} if c["difficulty"] is not None else {}
    batch = generate(GenerateConfig(env=_env(case), episodes=16, group_size=4, env_options=c["env_options"], **kw))
    toks = [t for row in batch.field("response_tokens") for t in row]
    assert "[UNK]" not in toks  # the vocabulary covers every text
    oc = oracle_columns(batch)
    for k in range(len(batch)):
        # the per-turn advantages sum to Q − V of the turn, token by token
        tadv = oc["token_adv"][k][batch.mask[k].bool()].sum().item()
        assert tadv == pytest.approx(sum(oc["turn_adv"][k]), abs=1e-4)
    if _env(case) == "sokoban":  # RAGEN's per-step rewards are recorded turn by turn
        assert batch.has("turn_rewards") and np.isnan(batch.outcome_reward).all()
    env = env_of(batch)  # rebuilt from the file's metadata
    assert env.option_values() == make_env(_env(case), **kw, **c["env_options"]).option_values()
    replayed = replay(batch, word_layout_of(env))  # every observation rebuilt, or it raises
    assert [len(r) for r in replayed] == list(batch.field("num_turns"))


@pytest.mark.parametrize("case", ["sokoban", "frozenlake"])
def test_a_model_generates_and_the_expert_truth_agrees_with_the_oracle(case):
    torch.manual_seed(0)
    c = CASES[case]
    env = make_env(case, **({"difficulty": c["difficulty"]} if c["difficulty"] else {}), **c["env_options"])
    policy = models.tiny_policy(build_tokenizer(env), "1m", seed=0)
    batch = rollout(policy, env, 4, group_size=2, max_turn_tokens=16, max_total_tokens=200)
    assert len(batch) == 4 and batch.has("oracle_values")
    expert = generate(
        GenerateConfig(
            env=case,
            episodes=8,
            group_size=4,
            env_options=c["env_options"],
            **({"difficulty": c["difficulty"]} if c["difficulty"] else {}),
        )
    )
    truth = mc_truth(expert, NoisyExpert(0.25), m=64, seed=0)
    mc = [v for row in truth.field("mc_value") for v in row]
    se = [v for row in truth.field("mc_value_se") for v in row]
    oracle = [v for x in expert.field("extra_json") for v in json.loads(x)["oracle"]["turn_v"]]
    z = [(m - o) / s if s > 0 else 0.0 for m, o, s in zip(mc, oracle, se)]
    assert np.mean(np.abs(z) < 3) >= 0.9


@pytest.mark.parametrize("case", ["sokoban", "frozenlake"])
def test_sft_then_one_rl_iteration(tmp_path, case):
    c = CASES[case]
    cfg = Config(
        env=case,
        difficulty=c["difficulty"] if c["difficulty"] is None else list(c["difficulty"]),
        env_options=c["env_options"],
        episodes=4,
        group_size=2,
        epochs=1,
        minibatches=2,
        sft_steps=2,
        sft_batch_episodes=4,
        sft_eval_interval=2,
        eval_interval=1,
        eval_episodes=2,
        max_turn_tokens=24,
        max_total_tokens=300,
        rollout_batch_size=4,
        iterations=1,
        estimator="bilevel_gae",
        critic_warmup_steps=2,
        critic_warmup_episodes=10,
    )
    recs = list(Trainer(cfg, tmp_path / "run", quiet=True).iterate())
    assert recs[-1]["iteration"] == 1 and np.isfinite(recs[-1]["policy_loss"])


@pytest.mark.parametrize("case", ["sokoban-2", "frozenlake"])
def test_doctor_report_and_explorer_read_the_files(case):
    from mpo_viz.doctor import diagnose
    from mpo_viz.render.report import ReportConfig, build_report
    from mpo_viz.widgets import TrajectoryExplorer

    c = CASES[case]
    batch = generate(
        GenerateConfig(
            env=_env(case), episodes=8, group_size=4, difficulty=c["difficulty"], env_options=c["env_options"]
        )
    )
    assert [f.check for f in diagnose(batch) if f.fired] == []  # the exact values are aligned, the rewards placed
    html = build_report(batch, ReportConfig(estimators=("mpo", "bilevel_gae", "grpo")))
    assert "oracle" in html and len(html) > 10_000
    ex = TrajectoryExplorer(batch, estimators=["mpo", "bilevel_gae"])
    assert ex is not None
