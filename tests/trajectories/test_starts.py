"""trajectories/starts/: the shipped SFT start loads as float32 from float16 weights, reads the
automation environment's words, plays what its record says, and ``make_start.py`` rounds and
records a start the way its docstring says."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from mpo_viz import models
from mpo_viz.envs.registry import make_env
from mpo_viz.rollout import rollout

ROOT = Path(__file__).resolve().parents[2]
START = ROOT / "trajectories" / "starts" / "automation"


def _make_start():
    spec = importlib.util.spec_from_file_location("make_start", ROOT / "trajectories" / "starts" / "make_start.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stored_dtypes(path: Path) -> set[str]:
    """The dtypes the file stores (``"F16"``, ``"F32"``), read from its header without loading."""
    with safe_open(str(path), framework="pt") as f:
        return {f.get_slice(k).get_dtype() for k in f.keys()}


def test_record_and_size():
    rec = json.loads((START / "start.json").read_text())
    assert rec["sft_config_hash"] and rec["sft_steps"] == 1450 and rec["stored_as"] == "float16"
    assert _stored_dtypes(START / "policy" / "model.safetensors") == {"F16"}
    total = sum(p.stat().st_size for p in START.rglob("*") if p.is_file())
    assert total < 2.5 * 2**20, total
    assert not (START / "critic").exists()  # runs warm up their own critic


def test_loads_as_float32_and_plays_one_room_tasks():
    policy, critic = models.load(START)
    assert critic is None and policy.dtype == torch.float32
    env = make_env("automation", difficulty=3)
    models.check_vocabulary(policy.tokenizer, env.vocabulary(), where="the shipped start")
    # greedy on 8 one-room tasks: the start copies the key's colour and the direction (0.99 of 128
    # tasks when measured); slips (p = 0.1) can cost a task, more than two failures would not be it
    b = rollout(policy, env, 8, seed=0, temperature=0.0, progress=False, oracle=None)
    assert float(np.sum(b.field("reward"))) >= 6, b.field("reward")


def test_make_start_rounds_to_float16_and_keeps_the_record(tmp_path):
    env = make_env("automation", difficulty=3)
    from mpo_viz.envs.tokenizer import build_tokenizer

    src = tmp_path / "start"
    policy = models.tiny_policy(build_tokenizer(env), size="1m", seed=3)
    models.save(src / "model", policy)
    (src / "start.json").write_text(
        json.dumps({"sft": {"sft_steps": 7, "sft_success": 0.25, "sft_expert_success": 0.5}, "sft_config_hash": "abc"})
    )
    out = tmp_path / "out"
    written = _make_start().write_start(src, out)
    assert out / "policy" / "model.safetensors" in written
    assert _stored_dtypes(out / "policy" / "model.safetensors") == {"F16"}
    rec = json.loads((out / "start.json").read_text())
    assert (rec["sft_steps"], rec["sft_success"], rec["sft_config_hash"]) == (7, 0.25, "abc")
    back, _ = models.load(out)
    for (name, a), (_, b) in zip(policy.model.state_dict().items(), back.model.state_dict().items()):
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, a.half().float(), rtol=0, atol=0, msg=name)


def test_make_start_records_every_stage_it_continued(tmp_path):
    env = make_env("automation", difficulty=3)
    from mpo_viz.envs.tokenizer import build_tokenizer

    stages = []
    for i, (steps, success) in enumerate([(30, 0.1), (4, 0.2), (12, 0.5)]):
        src = tmp_path / f"stage{i}"
        models.save(src, models.tiny_policy(build_tokenizer(env), size="1m", seed=i))  # a trainer's RUN/start
        (src / "start.json").write_text(
            json.dumps(
                {
                    "sft": {"sft_steps": steps, "sft_success": success, "sft_expert_success": 0.5},
                    "sft_config_hash": f"h{i}",
                }
            )
        )
        stages.append(src)
    out = tmp_path / "out"
    _make_start().write_start(stages[-1], out, after=stages[:-1])
    rec = json.loads((out / "start.json").read_text())
    assert rec["sft_steps"] == 46 and rec["sft_success"] == 0.5 and rec["sft_config_hash"] == "h2"
    assert [(s["sft_steps"], s["sft_config_hash"]) for s in rec["stages"]] == [(30, "h0"), (4, "h1"), (12, "h2")]
    last, _ = models.load(stages[-1])
    back, _ = models.load(out)
    w = next(iter(last.model.state_dict()))
    torch.testing.assert_close(back.model.state_dict()[w], last.model.state_dict()[w].half().float(), rtol=0, atol=0)
    (stages[0] / "start.json").unlink()
    with pytest.raises(FileNotFoundError, match="stage0.*start.json"):
        _make_start().write_start(stages[-1], out, after=stages[:-1])


def test_the_5_6_turn_start_records_its_three_stages_and_loads():
    d56 = START.parent / "automation-d5-6"
    rec = json.loads((d56 / "start.json").read_text())
    assert [s["sft_steps"] for s in rec["stages"]] == [3000, 400, 1200] and rec["sft_steps"] == 4600
    assert rec["sft_success"] == rec["stages"][-1]["sft_success"] and rec["stored_as"] == "float16"
    assert _stored_dtypes(d56 / "policy" / "model.safetensors") == {"F16"}
    assert sum(p.stat().st_size for p in d56.rglob("*") if p.is_file()) < 2.5 * 2**20
    policy, critic = models.load(d56)
    assert critic is None and policy.dtype == torch.float32
    models.check_vocabulary(policy.tokenizer, make_env("automation", difficulty=5).vocabulary(), where="the 5-6 start")
