"""Token log-probs and entropies from logits, in chunks (no (B, L, V) log-softmax copy).

A plain ``log_softmax(logits).gather(...)`` allocates a second tensor as large as the logits
(8 × 4096 × 32000 float32 = 4.2 GB) and autograd keeps it; an entropy written with softmax keeps
two or three. Here the forward walks over chunks of positions (``chunk_size`` positions ×
V at a time, upcast to float32 per chunk for bf16/fp16 logits; a fused ``log_softmax`` per chunk)
and keeps nothing but the (B, L) result; the backward recomputes the softmax of each chunk and
writes straight into the gradient buffer of the logits (which autograd has to allocate anyway).
Extra memory is O(chunk_size × V + B × L) in both directions. ``benchmarks/losses.py`` measures it.

:func:`token_logprobs_reference` and :func:`token_entropy_reference` are the plain versions the
tests compare against.
"""

from __future__ import annotations

import torch

from mpo_viz.checks import TensorLike

__all__ = [
    "token_logprobs",
    "token_entropy",
    "token_logprobs_reference",
    "token_entropy_reference",
    "default_chunk_size",
]

_CHUNK_BYTES = 32 * 2**20  # per float32 chunk temporary


def default_chunk_size(vocab: int) -> int:
    """Positions per chunk so that one float32 chunk is ~32 MiB (262 positions at V = 32 000)."""
    return max(1, _CHUNK_BYTES // (4 * max(int(vocab), 1)))


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _blocks(logits3: torch.Tensor, chunk: int):
    """Yield ``(src_view (n, V), flat_start)`` covering the (B, L) positions in row-major order.

    One flat view when the (B, L) dims can be merged without a copy (contiguous logits), else one
    view per row (e.g. ``logits[:, :-1]`` of a model output); either way chunks are views.
    """
    B, L, V = logits3.shape
    try:
        srcs = [(logits3.view(B * L, V), 0)]
    except RuntimeError:
        srcs = [(logits3[b], b * L) for b in range(B)]
    for src, off in srcs:
        n = src.shape[0]
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            yield src[s:e], off + s, off + e


def _prepare(logits, token_ids, chunk_size, temperature, name_ids="token_ids"):
    if not isinstance(logits, torch.Tensor):
        logits = torch.as_tensor(logits)
    if logits.dim() not in (2, 3):
        raise ValueError(f"logits: expected a (B, L, V) or (N, V) tensor, found shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits: expected a floating dtype, found {logits.dtype}")
    if logits.shape[-1] == 0:
        raise ValueError("logits: expected a vocabulary of at least one entry, found V = 0")
    if not temperature > 0:
        raise ValueError(f"temperature: expected a positive number, found {temperature}")
    ids = None
    if token_ids is not None:
        ids = torch.as_tensor(token_ids, device=logits.device)
        if tuple(ids.shape) != tuple(logits.shape[:-1]):
            raise ValueError(
                f"{name_ids}: expected shape {tuple(logits.shape[:-1])} (logits' without V), found {tuple(ids.shape)}"
            )
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
            raise ValueError(f"{name_ids}: expected an integer dtype, found {ids.dtype}")
        V = logits.shape[-1]
        bad = (ids < 0) | (ids >= V)
        if bool(bad.any()):
            b2 = bad.reshape(-1, bad.shape[-1]) if bad.dim() == 2 else bad.reshape(1, -1)
            r = int(b2.any(-1).nonzero()[0, 0])
            c = int(b2[r].nonzero()[0, 0])
            where = f"row {r}, position {c}" if bad.dim() == 2 else f"position {c}"
            raise ValueError(f"{name_ids}: {where}: expected ids in [0, {V}), found {int(ids.reshape(b2.shape)[r, c])}")
        ids = ids.to(torch.int64)
    chunk = default_chunk_size(logits.shape[-1]) if chunk_size is None else int(chunk_size)
    if chunk < 1:
        raise ValueError(f"chunk_size: expected a positive integer, found {chunk_size}")
    logits3 = logits if logits.dim() == 3 else logits.unsqueeze(0)
    return logits, logits3, ids, chunk


def _chunk(x: torch.Tensor, dtype: torch.dtype, temperature: float) -> torch.Tensor:
    x = x.to(dtype)
    return x / temperature if temperature != 1.0 else x


class _LogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, logits3, ids, chunk, temperature):
        B, L, V = logits3.shape
        dt = _compute_dtype(logits)
        out = torch.empty(B * L, dtype=dt, device=logits.device)
        flat_ids = ids.reshape(-1)
        for x, s, e in _blocks(logits3, chunk):
            # fused log_softmax on one chunk (faster than logsumexp + gather), then gather
            lsm = torch.log_softmax(_chunk(x, dt, temperature), -1)
            out[s:e] = lsm.gather(-1, flat_ids[s:e, None]).squeeze(-1)
        ctx.save_for_backward(logits, ids)
        ctx.chunk, ctx.temperature = chunk, temperature
        return out.reshape(logits.shape[:-1])

    @staticmethod
    def backward(ctx, grad_out):
        logits, ids = ctx.saved_tensors
        logits3 = logits if logits.dim() == 3 else logits.unsqueeze(0)
        B, L, V = logits3.shape
        dt = _compute_dtype(logits)
        grad = torch.empty((B * L, V), dtype=logits.dtype, device=logits.device)
        go = grad_out.reshape(-1).to(dt)
        flat_ids = ids.reshape(-1)
        for x, s, e in _blocks(logits3, ctx.chunk):
            # d log_softmax(x)_y / dx = onehot(y) − softmax(x)
            g = torch.softmax(_chunk(x, dt, ctx.temperature), -1).mul_(-go[s:e, None])
            g.scatter_add_(-1, flat_ids[s:e, None], go[s:e, None])
            if ctx.temperature != 1.0:
                g.div_(ctx.temperature)
            grad[s:e] = g
        return grad.reshape(logits.shape), None, None, None, None


