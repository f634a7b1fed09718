"""One RL iteration of the trainer, phase by phase: rollout, values, advantages, updates, evaluation, files.

The phases (:func:`one_iteration`), in order::

    rollout N episodes (G per task)          mpo_viz.rollout.rollout  -> values, log-probs, rewards
    Monte-Carlo values (critic="mc")         mpo_viz.rollout.truth.mc_truth: branch rollouts per turn start
    reference log-probs (kl_coef > 0)        one no-grad forward of the frozen reference policy
    advantages and returns                   mpo_viz.advantages.compute(batch, estimator, **options)
    E epochs × M minibatches of updates      mpo_viz.train.update (policy_loss, value_loss)
    what the update did (saved iterations)   one no-grad forward: per-token ratio and clip flags
    greedy evaluation (every eval_interval)  mpo_viz.train.evaluate: a fixed held-out set of tasks
    trajectories/iter=N.parquet, metrics.jsonl line, checkpoints/iter=N/ (mpo_viz.train.checkpoint)

Each phase is timed by one :class:`~mpo_viz.timer.Timer`, whose seconds are the line's ``timings``.
The functions take the trainer ``tr`` (a :class:`~mpo_viz.train.loop.Trainer`: its config, models,
optimizers, RNG state and run folder; typed ``Any`` here, as the trainer imports this module) and
are its RL step; the trainer keeps construction, SFT, the critic warm-up, checkpoints and the console.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mpo_viz.advantages import compute
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.timer import Timer
from mpo_viz.train.config import Config
from mpo_viz.train.evaluate import episode_stats, value_stats
from mpo_viz.train.runtime import mc_values
from mpo_viz.train.update import (
    Learners,
    UpdateSettings,
    after_update,
    check_loss_inputs,
    reference_logprobs,
    rows_of,
    update_with_critic,
)

__all__ = ["one_iteration", "collect", "update", "seen_by_update", "write", "saves", "oracle_as_values"]


def one_iteration(tr: Any) -> dict:
    cfg = tr.cfg
    it = tr.iteration + 1
    timer = Timer()  # its phases are the line's timings (in the order they end)
    if cfg.kl_coef > 0 and tr.reference is None:
        tr.reference = tr.frozen_copy()  # the policy as RL starts
    batch = collect(tr, timer)
    rollout_tokens = int(batch.mask.sum())

    with timer.phase("advantages"):
        res = compute(batch, cfg.estimator, **cfg.estimator_options)
        batch = res.attach(batch)
        target = res.returns  # what the value loss trains the critic on (value_target)
        if cfg.learns_critic and cfg.critic_option("value_target") == "mc":
            target = tr.mc_targets(batch)
            batch = batch.with_token_fields(returns=target)

    rec = {"iteration": it, "phase": "rl", **episode_stats(batch)}
    if cfg.learns_critic:
        rec["value_target"] = cfg.critic_option("value_target")
    rec.update(value_stats(batch, target, learned=cfg.critic == "learned"))

    # policy_lag: train on the rollout of policy_lag iterations ago (none yet: no update)
    tr.lagged.append(batch)
    train_batch = tr.lagged.pop(0) if len(tr.lagged) > cfg.policy_lag else None
    check_loss_inputs(train_batch if train_batch is not None else batch, cfg.loss)

    with timer.phase("update"):
        upd = update(tr, train_batch) if train_batch is not None else {}
    rec.update(upd)
    if train_batch is batch and saves(cfg, it):
        with timer.phase("after_update"):
            batch = seen_by_update(tr, batch)

    with timer.phase("eval"):
        if cfg.eval_interval and it % cfg.eval_interval == 0:
            rec.update(tr.evaluate())
    with timer.phase("write"):
        write(tr, rec, batch, res.options)
    tr.flag_collapse(rec)
    timings = timer.t
    timings["total"] = timer.elapsed()
    tr.state["iteration"] = it
    tr.state["elapsed_s"] += timings["total"]
    rec["time_s"] = tr.state["elapsed_s"]
    rec["timings"] = timings
    rec["throughput"] = {
        "rollout_tokens_per_sec": rollout_tokens / timings["rollout"] if timings["rollout"] > 0 else math.nan,
        "update_tokens_per_sec": upd.get("update_tokens", 0) / timings["update"] if timings["update"] > 0 else math.nan,
    }
    tr.run.append_metrics(rec)
    with timer.phase("checkpoint"):  # after the line is written: the yielded record's own
        tr.checkpoint()
    tr.history.append(rec)
    return rec


def collect(tr: Any, timer: Timer) -> TrajectoryBatch:
    """The iteration's rollout, with the values the estimator reads (the critic's, or the oracle's)
    and the reference's log-probs (``kl_coef > 0``); ``timer`` gets ``rollout``,
    ``rollout_oracle``, ``mc`` (``critic="mc"``) and ``values``."""
    cfg = tr.cfg
    inner: dict = {}
    with timer.phase("rollout"):
        batch = tr.rollout_episodes(cfg.episodes, seed=tr.next_seed(), group_size=cfg.group_size, timings=inner)
        if cfg.critic == "expert":
            batch = oracle_as_values(batch, cfg.env)
    # the rollout runs the critic once over the finished episodes: that is the "values" phase
    critic_s = float(inner.get("critic", 0.0))
    timer.t["rollout"] -= critic_s
    timer.t["rollout_oracle"] = float(inner.get("oracle", 0.0))
    if cfg.critic == "mc":
        with timer.phase("mc"):
            batch = mc_values(cfg, tr.policy, tr.env, batch, seed=tr.next_seed())
    with timer.phase("values"):
        if tr.reference is not None:
            batch = reference_logprobs(
                tr.reference,
                batch,
                pad_id=tr.pad_id,
                device=tr.device,
                micro_batch_tokens=cfg.micro_batch_tokens,
            )
    timer.t["values"] += critic_s
    return batch


def update(tr: Any, batch: TrajectoryBatch) -> dict:
    """The policy's ``epochs`` and, apart, the critic's ``critic_epochs`` passes over ``batch``
    (:func:`~mpo_viz.train.update.update_with_critic`; a shared-trunk critic moves with the policy
    instead)."""
    cfg = tr.cfg
    value_clip = cfg.critic_option("value_clip") if tr.critic is not None else None
    joint = tr.critic is not None and getattr(tr.critic, "shared", False)
    learners = Learners(tr.policy.model, tr.policy_opt, tr.critic if joint else None, tr.critic_opt if joint else None)
    apart = Learners(critic=tr.critic, critic_opt=tr.critic_opt) if tr.critic is not None and not joint else None
    return update_with_critic(
        rows_of(batch),
        learners,
        UpdateSettings.of(cfg, value_clip=value_clip),
        apart,
        UpdateSettings.of(cfg, epochs=cfg.critic_option("critic_epochs"), value_clip=value_clip),
        generator=tr.generator,
        pad_id=tr.pad_id,
        device=tr.device,
        side_thread=cfg.side_thread,
    )


def saves(cfg: Config, it: int) -> bool:
    """Whether iteration ``it`` writes its trajectories (every ``save_trajectories_every``)."""
    k = cfg.save_trajectories_every
    return bool(k) and it % k == 0


def seen_by_update(tr: Any, batch: TrajectoryBatch) -> TrajectoryBatch:
    """``batch``, the rollout the update just trained on, with what the update did to it: per
    token ``ratio`` and ``clipped``, per turn ``turn_ratio`` and ``turn_clipped``
    (:func:`~mpo_viz.train.update.after_update`: one no-grad forward of the updated policy)."""
    seen = after_update(tr.policy.model, rows_of(batch), UpdateSettings.of(tr.cfg), pad_id=tr.pad_id, device=tr.device)
    return seen.attach(batch)


def write(tr: Any, rec: dict, batch: TrajectoryBatch, options: dict) -> None:
    """``trajectories/iter=N.parquet`` every ``save_trajectories_every`` iterations."""
    it = rec["iteration"]
    if saves(tr.cfg, it):
        batch.meta["iteration"] = it
        batch.meta["estimator"] = tr.cfg.estimator
        batch.meta["estimator_options"] = options
        if "critic_explained_var" in rec:  # the values against these returns, before the critic's update on them
            ev = rec["critic_explained_var"]
            batch.meta["critic_explained_var"] = ev if ev is not None and math.isfinite(ev) else None  # None: undefined
        tr.run.write_trajectories(batch, it, max_mb=tr.cfg.trajectories_max_mb)


def oracle_as_values(batch: TrajectoryBatch, env: str):
    """The batch with the scripted expert's exact values as its ``values`` (``critic="expert"``);
    terminal after the last action token (no bootstrap: a cut episode's return is 0, as its rewards
    say)."""
    if not batch.has("oracle_values"):
        raise ValueError(
            f"critic: 'expert' reads the environment's exact values, found a rollout of {env!r} without "
            f"oracle_values (its environment has no exact model; use critic='learned')"
        )
    return batch.with_token_fields(values=batch.padded("oracle_values", torch.float32))
