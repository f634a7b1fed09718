"""Write trajectories/verl/run/: a run folder written by the verl plugin's own run logger, from real
rollouts of a tiny model, with the advantages computed by verl's ``compute_advantage`` through the
plugin. Run it in the verl environment (``make venv-verl``), from the repository root:

    .venv-verl/bin/python trajectories/verl/make_verl_run.py

What it does (everything on CPU, about 5 minutes of CPU time; 17 minutes of wall time on a shared
2-core machine at load average 6.5):

1. mpo_viz's trainer (``mpo_viz.train``, config :data:`CONFIG`): a 1M-parameter Llama policy and a
   critic on ``automation`` with a progress reward (``shaping`` 0.1 per turn that moves on, 1 for
   opening the door), an SFT warm start on the noisy scripted expert and a critic warm-up.
2. :data:`ITERATIONS` times, the shape of one step of verl's PPO loop:

   a. a rollout of the current policy (``mpo_viz.rollout``: 16 episodes, 4 tasks x 4 samples), with
      the critic's values and the policy's log-probs;
   b. the batch laid out as verl's agent loop hands it to the trainer (:func:`to_dataproto`): a real
      ``verl.DataProto`` with ``prompts`` (left-padded), ``responses`` (right-padded),
      ``attention_mask``, ``position_ids``, ``response_mask`` (1 on the model's tokens, 0 on tool
      replies and padding), the outcome score on the last valid response token, ``values``,
      ``old_log_probs``, ``rollout_log_probs``, ``uid`` and ``global_steps``;
   c. verl's own ``verl.trainer.ppo.ray_trainer.compute_advantage`` with the algorithm config that
      Hydra composes from verl's ``ppo_trainer.yaml`` and the overrides of docs/verl.md
      (:data:`OVERRIDES`): the plugin's wrapper computes the ``mpo`` advantages with the critic's
      values, and its run logger appends the step to the run folder (``algorithm.mpo_viz.run_dir``);
   d. the update, as the trainer's (``mpo_viz.train.update.update_epochs``) on the advantages and
      returns verl holds after step c: ``epochs`` passes of the policy with the ``turn_ppo`` loss at
      the settings of the composed verl actor config (clip, dual clip, aggregation, and the token
      band ``token_clip`` that the plugin reads from ``policy_loss``), then ``critic_epochs`` passes
      of the critic's value loss.

What is not verl here: the rollout (mpo_viz's, not vLLM/SGLang), the actor and critic updates (the
trainer's, not verl's FSDP workers) and Ray. What is verl: the ``DataProto``, the config, the
advantage step, and the plugin code that writes the folder.

``made_with.json`` beside the run folder records the settings, the trainer config's hash, the package
versions and per-step rollout success. The run is deterministic on CPU for a given code version.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
COMMAND = ".venv-verl/bin/python trajectories/verl/make_verl_run.py"

#: the trainer settings of the SFT warm start, critic warm-up and updates
#: (every SFT and critic setting given: they were the trainer's defaults or chosen here, and a later
#: change of a default must not change what this script makes). The critic warm-up is smaller than
#: the trainer's default (a pool of 128 episodes, at most 32 steps, instead of 512 and 256) to keep
#: the script at about 5 minutes of CPU; the critic gets its own critic_epochs passes per step, as in the
#: trainer.
CONFIG = dict(
    env="automation",
    env_options={"shaping": 0.1},
    model_size="1m",
    episodes=16,
    group_size=4,
    epochs=2,
    minibatches=2,
    max_turn_tokens=48,
    max_total_tokens=384,
    sft_steps=120,
    sft_lr=1e-3,
    sft_eval_interval=40,
    sft_target_success=0.5,
    sft_noise=0.3,
    sft_batch_episodes=16,
    eval_episodes=16,
    eval_seed=0,
    critic="learned",
    critic_init="policy",
    critic_lr=1e-3,
    value_clip=0.5,
    critic_epochs=4,
    critic_warmup_episodes=128,
    critic_warmup_steps=32,
    critic_warmup_ev=0.2,
    critic_warmup_lr=1e-3,
    estimator="mpo",
    loss="turn_ppo",
    seed=0,
    num_threads=1,
)
#: turn_ppo's token band in the update, set in verl's config (the plugin's TurnPPOLossConfig) rather
#: than left to the plugin's default
TOKEN_CLIP = 2.0
#: logged verl steps
ITERATIONS = 12
#: the recipe of docs/verl.md (the run folder is added by main())
OVERRIDES = [
    "algorithm.adv_estimator=mpo",
    "critic.enable=True",
    "actor_rollout_ref.actor.policy_loss.loss_mode=turn_ppo",
    "actor_rollout_ref.model.external_lib=mpo_viz.integrations.verl",
    "+algorithm.mpo.beta=1.0",
    "+algorithm.mpo.turn_lam=0.9",
    "actor_rollout_ref.actor.policy_loss._target_=mpo_viz.integrations.verl.config.TurnPPOLossConfig",
    f"+actor_rollout_ref.actor.policy_loss.token_clip={TOKEN_CLIP}",
]
#: what verl's actor config refuses to be without (any value; no verl worker runs here)
VERL_REQUIRED = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]


def to_dataproto(batch, pad_id: int, step: int):
    """A rolled-out :class:`~mpo_viz.trajectory.TrajectoryBatch` as the ``DataProto`` verl's agent loop
    hands to the trainer (``verl/experimental/agent_loop/agent_loop.py``): prompts left-padded to P,
    responses right-padded to R, the outcome score on the last valid response token (verl's reward
    manager: a tool token when the episode ended on a tool reply), zeros on padding."""
    from verl import DataProto

    prompts, resps = batch.field("prompt_ids"), batch.field("response_ids")
    B = len(batch)
    P, R = max(len(p) for p in prompts), max(len(r) for r in resps)
    ids = np.full((B, P + R), pad_id, dtype=np.int64)
    att = np.zeros((B, P + R), dtype=np.int64)
    rmask = np.zeros((B, R), dtype=np.int64)
    scores = np.zeros((B, R), dtype=np.float32)
    per_token = {k: np.zeros((B, R), dtype=np.float32) for k in ("values", "old_log_probs", "rollout_log_probs")}
    source = {
        "values": batch.field("values"),
        "old_log_probs": batch.field("old_logprobs"),
        "rollout_log_probs": batch.field("rollout_logprobs"),
    }
    score = batch.padded("rewards", torch.float64).sum(1).numpy()
    for i, (p, r) in enumerate(zip(prompts, resps)):
        ids[i, P - len(p) : P] = p
        att[i, P - len(p) : P] = 1
        ids[i, P : P + len(r)] = r
        att[i, P : P + len(r)] = 1
        rmask[i, : len(r)] = batch.field("loss_mask")[i]
        scores[i, len(r) - 1] = score[i]
        for k, v in source.items():
            per_token[k][i, : len(r)] = v[i]
    pos = np.clip(np.cumsum(att, axis=1) - 1, 0, None)
    tensors = {
        "prompts": ids[:, :P],
        "responses": ids[:, P:],
        "input_ids": ids,
        "attention_mask": att,
        "position_ids": pos,
        "response_mask": rmask,
        "token_level_scores": scores,
        "token_level_rewards": scores.copy(),
        **per_token,
    }
    return DataProto.from_dict(
        tensors={k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()},
        non_tensors={
            "uid": np.array(list(batch.group_ids), dtype=object),
            "request_id": np.array(list(batch.traj_ids), dtype=object),
        },
        meta_info={"global_steps": step},
    )


def from_dataproto(batch, data):
    """The advantages and returns verl holds after ``compute_advantage``, back on the batch's rows."""
    lengths = [len(r) for r in batch.field("response_ids")]
    adv = data.batch["advantages"].float().numpy()
    ret = data.batch["returns"].float().numpy()
    L = max(lengths)
    a, g = np.zeros((len(lengths), L), np.float32), np.zeros((len(lengths), L), np.float32)
    for i, n in enumerate(lengths):
        a[i, :n], g[i, :n] = adv[i, :n], ret[i, :n]
    return batch.with_token_fields(advantages=a, returns=g)


