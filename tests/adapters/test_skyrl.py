"""SkyRL GeneratorOutput: hand-computed rows, per-token and per-trajectory rewards, step-wise
outputs, JSON files and refusals."""

import json
import pickle

import pytest

from mpo_viz import TrajectoryError
from mpo_viz.adapters import from_skyrl
from tests.adapters.adapter_data import C0, C1, OBS, P0


def output(**over):
    return {
        "prompt_token_ids": [P0, P0],
        "response_ids": [C0 + OBS + C1, C1],
        "rewards": [[0, 0, 0, 0, 0.1, 0, 0, 0.2, 0, 0, 0, 0, 1.0], [0.0, 0.0, 0.0]],
        "loss_masks": [[1] * 5 + [0] * 5 + [1] * 3, [1, 1, 1]],
        "stop_reasons": ["stop", "length"],
        "rollout_metrics": {"generate/avg_num_tokens": 8.0},
        "rollout_logprobs": [[-0.5] * 13, [-0.25] * 3],
        "trajectory_ids": [{"instance_id": "q1", "repetition_id": 0}, {"instance_id": "q1", "repetition_id": 1}],
        "pixel_values": None,
        "env_metrics": [{"calls": 1}, {"calls": 0}],
        **over,
    }


def test_hand_computed_rows():
    b, rep = from_skyrl(output())
    r0, r1 = b.row(0), b.row(1)
    assert b.traj_ids == ["q1_0", "q1_1"] and b.group_ids == ["q1", "q1"]
    assert r0["prompt_ids"] == P0 and r0["response_ids"] == C0 + OBS + C1
    assert r0["turn_ids"] == [0] * 10 + [1] * 3
    # 0.2 sat on an observation token (position 7): moved to position 4, the last action token before it
    assert r0["token_rewards"] == pytest.approx([0, 0, 0, 0, 0.3, 0, 0, 0, 0, 0, 0, 0, 1.0])
    assert r0["reward"] == pytest.approx(1.3) and r1["reward"] == 0.0
    assert r0["rollout_logprobs"] == [-0.5] * 13 and r1["stop_reason"] == "length"
    assert json.loads(r1["extra_json"]) == {"env_metrics": {"calls": 0}}
    assert rep.rewards_moved == 1 and b.meta["skyrl_rollout_metrics"] == {"generate/avg_num_tokens": 8.0}
    assert "pixel_values" not in rep.fields_dropped  # None: nothing there to drop


def test_scalar_rewards_and_groups_from_prompts():
    out = output(rewards=[1.0, 0.0], trajectory_ids=None, prompt_token_ids=[P0, P0 + [9]])
    out.pop("env_metrics")
    b, rep = from_skyrl(out)
    assert b.traj_ids == ["row0", "row1"] and b.group_ids == ["prompt0", "prompt1"]
    assert b.outcome_reward.tolist() == [1.0, 0.0] and "token_rewards" not in b.row(0)
    assert any("group_id from identical prompt_token_ids" in k for k in rep.notes)


def test_step_wise_output_is_merged():
    out = {
        "prompt_token_ids": [P0, P0 + C0 + OBS, P0],
        "response_ids": [C0, C1, C1],
        "rewards": [[0.0] * 5, [0, 0, 1.0], [0, 0, 0.5]],
        "loss_masks": [[1] * 5, [1] * 3, [1] * 3],
        "is_last_step": [False, True, True],
        "stop_reasons": ["tool_call", "stop", "stop"],
        "trajectory_ids": [{"instance_id": "q", "repetition_id": 0}] * 2 + [{"instance_id": "q", "repetition_id": 1}],
    }
    b, rep = from_skyrl(out)
    assert b.traj_ids == ["q_0", "q_1"]
    r = b.row(0)
    assert r["response_ids"] == C0 + OBS + C1 and r["loss_mask"] == [1] * 5 + [0] * 5 + [1] * 3
    assert r["token_rewards"] == [0.0] * 12 + [1.0] and r["reward"] == 1.0 and r["stop_reason"] == "stop"
    assert rep.merged_steps == 2 and rep.rows_in == 3


def test_json_files_and_refusals(tmp_path):
    (tmp_path / "g.json").write_text(json.dumps(output()))
    b, _ = from_skyrl(tmp_path / "g.json")
    assert len(b) == 2
    (tmp_path / "g.jsonl").write_text(
        json.dumps(output())
        + "\n"
        + json.dumps(
            output(
                trajectory_ids=[{"instance_id": "q2", "repetition_id": 0}, {"instance_id": "q2", "repetition_id": 1}]
            )
        )
        + "\n"
    )
    b2, rep = from_skyrl(tmp_path / "g.jsonl")
    assert b2.traj_ids == ["q1_0", "q1_1", "q2_0", "q2_1"] and rep.rows_in == 4
    with open(tmp_path / "g.pkl", "wb") as fh:
        pickle.dump(output(), fh)
    with pytest.raises(ValueError, match=r"g.pkl: a pickle can run code .* trust=True \(--trust\)"):
        from_skyrl(tmp_path / "g.pkl")
    assert len(from_skyrl(tmp_path / "g.pkl", trust=True)[0]) == 2
    with pytest.raises(
        TrajectoryError,
        match=r"field 'loss_masks': expected skyrl layout: one entry per row like "
        r"'response_ids' \(2\), found 1",
    ):
        from_skyrl(output(loss_masks=[[1]]))
    with pytest.raises(TrajectoryError, match=r"field 'rewards': expected skyrl layout: a GeneratorOutput dict"):
        from_skyrl({k: v for k, v in output().items() if k != "rewards"})
    bad = output(rewards=[[0.0] * 12, [0.0] * 3])
    with pytest.raises(
        TrajectoryError,
        match=r"row 0, traj_id='q1_0': field 'rewards': expected skyrl layout: 13 "
        r"per-token rewards",
    ):
        from_skyrl(bad)
    b3, rep3 = from_skyrl(bad, errors="collect")
    assert b3.traj_ids == ["q1_1"] and rep3.rejected[0].row == 0
