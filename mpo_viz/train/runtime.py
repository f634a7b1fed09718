"""Small helpers of the trainer shared by its modules: derived seeds, thread settings, environment
options, the run's models (:func:`build_models`), :func:`play` (a rollout with the run's sampling
settings) and :func:`mc_values` (the policy's Monte-Carlo values as a batch's ``values``,
``critic="mc"``).

Invariant: each helper reads the :class:`~mpo_viz.train.Config` and nothing else of a run, so the
trainer, its evaluation, SFT and the critic fits derive the same seeds and settings from one config.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from mpo_viz import models
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.tokenizer import build_tokenizer
from mpo_viz.rollout import rollout
from mpo_viz.rollout.truth import mc_truth
from mpo_viz.train.config import MC_SAMPLES, Config

__all__ = ["build_models", "derive_seed", "env_kwargs", "mc_values", "play", "set_threads", "threads"]


def derive_seed(seed: int, *parts) -> int:
    """A 31-bit seed from the master seed and labels (stable across processes and platforms)."""
    text = "/".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def set_threads(n: int) -> None:
    """Torch's and numba's CPU threads to ``n``. Both matter: after a parallel estimator kernel,
    numba's OpenMP workers keep spinning unless numba is held to the same thread count. Numba first:
    starting its OpenMP layer resets the process's OpenMP thread count, torch's included (without
    it, a torch forward after a parallel estimator kernel ran several times slower on 2 cores)."""
    try:
        import numba

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - numba is a dependency
        pass
    torch.set_num_threads(n)


@contextmanager
def threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch (and numba) CPU threads (:func:`set_threads`), and give the
    process its torch thread count back after; ``None`` changes nothing."""
    if n is None:
        yield
        return
    if n < 1:
        raise ValueError(f"num_threads: expected an integer >= 1, found {n!r}")
    before = torch.get_num_threads()
    set_threads(int(n))
    try:
        yield
    finally:
        set_threads(before)


def env_kwargs(cfg: Config) -> dict:
    """The keyword options ``make_env`` gets from a Config (``env_options`` plus ``difficulty``)."""
    kw = dict(cfg.env_options)
    if cfg.difficulty is not None:
        kw["difficulty"] = tuple(cfg.difficulty) if isinstance(cfg.difficulty, list) else cfg.difficulty
    return kw


def play(
    cfg: Config,
    policy,
    env,
    n: int | None,
    *,
    seed: int,
    group_size: int = 1,
    greedy: bool = False,
    critic=None,
    seeds=None,
    timings: dict | None = None,
    notice=None,
) -> TrajectoryBatch:
    """:func:`mpo_viz.rollout.rollout` of ``n`` episodes (or one per task seed of ``seeds``) with the
    run's settings: its temperature and top-p (``greedy``: temperature 0), token budgets, batch
    size, oracle noise and ``side_thread``; ``critic`` records values; ``timings`` receives the
    rollout's seconds per phase. ``notice``: the run's first rollout only — receives the estimate
    of an untrained model's rollout, and text lost to ``[UNK]`` is warned about (later rollouts
    record it in their metadata only)."""
    return rollout(
        policy,
        env,
        None if seeds is not None else n,
        group_size=group_size,
        critic=critic,
        seed=seed,
        seeds=seeds,
        temperature=0.0 if greedy else cfg.temperature,
        top_p=1.0 if greedy else cfg.top_p,
        max_turn_tokens=cfg.max_turn_tokens,
        max_total_tokens=cfg.max_total_tokens,
        batch_size=cfg.rollout_batch_size,
        progress=False,
        timings=timings,
        critic_thread=None if cfg.side_thread else False,
        oracle=NoisyExpert(noise=cfg.oracle_noise) if cfg.oracle_noise is not None else None,
        notice=notice,
        warn_unknown=notice is not None,
    )


def mc_values(cfg: Config, policy, env, batch: TrajectoryBatch, *, seed: int) -> TrajectoryBatch:
    """``critic="mc"``: the policy's Monte-Carlo values at every turn start of ``batch``
    (``cfg.mc_samples`` branch rollouts each, seeded by ``seed``), read as ``values``: ``mc_value[k]``
    broadcast over turn k's tokens (its observation tokens too), terminal after the last action
    token. The batch keeps the ``mc_*`` fields."""
    m = cfg.mc_samples if cfg.mc_samples is not None else MC_SAMPLES
    out = mc_truth(batch, policy, m=m, seed=seed, env=env, batch_size=max(cfg.rollout_batch_size, m), progress=False)
    values = [
        np.asarray(v, dtype=np.float32)[np.asarray(t, dtype=np.int64)] if len(t) else np.zeros(0, np.float32)
        for v, t in zip(out.field("mc_value"), out.field("turn_ids"))
    ]
    return out.with_token_fields(values=values).with_meta(values_source="mc")


def build_models(cfg: Config, env, device, *, load=None) -> tuple:
    """``(policy, critic)`` of a new run: the policy of ``cfg.model_dir`` (a model folder, a plain
    Hugging Face one, or — with ``load``, :func:`mpo_viz.train.export.load_model` — a trained
    checkpoint), else a tiny one of ``cfg.model_size`` over ``env``'s words (or bytes); its tokenizer
    must cover ``env``'s vocabulary. The critic (None unless the run learns one): the folder's own,
    unless ``critic_init`` is given, else :func:`mpo_viz.models.make_critic` of the policy. Both on
    ``device``."""
    critic0 = None
    if cfg.model_dir:
        policy, critic0 = (load or models.load)(cfg.model_dir, device=cfg.device)
    else:
        policy = models.tiny_policy(build_tokenizer(env), size=cfg.model_size, seed=cfg.seed)
        policy.model.to(device)
    models.check_vocabulary(policy.tokenizer, env.vocabulary(), where=f"the policy's tokenizer for {cfg.env}")
    if not cfg.learns_critic:
        return policy, None
    if critic0 is not None and cfg.critic_init is None:
        critic = critic0
    else:
        critic = models.make_critic(policy, init=cfg.critic_option("critic_init"), seed=derive_seed(cfg.seed, "critic"))
    return policy, critic.to(device)
