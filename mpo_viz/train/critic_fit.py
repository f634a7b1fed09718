"""Fit a critic to a batch's returns, with a held-out split and an explained-variance gate.

One loop (:func:`fit_values`) serves the trainer's critic warm-up (a pool of rollouts of the start
policy) and :func:`fit_critic`, which gives logged trajectories that carry no values the values of
a critic fitted to their own returns (``mpo-viz fit-critic``). Per step::

    draw ``batch_episodes`` training episodes (a seeded permutation, epoch by epoch)
    loss = ½ · token-mean over their action tokens of (V_θ(t) − G_t)²       (no value clipping)
    one AdamW step (gradient norm clipped at ``grad_clip``)
    every ``eval_every`` steps: explained variance on the held-out episodes
        EV = 1 − Var(G − V) / Var(G)   over held-out action tokens (population variances)
    stop at the first evaluation with EV ≥ ``gate`` ("gate"), after ``patience`` evaluations
    without a better EV ("patience"), or after ``steps`` ("budget")
    ``keep_best``: end with the weights of the evaluation with the best held-out EV

unless the outcome is fixed before the first step (no step is then taken): every target is the
same ("constant": nothing varies, the EV is undefined) or, with a gate, every held-out target is
("heldout_constant": the EV the gate reads is undefined, so it cannot pass). The critic is then
set to the constant ``c`` that minimises the loss over the training tokens, their mean (exactly
the targets' value in the first case), by its value head: weights 0, bias ``c``, so
``V(s) = c`` everywhere.

Held-out episodes are never trained on. The values are the critic's output at position
``P + t − 1`` for response token ``t`` (the state before the token; docs/models.md), exactly as
the rollout and the trainer's updates read them. Deterministic for a seed on CPU.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaModel

from mpo_viz.advantages import mc_returns, turn_gae
from mpo_viz.analysis import explained_variance, value_variance, variance_summary
from mpo_viz.checks import OptionError
from mpo_viz.data.moments import Moments
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.losses import value_loss
from mpo_viz.models import Critic, load, make_critic
from mpo_viz.models.critic import RemappedCritic
from mpo_viz.models.policy import embedding_rows
from mpo_viz.models.tiny import MAX_POSITIONS
from mpo_viz.models.tiny import SIZES as TINY_SIZES
from mpo_viz.train.runtime import threads
from mpo_viz.train.update import Micro, Rows, forward_critic, make_micro, micro_batches, rows_of

__all__ = ["CONSTANT_STOPS", "CRITIC_TARGETS", "CriticFit", "FittedCritic", "critic_outputs", "fit_critic", "fit_targets",
           "fit_values", "holdout_split", "set_constant", "trunk_critic", "vocab_critic", "compact_critic",
           "COMPACT_MIN_VOCAB", "FIT_POSITIONS", "fit_positions"]

#: the stops of a fit whose outcome was fixed before its first step (the critic set to a constant)
CONSTANT_STOPS = ("constant", "heldout_constant")


@dataclass
class CriticFit:
    """What a fit did: ``steps`` taken, why it stopped (``stop``: ``"gate"``, ``"patience"``,
    ``"budget"``, or one of :data:`CONSTANT_STOPS` with ``constant`` the value the critic was set
    to), the held-out explained variance of the weights it ended with (``heldout_ev``) and at its
    best evaluation (``best_ev`` at ``best_step``), the training episodes' EV of the weights it
    ended with (``train_ev``), ``kept_step`` (the step whose weights it ended with: the last, or
    ``best_step`` with ``keep_best``), and ``history``: one dict per evaluation (``step``,
    ``heldout_ev``, ``loss`` = the mean training loss since the previous evaluation)."""

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
    constant: float | None = None
    kept_step: int | None = None
    values: torch.Tensor | None = field(default=None, repr=False)
    """``(B, L)`` float32 outputs of the kept weights on every row (``all_values=True``), else None."""

    @property
    def passed(self) -> bool:
        """Whether the held-out EV reached the gate."""
        return self.stop == "gate"

    def summary(self) -> str:
        """One line: where the fit stopped and why."""
        if self.stop == "constant":
            return (f"critic fit: 0 steps, the critic set to the constant {self.constant:.4g} (every return of the "
                    f"{self.n_train + self.n_heldout} episodes is {self.constant:.4g}: nothing varies for a critic to "
                    f"learn, the explained variance is undefined and no gate can pass)")
        if self.stop == "heldout_constant":
            return (f"critic fit: 0 steps, the critic set to the training episodes' mean return {self.constant:.4g} "
                    f"(the returns of the {self.n_heldout} held-out episodes are all equal, so their explained "
                    f"variance is undefined and the gate {self.gate:g} cannot pass; {self.n_train} training "
                    f"episodes)")
        if self.passed:
            why = f"passed the gate {self.gate:g}"
        elif math.isnan(self.heldout_ev):
            why = ("the held-out returns are all equal, so the explained variance is undefined and no gate can "
                   "pass (e.g. no held-out episode succeeded)")
        elif self.stop == "patience":
            why = f"stopped early: no better held-out EV for the last {self.steps - self.best_step} steps"
        elif self.gate is None or math.isnan(self.gate):
            why = f"the whole budget of {self.steps} steps, no gate"
        else:
            why = f"the budget of {self.steps} steps ended before the gate {self.gate:g}"
        kept = (f"; the weights of step {self.kept_step}, the best held-out EV, kept"
                if self.kept_step is not None and self.kept_step != self.steps else "")
        return (f"critic fit: {self.steps} steps, held-out explained variance {self.heldout_ev:.3f} ({why}{kept}; "
                f"{self.n_train} training / {self.n_heldout} held-out episodes)")


def holdout_split(n: int, share: float, seed: int, groups=None) -> tuple[np.ndarray, np.ndarray]:
    """``(train, heldout)`` row indices, both sorted: a seeded permutation of the ``n`` rows, the
    first ``max(1, round(share·n))`` held out. With ``groups`` (one label per row, e.g. the
    ``group_id`` of G samples of one task) whole groups are held out, in a seeded order, until at
    least that many rows are: no task is on both sides. Needs ``n ≥ 2``, ``0 < share < 1`` and, with
    groups, at least 2 of them."""
    if not 0 < share < 1:
        raise ValueError(f"holdout: expected a share in (0, 1), found {share}")
    if n < 2:
        raise ValueError(f"holdout: a held-out split needs at least 2 trajectories, found {n}")
    k = min(max(1, int(round(share * n))), n - 1)
    gen = torch.Generator().manual_seed(int(seed))
    if groups is None:
        perm = torch.randperm(n, generator=gen).numpy()
        return np.sort(perm[k:]), np.sort(perm[:k])
    labels, inv = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    if len(labels) < 2:
        raise ValueError(f"holdout: a held-out split by group needs at least 2 groups, found {len(labels)}")
    held = np.zeros(n, dtype=bool)
    for g in torch.randperm(len(labels), generator=gen).numpy():
        if held.sum() >= k:
            break
        held |= inv == g
    if held.all():  # one group was more than the rest: give it back
        held &= inv != inv[np.flatnonzero(held)[-1]]
    return np.flatnonzero(~held), np.flatnonzero(held)


def causal_values(critic: torch.nn.Module, mb: Micro) -> torch.Tensor:
    """``(b, Lb)`` values of each response token of right-padded micro-batch ``mb``, as
    :func:`~mpo_viz.train.update.forward_critic` gives them, without the padding mask.

    Every row is padded on the right, and a causal trunk's output at position ``t`` reads positions
    ``≤ t`` only: at every real token those are real tokens, so the padding mask changes nothing
    there (only the outputs at padding, which are never read). Without it the attention takes the
    plain causal path instead of materializing a ``(b, 1, T, T)`` mask — several times less work per
    token on CPU (benchmarks/fit_critic.py). Equal to the masked forward to float rounding."""
    return forward_critic(critic, dataclasses.replace(mb, attn=None))


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
            v = causal_values(critic, mb).float().cpu()
            out[[where[int(i)] for i in group], : mb.Lb] = v
    critic.train(was_training)
    return out


def _ev(critic, r: Rows, rows, targets: torch.Tensor, **kw) -> float:
    v = critic_outputs(critic, r, rows, **kw)
    idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
    return explained_variance(targets[idx], v.double(), r.mask[idx])


def _ev_of(values: torch.Tensor, r: Rows, rows, targets: torch.Tensor) -> float:
    """The explained variance on ``rows`` of outputs ``values`` computed for every row."""
    idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
    return explained_variance(targets[idx], values[idx].double(), r.mask[idx])


def _fit_step(critic: torch.nn.Module, r: Rows, chunk: np.ndarray, g32: torch.Tensor, opt, params: list,
              grad_clip: float, *, pad_id: int, device, micro_batch_tokens: int) -> float:
    """One AdamW step of ``½·mean_t (V_t − G_t)²`` over the action tokens of rows ``chunk`` (its
    micro-batches' gradients accumulated); returns the loss."""
    n_tok = float(r.mask[torch.from_numpy(chunk)].sum().clamp_min(1))
    step_loss = 0.0
    for group in micro_batches(r, chunk, micro_batch_tokens):
        mb = make_micro(r, group, pad_id, device)
        v = causal_values(critic, mb)
        loss, _ = value_loss(v, None, mb.take(g32).to(device), mb.take(r.mask).to(device), clip=None, scale=n_tok)
        loss.backward()
        step_loss += float(loss.detach())
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    critic.zero_grad(set_to_none=True)  # a shared trunk's gradients too: they must not reach the policy
    return step_loss


#: which action tokens a critic fit reads (:func:`fit_values` ``positions``)
FIT_POSITIONS = ("all", "turn_start")


def fit_positions(batch: TrajectoryBatch, positions: str) -> torch.Tensor:
    """``(B, L)`` bool: the action tokens a fit with ``positions`` reads — every action token
    (``"all"``), or each turn's first action token (``"turn_start"``)."""
    if positions not in FIT_POSITIONS:
        raise OptionError("positions", f"expected one of {', '.join(FIT_POSITIONS)}, found {positions!r}")
    mask = batch.mask.bool()
    if positions == "all":
        return mask
    out = torch.zeros_like(mask)
    tt = batch.turns()
    if len(tt):
        out[torch.tensor(tt["row"].to_numpy()), torch.tensor(tt["start"].to_numpy())] = True  # copies: the columns are read-only
    return out


def _next_episodes(order: list[int], train: np.ndarray, n: int, gen: torch.Generator) -> tuple[np.ndarray, list[int]]:
    """The next ``n`` training episodes of the shuffled order (reshuffled when it runs out), and the rest."""
    if len(order) < n:
        order = order + train[torch.randperm(len(train), generator=gen).numpy()].tolist()
    return np.array(order[:n]), order[n:]


def _say_eval(bar, log: Callable[[str], None] | None, done: int, steps: int, ev: float, gate: float | None) -> None:
    """An evaluation's held-out EV on the progress bar and in the log."""
    if bar is not None:
        bar.set_postfix(heldout_ev=f"{ev:.3f}")
    if log is not None:
        log(f"critic fit: step {done}/{steps}, held-out explained variance {ev:.3f}"
            + (f" (gate {gate:g})" if gate is not None else ""))


def set_constant(critic: torch.nn.Module, value: float) -> None:
    """Make ``critic`` (a :class:`~mpo_viz.models.Critic`: ``head`` an ``nn.Linear(H, 1)``) output
    ``value`` at every position: head weights 0, bias ``value``. Exact (``0·h + c = c`` for any
    finite hidden state), and the zero-loss fit to constant targets; the trunk is untouched, and
    the first update step gives the head's weights a gradient again."""
    head = getattr(critic, "head", None)
    if not isinstance(head, torch.nn.Linear) or head.out_features != 1 or head.bias is None:
        raise ValueError(f"critic: expected a value head nn.Linear(H, 1) with a bias as .head, found "
                         f"{type(head).__name__ if head is not None else 'none'} on {type(critic).__name__}")
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(float(value))


def _fixed_outcome(targets: torch.Tensor, mask: torch.Tensor, held: np.ndarray, gate: float | None) -> str | None:
    """``"constant"`` when the action-token targets have no variance, ``"heldout_constant"`` when a
    gate is set and those of the held-out rows have none (the same test as the explained
    variance's: ``M2 = Σ (G − mean)² = 0``), else None (also for a batch without action tokens)."""
    m = mask.bool()
    everything = Moments.of(targets[m])
    if everything.n and everything.m2 == 0:
        return "constant"
    idx = torch.from_numpy(np.asarray(held, dtype=np.int64))
    if gate is not None and Moments.of(targets[idx][m[idx]]).m2 == 0:
        return "heldout_constant"
    return None


def _constant_fit(critic: torch.nn.Module, stop: str, targets: torch.Tensor, mask: torch.Tensor, train: np.ndarray,
                  held: np.ndarray, gate: float | None) -> CriticFit:
    """Set ``critic`` to the loss-minimising constant of the training tokens (their mean; the
    shared value itself when ``stop="constant"``) and report it as a fit of 0 steps."""
    m = mask.bool()
    idx = torch.from_numpy(np.asarray(train, dtype=np.int64))
    g = targets[idx][m[idx]]
    c = float(targets[m][0]) if stop == "constant" else Moments.of(g).mean
    set_constant(critic, c)
    critic.eval()
    flat = torch.full(targets.shape, c, dtype=torch.float32).double()  # what the float32 critic outputs
    hidx = torch.from_numpy(np.asarray(held, dtype=np.int64))
    ev = explained_variance(targets[hidx], flat[hidx], mask[hidx])
    return CriticFit(steps=0, stop=stop, gate=math.nan if gate is None else float(gate), heldout_ev=ev, best_ev=ev,
                     best_step=0, train_ev=explained_variance(targets[idx], flat[idx], mask[idx]), n_train=len(train),
                     n_heldout=len(held), history=[{"step": 0, "heldout_ev": ev, "loss": math.nan}], constant=c, kept_step=0)


class _Best:
    """The best held-out EV so far (NaN loses to any number), its step, the evaluations since it,
    and (``keep``) a copy of the trainable weights it had."""

    def __init__(self, ev: float, params: list, keep: bool):
        self.ev, self.step, self.stale, self.params, self.keep = ev, 0, 0, params, keep
        self.weights = [p.detach().clone() for p in params] if keep else None

    def offer(self, ev: float, step: int) -> None:
        if ev > self.ev or (math.isnan(self.ev) and not math.isnan(ev)):
            self.ev, self.step, self.stale = ev, step, 0
            if self.keep:
                self.weights = [p.detach().clone() for p in self.params]
        else:
            self.stale += 1

    def restore(self) -> None:
        with torch.no_grad():
            assert self.weights is not None, "restore() needs keep=True"
            for p, w in zip(self.params, self.weights):
                p.copy_(w)


def _reached(ev: float, gate: float | None) -> bool:
    return gate is not None and ev >= gate


def _check_loop(r: Rows, targets, steps: int, batch_episodes: int, eval_every: int, patience) -> torch.Tensor:
    """``targets`` as float64 after checking the loop's counts and the targets' shape."""
    if patience is not None and patience < 1:
        raise OptionError("patience", f"expected an integer >= 1 (evaluations without a better held-out EV), "
                          f"found {patience!r}")
    if steps < 0 or batch_episodes < 1 or eval_every < 1:
        raise ValueError(f"steps/batch_episodes/eval_every: expected >= 0, >= 1, >= 1, found "
                         f"{steps}, {batch_episodes}, {eval_every}")
    targets = torch.as_tensor(targets, dtype=torch.float64)
    if targets.shape != r.mask.shape:
        raise ValueError(f"targets: expected shape {tuple(r.mask.shape)}, found {tuple(targets.shape)}")
    return targets


def _fixed_fit(critic: torch.nn.Module, targets: torch.Tensor, mask: torch.Tensor, train: np.ndarray, held: np.ndarray,
               gate: float | None, on_eval) -> CriticFit | None:
    """The fit of 0 steps when its outcome is fixed before the first step and the critic has a
    value head (:func:`_fixed_outcome`, :func:`_constant_fit`; ``on_eval`` called once), else None."""
    stop = _fixed_outcome(targets, mask, held, gate)
    if stop is None or not isinstance(getattr(critic, "head", None), torch.nn.Linear):
        return None
    fit = _constant_fit(critic, stop, targets, mask, train, held, gate)
    if on_eval is not None:
        on_eval(0, fit.heldout_ev, critic)
    return fit


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
    groups=None,
    on_eval: Callable[[int, float, torch.nn.Module], None] | None = None,
    patience: int | None = None,
    keep_best: bool = False,
    all_values: bool = False,
    positions: str = "all",
) -> CriticFit:
    """Fit ``critic`` (in place) to ``targets`` (B, L) on the training split of ``batch``.

    ``positions``: the action tokens the loss and the explained variance read — ``"all"`` (every
    action token) or ``"turn_start"`` (each turn's first action token only: the turn-level states
    ``V(s_k)`` that turn GAE and MAE's macro scale read; :func:`fit_positions`). The critic still
    reads every token of each sequence.

    The batch's rows are split by :func:`holdout_split` (``holdout`` share, ``seed``); each step
    is one AdamW step (``lr``, ``weight_decay``; a fresh optimizer) on ``batch_episodes``
    training episodes with the loss ``½·mean_t (V_t − G_t)²`` over their action tokens;
    ``gate=None`` never stops early. ``groups`` (a label per row): hold out whole groups.
    ``log(line)`` receives a line per evaluation, ``on_eval(step, heldout_ev, critic)`` is called
    at each (step 0 included); ``progress`` shows a tqdm bar. ``patience``: stop after that many
    evaluations in a row without a better held-out EV (None: never). ``keep_best``: end with the
    trainable weights of the best evaluation (a copy is taken at each new best). The held-out EV
    then reported is the best of the evaluations: chosen on the held-out episodes, so optimistic by
    the spread of their noise. ``all_values``: the kept weights' outputs on every row are computed
    once at the end (the training EV is read from them) and returned in ``CriticFit.values``.
    Returns a :class:`CriticFit`; the critic is left in eval mode. When the outcome is fixed before
    the first step (see the module docstring: no target varies, or with a gate no held-out one does)
    and the critic has a value head, it is set to the constant at once (:func:`set_constant`;
    ``on_eval`` is called once, at step 0, after that) and the fit reports 0 steps.
    """
    r = rows_of(batch)
    targets = _check_loop(r, targets, steps, batch_episodes, eval_every, patience)
    if positions != "all":
        r = dataclasses.replace(r, mask=fit_positions(batch, positions))
    train, held = holdout_split(len(r), holdout, seed, groups)
    fixed = _fixed_fit(critic, targets, r.mask, train, held, gate, on_eval)
    if fixed is not None:
        if all_values:
            fixed.values = critic_outputs(critic, r, np.arange(len(r)), pad_id=pad_id, device=device,
                                          micro_batch_tokens=micro_batch_tokens)
        return fixed
    kw = dict(pad_id=pad_id, device=device, micro_batch_tokens=micro_batch_tokens)
    g32 = targets.float()
    own = getattr(critic, "own_parameters", critic.parameters)()
    params = [p for p in own if p.requires_grad]  # a shared trunk is the policy's: only the head moves
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(int(seed) + 1)
    order: list[int] = []  # the training episodes' shuffled order
    history: list[dict] = []  # one dict per evaluation
    losses: list[float] = []  # since the last evaluation
    ev = _ev(critic, r, held, targets, **kw)
    best, done = _Best(ev, params, keep_best), 0
    stop = "gate" if _reached(ev, gate) else "budget"
    history.append({"step": 0, "heldout_ev": ev, "loss": math.nan})
    if on_eval is not None:
        on_eval(0, ev, critic)
    bar = tqdm(total=steps, desc="critic fit", unit="step") if progress and stop == "budget" else None
    critic.train()
    while stop == "budget" and done < steps:
        chunk, order = _next_episodes(order, train, batch_episodes, gen)
        step_loss = _fit_step(critic, r, chunk, g32, opt, params, grad_clip, **kw)
        done += 1
        losses.append(step_loss)
        if bar is not None:
            bar.update(1)
        if done % eval_every == 0 or done == steps:
            ev = _ev(critic, r, held, targets, **kw)
            critic.train()
            history.append({"step": done, "heldout_ev": ev, "loss": float(np.mean(losses))})
            losses = []
            best.offer(ev, done)
            if on_eval is not None:
                on_eval(done, ev, critic)
                critic.train()
            _say_eval(bar, log, done, steps, ev, gate)
            if _reached(ev, gate):
                stop = "gate"
            elif patience is not None and best.stale >= patience:
                stop = "patience"
    if bar is not None:
        bar.close()
    return _finish(critic, best, keep_best, done, stop, ev, gate, history, r, train, held, targets, kw, all_values)


