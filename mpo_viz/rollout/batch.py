"""Finished episodes to a trajectory/v1 batch (see :mod:`mpo_viz.rollout`)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.rollout.plan import ORACLE_TOKEN_FIELDS, RolloutConfig


def per_turn_rewards(shaping, reward_lists) -> bool:
    """Whether a batch records ``turn_rewards`` (and ``reward`` NaN): with shaping, or when a reward
    came on a turn before the last (an environment of your own that pays along the way); otherwise
    each episode's rewards sum into its outcome ``reward``."""
    return bool(shaping) or any(any(r != 0 for r in rs[:-1]) for rs in reward_lists)


def to_batch(episodes, env, layout, cfg: RolloutConfig, values, boot, oracle, policy) -> TrajectoryBatch:
    shaped = per_turn_rewards(env.shaping, [ep.rewards for ep in episodes])
    rows: list[dict] = []
    extra: dict[str, list] = {name: [] for name in ORACLE_TOKEN_FIELDS}
    has_oracle = oracle is not None and all(ep.oracle is not None for ep in episodes)
    env_id = env.env_id or env.name
    for ep in episodes:
        gid = f"{env.name}-s{cfg.seed}-t{ep.group:04d}"
        truncated = ep.stop_reason in ("turn_limit", "max_total_tokens")
        info = {
            "env": env_id,
            "task_seed": ep.task_seed,
            "seed": ep.seed,
            "success": ep.success,
            "needed_turns": env.needed_turns(ep.env.task),
            "turn_limit": ep.env.turn_limit,
        }
        if has_oracle:
            info["oracle"] = {k: ([round(x, 9) for x in v] if k != "turn_actions" else v) for k, v in ep.o_turn.items()}
        row = {
            "traj_id": f"{gid}-{ep.sample}",
            "group_id": gid,
            "sample_idx": ep.sample,
            "prompt_ids": ep.prompt,
            "response_ids": ep.ids,
            "loss_mask": ep.mask,
            "turn_ids": ep.turn_ids,
            "rollout_logprobs": np.asarray(ep.roll_lp, dtype=np.float32),
            "old_logprobs": np.asarray(ep.old_lp, dtype=np.float32),
            "entropy": np.asarray(ep.entropy, dtype=np.float32),
            "response_tokens": layout.tokens(ep.ids),
            "messages_json": json.dumps(ep.env.messages),
            "reward": float("nan") if shaped else float(sum(ep.rewards)),
            "num_turns": len(ep.rewards),
            "stop_reason": ep.stop_reason,
            "truncated": truncated,
            "extra_json": json.dumps(info),
        }
        if shaped:
            row["turn_rewards"] = ep.rewards
        if values is not None:
            row["values"] = values[ep.index]
            row["bootstrap_value"] = boot[ep.index] if ep.stop_reason == "max_total_tokens" else float("nan")
        if has_oracle:
            extra["oracle_values"].append(np.asarray(ep.o_values, dtype=np.float32))
            extra["oracle_token_adv"].append(np.asarray(ep.o_adv, dtype=np.float32))
            extra["decisive"].append(np.asarray(ep.o_dec, dtype=np.float32))
        rows.append(row)
    meta = {
        "tokenizer": policy.path or f"mpo_viz.envs.build_tokenizer({env_id!r})",
        "source_framework": "mpo_viz.rollout",
        "policy": policy.name,
        "generator": {
            "env": env_id,
            "env_options": env.option_values(),
            **dataclasses.asdict(cfg),
            "oracle_noise": oracle.noise if oracle is not None else None,
        },
    }
    if values is not None:
        meta["values_source"] = "critic"
    batch = TrajectoryBatch.from_rows(rows, meta=meta)
    return batch.with_token_fields(**extra) if has_oracle else batch
