"""The policy's Monte-Carlo truth in the views: the per-turn table's v_mc / a_mc (by hand), the value
curve's markers with ±1.96 SE bars, the comparison's truth bars and its accuracy table."""

import numpy as np
import pytest

from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.envs import NoisyExpert
from mpo_viz.envs.generate import GenerateConfig, generate
from mpo_viz.render import plots
from mpo_viz.rollout.truth import mc_truth
from mpo_viz.widgets import EstimatorComparison, TrajectoryExplorer


@pytest.fixture(scope="module")
def truth_batch():
    b = generate(GenerateConfig(env="automation", episodes=8, group_size=4, seed=4))
    return mc_truth(b, NoisyExpert(noise=0.25), m=4, seed=0, progress=False)


def test_turn_table_has_the_truth_by_hand():
    rows = [
        {
            "traj_id": "a",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [2, 2, 3, 2, 3],
            "loss_mask": [1, 1, 0, 1, 0],
            "reward": 1.0,
        }
    ]
    b = TrajectoryBatch.from_rows(rows).with_turn_fields(
        mc_value=[[0.4, 0.7]], mc_value_se=[[0.1, 0.2]], mc_value_a=[[0.4, 0.7]], mc_value_b=[[0.4, 0.7]]
    )
    tt = b.turns()
    np.testing.assert_allclose(tt["v_mc"], [0.4, 0.7])
    np.testing.assert_allclose(tt["v_mc_se"], [0.1, 0.2])
    np.testing.assert_allclose(tt["a_mc"], [0.7 - 0.4, 1.0 - 0.7])  # R_k + V(s_k+1) − V(s_k), V(s_2) = 0
    q = b.with_turn_fields(mc_q=[[0.5, 0.9]], mc_q_se=[[0.1, 0.1]]).turns()
    np.testing.assert_allclose(q["a_mc"], [0.5 - 0.4, 0.9 - 0.7])
    assert "v_mc" not in TrajectoryBatch.from_rows(rows).turns()


def test_value_curve_marks_the_true_values_with_error_bars(truth_batch):
    fig = plots.value_curve(truth_batch, 0)
    tr = next(t for t in fig.data if t.name == plots.MC_TRACE)
    tt = truth_batch[[0]].turns()
    np.testing.assert_array_equal(tr.x, tt["start"].to_numpy())
    np.testing.assert_allclose(tr.y, tt["v_mc"], atol=1e-6)
    np.testing.assert_allclose(tr.error_y.array, 1.96 * tt["v_mc_se"].to_numpy(), atol=1e-6)
    assert plots.MC_TRACE not in [
        t.name for t in plots.value_curve(generate(GenerateConfig(env="search", episodes=1, group_size=1)), 0).data
    ]


def test_explorer_and_comparison_show_the_truth(truth_batch):
    ex = TrajectoryExplorer(truth_batch, estimators=["mpo"], row=1)
    assert plots.MC_TRACE in [t.name for t in ex.figure.data]
    assert {"v_mc", "a_mc"} <= set(ex.turn_df.columns)
    ex.select(2)  # an in-place update keeps the bars in step
    tr = next(t for t in ex.figure.data if t.name == plots.MC_TRACE)
    np.testing.assert_allclose(tr.y, truth_batch[[2]].turns()["v_mc"], atol=1e-6)
    cmp = EstimatorComparison(truth_batch, ["mpo", "grpo"], row=0)
    names = [t.name for t in cmp.figure.data]
    assert names[-1] == "truth (Monte-Carlo)"
    assert cmp.mc_accuracy_df is not None and list(cmp.mc_accuracy_df.estimator) == ["mpo", "grpo"]
    assert "accuracy against this policy's truth" in cmp.metrics.value


def test_explorer_shows_the_token_truth(truth_batch):
    """With the token truth: the strip's truth channel on the advantage channels' scale, the per-token
    table of the trajectory's measured tokens (by hand against the fields) and the within-turn accuracy
    over the batch, saying which truth is used; a slider move keeps them in step."""
    from mpo_viz.rollout.token_truth import mc_token_truth

    b = mc_token_truth(truth_batch, NoisyExpert(noise=0.25), m=4, seed=0, progress=False)
    ex = TrajectoryExplorer(b, estimators=["mpo", "turn_gae"], row=1)
    p = ex.strip.payload_dict
    assert "truth" in p and p["channel_info"]["truth"]["scale"] == p["channel_info"]["adv_mpo"]["scale"]
    assert ex.has_token_truth and ex.tokens_view in ex.children
    meas = np.flatnonzero(np.asarray(b.field("mc_tok_measured")[1]) == 1)
    np.testing.assert_array_equal(ex.token_df["pos"], meas)
    np.testing.assert_allclose(ex.token_df["truth"], np.asarray(b.field("mc_tok_adv")[1])[meas])
    adv = ex.advantages["mpo"][1].numpy()
    np.testing.assert_allclose(ex.token_df["adv_mpo"], adv[meas], rtol=1e-6)
    assert "Truth used</b>: the Monte-Carlo token truth of expert(noise=0.25)" in ex.tokens_view.value
    acc = ex.token_accuracy_df.set_index("estimator")
    assert acc.loc["turn_gae", "within_corr"] == 0.0 and "flat credit" in acc.loc["turn_gae", "within_note"]
    assert {"tokens_" + b.traj_ids[1], "accuracy_tokens"} <= set(ex.tables())
    before = ex.token_accuracy_df.copy()
    ex.params.set(beta=0.5)
    assert not np.allclose(ex.token_df["adv_mpo"], adv[meas]) and not ex.token_accuracy_df.equals(before)
    plain = TrajectoryExplorer(truth_batch, estimators=["mpo"], row=0)
    assert (
        not plain.has_token_truth
        and plain.tokens_view not in plain.children
        and "truth" not in plain.strip.payload_dict
    )