def _finish(critic, best: _Best, keep_best: bool, done: int, stop: str, ev: float, gate: float | None, history: list,
            r: Rows, train: np.ndarray, held: np.ndarray, targets: torch.Tensor, kw: dict, all_values: bool) -> CriticFit:
    """The end of a fit: the best evaluation's weights back with ``keep_best``, eval mode, the record
    (with ``all_values`` every row's values of the kept weights)."""
    kept_step = done
    if keep_best and best.step != done:
        best.restore()
        ev, kept_step = best.ev, best.step
    critic.eval()
    values = critic_outputs(critic, r, np.arange(len(r)), **kw) if all_values else None
    train_ev = _ev_of(values, r, train, targets) if values is not None else _ev(critic, r, train, targets, **kw)
    return CriticFit(steps=done, stop=stop, gate=math.nan if gate is None else float(gate), heldout_ev=ev,
                     best_ev=best.ev, best_step=best.step, train_ev=train_ev, n_train=len(train),
                     n_heldout=len(held), history=history, kept_step=kept_step, values=values)


# ---------------------------------------------------------------------------------------------
# fitting a critic to logged trajectories that carry no values

#: fewer groups than this: the held-out split is by trajectory, not by group
MIN_GROUPS_FOR_GROUP_SPLIT = 5

