"""TRL completions_*.parquet and ART trajectory Parquet: text logs through a local tokenizer."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpo_viz import TrajectoryError
from mpo_viz.adapters import from_art, from_trl

SYSTEM = {"role": "system", "content": "you are an agent ."}
USER = {"role": "user", "content": "task : add 2 and 3"}


def write_trl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_trl_text_rows(tmp_path, tok):
    f = write_trl(
        tmp_path / "completions" / "completions_00010.parquet",
        [
            {
                "step": 10,
                "prompt": "task : add 2 and 3",
                "completion": "calc 2 + 3 result 5 answer 5",
                "correctness": 1.0,
                "format": 0.5,
                "advantage": 0.7,
                "note": "a",
            },
            {
                "step": 10,
                "prompt": "task : add 2 and 3",
                "completion": "answer 9",
                "correctness": 0.0,
                "format": float("nan"),
                "advantage": -0.7,
                "note": "b",
            },
            {
                "step": 10,
                "prompt": "task : add 3 and 4",
                "completion": "answer 9",
                "correctness": None,
                "format": None,
                "advantage": 0.0,
                "note": "c",
            },
        ],
    )
    b, rep = from_trl(tmp_path / "completions", tokenizer=tok)
    r = b.row(0)
    assert b.traj_ids == ["completions_00010/0", "completions_00010/1", "completions_00010/2"]
    assert b.group_ids == ["step10/prompt0", "step10/prompt0", "step10/prompt1"]
    assert r["prompt_ids"] == [12, 13, 14, 15, 16, 17] and r["response_ids"] == [20, 15, 21, 17, 22, 23, 25, 23]
    assert r["loss_mask"] == [1] * 8 and r["num_turns"] == 1 and r["step"] == 10
    assert r["reward"] == 1.5 and r["advantages"] == pytest.approx([0.7] * 8)
    assert b.outcome_reward[1] == 0.0  # the NaN format score is skipped (TRL's nansum)
    assert math.isnan(b.outcome_reward[2])  # no reward function scored it
    assert json.loads(r["extra_json"]) == {"note": "a"}
    assert rep.notes["reward = sum of columns ['correctness', 'format']"] == 1
    b2, _ = from_trl(f, tokenizer=tok, reward_columns=["correctness"])
    assert b2.outcome_reward[0] == 1.0 and json.loads(b2.row(0)["extra_json"]) == {"format": 0.5, "note": "a"}


def test_trl_conversational_rows_get_turns(tmp_path, tok):
    comp = [
        {"role": "assistant", "content": "calc 2 + 3"},
        {"role": "tool", "content": "result 5", "reward": 0.25},
        {"role": "assistant", "content": "answer 5"},
    ]
    f = write_trl(
        tmp_path / "completions_00001.parquet",
        [
            {
                "step": 1,
                "prompt": json.loads(json.dumps([SYSTEM, USER])),
                "completion": comp,
                "correctness": 1.0,
                "advantage": 0.5,
            }
        ],
    )
    b, rep = from_trl(f, tokenizer=tok)
    r = b.row(0)
    assert r["response_ids"] == [20, 15, 21, 17, 6, 5, 22, 23, 6, 4, 25, 23, 6]
    assert r["turn_ids"] == [0] * 10 + [1] * 3 and r["turn_rewards"] == [0.25, 0.0] and rep.rewards_moved == 1
    assert r["advantages"] == [0.5] * 5 + [0.0] * 5 + [0.5] * 3  # on action tokens only
    assert r["reward"] == 1.0


def test_trl_refusals(tmp_path, tok):
    f = write_trl(tmp_path / "completions_00002.parquet", [{"step": 2, "prompt": "task", "advantage": 0.0}])
    with pytest.raises(
        TrajectoryError,
        match=r"completions_00002.parquet: field 'completion': expected trl layout: a "
        r"completions_\*.parquet with columns step, prompt, completion",
    ):
        from_trl(f, tokenizer=tok, errors="collect")
    f = write_trl(
        tmp_path / "completions_00003.parquet",
        [{"step": 3, "prompt": "task", "completion": [{"role": "assistant", "content": "answer"}], "r": 1.0}],
    )
    b, rep = from_trl(f, tokenizer=tok, errors="collect")
    assert len(b) == 0 and rep.rejected[0].row == 0 and rep.rejected[0].field == "completion"
    assert "both text, or both lists of chat messages" in rep.rejected[0].expected
    with pytest.raises(ValueError, match=r"^tokenizer: expected a local tokenizer folder"):
        from_trl(f, tokenizer=None)


def art_rows():
    def msg(role, content, trainable=False):
        return {"role": role, "content": content, "tool_calls": None, "tool_call_id": None, "trainable": trainable}

    shot = [msg("user", "task : add 2 and 2"), msg("assistant", "answer 4")]  # a few-shot example, not trainable
    convo = [
        msg("system", "you are an agent ."),
        *shot,
        msg("user", "task : add 2 and 3"),
        msg("assistant", "calc 2 + 3", True),
        msg("tool", "result 5"),
        msg("assistant", "answer 5", True),
    ]
    return [
        {
            "format_version": 2,
            "group_index": 0,
            "trajectory_index": 0,
            "reward": 1.0,
            "messages": convo,
            "metrics": json.dumps({"calls": 1}),
            "metadata": None,
            "tools": None,
            "logs": ["ok"],
            "trajectory_json": "{}",
        },
        {
            "format_version": 2,
            "group_index": 0,
            "trajectory_index": 1,
            "reward": 0.0,
            "messages": convo[:5],
            "metrics": None,
            "metadata": None,
            "tools": None,
            "logs": None,
            "trajectory_json": "{}",
        },
        {
            "format_version": 2,
            "group_index": 1,
            "trajectory_index": None,
            "reward": None,
            "messages": None,
            "metrics": None,
            "metadata": None,
            "tools": None,
            "logs": None,
            "trajectory_json": None,
        },
    ]


def test_art_rows(tmp_path, tok):
    d = tmp_path / "trajectories" / "train"
    d.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(art_rows()), d / "0003.parquet")
    b, rep = from_art(d, tokenizer=tok)
    assert b.traj_ids == ["0003/g0/t0", "0003/g0/t1"] and b.group_ids == ["0003/g0", "0003/g0"]
    r = b.row(0)
    # prompt: system, the few-shot user + assistant (not trainable: prompt tokens), the task, <assistant>
    assert r["prompt_ids"] == [
        2,
        7,
        8,
        9,
        10,
        11,
        6,
        3,
        12,
        13,
        14,
        15,
        16,
        15,
        6,
        4,
        25,
        19,
        6,
        3,
        12,
        13,
        14,
        15,
        16,
        17,
        6,
        4,
    ]
    assert r["response_ids"] == [20, 15, 21, 17, 6, 5, 22, 23, 6, 4, 25, 23, 6] and r["num_turns"] == 2
    assert r["reward"] == 1.0 and r["step"] == 3
    assert json.loads(r["extra_json"]) == {"metrics": {"calls": 1}, "logs": ["ok"]}
    assert b.row(1)["num_turns"] == 1 and b.outcome_reward[1] == 0.0
    assert rep.rows_in == 3 and "trajectory_json" in rep.fields_dropped
    assert any("empty-group markers" in k for k in rep.notes)
    pq.write_table(pa.Table.from_pylist([{"group_index": 0, "reward": 1.0}]), tmp_path / "0001.parquet")
    with pytest.raises(TrajectoryError, match=r"0001.parquet: field 'messages': expected art layout"):
        from_art(tmp_path / "0001.parquet", tokenizer=tok)
