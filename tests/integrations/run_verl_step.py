"""One verl PPO step of a real (tiny) model with the mpo_viz plugin: `python -m verl.trainer.main_ppo`.

What it runs: verl 0.9.1's own entry point (Hydra config ``ppo_trainer.yaml``, Ray, the v1 trainer,
actor/critic/reference workers, the rollout server, ``compute_advantage``, the critic and actor
updates) with ``algorithm.adv_estimator=mpo``, ``critic.enable=True``, ``loss_mode=turn_ppo`` (the
token band from ``actor_rollout_ref.actor.policy_loss``) and the plugin's run folder. The model is
the shipped automation start ``trajectories/starts/automation/policy`` (a 1.1M-parameter Llama with
its word-level tokenizer and chat template; nothing is downloaded), as actor, reference and critic.
The prompts are tasks of mpo_viz's automation environment; the reward (``reward_fn.py``, written
into the work folder) is 1 when the reply's command is the expert's first move.

Usage (prints the verl command, runs it, then summarises the run folder)::

    python tests/integrations/run_verl_step.py --workdir /tmp/verl_step              # GPU machine, vLLM
    python tests/integrations/run_verl_step.py --workdir /tmp/verl_step --print-only # the command only

Needs verl 0.9.1 with a rollout backend (``--rollout vllm`` by default; ``sglang`` also) and one
GPU. On a CPU-only machine verl 0.9.1 stops before the first step; docs/verl.md says where.
After the run, ``<workdir>/run`` is the plugin's run folder: ``metrics.jsonl`` (the critic values'
across/within split, each estimator's advantages) and ``trajectories/iter=000001.parquet`` (the
batch with verl's critic ``values``); ``<workdir>/verl.log`` holds verl's console metrics, among
them turn_ppo's ``actor/turn_clipfrac``, ``actor/clipfrac_high``, ``actor/within_turn_shift``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "trajectories" / "starts" / "automation" / "policy"

REWARD_FN = '''"""Reward of the verl step: 1.0 when the reply's command (from its last verb on) is the expert's move."""

VERBS = ("take", "go", "open")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    words = solution_str.replace("<|eot|>", " ").lower().split()
    starts = [i for i, w in enumerate(words) if w in VERBS]
    command = " ".join(words[starts[-1]:]) if starts else ""
    return 1.0 if command == ground_truth else 0.0
'''


def write_data(workdir: Path, n_train: int, n_val: int, seed: int) -> tuple[Path, Path]:
    """Parquet files in verl's RLHFDataset layout: chat ``prompt``, ``data_source``,
    ``reward_model.ground_truth`` (the expert's first move), ``extra_info``."""
    import pandas as pd

    from mpo_viz.envs.automation import AutomationEnv
    from mpo_viz.envs.base import SYSTEM_PROMPT

    env = AutomationEnv()
    rng = random.Random(seed)

    def rows(n, split):
        out = []
        for i in range(n):
            task = env.sample_task(rng, rng.choice((3, 4)))
            out.append(
                {
                    "data_source": "mpo_viz/automation",
                    "prompt": [
                        {"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": env.prompt(task)},
                    ],
                    "ability": "agent",
                    "reward_model": {"style": "rule", "ground_truth": env.expert_action(task, env.initial_state(task))},
                    "extra_info": {"split": split, "index": i},
                }
            )
        return pd.DataFrame(out)

    train, val = workdir / "train.parquet", workdir / "val.parquet"
    rows(n_train, "train").to_parquet(train)
    rows(n_val, "val").to_parquet(val)
    return train, val


def overrides(
    workdir: Path,
    train: Path,
    val: Path,
    *,
    model: Path,
    rollout: str,
    device: str,
    n_gpus: int,
    batch: int,
    n: int,
    steps: int,
    token_clip: str,
) -> list[str]:
    """The Hydra overrides of the step: the recipe of docs/verl.md plus the smallest sizes."""
    return [
        # the plugin: estimator, critic, loss and its options, run folder
        "algorithm.adv_estimator=mpo",
        "critic.enable=True",
        "actor_rollout_ref.model.external_lib=mpo_viz.integrations.verl",
        "actor_rollout_ref.actor.policy_loss._target_=mpo_viz.integrations.verl.config.TurnPPOLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=turn_ppo",
        f"+actor_rollout_ref.actor.policy_loss.token_clip={token_clip}",
        f"+algorithm.mpo_viz.run_dir={workdir / 'run'}",
        # data
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"data.train_batch_size={batch}",
        "data.max_prompt_length=128",
        "data.max_response_length=32",
        "data.filter_overlong_prompts=False",
        # model: the tiny Llama as actor, reference and critic
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={model}",
        f"critic.model.tokenizer_path={model}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "critic.model.use_remove_padding=False",
        "actor_rollout_ref.actor.use_torch_compile=False",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "critic.optim.lr=1e-3",
        f"critic.ppo_mini_batch_size={batch}",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        # rollout
        f"actor_rollout_ref.rollout.name={rollout}",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.max_num_batched_tokens=512",
        "actor_rollout_ref.rollout.enforce_eager=True",
        # reward
        f"reward.custom_reward_function.path={workdir / 'reward_fn.py'}",
        "reward.custom_reward_function.name=compute_score",
        # trainer
        f"trainer.device={device}",
        f"trainer.n_gpus_per_node={n_gpus}",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={workdir / 'checkpoints'}",
        "trainer.project_name=mpo_viz",
        "trainer.experiment_name=verl_step",
        # Ray: logical CPUs for verl's actors (TaskRunner, transfer-queue controller and storage,
        # workers, rollout servers, reward loop); few storage units for a step this small
        "ray_kwargs.ray_init.num_cpus=16",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]


def summarise(workdir: Path) -> dict:
    """What the run folder holds: the critic values that arrived and the plugin's metrics."""
    import numpy as np

    import mpo_viz as mv

    run = workdir / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    out = {"steps": len(rows), "metrics": rows[-1]}
    files = sorted((run / "trajectories").glob("iter=*.parquet"))
    if files:
        b = mv.load(files[-1])
        vals = np.concatenate([np.asarray(v, dtype=float) for v in b.field("values")])
        out["values"] = {
            "file": files[-1].name,
            "trajectories": len(b),
            "tokens": int(vals.size),
            "mean": float(vals.mean()),
            "std": float(vals.std()),
            "all_finite": bool(np.isfinite(vals).all()),
        }
    log = workdir / "verl.log"
    if log.exists():
        keys = (
            "actor/turn_clipfrac",
            "actor/clipfrac_high",
            "actor/clipfrac_low",
            "actor/within_turn_shift",
            "actor/pg_clipfrac",
            "actor/ratio_max",
            "actor/turn_ratio_max",
            "critic/vf_loss",
            "critic/values/mean",
        )
        out["verl_console"] = [line for line in log.read_text().splitlines() if any(k in line for k in keys)][-5:]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, required=True, help="folder for data, reward, logs, run folder")
    ap.add_argument("--rollout", default="vllm", help="verl rollout backend: vllm (default), sglang")
    ap.add_argument("--device", default="cuda", help="trainer.device (verl 0.9.1: cuda or npu)")
    ap.add_argument("--n-gpus", type=int, default=1, help="trainer.n_gpus_per_node")
    ap.add_argument("--batch", type=int, default=4, help="prompts per step (data.train_batch_size)")
    ap.add_argument("--n", type=int, default=2, help="responses per prompt (rollout.n)")
    ap.add_argument("--steps", type=int, default=1, help="trainer.total_training_steps")
    ap.add_argument("--token-clip", default="2.0", help="policy_loss.token_clip (a number > 1 or null)")
    ap.add_argument("--model", type=Path, default=MODEL, help="HF model folder (default: the shipped start)")
    ap.add_argument("--print-only", action="store_true", help="write the data, print the command, do not run")
    ap.add_argument("extra", nargs="*", help="more Hydra overrides, passed on to verl")
    a = ap.parse_args(argv)

    work = a.workdir.resolve()
    if (work / "run").exists():
        shutil.rmtree(work / "run")
    work.mkdir(parents=True, exist_ok=True)
    (work / "reward_fn.py").write_text(REWARD_FN)
    train, val = write_data(work, n_train=max(a.batch * a.steps, 8), n_val=4, seed=0)
    cmd = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        *overrides(
            work,
            train,
            val,
            model=a.model.resolve(),
            rollout=a.rollout,
            device=a.device,
            n_gpus=a.n_gpus,
            batch=a.batch,
            n=a.n,
            steps=a.steps,
            token_clip=a.token_clip,
        ),
        *a.extra,
    ]
    print(" \\\n    ".join([shlex.join(cmd[:3]), *(shlex.quote(c) for c in cmd[3:])]), flush=True)
    if a.print_only:
        return 0
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    with open(work / "verl.log", "w") as log:
        rc = subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    print(f"verl exited with {rc}; its output: {work / 'verl.log'}")
    if rc != 0:
        print("\n".join((work / "verl.log").read_text().splitlines()[-30:]))
        return rc
    print(json.dumps(summarise(work), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
