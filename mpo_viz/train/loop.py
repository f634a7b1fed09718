"""The trainer: SFT warm start, critic warm-up, then RL iterations writing a run folder.

One iteration::

    rollout N episodes (G per task)          mpo_viz.rollout.rollout  -> values, log-probs, rewards
    Monte-Carlo values (critic="mc")         mpo_viz.rollout.truth.mc_truth: branch rollouts per turn start
    reference log-probs (kl_coef > 0)        one no-grad forward of the frozen reference policy
    advantages and returns                   mpo_viz.advantages.compute(batch, estimator, **options)
    E epochs × M minibatches of updates      mpo_viz.train.update (policy_loss, value_loss)
    what the update did (saved iterations)   one no-grad forward: per-token ratio and clip flags
    greedy evaluation (every eval_interval)  mpo_viz.train.evaluate: a fixed held-out set of tasks
    trajectories/iter=N.parquet, metrics.jsonl line, checkpoints/iter=N/ (mpo_viz.train.checkpoint)

Each phase is timed by one :class:`~mpo_viz.timer.Timer`, whose seconds are the line's ``timings``;
the console lines are :mod:`mpo_viz.train.summary`'s.

Invariant: every draw comes from a seeded source whose state is checkpointed — the rollout seed is
``derive(seed, "rollout", cursor)`` with a cursor that advances per rollout; shuffles come from the
trainer's ``torch.Generator``; evaluation tasks are fixed by ``derive(seed, "eval")``. So a run
stopped after iteration k and resumed is bit-for-bit the run that never stopped (on CPU).
"""

from __future__ import annotations

import copy
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from mpo_viz import models
from mpo_viz.advantages import compute, estimator_clock, mc_returns
from mpo_viz.checks import OptionError
from mpo_viz.data.runfolder import RunFolder
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.envs.registry import make_env
from mpo_viz.losses import get_loss
from mpo_viz.timer import Timer
from mpo_viz.train.checkpoint import (
    capture_rng,
    load_checkpoint,
    restore_usable,
    resume_config,
    save_checkpoint,
    save_start,
)
from mpo_viz.train.collapse import mark_line
from mpo_viz.train.config import EXPERT_BIAS, Config, ExpertCriticWarning
from mpo_viz.train.evaluate import Evaluator, episode_stats, value_stats
from mpo_viz.train.export import load_model
from mpo_viz.train.runtime import (
    build_models,
    derive_seed,
    env_kwargs,
    mc_values,
    play,
    set_threads,
)
from mpo_viz.train.sft import sft as run_sft
from mpo_viz.train.summary import collapse_warning, eval_line, progress_line, sft_line, warmup_line
from mpo_viz.train.trackers import Tracker, attach_tracker, check_available
from mpo_viz.train.update import (
    Learners,
    UpdateSettings,
    after_update,
    check_loss_inputs,
    reference_logprobs,
    rows_of,
    update_with_critic,
)
from mpo_viz.train.warmup import warm_up

__all__ = ["Trainer", "RESULT_KEYS_VOLATILE"]

#: metric keys that measure time (they differ between two runs that are otherwise bit-identical):
#: an iteration's phases are its ``timings``; the SFT, warm-up and evaluation lines' are ``seconds``
#: (kept apart, so that the dashboard's stack of ``timings`` stays the iterations' own)
RESULT_KEYS_VOLATILE = ("time_s", "timings", "seconds", "throughput")