#: what a critic fitted to logs can learn: Monte-Carlo returns per token, or the return from the
#: start of each turn broadcast over the turn (a target flat inside turns)
CRITIC_TARGETS = ("mc", "turn")


@dataclass
class FittedCritic:
    """The result of :func:`fit_critic`: ``batch`` (the input with ``values`` from the fitted
    critic, ``bootstrap_value`` on truncated rows, and metadata ``values_source="fitted_critic"``
    and ``critic_fit``), the ``critic`` module, the :class:`CriticFit` and ``info`` (what the
    metadata records)."""

    batch: TrajectoryBatch
    critic: torch.nn.Module
    fit: CriticFit
    info: dict


def fit_targets(batch: TrajectoryBatch, target: str = "mc", *, gamma: float = 1.0, turn_gamma: float | None = None
                ) -> torch.Tensor:
    """``(B, L)`` float64 targets: ``"mc"`` — :func:`mpo_viz.advantages.mc_returns`; ``"turn"`` — the
    Monte-Carlo return from the first action token of each turn, on every token of the turn (turn GAE
    with λ_T = 1 and zero values: ``G^T_k = Σ_{k' ≥ k} Γ·R_{k'}``). ``turn_gamma`` left out is
    ``gamma``, as in :func:`~mpo_viz.advantages.mc_returns`."""
    if target == "mc":
        return mc_returns(batch, gamma=gamma, turn_gamma=turn_gamma)
    if target != "turn":
        raise OptionError("target", f"expected one of {', '.join(CRITIC_TARGETS)}, found {target!r}")
    zeros = torch.zeros(batch.mask.shape, dtype=torch.float64)
    _, ret = turn_gae(batch.padded("rewards", torch.float64), zeros, batch.mask, turn_ids=batch.turn_ids,
                      gamma=gamma, turn_gamma=gamma if turn_gamma is None else turn_gamma, turn_lam=1.0,
                      bootstrap_value=batch.bootstrap_value)
    return ret


