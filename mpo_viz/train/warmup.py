"""The critic warm-up's fit: a pool of the start policy's episodes, the critic fitted to their
Monte-Carlo returns until a held-out gate or a step budget (the trainer's ``warmup_critic`` writes
the record).

Invariant: the pool's seeds and the fit's held-out split depend only on the run's seed, so the
warm-up depends only on the start and the seed.
"""

from __future__ import annotations

import numpy as np

from mpo_viz.timer import Timer
from mpo_viz.train.critic_fit import CriticFit, critic_outputs, fit_values
from mpo_viz.train.evaluate import value_stats
from mpo_viz.train.runtime import derive_seed
from mpo_viz.train.update import rows_of

__all__ = ["warm_up", "WARMUP_BATCH_EPISODES", "WARMUP_HOLDOUT", "WARMUP_EVAL_EVERY"]

#: the critic warm-up's fixed settings: episodes per AdamW step, held-out share, steps between checks
WARMUP_BATCH_EPISODES = 32
WARMUP_HOLDOUT = 0.2
WARMUP_EVAL_EVERY = 16


def warm_up(trainer, timer: Timer, *, steps: int, gate: float, n_pool: int) -> tuple[CriticFit, dict]:
    """Roll out ``n_pool`` episodes of ``trainer``'s policy (phase ``warmup_pool``) and fit its critic
    to their Monte-Carlo returns on the estimator's clock (phase ``warmup_fit``, :func:`fit_values`:
    AdamW at ``critic_warmup_lr``, a fifth held out, stop at held-out EV ≥ ``gate`` or after ``steps``).
    Returns the fit and the across/within statistics of the fitted values on the pool."""
    cfg = trainer.cfg
    with timer.phase("warmup_pool"):
        trainer._say(f"critic warm-up: rolling out a pool of {n_pool} episodes of the start policy")
        pool = trainer._rollout(n_pool, seed=derive_seed(cfg.seed, "critic-warmup"), group_size=1)
    with timer.phase("warmup_fit"):
        targets = trainer._mc_targets(pool)
        fit = fit_values(
            trainer.critic,
            pool,
            targets,
            steps=steps,
            lr=cfg.critic_option("critic_warmup_lr"),
            batch_episodes=WARMUP_BATCH_EPISODES,
            holdout=WARMUP_HOLDOUT,
            gate=gate,
            eval_every=WARMUP_EVAL_EVERY,
            seed=derive_seed(cfg.seed, "critic-warmup-fit"),
            pad_id=trainer.pad_id,
            device=trainer.device,
            micro_batch_tokens=cfg.micro_batch_tokens,
            grad_clip=cfg.grad_clip,
            weight_decay=cfg.weight_decay,
            log=None if trainer.quiet else trainer._say,
            positions=cfg.critic_option("critic_warmup_positions"),
        )
        values = critic_outputs(
            trainer.critic,
            rows_of(pool),
            np.arange(len(pool)),
            pad_id=trainer.pad_id,
            device=trainer.device,
            micro_batch_tokens=cfg.micro_batch_tokens,
        )
        split = value_stats(pool.with_token_fields(values=values), targets, learned=cfg.critic == "learned")
    return fit, split
