"""The trainer: SFT warm start, critic warm-up, then RL iterations writing a run folder.

One iteration::

    rollout N episodes (G per task)          mpo_viz.rollout.rollout  -> values, log-probs, rewards
    Monte-Carlo values (critic="mc")         mpo_viz.rollout.truth.mc_truth: branch rollouts per turn start
    reference log-probs (kl_coef > 0)        one no-grad forward of the frozen reference policy
    advantages and returns                   mpo_viz.advantages.compute(batch, estimator, **options)
    E epochs × M minibatches of updates      mpo_viz.train.update (policy_loss, value_loss)
    what the update did (saved iterations)   one no-grad forward: per-token ratio and clip flags
    greedy evaluation (every eval_interval)  a fixed held-out set of tasks
    trajectories/iter=N.parquet, metrics.jsonl line, checkpoints/iter=N/

Randomness: every draw comes from a seeded source whose state is checkpointed — the rollout seed is
``derive(seed, "rollout", cursor)`` with a cursor that advances per rollout; shuffles come from the
trainer's ``torch.Generator``; evaluation tasks are fixed by ``derive(seed, "eval")``. So a run
stopped after iteration k and resumed is bit-for-bit the run that never stopped (on CPU).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
import sys
import time
import warnings
from concurrent.futures import wait
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mpo_viz import models
from mpo_viz.advantages import compute, estimator_clock, mc_returns
from mpo_viz.analysis import explained_variance, pass_at_k, value_variance, variance_summary
from mpo_viz.data.runfolder import RunFolder, clean_json
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.registry import make_env
from mpo_viz.envs.tokenizer import build_tokenizer
from mpo_viz.losses import get_loss
from mpo_viz.rollout import rollout, side_pool, spare_cores
from mpo_viz.rollout.truth import mc_truth
from mpo_viz.train.checkpoint import (
    CheckpointError,
    CheckpointWarning,
    capture_rng,
    checkpoint_candidates,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from mpo_viz.train.collapse import collapse_flags, new_signals, stretches
from mpo_viz.train.config import (
    EXPERT_BIAS,
    MC_SAMPLES,
    RESUMABLE_FIELDS,
    Config,
    ExpertCriticWarning,
)
from mpo_viz.train.critic_fit import critic_outputs, fit_values
from mpo_viz.train.runtime import derive_seed, env_kwargs, set_threads
from mpo_viz.train.sft import sft as run_sft
from mpo_viz.train.trackers import Tracker, check_available, open_tracker
from mpo_viz.train.update import (
    Learners,
    UpdateSettings,
    after_update,
    check_loss_inputs,
    forward_policy,
    make_micro,
    micro_batches,
    rows_of,
    update_epochs,
)

__all__ = ["Trainer", "RESULT_KEYS_VOLATILE", "episode_stats", "progress_line", "warmup_line"]

#: the critic warm-up's fixed settings: episodes per AdamW step, held-out share, steps between checks
WARMUP_BATCH_EPISODES = 32
WARMUP_HOLDOUT = 0.2
WARMUP_EVAL_EVERY = 16

#: metric keys that measure time (they differ between two runs that are otherwise bit-identical):
#: an iteration's phases are its ``timings``; the SFT, warm-up and evaluation lines' are ``seconds``
#: (kept apart, so that the dashboard's stack of ``timings`` stays the iterations' own)
RESULT_KEYS_VOLATILE = ("time_s", "timings", "seconds", "throughput")


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
    trunc = np.array([bool(x) for x in batch.field("truncated")], dtype=np.float64) if batch.has("truncated") else np.zeros(len(batch))
    return {
        f"{prefix}success": float(_success(batch).mean()),
        f"{prefix}reward_mean": float(scores.mean()),
        f"{prefix}reward_std": float(scores.std()),
        f"{prefix}turns_mean": float(batch.num_turns.astype(np.float64).mean()),
        f"{prefix}tokens_mean": float(lengths.mean()),
        f"{prefix}action_tokens_mean": float(act.mean()),
        f"{prefix}truncated_frac": float(trunc.mean()),
    }


class Trainer:
    """Train a policy (and critic) on an environment, writing a run folder.

    ``Trainer(cfg, run_dir)`` starts a new run (``run_dir`` must not hold one yet);
    :meth:`resume` continues one. Steps: :meth:`sft`, :meth:`warmup_critic`, :meth:`iterate`
    (a generator of per-iteration metrics), :meth:`evaluate` (greedy and sampled; :meth:`evaluate_one` for one); :meth:`run_all` does them all.

    Attributes: ``cfg``, ``run`` (:class:`~mpo_viz.data.runfolder.RunFolder`), ``env``, ``policy``
    (:class:`mpo_viz.models.Policy`), ``critic`` (or None), ``reference`` (frozen policy model, or
    None), ``iteration`` (completed RL iterations), ``history`` (the metrics written this session).
    """

    def __init__(self, cfg: Config, run_dir, *, _resume: bool = False, quiet: bool = False):
        if not isinstance(cfg, Config):
            raise ValueError(f"cfg: expected a mpo_viz.train.Config, found {type(cfg).__name__}")
        self.cfg = cfg
        self.run = RunFolder(run_dir)
        self.quiet = quiet
        if not _resume and (self.run.checkpoints / "latest").exists():
            raise ValueError(f"run_dir: {str(self.run.path)!r} already holds a run (checkpoints/latest); "
                             f"continue it with Trainer.resume({str(self.run.path)!r}) or pick a new folder")
        if not _resume and self.run.metrics_path.exists() and self.run.metrics_path.stat().st_size:
            raise ValueError(f"run_dir: {str(self.run.path)!r} already holds metrics.jsonl; pick a new folder")
        self.tracker: Tracker | None = None
        if cfg.log_to:  # a missing package is said before anything is written
            check_available(cfg.log_to)
        self.device = models.resolve_device(cfg.device)  # a backend this torch lacks: one line saying how to get it
        if cfg.critic == "expert" and cfg.uses_critic:
            warnings.warn(f"critic='expert' reads {EXPERT_BIAS}", ExpertCriticWarning, stacklevel=2)
        if cfg.num_threads:
            set_threads(cfg.num_threads)
        self._build()
        self.history: list[dict] = []
        self.interrupted = False
        if not _resume:
            self.run.create()
            cfg.save(self.run.config_path)
            self._open_tracker()
            self._checkpoint()  # iteration 0: the initial weights, so that any step can be undone

    # ------------------------------------------------------------------ construction
    def _build(self) -> None:
        cfg = self.cfg
        try:
            self.env = make_env(cfg.env, **env_kwargs(cfg))
        except TypeError as exc:
            raise ValueError(f"env_options: the {cfg.env} environment refuses them ({exc})") from None
        critic0 = None
        if cfg.model_dir:
            self.policy, critic0 = models.load(cfg.model_dir, device=cfg.device)
        else:
            self.policy = models.tiny_policy(build_tokenizer(self.env), size=cfg.model_size, seed=cfg.seed)
            self.policy.model.to(self.device)
        models.check_vocabulary(self.policy.tokenizer, self.env.vocabulary(), where=f"the policy's tokenizer for {cfg.env}")
        self.pad_id = self.policy.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.policy.tokenizer.eos_token_id or 0
        self.critic = None
        if cfg.learns_critic:
            if critic0 is not None and cfg.critic_init is None:
                self.critic = critic0
            else:
                self.critic = models.make_critic(self.policy, init=cfg.critic_option("critic_init"),
                                                 seed=derive_seed(cfg.seed, "critic"))
            self.critic.to(self.device)
        self.reference: torch.nn.Module | None = None
        p_params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.policy_opt = torch.optim.AdamW(p_params, lr=cfg.policy_lr, weight_decay=cfg.weight_decay)
        self.critic_opt = None
        if self.critic is not None:
            own = self.critic.own_parameters()
            self.critic_opt = torch.optim.AdamW(own, lr=cfg.critic_option("critic_lr"), weight_decay=cfg.weight_decay)
        self.generator = torch.Generator().manual_seed(derive_seed(cfg.seed, "shuffle"))
        self.state: dict[str, Any] = {"iteration": 0, "seed_cursor": 0, "sft_done": False, "critic_warm": False,
                      "elapsed_s": 0.0, "config_hash": cfg.hash(), "config": cfg.to_dict()}
        self.lagged: list = []  # rollouts waiting for their update (policy_lag)
        self._evals: dict = {}  # (greedy, n) -> (the policy's weights digest, the stats): see evaluate
        self.eval_seconds = 0.0  # wall seconds spent in evaluate() by this trainer (cached ones: none)

    @property
    def iteration(self) -> int:
        """Completed RL iterations."""
        return int(self.state["iteration"])

    def _modules(self) -> dict:
        out = {"policy": self.policy.model}
        if self.critic is not None:
            out["critic"] = self.critic
        if self.reference is not None:
            out["reference"] = self.reference
        return out

    def _optimizers(self) -> dict:
        out = {"policy": self.policy_opt}
        if self.critic_opt is not None:
            out["critic"] = self.critic_opt
        return out

    def _checkpoint(self) -> Path:
        batches = {f"lag{i}": b for i, b in enumerate(self.lagged)}
        state = {**self.state, "n_lagged": len(self.lagged), "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        return save_checkpoint(self.run.checkpoints, self.iteration, modules=self._modules(),
                               optimizers=self._optimizers(), rng=capture_rng({"shuffle": self.generator}),
                               state=state, batches=batches, keep=self.cfg.keep_checkpoints)

    def _restore(self, path: Path) -> None:
        ck = load_checkpoint(path)
        st = ck.state
        if st.get("config_hash") != self.cfg.hash():
            stored = Config.from_dict(st["config"]) if "config" in st else None
            diff = self.cfg.differences(stored) if stored else ["(the checkpoint does not record its config)"]
            raise ValueError(f"config: the checkpoint {path} was written with a different config; differing "
                             f"fields: {'; '.join(diff)}")
        ck.load_weights("policy", self.policy.model)
        if self.critic is not None:
            ck.load_weights("critic", self.critic)
        if ck.has_weights("reference"):
            if self.reference is None:
                self.reference = self._frozen_copy()
            ck.load_weights("reference", self.reference)
        else:
            self.reference = None
        self.policy_opt.load_state_dict(ck.optimizers["policy"])
        if self.critic_opt is not None:
            self.critic_opt.load_state_dict(ck.optimizers["critic"])
        restore_rng(ck.rng, {"shuffle": self.generator})
        self.state = {k: st[k] for k in ("iteration", "seed_cursor", "sft_done", "critic_warm", "elapsed_s",
                                         "config_hash", "config")}
        self.lagged = [ck.batches[f"lag{i}"] for i in range(int(st.get("n_lagged", 0)))]
        # files written after this checkpoint belong to an iteration that did not finish
        self.run.truncate_metrics(self.iteration)
        self.run.remove_trajectories_after(self.iteration)

    def _frozen_copy(self):
        ref = copy.deepcopy(self.policy.model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    @classmethod
    def resume(cls, run_dir, cfg: Config | None = None, *, iterations: int | None = None,
               quiet: bool = False) -> Trainer:
        """Continue the run in ``run_dir`` from its latest checkpoint.

        ``cfg``: the config to continue with (default: the folder's ``config.json``); one that
        differs in anything but ``iterations`` is refused, naming the fields. ``iterations``: the new
        total of RL iterations (updates ``config.json``).
        """
        run = RunFolder(run_dir)
        if not run.path.is_dir():
            raise ValueError(f"run_dir: no such folder {str(run.path)!r} (nothing to resume)")
        if not run.config_path.is_file():
            raise ValueError(f"run_dir: expected a run folder with config.json, found {str(run.path)!r} without one")
        stored = Config.load(run.config_path)
        if cfg is not None:
            diff = stored.differences(cfg)
            if diff:
                raise ValueError(f"config: cannot resume {str(run.path)!r} with a different config; differing "
                                 f"fields (stored != given): {'; '.join(diff)}")
            stored = stored.replace(**{k: getattr(cfg, k) for k in RESUMABLE_FIELDS})
        if iterations is not None:
            stored = stored.replace(iterations=iterations)
        if not checkpoint_candidates(run.checkpoints):
            raise ValueError(f"run_dir: {str(run.path)!r} has no checkpoint to resume from (checkpoints/ holds none)")
        tr = cls(stored, run_dir, _resume=True, quiet=quiet)
        tr._restore_usable()
        stored.save(run.config_path)
        tr._open_tracker(resume_from=tr.iteration)
        return tr

    def _open_tracker(self, resume_from: int | None = None) -> None:
        """Mirror every metrics line to ``cfg.log_to`` from now on (a tracker opened for the first
        time on a resumed run first receives the lines already written)."""
        if not self.cfg.log_to:
            return
        self.tracker = open_tracker(self.cfg.log_to, self.run.path, self.cfg.to_dict(), resume_from=resume_from)
        if resume_from is not None and self.tracker.fresh:
            for rec in self.run.metrics():
                self.tracker.log(rec)
        self.run.mirror = self.tracker.log

    def close(self) -> None:
        """Close the experiment tracker (``cfg.log_to``), if any; the run folder needs no closing."""
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
            self.run.mirror = None

    def _restore_usable(self) -> Path:
        """Restore the newest checkpoint that reads (:func:`checkpoint_candidates`): a damaged one
        (truncated or unreadable file) is skipped for the previous one with a
        :class:`CheckpointWarning` naming the file; none usable is a one-line
        :class:`CheckpointError`. A checkpoint of another config is refused as before."""
        cands = checkpoint_candidates(self.run.checkpoints)
        damaged: list[CheckpointError] = []
        for path in cands:
            try:
                self._restore(path)
            except CheckpointError as exc:
                damaged.append(exc)
                continue
            for err in damaged:
                warnings.warn(f"damaged checkpoint skipped: {err}; resumed from {path.name} instead",
                              CheckpointWarning, stacklevel=3)
            return path
        first = f"; the newest: {damaged[0]}" if damaged else ""
        raise CheckpointError(f"{self.run.checkpoints}: no usable checkpoint ({len(cands)} found{first})")

    # ------------------------------------------------------------------ rollouts
    def _rollout(self, n: int, *, seed: int, group_size: int = 1, greedy: bool = False, critic=True,
                 seeds=None, timings: dict | None = None):
        cfg = self.cfg
        return rollout(self.policy, self.env, None if seeds is not None else n, group_size=group_size,
                       critic=self.critic if critic else None, seed=seed, seeds=seeds,
                       temperature=0.0 if greedy else cfg.temperature, top_p=1.0 if greedy else cfg.top_p,
                       max_turn_tokens=cfg.max_turn_tokens, max_total_tokens=cfg.max_total_tokens,
                       batch_size=cfg.rollout_batch_size, progress=False, timings=timings,
                       critic_thread=None if cfg.side_thread else False,
                       oracle=NoisyExpert(noise=cfg.oracle_noise) if cfg.oracle_noise is not None else None)

    def _next_seed(self) -> int:
        s = derive_seed(self.cfg.seed, "rollout", self.state["seed_cursor"])
        self.state["seed_cursor"] += 1
        return s

    def _eval_seeds(self, n: int) -> list[int]:
        """The task seeds of the first ``n`` tasks of the held-out evaluation set (fixed by ``eval_key``)."""
        return [derive_seed(self.cfg.eval_key, "eval", i) for i in range(n)]

    def _eval_rollout(self, n: int, *, greedy: bool, group_size: int = 1):
        with torch.random.fork_rng(devices=[]):
            return self._rollout(n, seed=derive_seed(self.cfg.eval_key, "eval"), greedy=greedy, critic=False,
                                 seeds=self._eval_seeds(n), group_size=group_size)

    def evaluate_one(self, n_episodes: int | None = None, *, greedy: bool = True) -> dict:
        """Success and reward of the current policy on the fixed held-out tasks, greedy (keys
        ``eval_success``, ``eval_reward_mean``, ``eval_reward_std``, ``eval_turns_mean``, ...; see
        :func:`episode_stats`) or sampled at the rollout's temperature (``greedy=False``: keys
        ``eval_sampled_success``, ...). The tasks and the sampling seeds are fixed by
        ``cfg.eval_key``: the same at every evaluation and in every run that shares it. Draws from
        no training RNG. An evaluation of weights already evaluated (bit for bit: a digest of the
        policy's state) returns the earlier result, which a rerun would reproduce, without playing
        the episodes again."""
        n = self.cfg.eval_episodes if n_episodes is None else int(n_episodes)
        if n < 1:
            raise ValueError(f"n_episodes: expected >= 1, found {n_episodes}")
        # the same weights on the same tasks and seeds play the same episodes: an evaluation of
        # unchanged weights (the end of SFT, then the critic warm-up, then the one before RL) is reused
        digest = _weights_digest(self.policy.model)
        cached = self._evals.get((greedy, n))
        if cached is not None and cached[0] == digest:
            return dict(cached[1])
        t0 = time.perf_counter()
        batch = self._eval_rollout(n, greedy=greedy)
        out = episode_stats(batch, prefix="eval_" if greedy else "eval_sampled_")
        self.eval_seconds += time.perf_counter() - t0
        self._evals[(greedy, n)] = (digest, dict(out))
        return out

    def evaluate(self, n_episodes: int | None = None) -> dict:
        """Both evaluations of :meth:`evaluate_one` (greedy and sampled) on the held-out set, with
        ``eval_seed`` and ``n_eval_tasks``: what RL moves first is the sampled success."""
        out = {**self.evaluate_one(n_episodes), **self.evaluate_one(n_episodes, greedy=False)}
        out["eval_seed"] = self.cfg.eval_key
        out["n_eval_tasks"] = self.cfg.eval_episodes if n_episodes is None else int(n_episodes)
        return out

    def pass_at_k(self, n_tasks: int = 64, n_samples: int = 8, ks=None) -> dict:
        """pass@k of the current policy on the first ``n_tasks`` held-out tasks, ``n_samples``
        sampled episodes each (fixed seeds), for k = 1 … ``n_samples`` (or ``ks``): the unbiased
        estimator ``mean_tasks [1 − C(n − c, k) / C(n, k)]`` with c successes of n samples
        (:func:`mpo_viz.analysis.pass_at_k`). Returns ``{"pass@k": value, ...}`` plus
        ``pass_tasks`` and ``pass_samples``."""
        if n_tasks < 1 or n_samples < 1:
            raise ValueError(f"n_tasks/n_samples: expected >= 1, found {n_tasks}, {n_samples}")
        batch = self._eval_rollout(n_tasks, greedy=False, group_size=n_samples)
        wins = _success(batch).reshape(n_tasks, n_samples)
        out = {f"pass@{k}": pass_at_k(wins, k) for k in (ks or range(1, n_samples + 1))}
        out.update(pass_tasks=n_tasks, pass_samples=n_samples)
        return out

    # ------------------------------------------------------------------ SFT and critic warm-up
    def sft(self, steps: int | None = None, *, target_success: float | None = None) -> dict:
        """Warm start on noisy-expert episodes (cross-entropy on their action tokens).

        Stops at ``target_success`` greedy eval success (default ``cfg.sft_target_success``) or after
        ``steps`` (default ``cfg.sft_steps``). Writes one ``phase: "sft"`` metrics line and the
        iteration-0 checkpoint. Only before RL starts.
        """
        if self.iteration > 0:
            raise ValueError(f"sft: the run already has {self.iteration} RL iterations; SFT is a warm start")
        cfg = self.cfg
        steps = cfg.sft_steps if steps is None else int(steps)
        target = cfg.sft_target_success if target_success is None else float(target_success)
        t0, e0 = time.perf_counter(), self.eval_seconds
        try:
            res = run_sft(self, steps=steps, target=target, log=self._say)
        except KeyboardInterrupt:
            self._abandon("interrupted: SFT abandoned; the run is back at its last checkpoint (resumable)")
            return {}
        self.state["sft_done"] = True
        took, evals = time.perf_counter() - t0, self.eval_seconds - e0
        self.state["elapsed_s"] += took
        rec = {"iteration": 0, "phase": "sft", "time_s": self.state["elapsed_s"], **res,
               "seconds": {"sft": took - evals, "eval": evals}}
        self.run.append_metrics(rec)
        self.history.append(rec)
        if res["sft_steps"] > 0:
            self._save_start(rec)
        self._checkpoint()
        return rec

    def _save_start(self, sft_record: dict | None = None) -> Path:
        """Write the start (the policy after SFT; the critic too once warmed up) as the model folder
        ``RUN/start`` (through a temporary name), with ``start.json`` (the SFT record and the config
        hash): ``--model-dir RUN/start`` reuses it; no checkpoint rule removes it."""
        final, tmp = self.run.start, self.run.path / ".start.tmp"
        info_path = final / "start.json"
        info = json.loads(info_path.read_text()) if sft_record is None and info_path.is_file() else {}
        if sft_record is not None:
            info = {"source": f"mpo-viz train: the SFT start of {self.run.path.name}",
                    "sft_config_hash": self.cfg.hash(), "sft": sft_record}
        if self.critic is not None and self.state["critic_warm"]:
            info["critic"] = "warmed up on the start's rollouts (see the critic_warmup line of metrics.jsonl)"
        if tmp.exists():
            shutil.rmtree(tmp)
        models.save(tmp, self.policy, self.critic if self.state["critic_warm"] else None)
        (tmp / "start.json").write_text(json.dumps(clean_json(info), indent=1) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    def warmup_critic(self, steps: int | None = None, *, gate: float | None = None, log=None) -> dict:
        """Fit the critic before RL on a pool of rollouts of the current policy.

        The pool: ``critic_warmup_episodes`` episodes (one per task; their seeds depend only on
        ``cfg.seed``, so the warm-up depends only on the start and the seed). A fifth is held out.
        The critic is fitted to the Monte-Carlo returns on the estimator's clock (as RL's ``value_target="mc"``)
        at ``critic_warmup_lr`` by :func:`~mpo_viz.train.critic_fit.fit_values` until its explained
        variance on the held-out episodes reaches ``gate`` (default ``critic_warmup_ev``) or the
        ``steps`` budget (default ``critic_warmup_steps``) ends; when the pool's returns (or the
        held-out ones) do not vary, no step can change that outcome and the critic is set to the
        constant at once. The metrics line (phase ``critic_warmup``) says which (``warmup_stop``:
        ``"gate"``, ``"budget"``, ``"constant"``, ``"heldout_constant"``; ``warmup_constant``), the EV
        reached and the seconds of the pool's rollout and of the fit (``seconds``); ``log(line)``
        (default: the console) receives one line, :func:`warmup_line`.
        """
        cfg = self.cfg
        if self.critic is None:
            raise ValueError(f"warmup_critic: no learned critic to warm up (estimator {cfg.estimator!r}, "
                             f"critic={cfg.critic!r})")
        steps = cfg.critic_option("critic_warmup_steps") if steps is None else int(steps)
        gate = cfg.critic_option("critic_warmup_ev") if gate is None else float(gate)
        n_pool = cfg.critic_option("critic_warmup_episodes")
        t0 = time.perf_counter()
        try:
            self._say(f"critic warm-up: rolling out a pool of {n_pool} episodes of the start policy")
            pool = self._rollout(n_pool, seed=derive_seed(cfg.seed, "critic-warmup"), group_size=1)
            t_pool = time.perf_counter() - t0
            targets = self._mc_targets(pool)
            fit = fit_values(self.critic, pool, targets, steps=steps, lr=cfg.critic_option("critic_warmup_lr"),
                             batch_episodes=WARMUP_BATCH_EPISODES, holdout=WARMUP_HOLDOUT, gate=gate,
                             eval_every=WARMUP_EVAL_EVERY, seed=derive_seed(cfg.seed, "critic-warmup-fit"),
                             pad_id=self.pad_id, device=self.device, micro_batch_tokens=cfg.micro_batch_tokens,
                             grad_clip=cfg.grad_clip, weight_decay=cfg.weight_decay,
                             log=None if self.quiet else self._say,
                             positions=cfg.critic_option("critic_warmup_positions"))
            values = critic_outputs(self.critic, rows_of(pool), np.arange(len(pool)), pad_id=self.pad_id,
                                    device=self.device, micro_batch_tokens=cfg.micro_batch_tokens)
            split = self._value_stats(pool.with_token_fields(values=values), targets)
        except KeyboardInterrupt:
            self._abandon("interrupted: critic warm-up abandoned; the run is back at its last checkpoint (resumable)")
            return {}
        self.state["critic_warm"] = True
        took = time.perf_counter() - t0
        self.state["elapsed_s"] += took
        rec = {"iteration": self.iteration, "phase": "critic_warmup", "time_s": self.state["elapsed_s"],
               "warmup_steps": fit.steps, "warmup_explained_var": fit.heldout_ev, "warmup_gate": gate,
               "warmup_passed": fit.passed, "warmup_stop": fit.stop, "warmup_best_explained_var": fit.best_ev,
               "warmup_train_explained_var": fit.train_ev, "warmup_episodes": n_pool,
               "warmup_heldout_episodes": fit.n_heldout, "warmup_history": fit.history,
               "warmup_summary": fit.summary(), "warmup_constant": fit.constant,
               **{f"warmup_{k}": v for k, v in split.items() if k != "critic_explained_var"},
               "seconds": {"warmup_pool": t_pool, "warmup_fit": took - t_pool}}
        (log or self._say)(warmup_line(rec))
        self.run.append_metrics(rec)
        self.history.append(rec)
        if self.run.start.is_dir():  # this run's SFT start: keep its critic beside it
            self._save_start()
        self._checkpoint()
        return rec

    # ------------------------------------------------------------------ RL
    def iterate(self, n: int | None = None):
        """Run ``n`` RL iterations (default: up to ``cfg.iterations`` in all), yielding each one's
        metrics dict after its files are written.

        Ctrl-C (KeyboardInterrupt) abandons the current iteration: the trainer goes back to the last
        checkpoint (the run folder stays consistent and resumable) and the generator ends, with
        ``self.interrupted`` set.
        """
        target = self.cfg.iterations if n is None else self.iteration + int(n)
        while self.iteration < target:
            try:
                rec = self._one_iteration()
            except KeyboardInterrupt:
                self._abandon(f"interrupted: iteration {self.iteration + 1} abandoned; the run is at iteration "
                              f"{self.iteration} (resume with Trainer.resume or mpo-viz train --resume)")
                return
            yield rec

    def run_all(self, iterations: int | None = None, *, log=None) -> list[dict]:
        """SFT (unless done or ``sft_steps`` = 0), critic warm-up (unless done, or no critic), a greedy
        evaluation before RL (iteration 0, phase ``"eval"``; once per run folder), then RL iterations
        up to ``iterations`` in all (default ``cfg.iterations``), the last one always evaluated;
        ``log(line)`` receives one progress line per iteration. Returns the iteration metrics."""
        log = log or self._say
        cfg = self.cfg
        if self.iteration == 0 and not self.state["sft_done"] and cfg.sft_steps > 0:
            r = self.sft()
            if self.interrupted:
                return []
            log(sft_line(r, self.run.start if r.get("sft_steps") else None))
        if self.critic is not None and not self.state["critic_warm"] and cfg.critic_option("critic_warmup_steps") > 0:
            self.warmup_critic(log=log)
            if self.interrupted:
                return []
        total = cfg.iterations if iterations is None else int(iterations)
        if self.iteration == 0 and total > 0 and not self._start_evaluated():
            # where every learning curve starts: the policy before its first RL update (the
            # evaluation draws from no training RNG, so the run itself is unchanged)
            ev = self._eval_line()
            log(f"eval before RL: sampled success {ev['eval_sampled_success']:.3f}, greedy {ev['eval_success']:.3f} "
                f"({ev['n_eval_tasks']} tasks)")
        out = []
        for rec in self.iterate(max(total - self.iteration, 0)):
            out.append(rec)
            log(progress_line(rec, total))
        if out and "eval_success" not in out[-1] and not self.interrupted:
            ev = self._eval_line()
            log(f"final eval: sampled success {ev['eval_sampled_success']:.3f}, greedy {ev['eval_success']:.3f}")
        return out

    def _eval_line(self) -> dict:
        """Both evaluations at the current iteration, written as a ``phase: "eval"`` metrics line
        (flagged like an iteration's line, see :meth:`_flag_collapse`); returns the line."""
        t0 = time.perf_counter()
        rec = {"iteration": self.iteration, "phase": "eval", "time_s": self.state["elapsed_s"], **self.evaluate()}
        rec["seconds"] = {"eval": time.perf_counter() - t0}
        self._flag_collapse(rec)
        self.run.append_metrics(rec)
        self.history.append(rec)
        return rec

    def _flag_collapse(self, rec: dict) -> None:
        """Mark ``rec`` with the collapse signatures it shows (``rec["collapse"]``: the metrics, see
        :mod:`mpo_viz.train.collapse`) read against the run's earlier lines, and warn in the
        console of each that the previous line did not show. ``rec["collapse_since"]``: the iteration
        where each one's stretch of flagged lines began; the warning names the first iteration the
        run ever flagged it at and the command that lists the episodes behind it."""
        stream = self.run.metrics() + [rec]
        span = get_loss(self.cfg.loss).span_ratio  # the ratio_max rule: turn- or sequence-level clips only
        flags = collapse_flags(stream, span_ratio=span)
        if flags[-1]:
            rec["collapse"] = [f.metric for f in flags[-1]]
            rec["collapse_since"] = [stretches(stream, flags, m)[-1][0] for m in rec["collapse"]]
        for f in new_signals(stream, flags=flags):
            first = stretches(stream, flags, f.metric)[0][0]
            self._say(f"warning: {f.message}; first flagged at iteration {first}, its episodes: "
                      f"mpo-viz runs explain {self.run.path}")

    def _start_evaluated(self) -> bool:
        """Whether the run folder already holds the evaluation before the first RL iteration."""
        return any(r.get("phase") == "eval" and r.get("iteration") == 0 for r in self.run.metrics())

    def _ref_logprobs(self, batch: TrajectoryBatch):
        r = rows_of(batch)
        out = torch.zeros(r.mask.shape, dtype=torch.float32)
        with torch.no_grad():
            for rows in micro_batches(r, np.arange(len(r)), self.cfg.micro_batch_tokens):
                mb = make_micro(r, rows, self.pad_id, self.device)
                lp, _ = forward_policy(self.reference, mb)
                out[torch.from_numpy(rows), : mb.Lb] = lp.float().cpu()
        return batch.with_token_fields(ref_logprobs=out)

    def _one_iteration(self) -> dict:
        cfg = self.cfg
        it = self.iteration + 1
        t_start = time.perf_counter()
        timings: dict = {}
        if cfg.kl_coef > 0 and self.reference is None:
            self.reference = self._frozen_copy()  # the policy as RL starts
        batch = self._collect(timings)
        rollout_tokens = int(batch.mask.sum())

        t = time.perf_counter()
        res = compute(batch, cfg.estimator, **cfg.estimator_options)
        batch = res.attach(batch)
        target = res.returns  # what the value loss trains the critic on (value_target)
        if cfg.learns_critic and cfg.critic_option("value_target") == "mc":
            target = self._mc_targets(batch)
            batch = batch.with_token_fields(returns=target)
        timings["advantages"] = time.perf_counter() - t

        rec = {"iteration": it, "phase": "rl", **episode_stats(batch)}
        if cfg.learns_critic:
            rec["value_target"] = cfg.critic_option("value_target")
        rec.update(self._value_stats(batch, target))

        # policy_lag: train on the rollout of policy_lag iterations ago (none yet: no update)
        self.lagged.append(batch)
        train_batch = self.lagged.pop(0) if len(self.lagged) > cfg.policy_lag else None
        check_loss_inputs(train_batch if train_batch is not None else batch, cfg.loss)

        t = time.perf_counter()
        upd = self._update(train_batch) if train_batch is not None else {}
        timings["update"] = time.perf_counter() - t
        rec.update(upd)
        if train_batch is batch and self._saves(it):
            t = time.perf_counter()
            batch = self._after_update(batch)
            timings["after_update"] = time.perf_counter() - t

        t = time.perf_counter()
        if cfg.eval_interval and it % cfg.eval_interval == 0:
            rec.update(self.evaluate())
        timings["eval"] = time.perf_counter() - t
        self._write(rec, batch, res.options, timings)
        self._flag_collapse(rec)
        timings["total"] = time.perf_counter() - t_start
        self.state["iteration"] = it
        self.state["elapsed_s"] += timings["total"]
        rec["time_s"] = self.state["elapsed_s"]
        rec["timings"] = timings
        rec["throughput"] = {
            "rollout_tokens_per_sec": rollout_tokens / timings["rollout"] if timings["rollout"] > 0 else math.nan,
            "update_tokens_per_sec": upd.get("update_tokens", 0) / timings["update"] if timings["update"] > 0 else math.nan,
        }
        self.run.append_metrics(rec)
        t = time.perf_counter()
        self._checkpoint()
        rec["timings"]["checkpoint"] = time.perf_counter() - t
        self.history.append(rec)
        return rec

    def _collect(self, timings: dict) -> TrajectoryBatch:
        """The iteration's rollout, with the values the estimator reads (the critic's, or the oracle's)
        and the reference's log-probs (``kl_coef > 0``); ``timings`` gets ``rollout``,
        ``rollout_oracle`` and ``values``."""
        cfg = self.cfg
        t = time.perf_counter()
        inner: dict = {}
        batch = self._rollout(cfg.episodes, seed=self._next_seed(), group_size=cfg.group_size, timings=inner)
        if cfg.critic == "expert":
            batch = _oracle_as_values(batch, cfg.env)
        # the rollout runs the critic once over the finished episodes: that is the "values" phase
        critic_s = float(inner.get("critic", 0.0))
        timings["rollout"] = time.perf_counter() - t - critic_s
        timings["rollout_oracle"] = float(inner.get("oracle", 0.0))
        t = time.perf_counter()
        if cfg.critic == "mc":
            batch = self._mc_values(batch)
            timings["mc"] = time.perf_counter() - t
            t = time.perf_counter()
        if self.reference is not None:
            batch = self._ref_logprobs(batch)
        timings["values"] = time.perf_counter() - t + critic_s
        return batch

    def _mc_values(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """``critic="mc"``: the current policy's Monte-Carlo values at every turn start of the batch
        (``mc_samples`` branch rollouts each, seeded from the run's seed and cursor), read as
        ``values``: ``mc_value[k]`` broadcast over turn k's tokens (its observation tokens too),
        terminal after the last action token. The batch keeps the ``mc_*`` fields."""
        cfg = self.cfg
        m = cfg.mc_samples if cfg.mc_samples is not None else MC_SAMPLES
        out = mc_truth(batch, self.policy, m=m, seed=self._next_seed(), env=self.env,
                       batch_size=max(cfg.rollout_batch_size, m), progress=False)
        tids = out.field("turn_ids")
        values = [np.asarray(v, dtype=np.float32)[np.asarray(t, dtype=np.int64)] if len(t) else np.zeros(0, np.float32)
                  for v, t in zip(out.field("mc_value"), tids)]
        return out.with_token_fields(values=values).with_meta(values_source="mc")

    def _mc_targets(self, batch: TrajectoryBatch) -> torch.Tensor:
        """The Monte-Carlo returns of ``batch`` on the estimator's clock (:func:`~mpo_viz.advantages.estimator_clock`:
        its γ, and γ_T where it has one, else γ): the warm-up's targets and RL's ``value_target="mc"``."""
        return mc_returns(batch, **estimator_clock(self.cfg.estimator, self.cfg.estimator_options))

    def _saves(self, it: int) -> bool:
        """Whether iteration ``it`` writes its trajectories (every ``save_trajectories_every``)."""
        k = self.cfg.save_trajectories_every
        return bool(k) and it % k == 0

    def _after_update(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """``batch``, the rollout the update just trained on, with what the update did to it: per
        token ``ratio`` and ``clipped``, per turn ``turn_ratio`` and ``turn_clipped``
        (:func:`~mpo_viz.train.update.after_update`: one no-grad forward of the updated policy)."""
        seen = after_update(self.policy.model, rows_of(batch), UpdateSettings.of(self.cfg), pad_id=self.pad_id,
                            device=self.device)
        return seen.attach(batch)

    def _write(self, rec: dict, batch: TrajectoryBatch, options: dict, timings: dict) -> None:
        """``trajectories/iter=N.parquet`` every ``save_trajectories_every`` iterations."""
        cfg = self.cfg
        it = rec["iteration"]
        t = time.perf_counter()
        if self._saves(it):
            batch.meta["iteration"] = it
            batch.meta["estimator"] = cfg.estimator
            batch.meta["estimator_options"] = options
            if "critic_explained_var" in rec:  # the values against these returns, before the critic's update on them
                ev = rec["critic_explained_var"]
                batch.meta["critic_explained_var"] = ev if ev is not None and math.isfinite(ev) else None  # None: undefined
            self.run.write_trajectories(batch, it, max_mb=cfg.trajectories_max_mb)
        timings["write"] = time.perf_counter() - t

    def _update(self, batch: TrajectoryBatch) -> dict:
        """The policy's ``epochs`` and, apart, the critic's ``critic_epochs`` passes over ``batch``
        (a shared-trunk critic moves with the policy instead). Critic metrics of the separate pass
        are ``value_loss``, ``vf_*``, ``critic_grad_norm``, ``critic_optimizer_steps``."""
        cfg = self.cfg
        r = rows_of(batch)
        common = dict(generator=self.generator, pad_id=self.pad_id, device=self.device)
        value_clip = cfg.critic_option("value_clip") if self.critic is not None else None
        joint = self.critic is not None and getattr(self.critic, "shared", False)
        learners = Learners(self.policy.model, self.policy_opt, self.critic if joint else None,
                            self.critic_opt if joint else None)
        apart = self.critic is not None and not joint
        critic_settings = UpdateSettings.of(cfg, epochs=cfg.critic_option("critic_epochs"), value_clip=value_clip)
        critic_learners = Learners(critic=self.critic, critic_opt=self.critic_opt)
        worker = None
        if apart and cfg.side_thread and self.critic is not None and _parallel_ok(self.policy.model, self.critic,
                                                                                  self.device):
            # the critic's pass in a second thread beside the policy's: the two share no parameter, and
            # the critic's shuffles come from a copy of the generator advanced past the policy's
            # (``epochs`` permutations), so both passes draw what they drew one after the other
            g = torch.Generator().manual_seed(0)
            g.set_state(self.generator.get_state())
            for _ in range(cfg.epochs):
                torch.randperm(len(r), generator=g)
            pool = side_pool()
            worker = pool.submit(update_epochs, r, critic_learners, critic_settings, **{**common, "generator": g})
            pool.shutdown(wait=False)
        try:
            out = update_epochs(r, learners, UpdateSettings.of(cfg, value_clip=value_clip), **common)
        finally:
            if worker is not None:  # the critic's pass ends before anything else happens
                wait([worker])
        if worker is not None:
            c = worker.result()
            self.generator.set_state(g.get_state())
        elif apart:
            c = update_epochs(r, critic_learners, critic_settings, **common)
        if apart:
            out["critic_optimizer_steps"] = c.pop("optimizer_steps")
            out["critic_update_tokens"] = c.pop("update_tokens")
            out.update(c)
        return out

    def _value_stats(self, batch: TrajectoryBatch, returns) -> dict:
        """Explained variance of the critic and the across/within split of its values (and of the
        oracle values when the environment provides them)."""
        out = {}
        if batch.has("values"):  # a learned critic's values, the expert's (critic="expert"), or Monte-Carlo
            out["critic_explained_var"] = _explained_variance(batch, returns)
            s = variance_summary(value_variance(batch))
            out.update({"values_across": s["mean_across"], "values_within": s["mean_within"],
                        "values_across_within_ratio": s["median_ratio"]})
        if batch.has("oracle_values"):
            s = variance_summary(value_variance(batch, batch.padded("oracle_values"), name="oracle_values"))
            out.update({"oracle_across": s["mean_across"], "oracle_within": s["mean_within"],
                        "oracle_across_within_ratio": s["median_ratio"]})
            values = batch.values
            if values is not None and self.cfg.critic == "learned":
                m = batch.mask.bool()
                err = (values - batch.padded("oracle_values"))[m]
                out["critic_oracle_mae"] = float(err.abs().mean()) if err.numel() else math.nan
        return out

    def _abandon(self, message: str) -> None:
        """After a KeyboardInterrupt: back to the last checkpoint (memory and disk agree), mark the
        trainer interrupted and say so; the run folder stays resumable."""
        self._restore_usable()
        self.interrupted = True
        self._say(message)

    def _say(self, line: str) -> None:
        if not self.quiet:
            print(line, file=sys.stderr, flush=True)


def _explained_variance(batch: TrajectoryBatch, returns) -> float:
    """The explained variance of the batch's values against ``returns`` (NaN without values)."""
    return explained_variance(returns, batch.values, batch.mask) if batch.has("values") else math.nan


def _weights_digest(model: torch.nn.Module) -> bytes:
    """A digest of every tensor of ``model``'s state (names, shapes, dtypes, bytes): equal digests
    are equal weights, bit for bit (a few ms for the tiny models)."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in model.state_dict().items():
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


def _oracle_as_values(batch: TrajectoryBatch, env: str):
    """The batch with the scripted expert's exact values as its ``values`` (``critic="expert"``);
    terminal after the last action token (no bootstrap: a cut episode's return is 0, as its rewards
    say)."""
    if not batch.has("oracle_values"):
        raise ValueError(f"critic: 'expert' reads the environment's exact values, found a rollout of {env!r} without "
                         f"oracle_values (its environment has no exact model; use critic='learned')")
    return batch.with_token_fields(values=batch.padded("oracle_values", torch.float32))


def sft_line(rec: dict, start: Path | None) -> str:
    """The line after SFT: steps, greedy success against the target (a missed target said so, in
    the same line), and where the start was kept."""
    steps, succ, target = rec.get("sft_steps"), rec.get("sft_success", math.nan), rec.get("sft_target_success")
    if steps == 0:
        return f"sft: none needed, the start's greedy success {succ:.3f} already meets the target {target:g}"
    head = f"sft: {steps} steps, greedy success {succ:.3f}, loss {rec.get('sft_loss', math.nan):.3f}"
    if target is not None and not succ >= target:
        head += (f"; MISSED the target {target:g} (the budget of {steps} steps ended first): RL starts from a weak "
                 f"policy; raise --sft-steps or start from a saved start (--model-dir)")
    return head + (f"; start kept in {start} (--model-dir {start})" if start is not None else "")


#: what to do when the warm-up's pool taught the critic nothing but a constant (critic_fit.CONSTANT_STOPS)
WARMUP_CONSTANT_ADVICE = ("RL starts from a critic that predicts that constant, and critic-based advantages are then "
                          "the bare returns; what helps: a start that succeeds sometimes (more SFT: --sft-steps, "
                          "or --model-dir of a stronger start), a larger pool (--critic-warmup-episodes), or "
                          "shaped rewards (per-turn rewards of the environment)")


def warmup_line(rec: dict) -> str:
    """The one line the critic warm-up ends with: the fit's summary (steps, held-out EV, why it
    stopped); when the pool's returns left nothing to learn, what happened and what to do."""
    steps, ev, stop = rec.get("warmup_steps"), rec.get("warmup_explained_var", math.nan), rec.get("warmup_stop")
    if stop == "constant":
        return (f"critic warm-up: stopped at once (0 steps): every return of the {rec.get('warmup_episodes')} pool "
                f"episodes is {rec.get('warmup_constant'):.4g}, so there is nothing for a critic to learn and the "
                f"gate cannot pass; the critic was set to that constant. {WARMUP_CONSTANT_ADVICE}")
    if stop == "heldout_constant":
        return (f"critic warm-up: stopped at once (0 steps): the returns of the {rec.get('warmup_heldout_episodes')} "
                f"held-out pool episodes are all equal, so their explained variance is undefined and the gate "
                f"{rec.get('warmup_gate'):g} cannot pass; the critic was set to the training episodes' mean return "
                f"{rec.get('warmup_constant'):.4g}. {WARMUP_CONSTANT_ADVICE}")
    return rec.get("warmup_summary") or f"critic fit: {steps} steps, held-out explained variance {ev:.3f}"


def progress_line(rec: dict, total: int | None = None) -> str:
    """One line per iteration for the shell and the log."""
    it = rec.get("iteration")
    head = f"iter {it}" + (f"/{total}" if total else "")
    bits = [head, f"success {rec.get('success', float('nan')):.3f}", f"reward {rec.get('reward_mean', float('nan')):+.3f}"]
    if "eval_success" in rec:
        bits.append(f"eval {rec['eval_success']:.3f}")
    for k, fmt in (("policy_loss", "{:+.4f}"), ("value_loss", "{:.4f}"), ("approx_kl", "{:.4f}"),
                   ("clipfrac", "{:.3f}"), ("critic_explained_var", "{:.3f}")):
        if k in rec and rec[k] is not None:
            bits.append(f"{k} " + fmt.format(rec[k]))
    tm = rec.get("timings", {})
    if tm:
        bits.append(f"{tm.get('total', float('nan')):.1f}s")
    if rec.get("collapse"):
        since = rec.get("collapse_since") or [None] * len(rec["collapse"])
        bits.append("collapse? " + ", ".join(m if it is None else f"{m} since iteration {it}"
                                             for m, it in zip(rec["collapse"], since)))
    return " | ".join(bits)


def _parallel_ok(policy: torch.nn.Module, critic: torch.nn.Module, device) -> bool:
    """Whether the critic's update may run in a second thread beside the policy's: a CPU with a core
    beyond torch's threads, and no dropout in either model (dropout draws from torch's global
    generator, whose draws two threads would interleave in a racing order; with none, each thread's
    numbers are those of the passes run one after the other)."""
    if torch.device(device).type != "cpu" or not spare_cores():
        return False
    for model in (policy, critic):
        if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
            return False
        for cfg in {id(c): c for c in (getattr(model, "config", None), getattr(getattr(model, "trunk", None),
                                                                                  "config", None)) if c}.values():
            if any(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                   for k, v in cfg.to_dict().items() if "dropout" in k or "pdrop" in k):
                return False
    return True
