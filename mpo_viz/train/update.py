"""One iteration's updates: E epochs × M minibatches of policy (and critic) steps, micro-batched.

Owns how the policy and the critic are called on a batch (:func:`forward_policy`,
:func:`forward_critic`, :func:`reference_logprobs`), the update (:func:`update_epochs`; with the
critic's own pass, in a second thread where that changes no number: :func:`update_with_critic`)
and what it did (:func:`after_update`). Invariant: however a minibatch is cut into micro-batches
and whichever thread runs the critic's pass, the gradients (to float rounding) and the shuffle
generator's draws are those of the one-batch update run in one thread.

Inputs are a rolled-out :class:`~mpo_viz.data.trajectory.TrajectoryBatch` carrying ``old_logprobs``
(and ``rollout_logprobs``), ``advantages`` and ``returns`` (and critic ``values``). Per epoch the
rows are shuffled with the trainer's generator and split into M minibatches of near-equal size;
each minibatch is cut into micro-batches of at most ``micro_batch_tokens`` padded tokens (length
buckets: rows sorted by length, cut where the padding saved outweighs another forward, see
:func:`micro_batches`), whose gradients are accumulated before one AdamW step.

**Normaliser.** The loss of a micro-batch is aggregated with ``scale`` = the *minibatch's* global
denominator of the aggregation mode (``token-mean``: its action-token count; ``seq-mean-*``: its
rows with an action token; ``turn-mean``: its turns; ``seq-mean-token-sum-norm``: its longest
response), so the accumulated gradient equals that of the minibatch as one batch, however it is cut.

**Alignment** (the rollout's, see docs/models.md). Row ``i`` is fed as ``prompt_i + response_i`` (right padding,
positions 0..T−1). The logits at position ``P_i + t − 1`` give ``log π(response token t)``; the
critic's output at the same position is ``V_t``.

Per optimizer step the policy loss is

    policy_loss(kind, logπ_θ, old_logp, A, mask; scale) + kl_coef·agg(kl(logπ_θ, ref_logp))
        − entropy_coef·agg(H)

and, when the estimator uses a critic, ``value_loss(V_θ, V_old, G, mask; clip=ε_v, scale)`` on the
critic's own AdamW.

**What the update did** (:func:`after_update`): one no-grad forward of the updated policy over the
rows gives each token's ratio ``exp(logπ_new − logπ_base)`` and which tokens and turns the loss's
clip holds at it (:func:`mpo_viz.losses.clip_flags`). The last epoch's own forwards cannot give it:
each ran before its minibatch's step and the later steps moved the policy again.
"""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import wait
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import torch

from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.losses import (
    LOGPROB_FIELDS,
    LOGPROB_WHAT,
    aggregate,
    clip_flags,
    get_loss,
    kl_penalty,
    policy_loss,
    token_entropy,
    token_logprobs,
    value_loss,
)
from mpo_viz.rollout import side_pool, spare_cores
from mpo_viz.train.config import Config

__all__ = [
    "Rows",
    "rows_of",
    "micro_batches",
    "forward_policy",
    "forward_critic",
    "normaliser",
    "update_epochs",
    "Learners",
    "UpdateSettings",
    "MetricMeter",
    "policy_logits",
    "critic_head_outputs",
    "AfterUpdate",
    "after_update",
    "check_loss_inputs",
    "update_with_critic",
    "parallel_ok",
    "reference_logprobs",
]


# ---------------------------------------------------------------------------------------------
# the model calls (one place that knows how a policy / critic is called)


def policy_logits(policy: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor | None) -> torch.Tensor:
    """``(b, T, V)`` logits of a Hugging Face causal LM on right-padded ``ids``."""
    return policy(input_ids=ids, attention_mask=attn, use_cache=False).logits


def critic_head_outputs(critic: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor | None) -> torch.Tensor:
    """``(b, T)`` outputs of the critic's scalar head at every position of right-padded ``ids``
    (:func:`forward_critic` reads them per response token)."""
    out = critic(input_ids=ids, attention_mask=attn)
    return out if isinstance(out, torch.Tensor) else out.values


