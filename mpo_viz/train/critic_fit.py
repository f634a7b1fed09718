"""Fit a critic to a batch's returns, with a held-out split and an explained-variance gate.

Owns the fit loop (:func:`fit_values`) and what it reads and reports (:func:`holdout_split`,
:func:`critic_outputs`, :class:`CriticFit`); one loop serves the trainer's critic warm-up (a pool
of rollouts of the start policy) and :func:`mpo_viz.train.fitted_critic.fit_critic`, which gives
logged trajectories that carry no values the values of a critic fitted to their own returns
(``mpo-viz fit-critic``). Invariant: held-out episodes are never trained on. Per step::

    draw ``batch_episodes`` training episodes (a seeded permutation, epoch by epoch)
    loss = ½ · token-mean over their action tokens of (V_θ(t) − G_t)²       (no value clipping)
    one AdamW step (gradient norm clipped at ``grad_clip``)
    every ``eval_every`` steps: explained variance on the held-out episodes
        EV = 1 − Var(G − V) / Var(G)   over held-out action tokens (population variances)
    (``window``: a row longer than ``window`` tokens is trained ``window`` tokens at a time, the
    earlier windows' keys and values held without gradient: :func:`windowed_step`)
    stop at the first evaluation with EV ≥ ``gate`` ("gate"), after ``patience`` evaluations
    without a better EV ("patience"), or after ``steps`` ("budget")
    ``keep_best``: end with the weights of the evaluation with the best held-out EV

unless the outcome is fixed before the first step (no step is then taken): every target is the
same ("constant": nothing varies, the EV is undefined) or, with a gate, every held-out target is
("heldout_constant": the EV the gate reads is undefined, so it cannot pass). The critic is then
set to the constant ``c`` that minimises the loss over the training tokens, their mean (exactly
the targets' value in the first case), by its value head: weights 0, bias ``c``, so
``V(s) = c`` everywhere.

The values are the critic's output at position
``P + t − 1`` for response token ``t`` (the state before the token; docs/models.md), exactly as
the rollout and the trainer's updates read them. Deterministic for a seed on CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from mpo_viz.analysis import explained_variance
from mpo_viz.checks import OptionError
from mpo_viz.data.io import release_memory
from mpo_viz.data.moments import Moments
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.losses import value_loss
from mpo_viz.train.update import Micro, Rows, forward_critic, make_micro, micro_batches, rows_of

__all__ = [
    "CONSTANT_STOPS",
    "CriticFit",
    "causal_values",
    "critic_outputs",
    "mlp_in_slices",
    "MLP_SLICE_TOKENS",
    "fit_values",
    "check_window",
    "row_window",
    "holdout_split",
    "set_constant",
    "FIT_POSITIONS",
    "fit_positions",
]

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
            return (
                f"critic fit: 0 steps, the critic set to the constant {self.constant:.4g} (every return of the "
                f"{self.n_train + self.n_heldout} episodes is {self.constant:.4g}: nothing varies for a critic to "
                f"learn, the explained variance is undefined and no gate can pass)"
            )
        if self.stop == "heldout_constant":
            return (
                f"critic fit: 0 steps, the critic set to the training episodes' mean return {self.constant:.4g} "
                f"(the returns of the {self.n_heldout} held-out episodes are all equal, so their explained "
                f"variance is undefined and the gate {self.gate:g} cannot pass; {self.n_train} training "
                f"episodes)"
            )
        if self.passed:
            why = f"passed the gate {self.gate:g}"
        elif math.isnan(self.heldout_ev):
            why = (
                "the held-out returns are all equal, so the explained variance is undefined and no gate can "
                "pass (e.g. no held-out episode succeeded)"
            )
        elif self.stop == "patience":
            why = f"stopped early: no better held-out EV for the last {self.steps - self.best_step} steps"
        elif self.gate is None or math.isnan(self.gate):
            why = f"the whole budget of {self.steps} steps, no gate"
        else:
            why = f"the budget of {self.steps} steps ended before the gate {self.gate:g}"
        kept = (
            f"; the weights of step {self.kept_step}, the best held-out EV, kept"
            if self.kept_step is not None and self.kept_step != self.steps
            else ""
        )
        return (
            f"critic fit: {self.steps} steps, held-out explained variance {self.heldout_ev:.3f} ({why}{kept}; "
            f"{self.n_train} training / {self.n_heldout} held-out episodes)"
        )


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


def critic_outputs(
    critic: torch.nn.Module, r: Rows, rows, *, pad_id: int, device, micro_batch_tokens: int = 8192
) -> torch.Tensor:
    """``(len(rows), L)`` float32 values of the critic for ``rows`` of ``r`` (no gradient; 0 past
    each row's response). The same alignment as the rollout's and the updates' values. The MLPs of
    a row longer than :data:`MLP_SLICE_TOKENS` positions run a slice at a time (:func:`mlp_in_slices`)."""
    rows = np.asarray(rows, dtype=np.int64)
    L = r.mask.shape[1]
    out = torch.zeros((len(rows), L), dtype=torch.float32)
    where = {int(i): j for j, i in enumerate(rows)}
    was_training = critic.training
    critic.eval()
    with torch.no_grad(), mlp_in_slices(critic, MLP_SLICE_TOKENS):
        for group in micro_batches(r, rows, micro_batch_tokens):
            mb = make_micro(r, group, pad_id, device)
            v = causal_values(critic, mb).float().cpu()
            v[torch.arange(mb.Lb)[None] >= torch.from_numpy(r.resp_len[group])[:, None]] = 0.0  # right padding
            out[[where[int(i)] for i in group], : mb.Lb] = v
    critic.train(was_training)
    release_memory()  # the long rows' activations: given back, not kept as the heap's high-water mark
    return out


def _ev(critic, r: Rows, rows, targets: torch.Tensor, **kw) -> float:
    v = critic_outputs(critic, r, rows, **kw)
    idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
    return explained_variance(targets[idx], v.double(), r.mask[idx])


def _ev_of(values: torch.Tensor, r: Rows, rows, targets: torch.Tensor) -> float:
    """The explained variance on ``rows`` of outputs ``values`` computed for every row."""
    idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
    return explained_variance(targets[idx], values[idx].double(), r.mask[idx])


#: a fit's default training window for logged rows (:func:`mpo_viz.train.fitted_critic.fit_critic`):
#: rows up to this many tokens (prompt + response) train whole, exactly; longer ones window by window
FIT_WINDOW = 1024

#: a window's attention reads (window × tokens so far) query-key pairs, and its forward and backward
#: hold a few bytes for each: a row of T tokens trains in windows of at most this many pairs / T
#: tokens (:func:`row_window`), so that this term stays near 0.05 GB however long the row (4M pairs
#: measured 0.055 GB more at the peak of a fit on 20,000-token rows, 10% faster)
WINDOW_PAIRS = 2_000_000

#: the shortest window :func:`row_window` gives (a row of more than WINDOW_PAIRS / 64 = 31,250 tokens
#: then holds more pairs than WINDOW_PAIRS)
MIN_WINDOW = 64


def check_window(window) -> int | None:
    """``window`` as the fit reads it: None (or 0, as ``--window 0`` says) trains every row whole, an
    integer >= 1 is the window; anything else is an :class:`OptionError` (checked before any work)."""
    if window is None or (isinstance(window, numbers.Integral) and not isinstance(window, bool) and window == 0):
        return None
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise OptionError("window", f"expected an integer >= 1, or 0 or None (every row whole), found {window!r}")
    return int(window)


def row_window(T: int, window: int) -> int:
    """The window a row of ``T`` tokens trains in: ``min(window, max(MIN_WINDOW, WINDOW_PAIRS // T))``
    (e.g. 1,024 up to a 1,953-token row, 133 for 15,000 tokens at ``window`` 1,024)."""
    return min(int(window), max(MIN_WINDOW, WINDOW_PAIRS // max(int(T), 1)))


def window_outputs(critic: torch.nn.Module, ids: torch.Tensor, window: int):
    """Yield ``(a, out)`` for the windows ``[a, a + window)`` of one sequence ``ids`` ``(1, T)``:
    ``out`` ``(1, w)`` are the critic's outputs at those positions, with gradient through this
    window's computation only. The keys and values of the earlier windows are read from a cache
    and held without gradient, so the outputs equal the whole sequence's forward (to float
    rounding) while the memory a backward keeps is one window's activations, not the row's.
    The caller takes each window's backward before asking for the next."""
    T = int(ids.shape[1])
    cache = DynamicCache()
    for a in range(0, T, window):
        b = min(T, a + window)
        pos = torch.arange(a, b, device=ids.device)[None]
        yield a, critic(input_ids=ids[:, a:b], position_ids=pos, past_key_values=cache)
        _detach_cache(cache)


def _detach_cache(cache: DynamicCache) -> None:
    """The cached keys and values without their graph: the next window reads them, not their gradient."""
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            raise TypeError(
                f"window: the trunk's cache layer {type(layer).__name__} holds no keys and values to carry "
                "from one window to the next; fit with window=None (every row whole)"
            )
        layer.keys, layer.values = keys.detach(), values.detach()  # type: ignore[union-attr]


def _input_embedding(critic: torch.nn.Module) -> torch.nn.Embedding | None:
    """The trunk's plain input embedding whose gradient a fit takes (None: another kind, frozen, or
    one whose backward is not a plain scatter-add — max_norm, scale_grad_by_freq, sparse)."""
    trunk = getattr(critic, "trunk", None)
    get = getattr(trunk, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    if type(emb) is not torch.nn.Embedding or not emb.weight.requires_grad:
        return None
    if emb.max_norm is not None or emb.scale_grad_by_freq or emb.sparse:
        return None
    return emb


@contextlib.contextmanager
def embedding_grad_in_place(critic: torch.nn.Module) -> Iterator[None]:
    """Within it, each backward adds the input embedding's gradient into its ``.grad`` in place:
    ``grad[ids[i]] += ∂L/∂e_i`` (``index_add_``; rows at ``padding_idx`` get nothing), the chain rule
    of the lookup ``e = W[ids]`` written out. The default backward of an embedding builds a dense
    ``(vocab, H)`` gradient for every backward and then adds it to ``.grad``: for a window of 200
    tokens of a critic embedding 151k ids, 77 MB written twice. The same gradient, to the rounding
    of the sums' order. Nothing changes for a critic without a plain trainable embedding
    (:func:`_input_embedding`)."""
    emb = _input_embedding(critic)
    if emb is None:
        yield
        return

    def lookup(module, args, out):
        if not torch.is_grad_enabled():
            return None
        ids = args[0].reshape(-1)
        leaf = out.detach().requires_grad_()

        def scatter(g: torch.Tensor) -> None:
            rows, g2 = ids, g.reshape(-1, g.shape[-1])
            if module.padding_idx is not None:
                keep = rows != module.padding_idx
                rows, g2 = rows[keep], g2[keep]
            w = module.weight
            if w.grad is None:
                w.grad = torch.zeros_like(w)
            w.grad.index_add_(0, rows, g2.to(w.dtype))

        leaf.register_hook(scatter)
        return leaf

    handle = emb.register_forward_hook(lookup)
    try:
        yield
    finally:
        handle.remove()


#: a no-gradient forward over more positions than this runs each MLP of the trunk over at most this
#: many tokens (rows × positions) at a time (:func:`mlp_in_slices`): its (tokens, intermediate)
#: activations are the largest tensors of a long row's forward (a 22,000-token row of the 1m critic:
#: +0.26–0.39 GB whole, +0.13–0.21 GB in slices of 2,048; one thread, load 2.2, two processes each way)
MLP_SLICE_TOKENS = 2048


def _mlps(critic: torch.nn.Module) -> list[torch.nn.Module]:
    """The trunk's position-wise feed-forward blocks: every submodule registered as ``mlp`` (the
    Hugging Face decoder layers' name: Llama, Qwen, Mistral, GPT-2)."""
    return [m for name, m in critic.named_modules() if name.rsplit(".", 1)[-1] == "mlp"]


@contextlib.contextmanager
def mlp_in_slices(critic: torch.nn.Module, tokens: int = MLP_SLICE_TOKENS) -> Iterator[None]:
    """Within it, a forward **without gradient** over more than ``tokens`` positions runs each MLP of
    the trunk (:func:`_mlps`) over slices of the sequence, ``max(1, tokens // b)`` positions of its
    ``b`` rows at a time (at most ``tokens`` rows × positions): ``mlp(x) = cat_s mlp(x[:, s])``, which
    holds for any position-wise block (each position's output reads that position only), so the
    outputs are the same to float rounding (bit for bit in our checks) while the
    ``(b, T, intermediate)`` activations of a long row are held a slice at a time. Run as they are:
    forwards with gradient, inputs of at most ``tokens`` positions (so short rows, however many, never
    slice), and any MLP called with more than its one ``(b, T, H)`` tensor or returning something
    else (Bloom's residual argument, a mixture of experts' router scores). Nothing changes for a
    trunk without ``mlp`` blocks. Not for modules that other threads run meanwhile: the MLPs' forward
    is replaced on the module itself."""
    if tokens < 1:
        raise ValueError(f"mlp_in_slices: expected tokens >= 1, found {tokens}")
    mlps = _mlps(critic)

    def sliced(forward):
        def run(*args, **kwargs):
            x = args[0] if len(args) == 1 and not kwargs else None
            if torch.is_grad_enabled() or not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] <= tokens:
                return forward(*args, **kwargs)
            step = max(1, tokens // x.shape[0])
            first = forward(x[:, :step])
            if not isinstance(first, torch.Tensor) or first.shape[:2] != x[:, :step].shape[:2]:
                return forward(x)  # not a plain position-wise block: whole
            rest = [forward(x[:, s : s + step]) for s in range(step, x.shape[1], step)]
            return torch.cat([first, *rest], dim=1)

        return run

    own = [m.__dict__.get("forward") for m in mlps]  # a forward already set on the instance, kept
    for m in mlps:
        m.forward = sliced(m.forward)  # an instance attribute: nn.Module.__call__ reads it first
    try:
        yield
    finally:
        for m, f in zip(mlps, own):
            if f is None:
                del m.forward  # the class's forward again
            else:
                m.forward = f


def windowed_step(
    critic: torch.nn.Module, mb: Micro, g: torch.Tensor, m: torch.Tensor, *, scale: float, window: int
) -> float:
    """The loss ``½ · Σ_t m_t (V_t − G_t)² / scale`` of the one row of ``mb`` with its gradient
    accumulated window by window (:func:`window_outputs`, windows of :func:`row_window` tokens:
    ``window``, shorter for very long rows); returns the loss.

    ``g``, ``m`` ``(1, Lb)``: the targets and mask of the row's response tokens; token ``t``'s value
    is the output at position ``mb.pos[0, t]``, so it belongs to the window that holds that
    position, and the windows' losses sum to the whole row's. The loss is the same number; the
    gradient leaves out what a token's value owes to the earlier windows' keys and values (their
    gradient through this token): a truncated backward, exact for rows of at most ``window`` tokens
    (which never come here). Memory: one window's activations plus the cache (``O(window · T)``
    attention pairs, bounded by :data:`WINDOW_PAIRS`; ``O(T)`` keys and values), instead of ``O(T)``
    activations of every layer. The embedding's gradient is added in place window by window
    (:func:`embedding_grad_in_place`), not built dense for each window."""
    pos = mb.pos[0]
    total = 0.0
    with embedding_grad_in_place(critic):
        for a, out in window_outputs(critic, mb.ids, row_window(mb.ids.shape[1], window)):
            here = (pos >= a) & (pos < a + out.shape[1]) & m[0]
            if not bool(here.any()):
                continue
            v = out[0, pos[here] - a][None]
            loss, _ = value_loss(v, None, g[:, here], torch.ones_like(v, dtype=torch.bool), clip=None, scale=scale)
            loss.backward()
            total += float(loss.detach())
    return total


def _fit_step(
    critic: torch.nn.Module,
    r: Rows,
    chunk: np.ndarray,
    g32: torch.Tensor,
    opt,
    params: list,
    grad_clip: float,
    *,
    pad_id: int,
    device,
    micro_batch_tokens: int,
    window: int | None = None,
) -> float:
    """One AdamW step of ``½·mean_t (V_t − G_t)²`` over the action tokens of rows ``chunk`` (its
    micro-batches' gradients accumulated; each row longer than ``window`` tokens alone, by
    :func:`windowed_step`); returns the loss."""
    n_tok = float(r.mask[torch.from_numpy(chunk)].sum().clamp_min(1))
    step_loss = 0.0
    long = np.zeros(len(chunk), dtype=bool)
    if window is not None:
        long = r.prompt_len[chunk] + r.resp_len[chunk] > window
        for row in chunk[long]:  # alone, window by window
            mb = make_micro(r, np.array([row]), pad_id, device)
            g, m = mb.take(g32).to(device), mb.take(r.mask).to(device)
            step_loss += windowed_step(critic, mb, g, m, scale=n_tok, window=window)
            release_memory()  # its windows' activations, before the next long row
    for group in micro_batches(r, chunk[~long], micro_batch_tokens):
        mb = make_micro(r, group, pad_id, device)
        loss, _ = value_loss(
            causal_values(critic, mb), None, mb.take(g32).to(device), mb.take(r.mask).to(device), clip=None, scale=n_tok
        )
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
        out[torch.tensor(tt["row"].to_numpy()), torch.tensor(tt["start"].to_numpy())] = (
            True  # copies: the columns are read-only
        )
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
        log(
            f"critic fit: step {done}/{steps}, held-out explained variance {ev:.3f}"
            + (f" (gate {gate:g})" if gate is not None else "")
        )


def set_constant(critic: torch.nn.Module, value: float) -> None:
    """Make ``critic`` (a :class:`~mpo_viz.models.Critic`: ``head`` an ``nn.Linear(H, 1)``) output
    ``value`` at every position: head weights 0, bias ``value``. Exact (``0·h + c = c`` for any
    finite hidden state), and the zero-loss fit to constant targets; the trunk is untouched, and
    the first update step gives the head's weights a gradient again."""
    head = getattr(critic, "head", None)
    if not isinstance(head, torch.nn.Linear) or head.out_features != 1 or head.bias is None:
        raise ValueError(
            f"critic: expected a value head nn.Linear(H, 1) with a bias as .head, found "
            f"{type(head).__name__ if head is not None else 'none'} on {type(critic).__name__}"
        )
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


def _constant_fit(
    critic: torch.nn.Module,
    stop: str,
    targets: torch.Tensor,
    mask: torch.Tensor,
    train: np.ndarray,
    held: np.ndarray,
    gate: float | None,
) -> CriticFit:
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
    return CriticFit(
        steps=0,
        stop=stop,
        gate=math.nan if gate is None else float(gate),
        heldout_ev=ev,
        best_ev=ev,
        best_step=0,
        train_ev=explained_variance(targets[idx], flat[idx], mask[idx]),
        n_train=len(train),
        n_heldout=len(held),
        history=[{"step": 0, "heldout_ev": ev, "loss": math.nan}],
        constant=c,
        kept_step=0,
    )


class _Best:
    """The best held-out EV so far (NaN loses to any number), its step, the evaluations since it,
    and (``keep``) the trainable weights it had — in a temporary file of the system's temporary
    folder (``tempfile``, ``TMPDIR``; ``torch.save``, read back bit for bit by :meth:`restore`),
    not in memory: the copy is as large as the weights (77 MB for a critic embedding 151k ids) and
    waits through the whole fit. Where the file cannot be written (a full or read-only folder) the
    copy is kept in memory instead, with a warning. :meth:`close` removes the file (so does the
    object's end, should the fit stop on an error)."""

    def __init__(self, ev: float, params: list, keep: bool):
        self.ev, self.step, self.stale, self.params = ev, 0, 0, params
        self._dir = tempfile.TemporaryDirectory(prefix="mpo_viz_best_") if keep else None
        self._held: list[torch.Tensor] | None = None  # the in-memory copy, where no file could be written
        self._save()

    def _save(self) -> None:
        if self._held is not None:
            for w, p in zip(self._held, self.params):
                w.copy_(p.detach())
            return
        if self._dir is None:
            return
        try:
            torch.save([p.detach() for p in self.params], Path(self._dir.name) / "best.pt")
        except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as RuntimeError
            warnings.warn(
                f"keep_best: could not write the best weights to {self._dir.name} ({exc}); keeping them in memory",
                RuntimeWarning,
                stacklevel=3,
            )
            self._held = [p.detach().clone() for p in self.params]

    def offer(self, ev: float, step: int) -> None:
        if ev > self.ev or (math.isnan(self.ev) and not math.isnan(ev)):
            self.ev, self.step, self.stale = ev, step, 0
            self._save()
        else:
            self.stale += 1

    def restore(self) -> None:
        assert self._dir is not None, "restore() needs keep=True"
        weights = self._held
        if weights is None:
            weights = torch.load(Path(self._dir.name) / "best.pt", map_location="cpu", weights_only=True, mmap=True)
        with torch.no_grad():
            for p, w in zip(self.params, weights):
                p.copy_(w)

    def close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def _reached(ev: float, gate: float | None) -> bool:
    return gate is not None and ev >= gate


def _check_loop(r: Rows, targets, steps: int, batch_episodes: int, eval_every: int, patience) -> torch.Tensor:
    """``targets`` as float64 after checking the loop's counts and the targets' shape."""
    if patience is not None and patience < 1:
        raise OptionError(
            "patience", f"expected an integer >= 1 (evaluations without a better held-out EV), found {patience!r}"
        )
    if steps < 0 or batch_episodes < 1 or eval_every < 1:
        raise ValueError(
            f"steps/batch_episodes/eval_every: expected >= 0, >= 1, >= 1, found {steps}, {batch_episodes}, {eval_every}"
        )
    targets = torch.as_tensor(targets, dtype=torch.float64)
    if targets.shape != r.mask.shape:
        raise ValueError(f"targets: expected shape {tuple(r.mask.shape)}, found {tuple(targets.shape)}")
    return targets


def _fixed_fit(
    critic: torch.nn.Module,
    targets: torch.Tensor,
    mask: torch.Tensor,
    train: np.ndarray,
    held: np.ndarray,
    gate: float | None,
    on_eval,
) -> CriticFit | None:
    """The fit of 0 steps when its outcome is fixed before the first step and the critic has a
    value head (:func:`_fixed_outcome`, :func:`_constant_fit`; ``on_eval`` called once), else None."""
    stop = _fixed_outcome(targets, mask, held, gate)
    if stop is None or not isinstance(getattr(critic, "head", None), torch.nn.Linear):
        return None
    fit = _constant_fit(critic, stop, targets, mask, train, held, gate)
    if on_eval is not None:
        on_eval(0, fit.heldout_ev, critic)
    return fit


def _let_go(batch: TrajectoryBatch) -> None:
    """The fit reads its rows from here on: the batch's derived arrays are not kept through it, nor
    the heap the targets' and rows' padded transients left behind."""
    batch.clear_cache()
    release_memory()


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
    window: int | None = None,
    fused: bool = False,
) -> CriticFit:
    """Fit ``critic`` (in place) to ``targets`` (B, L) on the training split of ``batch``.

    ``positions``: the action tokens the loss and the explained variance read — ``"all"`` (every
    action token) or ``"turn_start"`` (each turn's first action token only: the turn-level states
    ``V(s_k)`` that turn GAE and MAE's macro scale read; :func:`fit_positions`). The critic still
    reads every token of each sequence.

    ``window``: a row longer than this many tokens (prompt + response) trains ``window`` tokens at a
    time, fewer past 1,953 tokens (:func:`row_window`; :func:`windowed_step`: the same loss and
    values, the gradient through earlier windows' keys and values left out), so its memory is one
    window's, not the row's; None or 0 (None is the default, and the trainer's): every row trains
    whole.

    ``fused``: AdamW's fused kernel (``torch.optim.AdamW(fused=True)``): the same update to float
    rounding, without the default implementation's temporaries — two copies of the parameters at
    each step, 0.15 GB for a 1m critic embedding 151k ids. Off by default, so the trainer's and the
    archived experiments' numbers stay as they were (the two part by rounding that training
    amplifies: about 2e-4 in the weights after 20 steps).

    The batch's rows are split by :func:`holdout_split` (``holdout`` share, ``seed``); each step
    is one AdamW step (``lr``, ``weight_decay``; a fresh optimizer) on ``batch_episodes``
    training episodes with the loss ``½·mean_t (V_t − G_t)²`` over their action tokens;
    ``gate=None`` never stops early. ``groups`` (a label per row): hold out whole groups.
    ``log(line)`` receives a line per evaluation, ``on_eval(step, heldout_ev, critic)`` is called
    at each (step 0 included); ``progress`` shows a tqdm bar. ``patience``: stop after that many
    evaluations in a row without a better held-out EV (None: never). ``keep_best``: end with the
    trainable weights of the best evaluation (a copy is written to a temporary file at each new
    best: :class:`_Best`). The held-out EV
    then reported is the best of the evaluations: chosen on the held-out episodes, so optimistic by
    the spread of their noise. ``all_values``: the kept weights' outputs on every row are computed
    once at the end (the training EV is read from them) and returned in ``CriticFit.values``.
    Returns a :class:`CriticFit`; the critic is left in eval mode. When the outcome is fixed before
    the first step (see the module docstring: no target varies, or with a gate no held-out one does)
    and the critic has a value head, it is set to the constant at once (:func:`set_constant`;
    ``on_eval`` is called once, at step 0, after that) and the fit reports 0 steps. Once the fit
    holds its rows, ``batch``'s cached derived arrays are cleared (:meth:`TrajectoryBatch.clear_cache`:
    rebuilt when next used).
    """
    window = check_window(window)
    r = rows_of(batch, fields=False)
    targets = _check_loop(r, targets, steps, batch_episodes, eval_every, patience)
    if positions != "all":
        r = dataclasses.replace(r, mask=fit_positions(batch, positions))
    _let_go(batch)
    train, held = holdout_split(len(r), holdout, seed, groups)
    fixed = _fixed_fit(critic, targets, r.mask, train, held, gate, on_eval)
    if fixed is not None:
        if all_values:
            fixed.values = critic_outputs(
                critic, r, np.arange(len(r)), pad_id=pad_id, device=device, micro_batch_tokens=micro_batch_tokens
            )
        return fixed
    data = _FitData(
        critic, r, targets, train, held, dict(pad_id=pad_id, device=device, micro_batch_tokens=micro_batch_tokens)
    )
    g32 = targets.float()
    own = getattr(critic, "own_parameters", critic.parameters)()
    params = [p for p in own if p.requires_grad]  # a shared trunk is the policy's: only the head moves
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)
    gen = torch.Generator().manual_seed(int(seed) + 1)
    order: list[int] = []  # the training episodes' shuffled order
    losses: list[float] = []  # since the last evaluation
    ev = data.ev(held)
    run = _Progress(best=_Best(ev, params, keep_best), ev=ev, stop="gate" if _reached(ev, gate) else "budget")
    run.history.append({"step": 0, "heldout_ev": ev, "loss": math.nan})
    if on_eval is not None:
        on_eval(0, ev, critic)
    bar = tqdm(total=steps, desc="critic fit", unit="step") if progress and run.stop == "budget" else None
    critic.train()
    while run.stop == "budget" and run.done < steps:
        chunk, order = _next_episodes(order, train, batch_episodes, gen)
        losses.append(_fit_step(critic, r, chunk, g32, opt, params, grad_clip, window=window, **data.kw))
        run.done += 1
        if bar is not None:
            bar.update(1)
        if run.done % eval_every == 0 or run.done == steps:
            run.ev = data.ev(held)
            critic.train()
            run.history.append({"step": run.done, "heldout_ev": run.ev, "loss": float(np.mean(losses))})
            losses = []
            run.best.offer(run.ev, run.done)
            if on_eval is not None:
                on_eval(run.done, run.ev, critic)
                critic.train()
            _say_eval(bar, log, run.done, steps, run.ev, gate)
            if _reached(run.ev, gate):
                run.stop = "gate"
            elif patience is not None and run.best.stale >= patience:
                run.stop = "patience"
    if bar is not None:
        bar.close()
    del opt  # its state (two copies of the weights) is not needed for the values at the end
    return _finish(data, run, gate, keep_best=keep_best, all_values=all_values)


@dataclass
class _FitData:
    """What a fit reads: the critic, the rows and their training/held-out split, the targets, and
    how the critic is called (``kw``: pad id, device, micro-batch tokens)."""

    critic: torch.nn.Module
    r: Rows
    targets: torch.Tensor
    train: np.ndarray
    held: np.ndarray
    kw: dict

    def ev(self, rows) -> float:
        """The critic's explained variance on ``rows`` now."""
        return _ev(self.critic, self.r, rows, self.targets, **self.kw)

    def outputs(self) -> torch.Tensor:
        """The critic's ``(B, L)`` outputs on every row now."""
        return critic_outputs(self.critic, self.r, np.arange(len(self.r)), **self.kw)


@dataclass
class _Progress:
    """Where a fit's loop is: steps ``done``, why it stops (``stop``: ``"budget"`` while it runs on),
    the last held-out EV, the evaluations so far (``history``) and the best one (``best``)."""

    best: _Best
    ev: float
    stop: str
    done: int = 0
    history: list = field(default_factory=list)


def _finish(data: _FitData, run: _Progress, gate: float | None, *, keep_best: bool, all_values: bool) -> CriticFit:
    """The end of a fit: the best evaluation's weights back with ``keep_best``, eval mode, the record
    (with ``all_values`` every row's values of the kept weights)."""
    ev, kept_step = run.ev, run.done
    if keep_best and run.best.step != run.done:
        run.best.restore()
        ev, kept_step = run.best.ev, run.best.step
    run.best.close()  # the best weights' file (removed with its object too, should the fit stop on an error)
    data.critic.eval()
    values = data.outputs() if all_values else None
    train_ev = _ev_of(values, data.r, data.train, data.targets) if values is not None else data.ev(data.train)
    return CriticFit(
        steps=run.done,
        stop=run.stop,
        gate=math.nan if gate is None else float(gate),
        heldout_ev=ev,
        best_ev=run.best.ev,
        best_step=run.best.step,
        train_ev=train_ev,
        n_train=len(data.train),
        n_heldout=len(data.held),
        history=run.history,
        kept_step=kept_step,
        values=values,
    )
