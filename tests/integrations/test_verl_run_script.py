"""trajectories/verl/make_verl_run.py: its verl layout of a rollout batch is verl's agent-loop layout,
and what the plugin then writes holds the same trajectories (a real rollout of the trainer:
trajectories/trained/automation_early.parquet)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
import verl.trainer.ppo.ray_trainer as rt
from omegaconf import OmegaConf

import mpo_viz as mv
from mpo_viz.advantages import mae

REPO = Path(__file__).resolve().parents[2]


def script():
    spec = importlib.util.spec_from_file_location("make_verl_run", REPO / "trajectories" / "verl" / "make_verl_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rollout_batch():
    return mv.load(REPO / "trajectories" / "trained" / "automation_early.parquet")


def test_layout_is_verls_agent_loop_layout():
    b = rollout_batch()
    data = script().to_dataproto(b, pad_id=0, step=3)
    P = data.batch["prompts"].shape[1]
    att = data.batch["attention_mask"]
    assert data.meta_info["global_steps"] == 3
    for i in range(len(b)):
        p, r = b.field("prompt_ids")[i], b.field("response_ids")[i]
        n = int(att[i, P:].sum())
        assert n == len(r) and int(att[i, :P].sum()) == len(p)
        # prompts left-padded, responses right-padded
        np.testing.assert_array_equal(data.batch["prompts"][i, P - len(p) :].numpy(), p)
        assert int(att[i, : P - len(p)].sum()) == 0 and int(att[i, P + n :].sum()) == 0
        np.testing.assert_array_equal(data.batch["responses"][i, :n].numpy(), r)
        np.testing.assert_array_equal(data.batch["response_mask"][i, :n].numpy(), b.field("loss_mask")[i])
        # the episode's score on the last valid response token, nothing elsewhere
        s = data.batch["token_level_scores"][i]
        assert float(s[n - 1]) == np.float32(b.padded("rewards", torch.float64)[i].sum())
        assert int((s[: n - 1] != 0).sum()) == 0
        np.testing.assert_array_equal(data.batch["values"][i, :n].numpy(), b.field("values")[i])
        np.testing.assert_array_equal(data.batch["old_log_probs"][i, :n].numpy(), b.field("old_logprobs")[i])
    # position ids count the real tokens only, from 0
    pos = data.batch["position_ids"]
    assert int(pos[0][att[0].bool()][0]) == 0 and int(pos[0][att[0].bool()][-1]) == int(att[0].sum()) - 1
    assert list(data.non_tensor_batch["uid"]) == list(b.group_ids)


def test_plugin_writes_the_same_trajectories_and_mpo_advantages(tmp_path):
    mod = script()
    b = rollout_batch()
    run = tmp_path / "run"
    algo = OmegaConf.create(
        {
            "adv_estimator": "mpo",
            "gamma": 1.0,
            "lam": 1.0,
            "norm_adv_by_std_in_grpo": True,
            "mpo": {"beta": 1.0},
            "mpo_viz": {"run_dir": str(run)},
        }
    )
    out = rt.compute_advantage(mod.to_dataproto(b, pad_id=0, step=1), adv_estimator="mpo", num_repeat=1, config=algo)
    got = mv.load(run / "trajectories" / "iter=000001.parquet")
    assert got.traj_ids == b.traj_ids  # request_id
    for f in ("response_ids", "loss_mask", "prompt_ids", "values", "old_logprobs", "rollout_logprobs"):
        for x, y in zip(got.field(f), b.field(f)):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_allclose(got.outcome_reward, b.padded("rewards", torch.float64).sum(1).numpy(), rtol=0, atol=1e-6)
    # the score moved onto the last action token: the same as the rollout's outcome reward placement
    m = b.mask.float()
    want, _ = mae(b.padded("rewards", torch.float32), b.values.float(), m)
    torch.testing.assert_close(got.padded("advantages", torch.float32) * m, want * m, rtol=0, atol=1e-6)
    back = mod.from_dataproto(b, out)
    torch.testing.assert_close(back.padded("advantages", torch.float32), got.padded("advantages", torch.float32))
