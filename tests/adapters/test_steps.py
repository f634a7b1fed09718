"""Step-wise logs: merging when prompts extend token for token, one-turn rows otherwise (reason
counted), per-step rewards → turn_rewards, the layouts of verifiers, rLLM, agent-lightning and flat
steps, and refusals."""

import json
import math

import pytest

from mpo_viz import TrajectoryError
from mpo_viz.adapters import from_steps
from tests.adapters.adapter_data import C0, C1, OBS, P0


def verifiers_rollout(**over):
    steps = [
        {
            "tokens": {
                "prompt_ids": P0,
                "prompt_mask": [0] * 4,
                "completion_ids": C0,
                "completion_mask": [1] * 5,
                "completion_logprobs": [-0.1] * 5,
                "overlong_prompt": False,
                "is_truncated": False,
            },
            "reward": 0.1,
            "advantage": None,
            "trajectory_id": "r0",
            "is_truncated": False,
            "extras": {},
        },
        {
            "tokens": {
                "prompt_ids": P0 + C0 + OBS,
                "prompt_mask": [0] * 14,
                "completion_ids": C1,
                "completion_mask": [1] * 3,
                "completion_logprobs": [-0.2] * 3,
            },
            "reward": None,
            "advantage": None,
            "trajectory_id": "r0",
            "extras": {},
        },
    ]
    return {
        "example_id": 3,
        "reward": 1.0,
        "is_truncated": False,
        "stop_condition": "answered",
        "trajectory": steps,
        **over,
    }


def test_verifiers_merged_hand_computed():
    b, rep = from_steps([verifiers_rollout()])
    r = b.row(0)
    assert r["traj_id"] == "r0" and r["group_id"] == "3" and r["prompt_ids"] == P0
    assert r["response_ids"] == C0 + OBS + C1
    assert r["loss_mask"] == [1] * 5 + [0] * 5 + [1] * 3
    assert r["turn_ids"] == [0] * 10 + [1] * 3
    assert r["rollout_logprobs"] == pytest.approx([-0.1] * 5 + [0.0] * 5 + [-0.2] * 3)
    assert r["turn_rewards"] == [0.1, 0.0] and r["reward"] == 1.0  # 1.0 is neither their sum nor the last step's
    assert r["stop_reason"] == "answered" and r["truncated"] is False and r["num_turns"] == 2
    # the estimator's rewards: 0.1 on turn 0's last token, 1.0 on the last token
    assert b.field("rewards")[0].tolist() == pytest.approx([0, 0, 0, 0, 0.1] + [0] * 5 + [0, 0, 1.0])
    assert rep.merged_steps == 2 and not rep.kept_as_steps and rep.rows_in == 1


def test_prompt_that_does_not_extend_keeps_steps_apart():
    # rLLM Trajectory whose second call drops the system prompt (context management)
    traj = {
        "uid": "u1",
        "name": "solver",
        "task": {"q": 1},
        "reward": 1.0,
        "steps": [
            {"prompt_ids": P0, "response_ids": C0, "logprobs": [], "reward": 0.1},
            {"prompt_ids": [3] + C0 + OBS, "response_ids": C1, "logprobs": [], "reward": 0.0},
        ],
    }
    b, rep = from_steps([traj])
    assert b.traj_ids == ["u1/step0", "u1/step1"] and len(set(b.group_ids)) == 1
    r0, r1 = b.row(0), b.row(1)
    assert r0["prompt_ids"] == P0 and r0["response_ids"] == C0 and r0["loss_mask"] == [1] * 5
    assert r1["prompt_ids"] == [3] + C0 + OBS and r1["response_ids"] == C1
    assert r0["turn_rewards"] == [0.1] and math.isnan(r0["reward"])
    assert r1["turn_rewards"] == [0.0] and r1["reward"] == 1.0  # the outcome on the last step's row only
    assert "rollout_logprobs" not in r0  # rLLM's empty default list means: not logged
    assert json.loads(r1["extra_json"]) == {
        "source_traj_id": "u1",
        "step": 1,
        "merge_break": {"step": 1, "position": 0},
    }
    assert rep.kept_as_steps == {"the next prompt differs from prompt + completion (re-rendered or edited history)": 2}
    # a prompt shorter than prompt + completion (truncated context) is the other reason
    traj["steps"][1]["prompt_ids"] = P0 + C0[:2]
    _, rep2 = from_steps([traj])
    assert list(rep2.kept_as_steps) == [
        "the next prompt is shorter than prompt + completion (context truncated or summarized)"
    ]


