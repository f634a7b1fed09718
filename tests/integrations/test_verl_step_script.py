"""tests/integrations/run_verl_step.py, the verl PPO step kept ready for a GPU machine: its overrides
compose with verl 0.9.1's ppo_trainer.yaml and pass verl's own validate_config (what
`python -m verl.trainer.main_ppo` checks before starting Ray), its data loads in verl's RLHFDataset,
and its reward scores the expert's move 1. The step itself needs a GPU (docs/verl.md)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pandas as pd
import verl
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config
from verl.utils.dataset.rl_dataset import RLHFDataset

from mpo_viz.integrations.verl.config import TurnPPOLossConfig, core_default

SCRIPT = Path(__file__).resolve().parent / "run_verl_step.py"


def script():
    spec = importlib.util.spec_from_file_location("run_verl_step", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def composed(mod, work: Path, **kw):
    train, val = mod.write_data(work, n_train=8, n_val=4, seed=0)
    args = dict(model=mod.MODEL, rollout="vllm", device="cuda", n_gpus=1, batch=4, n=2, steps=1, token_clip="2.0")
    d = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=d, version_base=None):
        return compose(config_name="ppo_trainer", overrides=mod.overrides(work, train, val, **{**args, **kw}))


def test_the_overrides_pass_verls_validate_config(tmp_path):
    cfg = composed(script(), tmp_path)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert need_critic(cfg) and cfg.algorithm.adv_estimator == "mpo"
    loss = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
    assert isinstance(loss, TurnPPOLossConfig) and loss.loss_mode == "turn_ppo" and loss.token_clip == 2.0
    assert cfg.algorithm.mpo_viz.run_dir == str(tmp_path / "run")
    bare = omega_conf_to_dataclass(composed(script(), tmp_path, token_clip="null").actor_rollout_ref.actor)
    assert bare.policy_loss.token_clip is None
    assert core_default("turn_ppo", "token_clip") == TurnPPOLossConfig().token_clip


def test_the_data_loads_in_verls_dataset_and_the_reward_scores_the_expert_move(tmp_path):
    mod = script()
    cfg = composed(mod, tmp_path)
    tok = AutoTokenizer.from_pretrained(str(mod.MODEL), local_files_only=True)
    ds = RLHFDataset(data_files=[cfg.data.train_files], tokenizer=tok, config=cfg.data)
    assert len(ds) == 8
    first = pd.read_parquet(cfg.data.train_files).iloc[0]
    assert first["prompt"][1]["content"].startswith("task :")
    ns: dict = {}
    (tmp_path / "reward_fn.py").write_text(mod.REWARD_FN)
    exec((tmp_path / "reward_fn.py").read_text(), ns)
    truth = first["reward_model"]["ground_truth"]
    score = ns["compute_score"]
    assert score("mpo_viz/automation", f"the door needs a key . {truth} <|eot|>", truth) == 1.0
    assert score("mpo_viz/automation", "go north", truth) == (1.0 if truth == "go north" else 0.0)
    assert score("mpo_viz/automation", "no command here", truth) == 0.0


def test_print_only_writes_the_inputs_and_the_command(tmp_path, capsys):
    assert script().main(["--workdir", str(tmp_path), "--print-only"]) == 0
    out = capsys.readouterr().out
    assert "-m verl.trainer.main_ppo" in out and "policy_loss.token_clip=2.0" in out
    assert {p.name for p in tmp_path.iterdir()} >= {"train.parquet", "val.parquet", "reward_fn.py"}


def test_the_summary_reads_a_plugin_run_folder(tmp_path):
    """The script's last part on the shipped run folder (written by the same plugin logger)."""
    import shutil

    import numpy as np

    import mpo_viz as mv

    shipped = SCRIPT.parents[2] / "trajectories" / "verl" / "run"
    shutil.copytree(shipped, tmp_path / "run")
    out = script().summarise(tmp_path)
    last = sorted((shipped / "trajectories").glob("iter=*.parquet"))[-1]
    vals = np.concatenate([np.asarray(v, dtype=float) for v in mv.load(last).field("values")])
    assert out["steps"] == len((shipped / "metrics.jsonl").read_text().splitlines())
    assert out["values"]["file"] == last.name and out["values"]["tokens"] == vals.size
    assert out["values"]["mean"] == vals.mean() and out["values"]["all_finite"]
    assert "values/across" in out["metrics"]
