"""The held-out evaluation (train/evaluate.py): one evaluation set for every run of a seed, the reuse of
an evaluation of unchanged weights, and pass@k."""

import numpy as np
import pytest
import torch

from mpo_viz.analysis import pass_at_k
from mpo_viz.train import Trainer
from tests.train.train_helpers import tiny


def test_every_run_of_a_seed_is_judged_on_the_same_tasks(tmp_path):
    a = Trainer(tiny(estimator="mpo", seed=5, eval_episodes=3), tmp_path / "a", quiet=True)
    b = Trainer(
        tiny(estimator="grpo", loss="token_ppo", group_size=2, seed=5, eval_episodes=3), tmp_path / "b", quiet=True
    )
    c = Trainer(tiny(estimator="mpo", seed=6, eval_seed=5, eval_episodes=3), tmp_path / "c", quiet=True)
    d = Trainer(tiny(estimator="mpo", seed=6, eval_episodes=3), tmp_path / "d", quiet=True)
    assert a.evaluator.seeds(3) == b.evaluator.seeds(3) == c.evaluator.seeds(3) != d.evaluator.seeds(3)
    ev = a.evaluate()
    assert ev["eval_seed"] == 5 and ev["n_eval_tasks"] == 3
    assert {"eval_success", "eval_sampled_success", "eval_sampled_reward_mean"} <= set(ev)
    # the same tasks and sampling seeds every time: the same numbers twice
    assert a.evaluate() == ev


def test_pass_at_k_by_hand():
    s = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert pass_at_k(s, 1) == pytest.approx((0.25 + 1 + 0) / 3)
    # task 0: 1 − C(3, 2)/C(4, 2) = 1 − 3/6
    assert pass_at_k(s, 2) == pytest.approx((0.5 + 1 + 0) / 3)
    assert pass_at_k(s, 4) == pytest.approx((1 + 1 + 0) / 3)
    with pytest.raises(ValueError, match=r"k: expected 1 <= k <= 4 \(the samples per task\), found 5"):
        pass_at_k(s, 5)


def test_trainer_pass_at_k_reads_its_samples(tmp_path):
    tr = Trainer(tiny(estimator="grpo", loss="token_ppo", group_size=2), tmp_path / "r", quiet=True)
    pk = tr.pass_at_k(3, 4)
    assert pk["pass_tasks"] == 3 and pk["pass_samples"] == 4
    vals = [pk[f"pass@{k}"] for k in range(1, 5)]
    assert all(0 <= v <= 1 for v in vals) and vals == sorted(vals)  # pass@k never falls with k
    assert tr.pass_at_k(3, 4) == pk


def test_an_evaluation_of_unchanged_weights_is_reused_and_is_what_a_rerun_gives(tmp_path):
    tr = Trainer(
        tiny(estimator="grpo", loss="token_ppo", group_size=2, iterations=1, eval_episodes=3),
        tmp_path / "r",
        quiet=True,
    )
    greedy, sampled = tr.evaluate_one(), tr.evaluate_one(greedy=False)
    spent = tr.eval_seconds
    assert spent > 0 and tr.evaluate_one() == greedy and tr.evaluate_one(greedy=False) == sampled
    assert tr.eval_seconds == spent  # nothing played again
    tr.evaluator.cache.clear()  # played again: the same episodes, the same numbers
    assert tr.evaluate_one() == greedy and tr.eval_seconds > spent
    # other weights are evaluated again (an update, or any in-place change of a tensor)
    spent = tr.eval_seconds
    with torch.no_grad():
        next(tr.policy.model.parameters()).view(-1)[0] += 1e-3
    tr.evaluate_one()
    assert tr.eval_seconds > spent
    spent = tr.eval_seconds
    tr.evaluate_one(n_episodes=2)  # another number of tasks is another evaluation
    assert tr.eval_seconds > spent
