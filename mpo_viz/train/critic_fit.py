"""Fit a critic to a batch's returns, with a held-out split and an explained-variance gate.

One loop serves the trainer's critic warm-up (a pool of rollouts of the start policy) and fitting a
critic to logged trajectories that carry no values. Per step::

    draw ``batch_episodes`` training episodes (a seeded permutation, epoch by epoch)
    loss = ½ · token-mean over their action tokens of (V_θ(t) − G_t)²       (no value clipping)
    one AdamW step (gradient norm clipped at ``grad_clip``)
    every ``eval_every`` steps: explained variance on the held-out episodes
        EV = 1 − Var(G − V) / Var(G)   over held-out action tokens (population variances)
    stop at the first evaluation with EV ≥ ``gate`` ("gate"), or after ``steps`` ("budget")

Held-out episodes are never trained on. The values are the critic's output at position
``P + t − 1`` for response token ``t`` (the state before the token; docs/models.md), exactly as
the rollout and the trainer's updates read them. Deterministic for a seed on CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from mpo_viz.advantages import mae
from mpo_viz.analysis import explained_variance
from mpo_viz.losses import value_loss
from mpo_viz.train.update import Rows, forward_critic, make_micro, micro_batches, rows_of
from mpo_viz.trajectory import TrajectoryBatch

__all__ = ["CriticFit", "mc_returns", "holdout_split", "critic_outputs", "fit_values"]


@dataclass
class CriticFit:
    """What a fit did: ``steps`` taken, why it stopped (``stop``: ``"gate"`` or ``"budget"``), the
    held-out explained variance at the end (``heldout_ev``) and at its best evaluation
    (``best_ev`` at ``best_step``), the training episodes' EV at the end (``train_ev``), and
    ``history``: one dict per evaluation (``step``, ``heldout_ev``, ``loss`` = the mean training
    loss since the previous evaluation)."""

    steps: int
    stop: str
    gate: float
    heldout_ev: float
    best_ev: float
    best_step: int
    train_ev: float
    n_train: int
    n_heldout: int
    history: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Whether the held-out EV reached the gate."""
        return self.stop == "gate"

    def summary(self) -> str:
        """One line: where the fit stopped and why."""
        if self.passed:
            why = f"passed the gate {self.gate:g}"
        elif math.isnan(self.heldout_ev):
            why = ("the held-out returns are all equal, so the explained variance is undefined and no gate can "
                   "pass (e.g. no held-out episode succeeded)")
        else:
            why = f"the budget of {self.steps} steps ended before the gate {self.gate:g}"
        return (f"critic fit: {self.steps} steps, held-out explained variance {self.heldout_ev:.3f} ({why}; "
                f"{self.n_train} training / {self.n_heldout} held-out episodes)")


def mc_returns(batch: TrajectoryBatch, *, gamma: float = 1.0, turn_gamma: float = 1.0) -> torch.Tensor:
    """``(B, L)`` float64 Monte-Carlo returns of a batch: ``G_t = r_t + γ·G_{t+1}`` over action tokens,
    ``γ_T`` across turn boundaries (observation tokens skipped), 0 after the last action token or
    the batch's ``bootstrap_value`` where a trajectory was cut — MAE's ``critic_target="mc"``."""
    values = torch.zeros(batch.mask.shape, dtype=torch.float64)
    _, ret = mae(batch.padded("rewards", torch.float64), values, batch.mask, turn_ids=batch.turn_ids,
                 gamma=gamma, turn_gamma=turn_gamma, critic_target="mc", bootstrap_value=batch.bootstrap_value)
    return ret