def vocab_critic(vocab_size: int, *, size: str = "1m", seed: int = 0, max_positions: int = MAX_POSITIONS) -> Critic:
    """A fresh critic whose trunk is a tiny Llama of ``size`` (``1m``, ``3m``, ``10m``) over ids
    ``0 .. vocab_size − 1`` (built from a config, nothing downloaded; weights fixed by ``seed``)."""
    if size not in TINY_SIZES:
        raise OptionError("size", f"expected one of {', '.join(TINY_SIZES)}, found {size!r}")
    s = TINY_SIZES[size]
    cfg = LlamaConfig(vocab_size=int(vocab_size), **s, num_key_value_heads=s["num_attention_heads"],
                      max_position_embeddings=int(max_positions), tie_word_embeddings=False, pad_token_id=0,
                      bos_token_id=None, eos_token_id=None, rms_norm_eps=1e-5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        critic = Critic(LlamaModel(cfg))
        with torch.no_grad():
            critic.head.weight.normal_(0.0, 0.02)
            critic.head.bias.zero_()
    return critic.eval()


#: a fresh critic over a vocabulary larger than this gets embedding rows for the ids the batch uses
#: only (:func:`compact_critic`): a 49k byte-level vocabulary's embedding and its AdamW update
#: otherwise outweigh a tiny trunk several times over
COMPACT_MIN_VOCAB = 4096


def compact_critic(batch: TrajectoryBatch, *, size: str = "1m", seed: int = 0, max_positions: int = MAX_POSITIONS
                   ) -> torch.nn.Module:
    """A fresh critic for the ids of ``batch``: :func:`vocab_critic` over ``0 .. max id``, or — when
    that vocabulary is larger than :data:`COMPACT_MIN_VOCAB` and the batch uses fewer ids — a
    :class:`~mpo_viz.models.critic.RemappedCritic` whose embedding has one row per id the batch
    uses (in id order) and one for ids it does not. The same model on the batch's sequences,
    without the embedding rows (and their optimizer state) that no token of the batch reads."""
    used = np.unique(np.concatenate([np.asarray(x, dtype=np.int64) for f in ("prompt_ids", "response_ids")
                                     for x in batch.field(f)] or [np.zeros(0, np.int64)]))
    vocab = int(used[-1]) + 1 if len(used) else 1
    if vocab <= COMPACT_MIN_VOCAB or len(used) + 1 >= vocab:
        return vocab_critic(vocab, size=size, seed=seed, max_positions=max_positions)
    lut = torch.full((vocab,), -1, dtype=torch.int64)
    lut[torch.from_numpy(used)] = torch.arange(len(used))
    inner = vocab_critic(len(used) + 1, size=size, seed=seed, max_positions=max_positions)
    return RemappedCritic(inner, lut, unseen=len(used)).eval()


def _check_fit_input(batch: TrajectoryBatch, targets: torch.Tensor, holdout: float, source: str) -> None:
    """Refuse what no critic can be fitted to: no rewards, returns without variance, too few rows."""
    if len(batch) == 0:
        raise ValueError(f"{source}: no trajectories to fit a critic to")
    def carried(name):
        return np.array([x is not None for x in batch.field(name)]) if batch.has(name) else np.zeros(len(batch), bool)

    no_reward = np.isnan(batch.outcome_reward) & ~carried("token_rewards") & ~carried("turn_rewards")
    if no_reward.all():
        raise ValueError(f"{source}: no trajectory carries a reward (every 'reward' is missing or NaN, and there are "
                         f"no token_rewards or turn_rewards), so there are no returns to fit a critic to")
    n_held = max(1, int(round(holdout * len(batch))))
    if n_held < 2 or len(batch) - n_held < 2:
        raise ValueError(f"{source}: a held-out split of {holdout:g} leaves {len(batch) - n_held} training and "
                         f"{n_held} held-out trajectories of {len(batch)}; expected at least 2 of each "
                         f"(fit on more trajectories, or change --holdout)")
    g = targets[batch.mask.bool()]
    if g.numel() == 0 or float(g.var(unbiased=False)) == 0.0:
        raise ValueError(f"{source}: every return is the same ({float(g[0]) if g.numel() else 'no action token'}), "
                         f"so there is nothing for a critic to learn (explained variance is undefined)")


def trunk_critic(path, batch: TrajectoryBatch, *, seed: int = 0, device="cpu", source: str = "batch") -> Critic:
    """A critic on a pretrained trunk: the causal LM in folder ``path`` (a plain Hugging Face folder,
    e.g. SmolLM2's, or a model folder with ``policy/``: the policy that wrote the logs), its trunk's
    weights copied, a fresh value head drawn from ``seed`` (:func:`mpo_viz.models.make_critic`
    ``init="policy"``). The batch's ids must be ids of that model: an id past its embedding, or
    ``response_tokens`` that its tokenizer does not give back (more than half of a row's tokens
    differ), is an ``OptionError`` naming ``source`` and the folder."""
    try:
        policy, _ = load(path, device=device)
    except (OSError, ValueError) as exc:
        raise OptionError("trunk", f"expected a Hugging Face causal-LM folder (or a model folder with policy/), "
                          f"found {str(path)!r} that does not load ({str(exc)[:160]})") from None
    rows = embedding_rows(policy.model)
    top = max((int(x.max()) for f in ("prompt_ids", "response_ids") for x in batch.field(f) if len(x)), default=-1)
    if top >= rows:
        raise OptionError("trunk", f"expected a model whose vocabulary covers {source}'s token ids, found id {top} "
                          f"in {source} but {rows} embedding rows in {path} (the logs were tokenized by another model)")
    _check_same_tokenizer(policy, batch, path, source)
    return make_critic(policy, "policy", seed=seed)


def _check_same_tokenizer(policy, batch: TrajectoryBatch, path, source: str) -> None:
    """Refuse a trunk whose tokenizer decodes the first row's ids to other text than its ``response_tokens``."""
    if not batch.has("response_tokens") or batch.field("response_tokens")[0] is None or not len(batch):
        return
    ids = [int(i) for i in batch.field("response_ids")[0]]
    stored = ["" if t is None else str(t) for t in batch.field("response_tokens")[0]]
    tok = policy.tokenizer
    shown = [tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    raw = [str(t) for t in tok.convert_ids_to_tokens(ids)]
    differ = sum(1 for s, a, b in zip(stored, shown, raw) if s.strip() not in (a.strip(), b.strip()) and s != "")
    if ids and differ > len(ids) / 2:
        raise OptionError("trunk", f"expected the tokenizer that wrote {source}, found {path}'s tokenizer decodes "
                          f"{differ} of {len(ids)} tokens of {batch.traj_ids[0]} to other text than its "
                          "response_tokens")


def _last_outputs(critic: torch.nn.Module, batch: TrajectoryBatch, rows) -> dict[int, float]:
    """The critic's output after the whole response (position ``P + L − 1``) of each row in ``rows``."""
    out = {}
    with torch.no_grad():
        for i in rows:
            seq = np.concatenate([batch.field("prompt_ids")[i], batch.field("response_ids")[i]]).astype(np.int64)
            dev = next(critic.parameters()).device
            out[int(i)] = float(critic(torch.from_numpy(seq)[None].to(dev))[0, -1])
    return out


def fit_critic(
    batch: TrajectoryBatch,
    *,
    target: str = "mc",
    size: str = "1m",
    steps: int = 256,
    lr: float = 1e-3,
    batch_episodes: int = 16,
    holdout: float = 0.2,
    seed: int = 0,
    gate: float | None = None,
    eval_every: int = 16,
    gamma: float = 1.0,
    turn_gamma: float | None = None,
    critic: torch.nn.Module | None = None,
    trunk=None,
    patience: int | None = None,
    keep_best: bool = True,
    device="cpu",
    micro_batch_tokens: int = 8192,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    source: str = "batch",
    num_threads: int | None = 1,
) -> FittedCritic:
    """Fit a small critic to a batch's own returns and write its values into the batch.

    The critic (a fresh tiny Llama trunk of ``size`` over the batch's ids; ``trunk`` — a Hugging
    Face folder whose pretrained trunk is copied, :func:`trunk_critic`; or ``critic`` — e.g. a
    trained policy's trunk via :func:`mpo_viz.models.make_critic`) is fitted by :func:`fit_values`
    to ``target`` (:func:`fit_targets`: ``"mc"`` Monte-Carlo returns, or ``"turn"``) on all but a
    ``holdout`` share of the trajectories, ``steps`` AdamW steps of ``batch_episodes`` episodes at
    ``lr`` (``gate`` = a held-out EV that ends it early; None = the whole budget); whole groups are
    held out when the batch has at least 5 of them (no task on both sides), else trajectories;
    ``patience`` evaluations without a better held-out EV stop it early, and (``keep_best``, the
    default) the weights of the evaluation with the best held-out EV are the ones kept. Then every row
    gets ``values`` from the fitted critic (the output before each response token), truncated rows
    a ``bootstrap_value`` (the output after the response), and the metadata records
    ``values_source="fitted_critic"`` and ``critic_fit`` (target, size, steps, held-out and training
    explained variance, the across/within split of the new values, ...). Deterministic for a seed.

    ``num_threads``: torch CPU threads during the fit (the process's count is given back after;
    None keeps it). The default 1 is the trainer's (``Config.num_threads``): where other work shares
    the cores (a background run, a second kernel, another terminal's job), torch's threads wait on
    each other at every operation. Measured on 2 cores with one other busy process: 3 steps took
    51–69 s in a Jupyter kernel with 2 threads against 6 s with 1, while on the same machine
    outside a kernel 2 threads were only ~1.2× faster than 1.

    Errors (``ValueError`` naming ``source``): no rewards, returns all equal, too few trajectories
    for a held-out split (at least 2 on each side).
    """
    if critic is None and size not in TINY_SIZES:
        raise OptionError("size", f"expected one of {', '.join(TINY_SIZES)}, found {size!r}")
    for name, value, ok, want in (("steps", steps, steps >= 0, "an integer >= 0"),
                                  ("lr", lr, lr > 0, "a number > 0"),
                                  ("holdout", holdout, 0 < holdout < 1, "a share in (0, 1)"),
                                  ("batch_episodes", batch_episodes, batch_episodes >= 1, "an integer >= 1")):
        if not ok:
            raise OptionError(name, f"expected {want}, found {value!r}")
    targets = fit_targets(batch, target, gamma=gamma, turn_gamma=turn_gamma)
    _check_fit_input(batch, targets, holdout, source)
    # the G samples of one task share its start: hold out whole groups, so that no task is on both
    # sides, when there are enough of them to approach the share (else rows)
    ids = batch.field("group_id")
    groups = ids if len(set(ids)) >= MIN_GROUPS_FOR_GROUP_SPLIT else None
    if trunk is not None and critic is not None:
        raise OptionError("trunk", "expected either a trunk folder or a critic module, found both")
    fresh = critic is None and trunk is None
    if trunk is not None:
        critic = trunk_critic(trunk, batch, seed=seed, device=device, source=source)
    if critic is None:
        longest = int(max(len(p) + len(r) for p, r in zip(batch.field("prompt_ids"), batch.field("response_ids"))))
        critic = compact_critic(batch, size=size, seed=seed, max_positions=max(MAX_POSITIONS, longest + 1))
    critic.to(device)
    with threads(num_threads):
        fit = fit_values(critic, batch, targets, steps=steps, lr=lr, batch_episodes=batch_episodes, holdout=holdout,
                         gate=gate, eval_every=eval_every, seed=seed, pad_id=0, device=device,
                         micro_batch_tokens=micro_batch_tokens, progress=progress, log=log, groups=groups,
                         patience=patience, keep_best=keep_best, all_values=True)
    out = batch.with_token_fields(values=fit.values)
    cut = [i for i, t in enumerate(batch.field("truncated") if batch.has("truncated") else []) if t]
    if cut:
        last = _last_outputs(critic, batch, cut)
        old = batch.bootstrap_value.tolist()
        out = out.with_scalars(bootstrap_value=[last.get(i, old[i]) for i in range(len(batch))])
    split = variance_summary(value_variance(out))
    info = {"target": target, "size": size if fresh else ("trunk" if trunk is not None else "given"),
            "trunk": None if trunk is None else str(trunk), "kept_step": fit.kept_step, "best_step": fit.best_step,
            "patience": patience, "steps": fit.steps, "lr": lr,
            "batch_episodes": batch_episodes, "holdout": holdout, "seed": seed, "stop": fit.stop,
            "heldout_explained_variance": fit.heldout_ev, "best_heldout_explained_variance": fit.best_ev,
            "train_explained_variance": fit.train_ev, "n_train": fit.n_train, "n_heldout": fit.n_heldout,
            "values_mean_across": split["mean_across"], "values_mean_within": split["mean_within"],
            "values_median_across_within_ratio": split["median_ratio"], "truncated_bootstrapped": len(cut),
            "holdout_by": "row" if groups is None else "group", "num_threads": num_threads}
    out = out.with_meta(values_source="fitted_critic", critic_fit=info)
    return FittedCritic(batch=out, critic=critic, fit=fit, info=info)
