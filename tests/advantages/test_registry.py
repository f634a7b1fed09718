"""The registry and compute(batch, name, **options) on TrajectoryBatch objects."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mpo_viz.advantages as A
from mpo_viz.advantages import registry
from mpo_viz.data.synthetic import make_batch
from mpo_viz.data.trajectory import TrajectoryBatch

NAMES = [
    "bilevel_gae",
    "drgrpo",
    "gae",
    "gigpo",
    "grpo",
    "mpo",
    "mt_grpo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
    "turn_gae",
    "vapo",
]


@pytest.fixture(scope="module")
def batch():
    return make_batch(16, seed=7, turns=(1, 4), turn_len=(1, 8), obs_len=(1, 6), prompt_len=(2, 5), group_size=4)


def test_available_lists_every_builtin():
    assert set(NAMES) <= set(A.available_estimators())
    assert A.available_estimators() == sorted(A.available_estimators())


@pytest.mark.parametrize("name", NAMES)
def test_compute_every_estimator(batch, name):
    res = A.compute(batch, name)
    B, L = batch.mask.shape
    assert res.advantages.shape == (B, L) and res.returns.shape == (B, L)
    assert res.advantages.dtype == torch.float32
    m = batch.mask.numpy() == 0
    assert (res.advantages.numpy()[m] == 0).all()
    assert res.options == registry.get_estimator(name).options  # all defaults recorded
    assert len(res.turns) == int(batch.num_turns.sum())
    assert res.traj_ids == batch.traj_ids
    assert res.wall_time_s >= res.timings["estimate"] > 0
    assert np.isfinite(res.advantages.numpy()).all()


def test_compute_equals_tensor_function(batch):
    res = A.compute(batch, "mpo", beta=0.5, within="local", turn_lam=0.8)
    a, g = A.mae(
        batch.token_rewards,
        batch.values,
        batch.mask,
        turn_ids=batch.turn_ids,
        bootstrap_value=batch.bootstrap_value,
        beta=0.5,
        within="local",
        turn_lam=0.8,
    )
    torch.testing.assert_close(res.advantages, a, rtol=0, atol=0)
    torch.testing.assert_close(res.returns, g, rtol=0, atol=0)
    assert res.options["beta"] == 0.5 and res.options["lam"] == 0.95 and res.options["value_at"] == "first"
    # mean over each turn of MAE is the turn advantage (turn GAE), whatever β
    tg = A.compute(batch, "turn_gae", turn_lam=0.8)
    np.testing.assert_allclose(res.turns["adv_mpo"], tg.turns["adv_turn_gae"], atol=1e-5)
    # the result's table is the batch's per-turn table plus this estimator's columns
    base = batch.turns()
    assert list(res.turns.columns) == [*base.columns, "adv_mpo", "ret_mpo"]
    np.testing.assert_allclose(res.turns["value_first"], base["value_first"], atol=0)
    np.testing.assert_allclose(res.turns["reward"], base["reward"], atol=0)
    # turn_gae returns: G^T_k = A^T_k + V(s_k)
    np.testing.assert_allclose(tg.turns["ret_turn_gae"], tg.turns["adv_turn_gae"] + tg.turns["value_first"], atol=1e-5)


@pytest.mark.parametrize("name", ["mpo", "turn_gae", "grpo", "reinforce_pp"])
def test_turn_advantage_column_stays_unwhitened(batch, name):
    # adv_<name> is the turn's mean advantage in the estimator's own units (A^T_k for mae and
    # turn_gae) whatever whiten is; only the token tensor is whitened
    plain = A.compute(batch, name, whiten=False)
    white = A.compute(batch, name, whiten=True)
    col = f"adv_{name}"
    np.testing.assert_allclose(white.turns[col], plain.turns[col], rtol=1e-6, atol=1e-6)
    m = batch.mask.numpy() != 0
    x = plain.advantages.numpy()[m].astype(np.float64)
    np.testing.assert_allclose(
        white.advantages.numpy()[m], (x - x.mean()) / np.sqrt(x.var(ddof=1) + 1e-8), rtol=1e-4, atol=1e-5
    )
    assert not np.allclose(white.advantages.numpy()[m], x)  # whitening did change the tokens
    if name in ("mpo", "turn_gae"):
        _, _, t = A.mae_with_turns(
            batch.token_rewards,
            batch.values,
            batch.mask,
            turn_ids=batch.turn_ids,
            bootstrap_value=batch.bootstrap_value,
            **({"beta": 0.0, "critic_target": "turn", "lam": 1.0} if name == "turn_gae" else {}),
        )
        at = t["advantage"][~np.isnan(t["advantage"])]  # row-major: the table's turn order
        np.testing.assert_allclose(white.turns[col], at, rtol=1e-5, atol=1e-5)


def test_gigpo_through_compute_uses_token_ids(batch):
    # ω = 0 leaves the episode level: GRPO with per-trajectory statistics, Dr. GRPO without the std
    res = A.compute(batch, "gigpo", omega=0.0, episode_stats="trajectories")
    grpo = A.compute(batch, "grpo")
    torch.testing.assert_close(res.advantages, grpo.advantages)
    res = A.compute(batch, "gigpo", omega=0.0, episode_stats="trajectories", norm="mean_norm")
    torch.testing.assert_close(res.advantages, A.compute(batch, "drgrpo").advantages)


def test_unknown_name_and_option(batch):
    with pytest.raises(ValueError, match=r"name: unknown estimator 'ppo'; available: .*gae"):
        A.compute(batch, "ppo")
    with pytest.raises(
        ValueError,
        match=r"options: estimator 'gae' has no option 'beta'; valid options: gamma, lam, lam_rule, alpha, q, whiten",
    ):
        A.compute(batch, "gae", beta=1.0)
    with pytest.raises(ValueError, match=r"no option 'turn_ids'"):
        A.compute(batch, "mpo", turn_ids=None)  # taken from the batch, not an option


def _no_values_batch():
    rows = [
        {
            "traj_id": f"t{i}",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [5, 6, 7],
            "loss_mask": [1, 0, 1],
            "reward": float(i),
        }
        for i in range(3)
    ]
    return TrajectoryBatch.from_rows(rows)


def test_needs_are_checked_up_front():
    b = _no_values_batch()
    assert A.missing(b, "mpo") == ["values"]
    assert A.missing(b, "grpo") == []
    with pytest.raises(
        ValueError, match=r"estimator 'mpo' needs what this batch lacks — values: critic values.*supports: .*grpo"
    ):
        A.compute(b, "mpo")
    res = A.compute(b, "grpo")
    assert "value_first" not in res.turns and len(res.turns) == 6  # mask [1, 0, 1]: two turns a row
    np.testing.assert_allclose(res.advantages.numpy()[:, 0], [-1, 0, 1], atol=1e-5)
    assert registry.get_estimator("gigpo").needs == ("groups", "turns", "prompt_ids", "response_ids")


def test_register_refuses_duplicates_and_runs_custom():
    with pytest.raises(ValueError, match=r"estimator 'gae' is already registered"):
        A.register_estimator("gae")(lambda batch: None)
    name = "test_only_constant"
    if name not in A.available_estimators():

        @A.register_estimator(name, needs=("values",))
        def constant(batch, *, c=2.0):
            """Every action token gets c."""
            return batch.mask * c, batch.mask * c

    b = make_batch(3, seed=1)
    res = A.compute(b, name, c=3.0)
    assert res.options == {"c": 3.0}
    assert registry.get_estimator(name).doc == "Every action token gets c."
    np.testing.assert_allclose(res.turns[f"adv_{name}"], 3.0)
    with pytest.raises(ValueError, match=r"estimator 'test_only_constant' is already registered"):
        A.register_estimator(name)(lambda batch: None)


def test_attach_puts_results_on_the_batch(batch):
    res = A.compute(batch, "gae")
    b2 = res.attach(batch, advantages="adv_gae", returns="ret_gae")
    torch.testing.assert_close(b2.padded("adv_gae"), res.advantages)


def test_rows_without_values_are_named():
    rows = [
        {
            "traj_id": f"t{i}",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [5, 6, 7],
            "loss_mask": [1, 0, 1],
            "reward": 1.0,
        }
        for i in range(3)
    ]
    rows[0]["values"] = [0.1, 0.2, 0.3]
    b = TrajectoryBatch.from_rows(rows)
    with pytest.raises(
        ValueError,
        match=r"values: row 1 \(traj_id 't1'\) has no critic values; estimator 'gae' needs them on every row \(2 rows",
    ):
        A.compute(b, "gae")


def test_compute_on_plain_tensors_says_what_to_call(batch):
    for call in (lambda: A.compute(batch.values, "mpo"), lambda: A.missing(batch.values, "mpo")):
        with pytest.raises(
            ValueError, match=r"batch: expected a TrajectoryBatch .*found Tensor.*mpo_viz\.advantages\.mae\("
        ):
            call()
