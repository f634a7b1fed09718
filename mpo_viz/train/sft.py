"""SFT warm start: imitate the environment's noisy scripted expert (or, for an environment without a
finite model, its own ``expert(rng)``).

Each step plays ``sft_batch_episodes`` fresh expert episodes (noise ``sft_noise``; seeds derived
from the run's seed and the step, so SFT is reproducible) with
:func:`mpo_viz.envs.generate.run_episode`, laid out by the policy's own chat layout, and takes one
AdamW step on the cross-entropy of their action tokens::

    loss = −(1/N) Σ_{i,t} m_{i,t} · log π_θ(y_{i,t} | prefix)        N = the step's action tokens

(micro-batched under ``micro_batch_tokens`` with ``scale = N``). Every ``sft_eval_interval`` steps a
greedy evaluation on the held-out tasks decides the stop: SFT ends once success reaches the target —
a warm start, not a solution, so RL keeps headroom.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.generate import run_episode
from mpo_viz.envs.protocol import play_expert
from mpo_viz.envs.registry import make_env
from mpo_viz.losses import aggregate
from mpo_viz.train.runtime import derive_seed, env_kwargs
from mpo_viz.train.update import Rows, forward_policy, make_micro, micro_batches

__all__ = ["expert_rows", "sft", "sft_estimate", "ESTIMATE_AFTER"]

#: SFT steps timed before the estimate of the whole SFT is said
ESTIMATE_AFTER = 3


def expert_rows(env, policy, *, n: int, noise: float, seeds) -> tuple[Rows, float]:
    """``n`` noisy-expert episodes as :class:`~mpo_viz.train.update.Rows` (ids and mask only) and
    their success rate."""
    expert = NoisyExpert(noise=noise)
    seqs, plen, rlen, masks, succ = [], [], [], [], []
    for s in seeds[:n]:
        if getattr(env, "finite_model", True):
            ep = run_episode(env, expert, policy.layout, seed=int(s))
        else:  # an environment's own expert (no noise rate: it is used as it is)
            ep = play_expert(env, policy.layout, seed=int(s))
        p, r = ep["prompt_ids"], ep["response_ids"]
        seqs.append(torch.tensor(list(p) + list(r), dtype=torch.int64))
        plen.append(len(p))
        rlen.append(len(r))
        masks.append(ep["loss_mask"])
        succ.append(ep["success"])
    L = max(rlen)
    mask = torch.zeros((n, L), dtype=torch.bool)
    for i, m in enumerate(masks):
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.bool)
    rows = Rows(
        seqs=seqs,
        prompt_len=np.array(plen),
        resp_len=np.array(rlen),
        mask=mask,
        turn_ids=torch.zeros((n, L), dtype=torch.int64),
        old_logp=None,
        rollout_logp=None,
        advantages=None,
        returns=None,
        values=None,
        ref_logp=None,
    )
    return rows, float(np.mean(succ))


def _sft_step(trainer, env, opt, step: int) -> tuple[float, int, float]:
    """One SFT step on fresh expert episodes: ``(loss, action tokens, the episodes' success rate)``."""
    cfg, model = trainer.cfg, trainer.policy.model
    seeds = [derive_seed(cfg.seed, "sft", step, j) for j in range(cfg.sft_batch_episodes)]
    r, es = expert_rows(env, trainer.policy, n=cfg.sft_batch_episodes, noise=cfg.sft_noise, seeds=seeds)
    n_tok = float(r.mask.sum())
    model.train()
    total = 0.0
    for rows in micro_batches(r, np.arange(len(r)), cfg.micro_batch_tokens):
        mb = make_micro(r, rows, trainer.pad_id, trainer.device)
        logp, _ = forward_policy(model, mb)
        mask = mb.take(r.mask).to(trainer.device)
        loss = -aggregate(logp, mask, "token-mean", scale=n_tok)
        loss.backward()
        total += float(loss.detach())
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.eval()
    return total, int(n_tok), es


def _duration(s: float) -> str:
    return f"about {s:.0f} s" if s < 120 else f"about {s / 60:.1f} min"


def sft_estimate(cfg, steps: int, step_s: float, target: float) -> str:
    """The line that says how long SFT will take and why: the step budget × the measured seconds
    per step, the evaluations on the way, and the stop."""
    n_evals = steps // cfg.sft_eval_interval
    return (
        f"sft: up to {steps} steps x {step_s:.2f} s per step (measured on the first {ESTIMATE_AFTER}, "
        f"{cfg.sft_batch_episodes} expert episodes each) = {_duration(steps * step_s)}, plus {n_evals} "
        f"greedy evaluations of {cfg.eval_episodes} tasks (every {cfg.sft_eval_interval} steps); it stops "
        f"early once greedy success reaches {target:g}. A new {cfg.model_size} model copies nothing from its context "
        f"for its first few hundred steps (success 0 until then); --model-dir starts from a saved start "
        f"instead (trajectories/starts/automation, or RUN/start of an earlier run)"
    )


def sft(trainer, *, steps: int, target: float, log=None) -> dict:
    """Run the SFT warm start of ``trainer`` (see the module docstring); returns its summary:
    ``sft_steps``, ``sft_loss`` (last step), ``sft_success`` (last greedy eval), ``sft_expert_success``
    (the imitated expert's success), ``sft_tokens``. ``log(line)`` receives :func:`sft_estimate`
    after the first :data:`ESTIMATE_AFTER` steps. A start loaded from ``cfg.model_dir`` is
    evaluated before the first step, and one that already meets ``target`` takes no step."""
    cfg = trainer.cfg
    env = make_env(cfg.env, **env_kwargs(cfg))
    opt = torch.optim.AdamW(
        [p for p in trainer.policy.model.parameters() if p.requires_grad], lr=cfg.sft_lr, weight_decay=cfg.weight_decay
    )
    loss_v, success, expert_succ, tokens, done = math.nan, math.nan, [], 0, 0
    bar = tqdm(range(steps), desc="sft", disable=trainer.quiet or steps == 0, leave=False)
    t0 = time.perf_counter()
    for step in bar:
        # a start loaded from a folder is checked first: one that already meets the target needs no SFT
        if step % cfg.sft_eval_interval == 0 and (step > 0 or cfg.model_dir):
            success = trainer.evaluate_one()["eval_success"]
            bar.set_postfix(
                **({"loss": f"{loss_v:.3f}"} if done else {}), success=f"{success:.2f}"
            )  # no loss before a step
            if success >= target:
                break
            t0 = t0 if step else time.perf_counter()
        if step == ESTIMATE_AFTER and log is not None:
            with tqdm.external_write_mode(file=sys.stderr):  # a line of its own, above the progress bar
                log(sft_estimate(cfg, steps, (time.perf_counter() - t0) / ESTIMATE_AFTER, target))
        loss_v, n_tok, es = _sft_step(trainer, env, opt, step)
        expert_succ.append(es)
        tokens, done = tokens + n_tok, step + 1
    else:
        if steps > 0:
            success = trainer.evaluate_one()["eval_success"]
    bar.close()
    return {
        "sft_steps": done,
        "sft_loss": loss_v,
        "sft_success": success,
        "sft_expert_success": float(np.mean(expert_succ)) if expert_succ else math.nan,
        "sft_tokens": tokens,
        "sft_target_success": target,
    }