def holdout_split(n: int, share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train, heldout)`` row indices: a seeded permutation of ``n`` rows, the first
    ``max(1, round(share·n))`` held out; both sorted. Needs ``n ≥ 2`` and ``0 < share < 1``."""
    if not 0 < share < 1:
        raise ValueError(f"holdout: expected a share in (0, 1), found {share}")
    if n < 2:
        raise ValueError(f"holdout: a held-out split needs at least 2 trajectories, found {n}")
    k = min(max(1, int(round(share * n))), n - 1)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed))).numpy()
    return np.sort(perm[k:]), np.sort(perm[:k])


def critic_outputs(critic: torch.nn.Module, r: Rows, rows, *, pad_id: int, device, micro_batch_tokens: int = 8192
                   ) -> torch.Tensor:
    """``(len(rows), L)`` float32 values of the critic for ``rows`` of ``r`` (no gradient; 0 past
    each row's response). The same alignment as the rollout's and the updates' values."""
    rows = np.asarray(rows, dtype=np.int64)
    L = r.mask.shape[1]
    out = torch.zeros((len(rows), L), dtype=torch.float32)
    where = {int(i): j for j, i in enumerate(rows)}
    was_training = critic.training
    critic.eval()
    with torch.no_grad():
        for group in micro_batches(r, rows, micro_batch_tokens):
            mb = make_micro(r, group, pad_id, device)
            v = forward_critic(critic, mb).float().cpu()
            out[[where[int(i)] for i in group], : mb.Lb] = v
    critic.train(was_training)
    return out


def _ev(critic, r: Rows, rows, targets: torch.Tensor, **kw) -> float:
    v = critic_outputs(critic, r, rows, **kw)
    idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
    return explained_variance(targets[idx], v.double(), r.mask[idx])


def fit_values(
    critic: torch.nn.Module,
    batch: TrajectoryBatch,
    targets: torch.Tensor,
    *,
    steps: int = 256,
    lr: float = 1e-3,
    batch_episodes: int = 32,
    holdout: float = 0.2,
    gate: float | None = 0.2,
    eval_every: int = 16,
    seed: int = 0,
    pad_id: int = 0,
    device="cpu",
    micro_batch_tokens: int = 8192,
    grad_clip: float = 1.0,
    weight_decay: float = 0.0,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> CriticFit:
    """Fit ``critic`` (in place) to ``targets`` (B, L) on the training split of ``batch``.

    The batch's rows are split by :func:`holdout_split` (``holdout`` share, ``seed``); each step
    is one AdamW step (``lr``, ``weight_decay``; a fresh optimizer) on ``batch_episodes``
    training episodes with the loss ``½·mean_t (V_t − G_t)²`` over their action tokens;
    ``gate=None`` never stops early. ``log(line)`` receives a line per evaluation; ``progress``
    shows a tqdm bar. Returns a :class:`CriticFit`; the critic is left in eval mode.
    """
    if steps < 0 or batch_episodes < 1 or eval_every < 1:
        raise ValueError(f"steps/batch_episodes/eval_every: expected >= 0, >= 1, >= 1, found "
                         f"{steps}, {batch_episodes}, {eval_every}")
    r = rows_of(batch)
    targets = torch.as_tensor(targets, dtype=torch.float64)
    if targets.shape != r.mask.shape:
        raise ValueError(f"targets: expected shape {tuple(r.mask.shape)}, found {tuple(targets.shape)}")
    train, held = holdout_split(len(r), holdout, seed)
    kw = dict(pad_id=pad_id, device=device, micro_batch_tokens=micro_batch_tokens)
    g32 = targets.float()
    own = critic.own_parameters() if hasattr(critic, "own_parameters") else list(critic.parameters())
    params = [p for p in own if p.requires_grad]  # a shared trunk is the policy's: only the head moves
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(int(seed) + 1)
    order: list[int] = []
    history: list[dict] = []
    losses: list[float] = []
    def reached(ev: float) -> bool:
        return gate is not None and ev >= gate

    ev = _ev(critic, r, held, targets, **kw)
    best, best_step, done = ev, 0, 0
    stop = "gate" if reached(ev) else "budget"
    history.append({"step": 0, "heldout_ev": ev, "loss": math.nan})
    bar = tqdm(total=steps, desc="critic fit", unit="step") if progress and stop != "gate" else None
    critic.train()
    while stop != "gate" and done < steps:
        if len(order) < batch_episodes:
            order += train[torch.randperm(len(train), generator=gen).numpy()].tolist()
        chunk, order = np.array(order[:batch_episodes]), order[batch_episodes:]
        n_tok = float(r.mask[torch.from_numpy(chunk)].sum().clamp_min(1))
        step_loss = 0.0
        for group in micro_batches(r, chunk, micro_batch_tokens):
            mb = make_micro(r, group, pad_id, device)
            v = forward_critic(critic, mb)
            loss, _ = value_loss(v, None, mb.take(g32).to(device), mb.take(r.mask).to(device), clip=None, scale=n_tok)
            loss.backward()
            step_loss += float(loss.detach())
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        critic.zero_grad(set_to_none=True)  # a shared trunk's gradients too: they must not reach the policy
        done += 1
        losses.append(step_loss)
        if bar is not None:
            bar.update(1)
        if done % eval_every == 0 or done == steps:
            ev = _ev(critic, r, held, targets, **kw)
            critic.train()
            history.append({"step": done, "heldout_ev": ev, "loss": float(np.mean(losses))})
            losses = []
            if ev > best or math.isnan(best):
                best, best_step = ev, done
            if bar is not None:
                bar.set_postfix(heldout_ev=f"{ev:.3f}")
            if log is not None:
                log(f"critic fit: step {done}/{steps}, held-out explained variance {ev:.3f}"
                    + (f" (gate {gate:g})" if gate is not None else ""))
            if reached(ev):
                stop = "gate"
    if bar is not None:
        bar.close()
    critic.eval()
    return CriticFit(steps=done, stop=stop, gate=math.nan if gate is None else float(gate), heldout_ev=ev,
                     best_ev=best, best_step=best_step, train_ev=_ev(critic, r, train, targets, **kw),
                     n_train=len(train), n_heldout=len(held), history=history)