def composed_config(run_dir: Path):
    """verl's ``ppo_trainer.yaml`` with :data:`OVERRIDES` and the run folder, through Hydra."""
    import verl
    from hydra import compose, initialize_config_dir

    d = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=d, version_base=None):
        return compose(
            config_name="ppo_trainer", overrides=[*OVERRIDES, *VERL_REQUIRED, f"+algorithm.mpo_viz.run_dir={run_dir}"]
        )


def make(out: Path) -> dict:
    import verl
    import verl.trainer.ppo.ray_trainer as rt
    from verl.utils.config import omega_conf_to_dataclass

    import mpo_viz
    from mpo_viz.integrations.verl.config import FROM_VERL
    from mpo_viz.integrations.verl.config import loss_options as loss_options_of
    from mpo_viz.rollout import rollout
    from mpo_viz.train import Config, Trainer
    from mpo_viz.train.loop import episode_stats
    from mpo_viz.train.runtime import derive_seed
    from mpo_viz.train.update import Learners, UpdateSettings, rows_of, update_epochs

    if out.exists():
        shutil.rmtree(out)
    cfg = Config(**CONFIG)
    verl_cfg = composed_config(Path(os.path.relpath(out)))  # relative: config.json names no machine path
    actor = omega_conf_to_dataclass(verl_cfg.actor_rollout_ref.actor)
    turn = loss_options_of(actor.policy_loss, cfg.loss)  # what the plugin's loss reads in a verl run
    loss_options = {
        "clip_low": actor.clip_ratio_low,
        "clip_high": actor.clip_ratio_high,
        "dual_clip": actor.clip_ratio_c if turn["dual_clip"] == FROM_VERL else turn["dual_clip"],
        "token_clip": turn["token_clip"],
        "ratio": turn["ratio"],
        "agg": actor.loss_agg_mode,
    }
    common = UpdateSettings.of(cfg, value_clip=cfg.critic_option("value_clip"))
    policy_settings = dataclasses.replace(common, loss_options=loss_options)
    critic_settings = dataclasses.replace(common, epochs=cfg.critic_option("critic_epochs"))
    algo = verl_cfg.algorithm
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mpo_viz_verl_run_") as work:
        tr = Trainer(cfg, Path(work) / "trainer", quiet=False)
        sft = tr.sft()
        warm = tr.warmup_critic()
        steps = []
        for step in range(1, ITERATIONS + 1):
            batch = rollout(
                tr.policy,
                tr.env,
                cfg.episodes,
                group_size=cfg.group_size,
                critic=tr.critic,
                seed=derive_seed(cfg.seed, "verl", step),
                max_turn_tokens=cfg.max_turn_tokens,
                max_total_tokens=cfg.max_total_tokens,
                batch_size=cfg.rollout_batch_size,
                progress=False,
            )
            data = to_dataproto(batch, tr.pad_id, step)
            data = rt.compute_advantage(
                data,
                adv_estimator=algo.adv_estimator,
                gamma=algo.gamma,
                lam=algo.lam,
                num_repeat=1,
                norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
                config=algo,
            )
            r = rows_of(from_dataproto(batch, data))
            where = dict(generator=tr.generator, pad_id=tr.pad_id, device=tr.device)
            upd = update_epochs(r, Learners(tr.policy.model, tr.policy_opt), policy_settings, **where)
            crit = update_epochs(r, Learners(critic=tr.critic, critic_opt=tr.critic_opt), critic_settings, **where)
            ep = episode_stats(batch)
            steps.append(
                {
                    "step": step,
                    "success": ep["success"],
                    "score_mean": ep["reward_mean"],
                    "turn_limit_frac": ep["truncated_frac"],
                    "policy_loss": upd.get("policy_loss"),
                    "value_loss": crit.get("value_loss"),
                    "approx_kl": upd.get("approx_kl"),
                }
            )
            print(
                f"step {step}: success {ep['success']:.3f}, score {ep['reward_mean']:.3f}, policy loss "
                f"{upd.get('policy_loss', float('nan')):+.4f}, value loss {crit.get('value_loss', float('nan')):.4f}",
                file=sys.stderr,
                flush=True,
            )
    return {
        "command": COMMAND,
        "what": "verl's compute_advantage with the mpo_viz plugin (adv_estimator=mpo) and its run logger, on "
        "DataProto batches of real rollouts of mpo_viz's trainer; updates by mpo_viz's trainer",
        "trainer_config": cfg.to_dict(),
        "trainer_config_hash": cfg.hash(),
        "verl_overrides": OVERRIDES + VERL_REQUIRED,
        "iterations": ITERATIONS,
        "update_loss_options": loss_options,
        "sft": {k: sft.get(k) for k in ("sft_steps", "sft_success", "sft_expert_success")},
        "critic_warmup": {
            k: warm.get(k) for k in ("warmup_episodes", "warmup_steps", "warmup_explained_var", "warmup_stop")
        },
        "steps": steps,
        "versions": {"verl": verl.__version__, "torch": torch.__version__, "mpo_viz": mpo_viz.__version__},
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    out = Path(argv[0]) if argv else HERE
    made = make(out / "run")
    (out / "made_with.json").write_text(json.dumps(made, indent=1) + "\n")
    files = [p for p in sorted((out / "run").rglob("*")) if p.is_file()]
    for p in files:
        print(f"{p.relative_to(out)}  {p.stat().st_size / 1e3:.0f} kB")
    print(f"total {sum(p.stat().st_size for p in files) / 1e6:.2f} MB in {made['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
