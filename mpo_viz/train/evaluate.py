"""The held-out evaluation of a trainer's policy, and the statistics of a batch that metrics lines read.

:class:`Evaluator`: greedy and sampled success on fixed held-out tasks, and pass@k;
:func:`episode_stats`: what a batch's episodes did; :func:`value_stats`: how their values explain
the returns.

Invariant: an evaluation draws from no training RNG and is fixed by ``cfg.eval_key`` — the same
tasks and sampling seeds at every evaluation and in every run that shares the key — so equal
weights give equal numbers; :class:`Evaluator` therefore reuses the result of weights already
evaluated (a digest of every tensor of the policy's state, bit for bit) instead of playing the
episodes again.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import torch

from mpo_viz.analysis import explained_variance, pass_at_k, value_variance, variance_summary
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.models import Policy
from mpo_viz.timer import Timer
from mpo_viz.train.config import Config
from mpo_viz.train.runtime import derive_seed, play

__all__ = ["Evaluator", "episode_stats", "value_stats", "weights_digest"]


def _success(batch: TrajectoryBatch) -> np.ndarray:
    """Per-episode success: ``extra_json["success"]`` when the rollout recorded it, else reward > 0."""
    if batch.has("extra_json"):
        out = []
        for x in batch.field("extra_json"):
            try:
                out.append(bool(json.loads(x).get("success")))
            except (TypeError, ValueError, AttributeError):
                out.append(False)
        return np.array(out, dtype=np.float64)
    r = np.nan_to_num(batch.outcome_reward.astype(np.float64))
    return (r > 0).astype(np.float64)


def episode_stats(batch: TrajectoryBatch, prefix: str = "") -> dict:
    """Success rate, reward mean/std, turns, tokens and truncation of a rolled-out batch."""
    scores = batch.padded("rewards", torch.float64).sum(1).numpy()
    lengths = batch.lengths.numpy().astype(np.float64)
    act = batch.mask.sum(1).numpy().astype(np.float64)
    trunc = (
        np.array([bool(x) for x in batch.field("truncated")], dtype=np.float64)
        if batch.has("truncated")
        else np.zeros(len(batch))
    )
    return {
        f"{prefix}success": float(_success(batch).mean()),
        f"{prefix}reward_mean": float(scores.mean()),
        f"{prefix}reward_std": float(scores.std()),
        f"{prefix}turns_mean": float(batch.num_turns.astype(np.float64).mean()),
        f"{prefix}tokens_mean": float(lengths.mean()),
        f"{prefix}action_tokens_mean": float(act.mean()),
        f"{prefix}truncated_frac": float(trunc.mean()),
    }


def value_stats(batch: TrajectoryBatch, returns, *, learned: bool = True) -> dict:
    """The values' metrics of a batch: the explained variance of its ``values`` against ``returns``
    and the across/within split of them (``values_*``), the same split of the environment's exact
    values (``oracle_*``) when it has them, and (``learned``: the values are a trained critic's)
    their mean absolute error against the exact ones."""
    out = {}
    if batch.has("values"):  # a learned critic's values, the expert's (critic="expert"), or Monte-Carlo
        out["critic_explained_var"] = explained_variance(returns, batch.values, batch.mask)
        s = variance_summary(value_variance(batch))
        out.update(
            {
                "values_across": s["mean_across"],
                "values_within": s["mean_within"],
                "values_across_within_ratio": s["median_ratio"],
            }
        )
    if batch.has("oracle_values"):
        s = variance_summary(value_variance(batch, batch.padded("oracle_values"), name="oracle_values"))
        out.update(
            {
                "oracle_across": s["mean_across"],
                "oracle_within": s["mean_within"],
                "oracle_across_within_ratio": s["median_ratio"],
            }
        )
        values = batch.values
        if values is not None and learned:
            m = batch.mask.bool()
            err = (values - batch.padded("oracle_values"))[m]
            out["critic_oracle_mae"] = float(err.abs().mean()) if err.numel() else math.nan
    return out


def weights_digest(model: torch.nn.Module) -> bytes:
    """A digest of every tensor of ``model``'s state (names, shapes, dtypes, bytes): equal digests
    are equal weights, bit for bit (a few ms for the tiny models)."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in model.state_dict().items():
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


class Evaluator:
    """The evaluations of one run (``cfg``, ``env``): each method takes the policy to evaluate.

    ``cache``: ``(greedy, n) -> (weights digest, stats)`` of the evaluations done; ``seconds``: the
    wall seconds spent playing evaluation episodes (a reused result costs none)."""

    def __init__(self, cfg: Config, env):
        self.cfg, self.env = cfg, env
        self.cache: dict = {}
        self.timer = Timer()
        #: ``() -> callable or None``: the trainer's first-rollout console (``play``'s ``notice``)
        self.notice = lambda: None

    @property
    def seconds(self) -> float:
        return self.timer.t.get("eval", 0.0)

    def seeds(self, n: int) -> list[int]:
        """The task seeds of the first ``n`` tasks of the held-out set (fixed by ``eval_key``)."""
        return [derive_seed(self.cfg.eval_key, "eval", i) for i in range(n)]

    def rollout(self, policy: Policy, n: int, *, greedy: bool, group_size: int = 1) -> TrajectoryBatch:
        """``group_size`` episodes on each of the first ``n`` held-out tasks (no critic; torch's global
        RNG left as it was)."""
        with torch.random.fork_rng(devices=[]):
            return play(
                self.cfg,
                policy,
                self.env,
                n,
                seed=derive_seed(self.cfg.eval_key, "eval"),
                greedy=greedy,
                seeds=self.seeds(n),
                group_size=group_size,
                notice=self.notice(),
            )

    def one(self, policy: Policy, n_episodes: int | None = None, *, greedy: bool = True) -> dict:
        """:meth:`mpo_viz.train.Trainer.evaluate_one`: greedy (``eval_*`` keys) or sampled
        (``eval_sampled_*``) :func:`episode_stats` on the held-out tasks; weights evaluated before
        (the same digest) give the earlier result without playing again."""
        n = self.cfg.eval_episodes if n_episodes is None else int(n_episodes)
        if n < 1:
            raise ValueError(f"n_episodes: expected >= 1, found {n_episodes}")
        # the same weights on the same tasks and seeds play the same episodes: an evaluation of
        # unchanged weights (the end of SFT, then the critic warm-up, then the one before RL) is reused
        digest = weights_digest(policy.model)
        cached = self.cache.get((greedy, n))
        if cached is not None and cached[0] == digest:
            return dict(cached[1])
        with self.timer.phase("eval"):
            out = episode_stats(self.rollout(policy, n, greedy=greedy), prefix="eval_" if greedy else "eval_sampled_")
        self.cache[(greedy, n)] = (digest, dict(out))
        return out

    def both(self, policy: Policy, n_episodes: int | None = None) -> dict:
        """:meth:`mpo_viz.train.Trainer.evaluate`: greedy and sampled, with ``eval_seed`` and ``n_eval_tasks``."""
        out = {**self.one(policy, n_episodes), **self.one(policy, n_episodes, greedy=False)}
        out["eval_seed"] = self.cfg.eval_key
        out["n_eval_tasks"] = self.cfg.eval_episodes if n_episodes is None else int(n_episodes)
        return out

    def pass_at_k(self, policy: Policy, n_tasks: int = 64, n_samples: int = 8, ks=None) -> dict:
        """:meth:`mpo_viz.train.Trainer.pass_at_k`: ``{"pass@k": value, ...}``, ``pass_tasks``, ``pass_samples``."""
        if n_tasks < 1 or n_samples < 1:
            raise ValueError(f"n_tasks/n_samples: expected >= 1, found {n_tasks}, {n_samples}")
        batch = self.rollout(policy, n_tasks, greedy=False, group_size=n_samples)
        wins = _success(batch).reshape(n_tasks, n_samples)
        out = {f"pass@{k}": pass_at_k(wins, k) for k in (ks or range(1, n_samples + 1))}
        out.update(pass_tasks=n_tasks, pass_samples=n_samples)
        return out