# ---------------------------------------------------------------------------------------------
# the batch as tensors


@dataclass
class Rows:
    """A batch as the update needs it. ``seqs``: per row ``prompt + response`` ids (int64);
    ``prompt_len``/``resp_len`` (B,); per-token ``(B, L)`` tensors: ``mask`` (bool), ``turn_ids``,
    ``old_logp``, ``rollout_logp``, ``advantages``, ``returns``, ``values``, ``ref_logp`` (None
    when absent)."""

    seqs: list
    prompt_len: np.ndarray
    resp_len: np.ndarray
    mask: torch.Tensor
    turn_ids: torch.Tensor
    old_logp: torch.Tensor | None
    rollout_logp: torch.Tensor | None
    advantages: torch.Tensor | None
    returns: torch.Tensor | None
    values: torch.Tensor | None
    ref_logp: torch.Tensor | None

    def __len__(self) -> int:
        return len(self.seqs)


def check_loss_inputs(batch: TrajectoryBatch, loss: str) -> None:
    """Refuse a batch that lacks the log-probs the loss kind needs (``rollout_logprobs`` for sao,
    ``old_logprobs`` for the others: :attr:`mpo_viz.losses.LossKind.logprobs`)."""
    for arg in get_loss(loss).logprobs:
        field = LOGPROB_FIELDS[arg]
        if not batch.has(field):
            raise ValueError(
                f"loss: {loss!r} forms its ratio against {LOGPROB_WHAT[arg]} and needs the field "
                f"{field!r}, found a batch without it (fields: {', '.join(sorted(batch.fields))})"
            )


def rows_of(batch: TrajectoryBatch, *, fields: bool = True) -> Rows:
    """The :class:`Rows` of a TrajectoryBatch (float32 per-token fields). ``fields=False`` leaves out
    the optional per-token fields (log-probs, advantages, returns, values: None), which a value fit
    never reads: ``(B, L)`` float32 each, 62 MB for a sample of 176 rows of up to 22,000 tokens
    with all four."""
    prompts = batch.field("prompt_ids")
    resps = batch.field("response_ids")
    seqs = [torch.from_numpy(np.concatenate([p, r]).astype(np.int64)) for p, r in zip(prompts, resps)]

    def opt(name):
        return batch.padded(name, torch.float32) if fields and batch.has(name) else None

    return Rows(
        seqs=seqs,
        prompt_len=np.array([len(p) for p in prompts], dtype=np.int64),
        resp_len=np.array([len(r) for r in resps], dtype=np.int64),
        mask=batch.mask.bool(),
        turn_ids=batch.turn_ids,
        old_logp=opt("old_logprobs"),
        rollout_logp=opt("rollout_logprobs"),
        advantages=opt("advantages"),
        returns=opt("returns"),
        values=opt("values"),
        ref_logp=opt("ref_logprobs"),
    )


