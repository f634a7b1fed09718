"""A learning test: on a one-turn task (press the button the prompt names) a noisy SFT warm start
is improved by a few seeded RL iterations."""

from mpo_viz.train import Config, Trainer
from tests.train.train_helpers import register_onepress


def test_success_rises_over_a_few_iterations(tmp_path):
    env = register_onepress()
    cfg = Config(
        env=env,
        difficulty=1,
        env_options={"slack": 0},
        sft_steps=20,
        sft_noise=0.9,
        sft_target_success=1.0,
        sft_eval_interval=1000,
        sft_batch_episodes=16,
        sft_lr=1e-3,
        estimator="grpo",
        loss="token_ppo",
        group_size=4,
        episodes=32,
        epochs=2,
        minibatches=2,
        policy_lr=1e-3,
        iterations=6,
        eval_interval=0,
        eval_episodes=32,
        max_turn_tokens=12,
        rollout_batch_size=32,
        oracle_noise=None,
    )
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    sft = tr.sft()
    # the expert is right 1 - 0.9 + 0.9/3 = 40% of the time; the warm start is below that
    assert 0.0 < sft["sft_success"] < 0.4 and abs(sft["sft_expert_success"] - 0.4) < 0.15
    succ = [m["success"] for m in tr.iterate()]
    assert len(succ) == 6
    assert sum(succ[3:]) / 3 > succ[0] + 0.1, succ
    assert tr.evaluate_one()["eval_success"] > sft["sft_success"] + 0.15