def test_rllm_episode_and_agent_lightning_rewards():
    ep = {
        "id": "task7:1",
        "trajectories": [
            {
                "uid": "t-a",
                "name": "solver",
                "reward": 0.1 + 1.0,
                "steps": [
                    {"prompt_ids": P0, "response_ids": C0, "logprobs": [-0.5] * 5, "reward": 0.1},
                    {"prompt_ids": P0 + C0 + OBS, "response_ids": C1, "logprobs": [-0.5] * 3, "reward": 1.0},
                ],
            }
        ],
    }
    agl = {
        "rollout_id": "ro1",
        "data_id": "task7",
        "step": 4,
        "final_reward": 1.0,
        "triplets": [
            {"prompt": {"token_ids": P0}, "response": {"token_ids": C0, "log_probs": None}, "reward": None},
            {"prompt": {"token_ids": P0 + C0 + OBS}, "response": {"token_ids": C1, "log_probs": None}, "reward": 1.0},
        ],
    }
    b, rep = from_steps([ep, agl])
    e, a = b.row(0), b.row(1)
    assert e["traj_id"] == "t-a" and e["group_id"] == "task7" and a["traj_id"] == "ro1" and a["group_id"] == "task7"
    # rLLM: the trajectory reward is the sum of the step rewards; agent-lightning copies the final reward
    # onto the last triplet: both already carried by the steps, so not added again
    assert e["turn_rewards"] == [0.1, 1.0] and math.isnan(e["reward"])
    assert a["turn_rewards"] == [0.0, 1.0] and math.isnan(a["reward"]) and a["step"] == 4
    assert b.token_rewards.sum(1).tolist() == pytest.approx([1.1, 1.0])
    assert rep.notes[next(k for k in rep.notes if k.startswith("trajectory reward equals"))] == 2


def test_flat_steps_in_any_order_and_from_a_file(tmp_path):
    lines = [
        {
            "trajectory_id": "x",
            "group_id": "g",
            "step": 1,
            "prompt_ids": P0 + C0 + OBS,
            "completion_ids": C1,
            "reward": 1.0,
        },
        {"trajectory_id": "x", "group_id": "g", "step": 0, "prompt_ids": P0, "completion_ids": C0, "reward": 0.0},
        {"trajectory_id": "y", "group_id": "g", "step": 0, "prompt_ids": P0, "completion_ids": C1, "reward": 0.0},
    ]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    b, rep = from_steps(tmp_path / "s.jsonl")
    assert b.traj_ids == ["x", "y"] and b.row(0)["response_ids"] == C0 + OBS + C1
    assert b.row(0)["turn_rewards"] == [0.0, 1.0] and "turn_rewards" not in b.row(1) and math.isnan(b.row(1)["reward"])
    assert rep.rows_in == 3 and rep.merged_steps == 2


def test_refusals_name_line_field_and_layout(tmp_path):
    bad_tokens = verifiers_rollout()
    bad_tokens["trajectory"][1]["tokens"] = None
    lines = [json.dumps(verifiers_rollout()), json.dumps({"foo": 1}), "{oops", json.dumps(bad_tokens)]
    (tmp_path / "s.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        TrajectoryError,
        match=r"s.jsonl, line 2: field '<record>': expected steps layout: a step-wise "
        r"log record: a verifiers rollout .* found keys \['foo'\]",
    ):
        from_steps(tmp_path / "s.jsonl")
    b, rep = from_steps(tmp_path / "s.jsonl", errors="collect")
    assert len(b) == 1 and [p.line for p in b.rejected] == [2, 3, 4]
    assert b.rejected[2].field == "trajectory[1].tokens" and "TrajectoryStepTokens" in b.rejected[2].expected
    assert b.rejected[2].traj_id == "r0"
    assert rep.rows_in == 4 and rep.trajectories == 1 and len(rep.rejected) == 3


def test_wrong_logprob_count_and_duplicate_ids():
    r = verifiers_rollout()
    r["trajectory"][0]["tokens"]["completion_logprobs"] = [-0.1] * 4
    with pytest.raises(
        TrajectoryError,
        match=r"field 'trajectory\[0\].completion_logprobs': expected steps layout: 5 "
        r"log-probs \(one per completion token\), found 4",
    ):
        from_steps([r])
    b, rep = from_steps([verifiers_rollout(), verifiers_rollout()], errors="collect")
    assert len(b) == 1 and b.rejected[0].field == "traj_id" and b.rejected[0].row == 1
    assert "a duplicate of 'r0' (first at row 0)" in b.rejected[0].found