@dataclass
class Micro:
    """One micro-batch: padded ``ids``/``attn`` (b, T), the gather index ``pos`` (b, Lb) of each
    response token's predicting position, the row indices, and ``Lb`` (its longest response)."""

    rows: np.ndarray
    ids: torch.Tensor
    attn: torch.Tensor | None
    pos: torch.Tensor
    Lb: int

    @overload
    def take(self, x: torch.Tensor) -> torch.Tensor: ...

    @overload
    def take(self, x: None) -> None: ...

    def take(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """This micro-batch's rows of a ``(B, L)`` tensor, cut to ``Lb`` (None stays None)."""
        return None if x is None else x[torch.from_numpy(self.rows), : self.Lb]


def make_micro(r: Rows, rows: np.ndarray, pad_id: int, device) -> Micro:
    rows = np.asarray(rows, dtype=np.int64)
    T = int((r.prompt_len[rows] + r.resp_len[rows]).max())
    Lb = int(r.resp_len[rows].max())
    ids = torch.full((len(rows), T), pad_id, dtype=torch.int64)
    attn = torch.zeros((len(rows), T), dtype=torch.int64)
    for j, i in enumerate(rows):
        s = r.seqs[i]
        ids[j, : len(s)] = s
        attn[j, : len(s)] = 1
    P = torch.from_numpy(r.prompt_len[rows])
    pos = (P[:, None] - 1 + torch.arange(Lb)[None, :]).clamp(max=T - 2)
    return Micro(rows=rows, ids=ids.to(device), attn=attn.to(device), pos=pos.to(device), Lb=Lb)


#: the fixed cost of one micro-batch's forward/backward (calls, autograd graph), in padded tokens:
#: what splitting a minibatch into one more length bucket must save in padding to be worth it.
#: Measured on the "1m" model on one CPU thread: a micro-batch costs ~20 ms + ~0.1 ms per padded token.
MICRO_OVERHEAD_TOKENS = 192


def micro_batches(r: Rows, rows: np.ndarray, budget: int, overhead: int = MICRO_OVERHEAD_TOKENS) -> list[np.ndarray]:
    """Cut ``rows`` into length buckets: groups of consecutive rows in length order (stable sort of
    prompt + response) whose padded size (rows × longest) is at most ``budget`` tokens (a longer row
    goes alone), chosen to minimise ``Σ_groups (rows × longest + overhead)``, the padded tokens the
    forward/backward pays plus ``overhead`` per group.

    An exact dynamic programme over the sorted lengths ``l_1 <= ... <= l_n``:
    ``cost[j] = min_{i < j, (j - i)·l_j <= budget or j - i = 1} cost[i] + (j - i)·l_j + overhead``.
    A minibatch of rows of ragged lengths is cut where padding would cost more than another
    forward, so less padding is computed; the gradient is the same (each micro-batch is scaled by
    the minibatch's denominator), to float rounding.
    """
    rows = np.asarray(rows, dtype=np.int64)
    total = r.prompt_len[rows] + r.resp_len[rows]
    sort = np.argsort(total, kind="stable")
    order, lens = rows[sort], total[sort].astype(np.int64)
    n = len(order)
    if n == 0:
        return []
    cost = np.zeros(n + 1, dtype=np.float64)
    cut = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        lj = int(lens[j - 1])
        lo = max(0, j - max(1, budget // max(lj, 1)))  # the group rows i..j-1 fits the budget (or is one row)
        i = np.arange(lo, j)
        c = cost[lo:j] + (j - i) * lj + overhead
        k = int(np.argmin(c))  # the first minimum: the largest group among equal costs
        cost[j], cut[j] = c[k], lo + k
    out: list[np.ndarray] = []
    j = n
    while j > 0:
        out.append(order[cut[j] : j])
        j = int(cut[j])
    return out[::-1]


def _gather(full: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    return full.gather(1, pos)


def forward_policy(policy, mb: Micro, *, entropy: bool = False):
    """``(logp, ent)``, each ``(b, Lb)``: log π of each response token under ``policy`` (with
    gradient) and, if asked, the entropy of the policy's distribution at that position."""
    logits = policy_logits(policy, mb.ids, mb.attn)
    lp = token_logprobs(logits[:, :-1], mb.ids[:, 1:])
    logp = _gather(lp, mb.pos)
    ent = None
    if entropy:
        ent = _gather(token_entropy(logits[:, :-1]), mb.pos)
    return logp, ent


def reference_logprobs(
    reference: torch.nn.Module, batch: TrajectoryBatch, *, pad_id: int, device, micro_batch_tokens: int
) -> TrajectoryBatch:
    """``batch`` with ``ref_logprobs``: log π_ref of each response token under the frozen
    ``reference`` (one no-grad forward in micro-batches; 0 past each row's response)."""
    r = rows_of(batch)
    out = torch.zeros(r.mask.shape, dtype=torch.float32)
    with torch.no_grad():
        for rows in micro_batches(r, np.arange(len(r)), micro_batch_tokens):
            mb = make_micro(r, rows, pad_id, device)
            lp, _ = forward_policy(reference, mb)
            out[torch.from_numpy(rows), : mb.Lb] = lp.float().cpu()
    return batch.with_token_fields(ref_logprobs=out)


def forward_critic(critic, mb: Micro) -> torch.Tensor:
    """``(b, Lb)`` critic values of each response token (the output at position P + t − 1)."""
    return _gather(critic_head_outputs(critic, mb.ids, mb.attn), mb.pos)


def normaliser(r: Rows, rows: np.ndarray, agg: str) -> float:
    """The minibatch's global denominator of aggregation mode ``agg`` (see the module docstring)."""
    m = r.mask[torch.from_numpy(np.asarray(rows, dtype=np.int64))]
    if agg == "token-mean":
        n = int(m.sum())
    elif agg.startswith("seq-mean-token-sum-norm"):
        n = int(r.resp_len[rows].max())
    elif agg.startswith("seq-mean"):
        n = int((m.sum(1) > 0).sum())
    elif agg == "turn-mean":
        t = r.turn_ids[torch.from_numpy(np.asarray(rows, dtype=np.int64))]
        n = int(sum(len(torch.unique(t[i][m[i]])) for i in range(len(rows))))
    else:
        raise ValueError(f"agg: expected a reducing mode, found {agg!r}")
    return float(max(n, 1))


# ---------------------------------------------------------------------------------------------
# metrics over micro-batches


class MetricMeter:
    """Combines per-micro-batch metrics: ``*_min`` by min, ``*_max`` by max, everything else by a
    weighted mean (weight = the micro-batch's action tokens, or turns for ``turn_*`` metrics);
    NaN values are left out."""

    def __init__(self):
        self.sum = defaultdict(float)
        self.w = defaultdict(float)
        self.ext: dict[str, float] = {}

    def add(self, metrics: dict, *, tokens: float, turns: float | None = None) -> None:
        for k, v in metrics.items():
            v = float(v)
            if v != v:  # NaN
                continue
            if k.endswith("_min"):
                self.ext[k] = min(self.ext.get(k, v), v)
            elif k.endswith("_max"):
                self.ext[k] = max(self.ext.get(k, v), v)
            else:
                w = turns if (k.startswith("turn_") and turns is not None) else tokens
                self.sum[k] += v * w
                self.w[k] += w

    def result(self) -> dict:
        out = {k: self.sum[k] / self.w[k] for k in self.sum if self.w[k] > 0}
        out.update(self.ext)
        return out


def _n_turns(mask: torch.Tensor, turn_ids: torch.Tensor) -> int:
    t = torch.where(mask, turn_ids, torch.full_like(turn_ids, -1))
    return int(sum(len(torch.unique(t[i][mask[i]])) for i in range(mask.shape[0])))


# ---------------------------------------------------------------------------------------------
# the update


def _grad_norm(params) -> float:
    norms = [p.grad.detach().norm(2) for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms), 2)) if norms else 0.0


def _step(opt, params, grad_clip: float) -> float:
    if grad_clip > 0:
        gn = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    else:
        gn = _grad_norm(params)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return gn


@dataclass(frozen=True)
class Learners:
    """What an update moves: the policy and/or the critic, each with its optimizer (None: that one
    is not updated; a critic whose trunk is the policy's moves with the policy's step)."""

    policy: torch.nn.Module | None = None
    policy_opt: torch.optim.Optimizer | None = None
    critic: torch.nn.Module | None = None
    critic_opt: torch.optim.Optimizer | None = None


@dataclass(frozen=True)
class UpdateSettings:
    """The slice of the trainer's :class:`~mpo_viz.train.Config` an update reads (the fields of the
    same names; :meth:`of` takes them from a Config)."""

    epochs: int
    minibatches: int
    micro_batch_tokens: int
    loss: str = "turn_ppo"
    loss_options: dict = field(default_factory=dict)
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    value_clip: float | None = 0.5
    grad_clip: float = 1.0

    @classmethod
    def of(cls, cfg: Config, *, epochs: int | None = None, value_clip: float | None = None) -> UpdateSettings:
        """The settings of ``cfg``; ``epochs`` (default ``cfg.epochs``: the critic's own pass gives
        ``critic_epochs``) and ``value_clip`` (resolved by the trainer) given apart."""
        return cls(
            epochs=cfg.epochs if epochs is None else epochs,
            minibatches=cfg.minibatches,
            micro_batch_tokens=cfg.micro_batch_tokens,
            loss=cfg.loss,
            loss_options=dict(cfg.loss_options),
            kl_coef=cfg.kl_coef,
            kl_estimator=cfg.kl_estimator,
            entropy_coef=cfg.entropy_coef,
            value_clip=value_clip,
            grad_clip=cfg.grad_clip,
        )


def update_epochs(
    r: Rows, learners: Learners, settings: UpdateSettings, *, generator: torch.Generator, pad_id: int, device
) -> dict:
    """Run ``settings.epochs`` × ``settings.minibatches`` optimizer steps on the rows of ``r``;
    returns the metrics.

    ``learners.policy=None`` updates only the critic (the critic's own pass); ``critic=None`` only
    the policy.
    Metrics: ``policy_loss``, ``entropy`` (token-mean), ``kl_ref`` (with a reference),
    ``grad_norm`` (policy, before clipping), ``value_loss``, ``critic_grad_norm`` — each the mean
    over optimizer steps of the minibatch's value; every :func:`mpo_viz.losses.policy_loss` metric
    and ``vf_clipfrac``, ``vf_explained_var``, ``vf_mse`` of :func:`value_loss` — combined over
    micro-batches by :class:`MetricMeter`; ``update_tokens`` (action tokens × epochs) and
    ``optimizer_steps``.
    """
    run = _Update(r, learners, settings, generator, pad_id, device)
    for model in (learners.policy, learners.critic):
        if model is not None:
            model.train()
    try:
        for _ in range(settings.epochs):
            perm = torch.randperm(len(r), generator=generator).numpy()
            for chunk in np.array_split(perm, settings.minibatches):
                if len(chunk):
                    run.minibatch(chunk)
    finally:
        for model in (learners.policy, learners.critic):
            if model is not None:
                model.eval()
    return run.result()


class _Update:
    """One update's state: the rows, what moves, the settings, and the metrics so far."""

    def __init__(self, r: Rows, learners: Learners, settings: UpdateSettings, generator, pad_id: int, device):
        self.r, self.learners, self.settings = r, learners, settings
        self.generator, self.pad_id, self.device = generator, pad_id, device
        self.agg = settings.loss_options.get("agg") or get_loss(settings.loss).agg
        self.pm, self.cm, self.steps_meter = MetricMeter(), MetricMeter(), MetricMeter()
        self.steps, self.tokens = 0, 0

    def minibatch(self, chunk: np.ndarray) -> None:
        """One optimizer step (of the policy and/or the critic) on the rows ``chunk``, its
        micro-batches' gradients accumulated; each normalised by the whole minibatch's denominator."""
        r, lr, st = self.r, self.learners, self.settings
        scale_p = normaliser(r, chunk, self.agg) if lr.policy is not None else None
        scale_v = normaliser(r, chunk, "token-mean")
        sums: defaultdict[str, float] = defaultdict(float)  # minibatch losses: the sum of the micro-batch terms
        for rows in micro_batches(r, chunk, st.micro_batch_tokens):
            self._micro(make_micro(r, rows, self.pad_id, self.device), scale_p, scale_v, sums)
        if lr.policy is not None:
            sums["grad_norm"] = _step(
                lr.policy_opt, [p for p in lr.policy.parameters() if p.requires_grad], st.grad_clip
            )
        if lr.critic is not None:
            sums["critic_grad_norm"] = _step(
                lr.critic_opt, [p for p in lr.critic.parameters() if p.requires_grad], st.grad_clip
            )
        self.steps_meter.add(sums, tokens=1.0)
        self.steps += 1

    def _micro(self, mb: Micro, scale_p, scale_v: float, sums: dict) -> None:
        """The forward and backward of one micro-batch."""
        r, lr, st, device = self.r, self.learners, self.settings, self.device

        def take(
            x: torch.Tensor | None,
        ) -> Any:  # a field of the batch, None when absent (a loss that needs it says so)
            return None if x is None else mb.take(x).to(device)

        mask = mb.take(r.mask).to(device)
        n_tok = float(mask.sum())
        self.tokens += int(n_tok)
        turn_ids = mb.take(r.turn_ids).to(device)
        if lr.policy is not None:
            logp, ent = forward_policy(lr.policy, mb, entropy=True)
            lp_loss, metrics = policy_loss(
                st.loss,
                logp,
                take(r.old_logp),
                take(r.advantages),
                mask,
                turn_ids=turn_ids,
                rollout_logp=take(r.rollout_logp),
                scale=scale_p,
                **st.loss_options,
            )
            total = lp_loss
            sums["policy_loss"] += float(lp_loss.detach())
            if ent is not None:
                ent_mean = aggregate(ent, mask, "token-mean", scale=scale_v)
                sums["entropy"] += float(ent_mean.detach())
                if st.entropy_coef:
                    total = total - st.entropy_coef * ent_mean
            if st.kl_coef:
                kl = kl_penalty(logp, take(r.ref_logp), st.kl_estimator, mask=mask)
                kl_loss = aggregate(kl, mask, "token-mean", scale=scale_v)
                total = total + st.kl_coef * kl_loss
                sums["kl_ref"] += float(kl_loss.detach())
            total.backward()
            self.pm.add(metrics, tokens=n_tok, turns=_n_turns(mask.cpu(), turn_ids.cpu()))
        if lr.critic is not None:
            v = forward_critic(lr.critic, mb)
            v_loss, vmetrics = value_loss(
                v, take(r.values), take(r.returns), mask, clip=st.value_clip if st.value_clip else None, scale=scale_v
            )
            v_loss.backward()
            sums["value_loss"] += float(v_loss.detach())
            self.cm.add(vmetrics, tokens=n_tok)

    def result(self) -> dict:
        return {
            **self.pm.result(),
            **self.cm.result(),
            **self.steps_meter.result(),
            "optimizer_steps": self.steps,
            "update_tokens": self.tokens,
        }


def update_with_critic(
    r: Rows,
    learners: Learners,
    settings: UpdateSettings,
    critic: Learners | None = None,
    critic_settings: UpdateSettings | None = None,
    *,
    generator: torch.Generator,
    pad_id: int,
    device,
    side_thread: bool = True,
) -> dict:
    """The policy's pass (``learners``, ``settings``: a critic whose trunk is the policy's moves with
    it) and, apart, the critic's own pass (``critic``, ``critic_settings``) over the same rows;
    returns the policy pass's metrics with the critic's (``value_loss``, ``vf_*``,
    ``critic_grad_norm``, ``critic_optimizer_steps``, ``critic_update_tokens``).

    With ``side_thread`` and :func:`parallel_ok`, the critic's pass runs in a second thread beside
    the policy's: the two share no parameter, and the critic's shuffles come from a copy of the
    generator advanced past the policy's (``settings.epochs`` permutations), so both passes draw what
    they draw one after the other and the generator ends in the same state either way."""
    common = dict(generator=generator, pad_id=pad_id, device=device)
    worker = g = None
    if (
        critic is not None
        and critic_settings is not None
        and side_thread
        and learners.policy is not None
        and parallel_ok(learners.policy, critic.critic, device)
    ):
        g = torch.Generator().manual_seed(0)
        g.set_state(generator.get_state())
        for _ in range(settings.epochs):
            torch.randperm(len(r), generator=g)
        pool = side_pool()
        worker = pool.submit(update_epochs, r, critic, critic_settings, **{**common, "generator": g})
        pool.shutdown(wait=False)
    try:
        out = update_epochs(r, learners, settings, **common)
    finally:
        if worker is not None:  # the critic's pass ends before anything else happens
            wait([worker])
    if critic is None or critic_settings is None:
        return out
    if worker is not None and g is not None:
        c = worker.result()
        generator.set_state(g.get_state())
    else:
        c = update_epochs(r, critic, critic_settings, **common)
    out["critic_optimizer_steps"] = c.pop("optimizer_steps")
    out["critic_update_tokens"] = c.pop("update_tokens")
    out.update(c)
    return out


def parallel_ok(policy: torch.nn.Module, critic: torch.nn.Module | None, device) -> bool:
    """Whether the critic's update may run in a second thread beside the policy's: a CPU with a core
    beyond torch's threads, and no dropout in either model (dropout draws from torch's global
    generator, whose draws two threads would interleave in a racing order; with none, each thread's
    numbers are those of the passes run one after the other)."""
    if critic is None or torch.device(device).type != "cpu" or not spare_cores():
        return False
    for model in (policy, critic):
        if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
            return False
        for cfg in {
            id(c): c
            for c in (getattr(model, "config", None), getattr(getattr(model, "trunk", None), "config", None))
            if c
        }.values():
            if any(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                for k, v in cfg.to_dict().items()
                if "dropout" in k or "pdrop" in k
            ):
                return False
    return True


# ---------------------------------------------------------------------------------------------
# what the update did, per token and per turn


@dataclass(frozen=True)
class AfterUpdate:
    """Per row, what an update left: ``ratio`` (B, L) float32 — ``exp(logπ_new − logπ_base)`` on
    action tokens (base: the loss's, ``old_logprobs``; sao: ``rollout_logprobs``), 1 elsewhere;
    ``clipped`` (B, L) int8 — 1 where the loss's clip holds the token at that ratio; per row, one
    entry per turn: ``turn_ratio`` (float64) and ``turn_clipped`` (int8), see
    :class:`mpo_viz.losses.ClipFlags`."""

    ratio: torch.Tensor
    clipped: torch.Tensor
    turn_ratio: list
    turn_clipped: list

    def attach(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """``batch`` (the rows this was computed on) with the four v1 fields set."""
        return batch.with_token_fields(ratio=self.ratio, clipped=self.clipped).with_turn_fields(
            turn_ratio=self.turn_ratio, turn_clipped=self.turn_clipped
        )


def after_update(policy: torch.nn.Module, r: Rows, settings: UpdateSettings, *, pad_id: int, device) -> AfterUpdate:
    """The policy's ratio on every token of ``r`` and the loss's clip flags there, by
    :func:`mpo_viz.losses.clip_flags` with ``settings.loss`` and ``settings.loss_options`` on the
    rows' advantages: one no-grad forward of ``policy`` in micro-batches of at most
    ``settings.micro_batch_tokens`` padded tokens (about a third of one epoch's policy compute)."""
    B, L = r.mask.shape
    ratio = torch.ones((B, L), dtype=torch.float32)
    clipped = torch.zeros((B, L), dtype=torch.int8)
    turn_ratio: list = [np.zeros(0)] * B
    turn_clipped: list = [np.zeros(0, dtype=np.int8)] * B
    with torch.no_grad():
        for rows in micro_batches(r, np.arange(B), settings.micro_batch_tokens):
            mb = make_micro(r, rows, pad_id, device)
            f = _micro_flags(policy, r, mb, settings, device)
            idx = torch.from_numpy(mb.rows)
            ratio[idx, : mb.Lb] = f.ratio.float().cpu()
            clipped[idx, : mb.Lb] = f.clipped.to(torch.int8).cpu()
            row, rho, out = f.turn_row.cpu().numpy(), f.turn_ratio.double().cpu().numpy(), f.turn_clipped.cpu().numpy()
            for j, i in enumerate(mb.rows):
                turn_ratio[i], turn_clipped[i] = rho[row == j], out[row == j].astype(np.int8)
    return AfterUpdate(ratio=ratio, clipped=clipped, turn_ratio=turn_ratio, turn_clipped=turn_clipped)


def _micro_flags(policy: torch.nn.Module, r: Rows, mb: Micro, settings: UpdateSettings, device):
    """:func:`mpo_viz.losses.clip_flags` of one micro-batch at the policy's log-probs."""

    def take(x: torch.Tensor | None) -> Any:
        return None if x is None else mb.take(x).to(device)

    logp, _ = forward_policy(policy, mb)
    return clip_flags(
        settings.loss,
        logp,
        take(r.old_logp),
        take(r.advantages),
        take(r.mask),
        turn_ids=take(r.turn_ids),
        rollout_logp=take(r.rollout_logp),
        **settings.loss_options,
    )
