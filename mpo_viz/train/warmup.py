"""The critic warm-up's fit: a pool of the start policy's episodes, the critic fitted to their
Monte-Carlo returns until a held-out gate or a step budget (the trainer's ``warmup_critic`` writes
the record).

Invariant: the pool's seeds and the fit's held-out split depend only on the run's seed, so the
warm-up depends only on the start and the seed.
"""

from __future__ import annotations

import numpy as np
import torch

from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.train.critic_fit import CriticFit, critic_outputs, fit_values
from mpo_viz.train.evaluate import value_stats
from mpo_viz.train.runtime import derive_seed
from mpo_viz.train.update import rows_of

__all__ = ["warm_up", "WARMUP_BATCH_EPISODES", "WARMUP_HOLDOUT", "WARMUP_EVAL_EVERY"]

#: the critic warm-up's fixed settings: episodes per AdamW step, held-out share, steps between checks
WARMUP_BATCH_EPISODES = 32
WARMUP_HOLDOUT = 0.2
WARMUP_EVAL_EVERY = 16


def warm_up(
    critic, pool: TrajectoryBatch, targets: torch.Tensor, cfg, *, steps: int, gate: float, pad_id: int, device, log=None
) -> tuple[CriticFit, dict]:
    """Fit ``critic`` to ``targets`` (B, L), the Monte-Carlo returns of the start policy's ``pool`` on
    the estimator's clock (:func:`fit_values`: AdamW at ``critic_warmup_lr``, a fifth held out, stop at
    held-out EV ≥ ``gate`` or after ``steps``). Returns the fit and the
    across/within statistics of the fitted values on the pool."""
    fit = fit_values(
        critic,
        pool,
        targets,
        steps=steps,
        lr=cfg.critic_option("critic_warmup_lr"),
        batch_episodes=WARMUP_BATCH_EPISODES,
        holdout=WARMUP_HOLDOUT,
        gate=gate,
        eval_every=WARMUP_EVAL_EVERY,
        seed=derive_seed(cfg.seed, "critic-warmup-fit"),
        pad_id=pad_id,
        device=device,
        micro_batch_tokens=cfg.micro_batch_tokens,
        grad_clip=cfg.grad_clip,
        weight_decay=cfg.weight_decay,
        log=log,
        positions=cfg.critic_option("critic_warmup_positions"),
    )
    values = critic_outputs(
        critic,
        rows_of(pool),
        np.arange(len(pool)),
        pad_id=pad_id,
        device=device,
        micro_batch_tokens=cfg.micro_batch_tokens,
    )
    split = value_stats(pool.with_token_fields(values=values), targets, learned=cfg.critic == "learned")
    return fit, split
