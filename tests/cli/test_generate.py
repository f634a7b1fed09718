"""`mpo-viz generate --policy model`: a fresh tiny model, saved and reloaded, and errors that name the flag."""

import json

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz.cli import main

FAST = ["--env", "search", "--difficulty", "2", "--group-size", "2", "--episodes", "4", "--max-turn-tokens", "5"]


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def test_fresh_model_saved_and_reloaded_gives_the_same_file(tmp_path, capsys):
    a, b = tmp_path / "a.parquet", tmp_path / "b.jsonl"
    assert main(["generate", *FAST, "--save-model", str(tmp_path / "m"), "--out", str(a)]) == 0
    out = capsys.readouterr().out
    # a fresh critic's values are labelled untrained; the same critic saved and loaded back counts as a critic
    assert "wrote 4 trajectories (2 tasks x 2)" in out and "values_source=untrained_critic" in out
    assert "note: the critic's value head is untrained" in out
    assert (tmp_path / "m/policy/config.json").is_file() and (tmp_path / "m/critic/model.safetensors").is_file()
    assert main(["generate", *FAST, "--model", str(tmp_path / "m"), "--out", str(b)]) == 0
    ba, bb = mv.load(a), mv.load(b)
    assert ba.meta["values_source"] == "untrained_critic" and bb.meta["values_source"] == "critic"
    assert "--save-model" in ba.meta["command"]
    assert ba.traj_ids == bb.traj_ids
    for i in range(len(ba)):
        ra, rb = ba.row(i), bb.row(i)
        assert ra["response_ids"] == rb["response_ids"]
        np.testing.assert_array_equal(ra["values"], rb["values"])
        np.testing.assert_array_equal(ra["old_logprobs"], rb["old_logprobs"])
        np.testing.assert_array_equal(ra["entropy"], rb["entropy"])
        act = np.asarray(ra["loss_mask"]) != 0
        ent = np.asarray(ra["entropy"])
        assert (ent[act] > 0).all() and (ent[~act] == 0).all()  # the policy's entropy on its own tokens
        assert len(ra["oracle_values"]) == len(ra["response_ids"])
        assert json.loads(ra["messages_json"])[-2]["role"] == "assistant"


@pytest.mark.parametrize(
    "argv, msg",
    [
        (
            ["--policy", "expert", "--model", "m"],
            "--model: expected only with --policy model, found it with --policy expert",
        ),
        (["--temperature", "0.5"], "--temperature: expected only with --policy model"),
        (["--policy", "model", "--value-noise", "0.1"], "--value-noise: expected only with --policy expert"),
        (["--policy", "model", "--top-p", "0"], r"--top-p: expected a number in (0, 1], found 0.0"),
        (["--policy", "model", "--max-total-tokens", "9"], "--max-total-tokens: expected more than the prompt"),
        (["--model", "nowhere"], "--model: nowhere: expected a model folder"),
    ],
)
def test_errors_name_the_flag(tmp_path, capsys, argv, msg):
    argv = [a.replace("nowhere", str(tmp_path / "nowhere")) for a in argv]
    assert main(["generate", *FAST, *argv, "--out", str(tmp_path / "x.parquet")]) == 1
    err = capsys.readouterr().err
    assert msg.replace("nowhere", str(tmp_path / "nowhere")) in err
    assert not (tmp_path / "x.parquet").exists()


def test_model_of_another_environment_is_refused(tmp_path, capsys):
    assert main(["generate", *FAST, "--save-model", str(tmp_path / "m"), "--out", str(tmp_path / "a.parquet")]) == 0
    capsys.readouterr()
    argv = [
        "generate",
        "--env",
        "tooluse",
        "--model",
        str(tmp_path / "m"),
        "--episodes",
        "2",
        "--group-size",
        "1",
        "--out",
        str(tmp_path / "b.parquet"),
    ]
    assert main(argv) == 1
    assert "--model: policy " in capsys.readouterr().err