class Trainer:
    """Train a policy (and critic) on an environment, writing a run folder.

    ``Trainer(cfg, run_dir)`` starts a new run (``run_dir`` must not hold one yet);
    :meth:`resume` continues one. Steps: :meth:`sft`, :meth:`warmup_critic`, :meth:`iterate`
    (a generator of per-iteration metrics), :meth:`evaluate` (greedy and sampled; :meth:`evaluate_one` for one);
    :meth:`run_all` does them all.

    Attributes: ``cfg``, ``run`` (:class:`~mpo_viz.data.runfolder.RunFolder`), ``env``, ``policy``
    (:class:`mpo_viz.models.Policy`), ``critic`` (or None), ``reference`` (frozen policy model, or
    None), ``evaluator`` (:class:`~mpo_viz.train.evaluate.Evaluator`), ``iteration`` (completed RL
    iterations), ``history`` (the metrics written this session).
    """

    def __init__(self, cfg: Config, run_dir, *, _resume: bool = False, quiet: bool = False):
        if not isinstance(cfg, Config):
            raise ValueError(f"cfg: expected a mpo_viz.train.Config, found {type(cfg).__name__}")
        self.cfg = cfg
        self.run = RunFolder(run_dir)
        self.quiet = quiet
        if not _resume and (self.run.checkpoints / "latest").exists():
            raise ValueError(
                f"run_dir: {str(self.run.path)!r} already holds a run (checkpoints/latest); "
                f"continue it with Trainer.resume({str(self.run.path)!r}) or pick a new folder"
            )
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
        _check_env(cfg, self.env)
        self._noticed = False
        self.policy, self.critic = build_models(cfg, self.env, self.device, load=load_model)
        self.pad_id = self.policy.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.policy.tokenizer.eos_token_id or 0
        self.reference: torch.nn.Module | None = None
        p_params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.policy_opt = torch.optim.AdamW(p_params, lr=cfg.policy_lr, weight_decay=cfg.weight_decay)
        self.critic_opt = None
        if self.critic is not None:
            own = self.critic.own_parameters()
            self.critic_opt = torch.optim.AdamW(own, lr=cfg.critic_option("critic_lr"), weight_decay=cfg.weight_decay)
        self.generator = torch.Generator().manual_seed(derive_seed(cfg.seed, "shuffle"))
        self.state: dict[str, Any] = {
            "iteration": 0,
            "seed_cursor": 0,
            "sft_done": False,
            "critic_warm": False,
            "elapsed_s": 0.0,
            "config_hash": cfg.hash(),
            "config": cfg.to_dict(),
        }
        self.lagged: list = []  # rollouts waiting for their update (policy_lag)
        self.evaluator = Evaluator(cfg, self.env)
        self.evaluator.notice = self._first_notice

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

    # ------------------------------------------------------------------ checkpoints and resume
    def _checkpoint(self) -> Path:
        batches = {f"lag{i}": b for i, b in enumerate(self.lagged)}
        state = {
            **self.state,
            "n_lagged": len(self.lagged),
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        return save_checkpoint(
            self.run.checkpoints,
            self.iteration,
            modules=self._modules(),
            optimizers=self._optimizers(),
            rng=capture_rng({"shuffle": self.generator}),
            state=state,
            batches=batches,
            keep=self.cfg.keep_checkpoints,
        )

    def _restore(self, path: Path) -> None:
        """Back to the checkpoint at ``path`` (one of another config is refused); the files written
        after it belong to an iteration that did not finish and are cut."""
        ck = load_checkpoint(path)
        ck.check_config(self.cfg)
        if not ck.has_weights("reference"):
            self.reference = None
        elif self.reference is None:
            self.reference = self._frozen_copy()
        ck.restore(self._modules(), self._optimizers(), {"shuffle": self.generator})
        self.state = ck.train_state()
        self.lagged = ck.lagged()
        self.run.truncate_metrics(self.iteration)
        self.run.remove_trajectories_after(self.iteration)

    def _restore_usable(self) -> Path:
        """Restore the newest checkpoint that reads (a damaged one is skipped for the previous one:
        :func:`~mpo_viz.train.checkpoint.restore_usable`)."""
        return restore_usable(self.run.checkpoints, self._restore)

    def _frozen_copy(self):
        ref = copy.deepcopy(self.policy.model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    @classmethod
    def resume(
        cls, run_dir, cfg: Config | None = None, *, iterations: int | None = None, quiet: bool = False
    ) -> Trainer:
        """Continue the run in ``run_dir`` from its latest checkpoint.

        ``cfg``: the config to continue with (default: the folder's ``config.json``); one that
        differs in anything but ``iterations`` is refused, naming the fields. ``iterations``: the new
        total of RL iterations (updates ``config.json``).
        """
        run = RunFolder(run_dir)
        stored = resume_config(run, cfg, iterations)
        tr = cls(stored, run_dir, _resume=True, quiet=quiet)
        tr._restore_usable()
        stored.save(run.config_path)
        tr._open_tracker(resume_from=tr.iteration)
        return tr

    def _open_tracker(self, resume_from: int | None = None) -> None:
        """Mirror every metrics line to ``cfg.log_to`` from now on (a tracker opened for the first
        time on a resumed run first receives the lines already written)."""
        if self.cfg.log_to:
            self.tracker = attach_tracker(self.cfg.log_to, self.run, self.cfg.to_dict(), resume_from=resume_from)

    def close(self) -> None:
        """Close the experiment tracker (``cfg.log_to``), if any; the run folder needs no closing."""
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
            self.run.mirror = None

    # ------------------------------------------------------------------ rollouts and evaluation
    def _rollout(self, n: int, *, seed: int, group_size: int = 1, timings: dict | None = None):
        """``n`` episodes of the current policy with the run's sampling settings, the critic's values recorded."""
        return play(
            self.cfg,
            self.policy,
            self.env,
            n,
            seed=seed,
            group_size=group_size,
            critic=self.critic,
            timings=timings,
            notice=self._first_notice(),
        )

    def _first_notice(self):
        """The console for this session's first rollout (its estimate when the model is untrained, and
        text lost to ``[UNK]``), None for every later one."""
        if self._noticed or self.quiet:
            return None
        self._noticed = True
        return self._say

    def _next_seed(self) -> int:
        s = derive_seed(self.cfg.seed, "rollout", self.state["seed_cursor"])
        self.state["seed_cursor"] += 1
        return s

    @property
    def eval_seconds(self) -> float:
        """Wall seconds this trainer spent playing evaluation episodes (a reused evaluation costs none)."""
        return self.evaluator.seconds

    def evaluate_one(self, n_episodes: int | None = None, *, greedy: bool = True) -> dict:
        """Success and reward of the current policy on the fixed held-out tasks, greedy (keys
        ``eval_success``, ``eval_reward_mean``, ``eval_reward_std``, ``eval_turns_mean``, ...; see
        :func:`~mpo_viz.train.evaluate.episode_stats`) or sampled at the rollout's temperature
        (``greedy=False``: keys ``eval_sampled_success``, ...). The tasks and the sampling seeds are
        fixed by ``cfg.eval_key``: the same at every evaluation and in every run that shares it. Draws
        from no training RNG. An evaluation of weights already evaluated (bit for bit: a digest of
        the policy's state) returns the earlier result, which a rerun would reproduce, without
        playing the episodes again."""
        return self.evaluator.one(self.policy, n_episodes, greedy=greedy)

    def evaluate(self, n_episodes: int | None = None) -> dict:
        """Both evaluations of :meth:`evaluate_one` (greedy and sampled) on the held-out set, with
        ``eval_seed`` and ``n_eval_tasks``: what RL moves first is the sampled success."""
        return self.evaluator.both(self.policy, n_episodes)

    def pass_at_k(self, n_tasks: int = 64, n_samples: int = 8, ks=None) -> dict:
        """pass@k of the current policy on the first ``n_tasks`` held-out tasks, ``n_samples``
        sampled episodes each (fixed seeds), for k = 1 … ``n_samples`` (or ``ks``): the unbiased
        estimator ``mean_tasks [1 − C(n − c, k) / C(n, k)]`` with c successes of n samples
        (:func:`mpo_viz.analysis.pass_at_k`). Returns ``{"pass@k": value, ...}`` plus
        ``pass_tasks`` and ``pass_samples``."""
        return self.evaluator.pass_at_k(self.policy, n_tasks, n_samples, ks)

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
        timer, e0 = Timer(), self.eval_seconds
        try:
            with timer.phase("sft"):
                res = run_sft(self, steps=steps, target=target, log=self._say)
        except KeyboardInterrupt:
            self._abandon("interrupted: SFT abandoned; the run is back at its last checkpoint (resumable)")
            return {}
        self.state["sft_done"] = True
        took, evals = timer.t["sft"], self.eval_seconds - e0
        self.state["elapsed_s"] += took
        rec = {
            "iteration": 0,
            "phase": "sft",
            "time_s": self.state["elapsed_s"],
            **res,
            "seconds": {"sft": took - evals, "eval": evals},
        }
        self._append(rec)
        if res["sft_steps"] > 0:
            save_start(
                self.run,
                self.policy,
                self.critic if self.state["critic_warm"] else None,
                sft_record=rec,
                config_hash=self.cfg.hash(),
            )
        self._checkpoint()
        return rec

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
        (default: the console) receives one line, :func:`~mpo_viz.train.summary.warmup_line`.
        """
        cfg = self.cfg
        if self.critic is None:
            raise ValueError(
                f"warmup_critic: no learned critic to warm up (estimator {cfg.estimator!r}, critic={cfg.critic!r})"
            )
        steps = cfg.critic_option("critic_warmup_steps") if steps is None else int(steps)
        gate = cfg.critic_option("critic_warmup_ev") if gate is None else float(gate)
        n_pool = cfg.critic_option("critic_warmup_episodes")
        timer = Timer()
        try:
            with timer.phase("warmup_pool"):
                self._say(f"critic warm-up: rolling out a pool of {n_pool} episodes of the start policy")
                pool = self._rollout(n_pool, seed=derive_seed(cfg.seed, "critic-warmup"), group_size=1)
            with timer.phase("warmup_fit"):
                fit, split = warm_up(
                    self.critic,
                    pool,
                    self._mc_targets(pool),
                    cfg,
                    steps=steps,
                    gate=gate,
                    pad_id=self.pad_id,
                    device=self.device,
                    log=None if self.quiet else self._say,
                )
        except KeyboardInterrupt:
            self._abandon("interrupted: critic warm-up abandoned; the run is back at its last checkpoint (resumable)")
            return {}
        self.state["critic_warm"] = True
        self.state["elapsed_s"] += sum(timer.t.values())
        rec = {
            "iteration": self.iteration,
            "phase": "critic_warmup",
            "time_s": self.state["elapsed_s"],
            "warmup_steps": fit.steps,
            "warmup_explained_var": fit.heldout_ev,
            "warmup_gate": gate,
            "warmup_passed": fit.passed,
            "warmup_stop": fit.stop,
            "warmup_best_explained_var": fit.best_ev,
            "warmup_train_explained_var": fit.train_ev,
            "warmup_episodes": n_pool,
            "warmup_heldout_episodes": fit.n_heldout,
            "warmup_history": fit.history,
            "warmup_summary": fit.summary(),
            "warmup_constant": fit.constant,
            **{f"warmup_{k}": v for k, v in split.items() if k != "critic_explained_var"},
            "seconds": dict(timer.t),
        }
        (log or self._say)(warmup_line(rec))
        self._append(rec)
        if self.run.start.is_dir():  # this run's SFT start: keep its critic beside it
            save_start(self.run, self.policy, self.critic)
        self._checkpoint()
        return rec

    def _mc_targets(self, batch: TrajectoryBatch) -> torch.Tensor:
        """The Monte-Carlo returns of ``batch`` on the estimator's clock (:func:`~mpo_viz.advantages.estimator_clock`:
        its γ, and γ_T where it has one, else γ): the warm-up's targets and RL's ``value_target="mc"``."""
        return mc_returns(batch, **estimator_clock(self.cfg.estimator, self.cfg.estimator_options))

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
                self._abandon(
                    f"interrupted: iteration {self.iteration + 1} abandoned; the run is at iteration "
                    f"{self.iteration} (resume with Trainer.resume or mpo-viz train --resume)"
                )
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
            log(eval_line(self._eval_line()))
        out = []
        for rec in self.iterate(max(total - self.iteration, 0)):
            out.append(rec)
            log(progress_line(rec, total))
        if out and "eval_success" not in out[-1] and not self.interrupted:
            log(eval_line(self._eval_line(), final=True))
        return out

    def _eval_line(self) -> dict:
        """Both evaluations at the current iteration, written as a ``phase: "eval"`` metrics line
        (flagged like an iteration's line, see :meth:`_flag_collapse`); returns the line."""
        timer = Timer()
        with timer.phase("eval"):
            rec = {"iteration": self.iteration, "phase": "eval", "time_s": self.state["elapsed_s"], **self.evaluate()}
        rec["seconds"] = dict(timer.t)
        self._flag_collapse(rec)
        self._append(rec)
        return rec

    def _flag_collapse(self, rec: dict) -> None:
        """Mark ``rec`` with the collapse signatures it shows (``rec["collapse"]``: the metrics, see
        :mod:`mpo_viz.train.collapse`) read against the run's earlier lines, and warn in the
        console of each that the previous line did not show. ``rec["collapse_since"]``: the iteration
        where each one's stretch of flagged lines began; the warning names the first iteration the
        run ever flagged it at and the command that lists the episodes behind it."""
        span = get_loss(self.cfg.loss).span_ratio  # the ratio_max rule: turn- or sequence-level clips only
        for message, first in mark_line(rec, self.run.metrics(), span_ratio=span):
            self._say(collapse_warning(message, first, self.run.path))

    def _start_evaluated(self) -> bool:
        """Whether the run folder already holds the evaluation before the first RL iteration."""
        return any(r.get("phase") == "eval" and r.get("iteration") == 0 for r in self.run.metrics())

    def _one_iteration(self) -> dict:
        cfg = self.cfg
        it = self.iteration + 1
        timer = Timer()  # its phases are the line's timings (in the order they end)
        if cfg.kl_coef > 0 and self.reference is None:
            self.reference = self._frozen_copy()  # the policy as RL starts
        batch = self._collect(timer)
        rollout_tokens = int(batch.mask.sum())

        with timer.phase("advantages"):
            res = compute(batch, cfg.estimator, **cfg.estimator_options)
            batch = res.attach(batch)
            target = res.returns  # what the value loss trains the critic on (value_target)
            if cfg.learns_critic and cfg.critic_option("value_target") == "mc":
                target = self._mc_targets(batch)
                batch = batch.with_token_fields(returns=target)

        rec = {"iteration": it, "phase": "rl", **episode_stats(batch)}
        if cfg.learns_critic:
            rec["value_target"] = cfg.critic_option("value_target")
        rec.update(value_stats(batch, target, learned=cfg.critic == "learned"))

        # policy_lag: train on the rollout of policy_lag iterations ago (none yet: no update)
        self.lagged.append(batch)
        train_batch = self.lagged.pop(0) if len(self.lagged) > cfg.policy_lag else None
        check_loss_inputs(train_batch if train_batch is not None else batch, cfg.loss)

        with timer.phase("update"):
            upd = self._update(train_batch) if train_batch is not None else {}
        rec.update(upd)
        if train_batch is batch and self._saves(it):
            with timer.phase("after_update"):
                batch = self._after_update(batch)

        with timer.phase("eval"):
            if cfg.eval_interval and it % cfg.eval_interval == 0:
                rec.update(self.evaluate())
        with timer.phase("write"):
            self._write(rec, batch, res.options)
        self._flag_collapse(rec)
        timings = timer.t
        timings["total"] = timer.elapsed()
        self.state["iteration"] = it
        self.state["elapsed_s"] += timings["total"]
        rec["time_s"] = self.state["elapsed_s"]
        rec["timings"] = timings
        rec["throughput"] = {
            "rollout_tokens_per_sec": rollout_tokens / timings["rollout"] if timings["rollout"] > 0 else math.nan,
            "update_tokens_per_sec": upd.get("update_tokens", 0) / timings["update"]
            if timings["update"] > 0
            else math.nan,
        }
        self.run.append_metrics(rec)
        with timer.phase("checkpoint"):  # after the line is written: the yielded record's own
            self._checkpoint()
        self.history.append(rec)
        return rec

    def _collect(self, timer: Timer) -> TrajectoryBatch:
        """The iteration's rollout, with the values the estimator reads (the critic's, or the oracle's)
        and the reference's log-probs (``kl_coef > 0``); ``timer`` gets ``rollout``,
        ``rollout_oracle``, ``mc`` (``critic="mc"``) and ``values``."""
        cfg = self.cfg
        inner: dict = {}
        with timer.phase("rollout"):
            batch = self._rollout(cfg.episodes, seed=self._next_seed(), group_size=cfg.group_size, timings=inner)
            if cfg.critic == "expert":
                batch = _oracle_as_values(batch, cfg.env)
        # the rollout runs the critic once over the finished episodes: that is the "values" phase
        critic_s = float(inner.get("critic", 0.0))
        timer.t["rollout"] -= critic_s
        timer.t["rollout_oracle"] = float(inner.get("oracle", 0.0))
        if cfg.critic == "mc":
            with timer.phase("mc"):
                batch = mc_values(cfg, self.policy, self.env, batch, seed=self._next_seed())
        with timer.phase("values"):
            if self.reference is not None:
                batch = reference_logprobs(
                    self.reference,
                    batch,
                    pad_id=self.pad_id,
                    device=self.device,
                    micro_batch_tokens=cfg.micro_batch_tokens,
                )
        timer.t["values"] += critic_s
        return batch

    def _update(self, batch: TrajectoryBatch) -> dict:
        """The policy's ``epochs`` and, apart, the critic's ``critic_epochs`` passes over ``batch``
        (:func:`~mpo_viz.train.update.update_with_critic`; a shared-trunk critic moves with the policy
        instead)."""
        cfg = self.cfg
        value_clip = cfg.critic_option("value_clip") if self.critic is not None else None
        joint = self.critic is not None and getattr(self.critic, "shared", False)
        learners = Learners(
            self.policy.model, self.policy_opt, self.critic if joint else None, self.critic_opt if joint else None
        )
        apart = (
            Learners(critic=self.critic, critic_opt=self.critic_opt) if self.critic is not None and not joint else None
        )
        return update_with_critic(
            rows_of(batch),
            learners,
            UpdateSettings.of(cfg, value_clip=value_clip),
            apart,
            UpdateSettings.of(cfg, epochs=cfg.critic_option("critic_epochs"), value_clip=value_clip),
            generator=self.generator,
            pad_id=self.pad_id,
            device=self.device,
            side_thread=cfg.side_thread,
        )

    def _saves(self, it: int) -> bool:
        """Whether iteration ``it`` writes its trajectories (every ``save_trajectories_every``)."""
        k = self.cfg.save_trajectories_every
        return bool(k) and it % k == 0

    def _after_update(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """``batch``, the rollout the update just trained on, with what the update did to it: per
        token ``ratio`` and ``clipped``, per turn ``turn_ratio`` and ``turn_clipped``
        (:func:`~mpo_viz.train.update.after_update`: one no-grad forward of the updated policy)."""
        seen = after_update(
            self.policy.model, rows_of(batch), UpdateSettings.of(self.cfg), pad_id=self.pad_id, device=self.device
        )
        return seen.attach(batch)

    def _write(self, rec: dict, batch: TrajectoryBatch, options: dict) -> None:
        """``trajectories/iter=N.parquet`` every ``save_trajectories_every`` iterations."""
        it = rec["iteration"]
        if self._saves(it):
            batch.meta["iteration"] = it
            batch.meta["estimator"] = self.cfg.estimator
            batch.meta["estimator_options"] = options
            if "critic_explained_var" in rec:  # the values against these returns, before the critic's update on them
                ev = rec["critic_explained_var"]
                batch.meta["critic_explained_var"] = (
                    ev if ev is not None and math.isfinite(ev) else None
                )  # None: undefined
            self.run.write_trajectories(batch, it, max_mb=self.cfg.trajectories_max_mb)

    def _append(self, rec: dict) -> None:
        """Write ``rec`` as a metrics line and keep it in :attr:`history`."""
        self.run.append_metrics(rec)
        self.history.append(rec)

    def _abandon(self, message: str) -> None:
        """After a KeyboardInterrupt: back to the last checkpoint (memory and disk agree), mark the
        trainer interrupted and say so; the run folder stays resumable."""
        self._restore_usable()
        self.interrupted = True
        self._say(message)

    def _say(self, line: str) -> None:
        if not self.quiet:
            print(line, file=sys.stderr, flush=True)


def _check_env(cfg: Config, env) -> None:
    """Refuse what an environment without a finite model (a reset/step one) cannot do, naming the
    alternative: SFT without an expert of its own, the expert's exact values, Monte-Carlo values
    without ``fork``."""
    if getattr(env, "finite_model", True):
        return
    if cfg.sft_steps > 0 and not getattr(env, "has_expert", False):
        raise OptionError(
            "sft_steps",
            f"expected 0 for the {cfg.env} environment, which has no scripted expert to "
            f"imitate (no finite model, no expert(rng)), found {cfg.sft_steps}; start from a "
            "trained model instead (model_dir: a model folder or a checkpoint)",
        )
    if cfg.critic == "expert" and cfg.uses_critic:
        raise OptionError(
            "critic",
            f"the {cfg.env} environment has no finite model, so no expert's exact values; "
            "expected 'learned' or 'mc', found 'expert'",
        )
    if cfg.critic == "mc" and cfg.uses_critic and not getattr(env, "can_fork", True):
        raise OptionError(
            "critic",
            f"critic='mc' continues the policy from forks of each turn state; the {cfg.env} "
            "environment has no fork(seed) (a copy at the current state that copies the whole "
            "dynamic state, any RNG included); expected 'learned', found 'mc'",
        )


def _oracle_as_values(batch: TrajectoryBatch, env: str):
    """The batch with the scripted expert's exact values as its ``values`` (``critic="expert"``);
    terminal after the last action token (no bootstrap: a cut episode's return is 0, as its rewards
    say)."""
    if not batch.has("oracle_values"):
        raise ValueError(
            f"critic: 'expert' reads the environment's exact values, found a rollout of {env!r} without "
            f"oracle_values (its environment has no exact model; use critic='learned')"
        )
    return batch.with_token_fields(values=batch.padded("oracle_values", torch.float32))