def _plogp(lsm: torch.Tensor) -> torch.Tensor:
    """``p · log p`` from log-probs, 0 where p = 0 (also where log p = −inf: a banned token)."""
    return lsm.exp().mul_(lsm).nan_to_num_(nan=0.0)


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, logits3, chunk, temperature):
        B, L, V = logits3.shape
        dt = _compute_dtype(logits)
        out = torch.empty(B * L, dtype=dt, device=logits.device)
        for x, s, e in _blocks(logits3, chunk):
            lsm = torch.log_softmax(_chunk(x, dt, temperature), -1)
            out[s:e] = -_plogp(lsm).sum(-1)  # H = −Σ p log p
        ctx.save_for_backward(logits, out)
        ctx.chunk, ctx.temperature = chunk, temperature
        return out.reshape(logits.shape[:-1])

    @staticmethod
    def backward(ctx, grad_out):
        logits, ent = ctx.saved_tensors
        logits3 = logits if logits.dim() == 3 else logits.unsqueeze(0)
        B, L, V = logits3.shape
        dt = ent.dtype
        grad = torch.empty((B * L, V), dtype=logits.dtype, device=logits.device)
        go = grad_out.reshape(-1).to(dt)
        for x, s, e in _blocks(logits3, ctx.chunk):
            # dH/dx_v = −p_v (x_v − E_p[x]) = −p_v (log p_v + H)   (p_v log p_v := 0 at p_v = 0)
            lsm = torch.log_softmax(_chunk(x, dt, ctx.temperature), -1)
            g = _plogp(lsm).add_(lsm.exp_().mul_(ent[s:e, None])).mul_(-go[s:e, None])
            if ctx.temperature != 1.0:
                g.div_(ctx.temperature)
            grad[s:e] = g
        return grad.reshape(logits.shape), None, None, None


def token_logprobs(
    logits: TensorLike, token_ids: TensorLike, *, chunk_size: int | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """``log softmax(logits / temperature)[..., token_ids]``, chunk by chunk; differentiable.

    Shapes: ``logits`` (B, L, V) or (N, V), any float dtype (bf16/fp16 are upcast per chunk);
    ``token_ids`` (B, L) or (N,) integers in [0, V). Returns (B, L) / (N,), float64 for float64
    logits else float32. ``chunk_size``: positions per chunk (default ~32 MiB of float32 per chunk).
    Extra memory beyond the logits (and their gradient, in backward): one chunk plus O(B·L).
    """
    logits, logits3, ids, chunk = _prepare(logits, token_ids, chunk_size, float(temperature))
    return _LogProbs.apply(logits, logits3, ids, chunk, float(temperature))


def token_entropy(logits: TensorLike, *, chunk_size: int | None = None, temperature: float = 1.0) -> torch.Tensor:
    """Entropy ``H = −Σ_v p_v log p_v`` of ``softmax(logits / temperature)`` per position, chunked.

    Shapes: ``logits`` (B, L, V) or (N, V) → (B, L) / (N,), float64 for float64 logits else
    float32; differentiable (``∂H/∂x_v = −p_v (x_v − E_p[x])``). Memory as :func:`token_logprobs`.
    """
    logits, logits3, _, chunk = _prepare(logits, None, chunk_size, float(temperature))
    return _Entropy.apply(logits, logits3, chunk, float(temperature))


def token_logprobs_reference(logits: TensorLike, token_ids: TensorLike, *, temperature: float = 1.0) -> torch.Tensor:
    """The plain version: ``log_softmax(logits / T).gather(token_ids)`` (a full (B, L, V) copy)."""
    logits = torch.as_tensor(logits)
    x = logits.to(_compute_dtype(logits))
    x = x / temperature if temperature != 1.0 else x
    return torch.log_softmax(x, -1).gather(-1, torch.as_tensor(token_ids).to(torch.int64).unsqueeze(-1)).squeeze(-1)


def token_entropy_reference(logits: TensorLike, *, temperature: float = 1.0) -> torch.Tensor:
    """The plain version: ``−Σ softmax · log_softmax`` (several full (B, L, V) copies)."""
    logits = torch.as_tensor(logits)
    x = logits.to(_compute_dtype(logits))
    x = x / temperature if temperature != 1.0 else x
    logp = torch.log_softmax(x, -1)
    return -(logp.exp() * logp).sum(-1)
