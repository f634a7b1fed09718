"""token_logprobs / token_entropy (chunked, custom backward) against a plain log_softmax."""

from __future__ import annotations

import math

import pytest
import torch

from mpo_viz.losses import (
    token_entropy,
    token_entropy_reference,
    token_logprobs,
    token_logprobs_reference,
)
from mpo_viz.losses.logprobs import default_chunk_size


def _case(B=3, L=17, V=50, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(B, L, V, generator=g, dtype=dtype)
    ids = torch.randint(0, V, (B, L), generator=g)
    w = torch.randn(B, L, generator=g, dtype=dtype)  # weights for a non-trivial backward
    return logits, ids, w


@pytest.mark.parametrize("chunk", [1, 4, 7, 51, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_grad_match_plain(chunk, temperature):
    logits, ids, w = _case()
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    out = token_logprobs(a, ids, chunk_size=chunk, temperature=temperature)
    ref = token_logprobs_reference(b, ids, temperature=temperature)
    assert out.shape == (3, 17) and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 5, None])
@pytest.mark.parametrize("temperature", [1.0, 1.3])
def test_entropy_and_grad_match_plain(chunk, temperature):
    logits, _, w = _case(seed=1)
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    out = token_entropy(a, chunk_size=chunk, temperature=temperature)
    ref = token_entropy_reference(b, temperature=temperature)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_gradcheck():
    logits, ids, _ = _case(B=2, L=3, V=5)
    x = logits.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: token_logprobs(t, ids, chunk_size=2), (x,))
    assert torch.autograd.gradcheck(lambda t: token_entropy(t, chunk_size=2, temperature=0.8), (x,))


def test_non_contiguous_logits_and_2d():
    # the usual model-output slice logits[:, :-1] cannot be flattened without a copy
    logits, ids, w = _case(L=18)
    x = logits.clone().requires_grad_(True)
    sl = x[:, :-1]
    assert not sl.is_contiguous()
    out = token_logprobs(sl, ids[:, :-1], chunk_size=4)
    torch.testing.assert_close(out, token_logprobs_reference(logits[:, :-1], ids[:, :-1]))
    (out * w[:, :-1]).sum().backward()
    y = logits.clone().requires_grad_(True)
    (token_logprobs_reference(y[:, :-1], ids[:, :-1]) * w[:, :-1]).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)
    torch.testing.assert_close(token_entropy(sl, chunk_size=3), token_entropy_reference(logits[:, :-1]))
    flat = logits.reshape(-1, 50)
    torch.testing.assert_close(
        token_logprobs(flat, ids.reshape(-1), chunk_size=10), token_logprobs_reference(flat, ids.reshape(-1))
    )


def test_half_precision_upcast_per_chunk():
    logits, ids, _ = _case(dtype=torch.float32)
    bf = logits.to(torch.bfloat16).requires_grad_(True)
    out = token_logprobs(bf, ids, chunk_size=8)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, token_logprobs_reference(bf.detach().float(), ids))
    out.sum().backward()
    assert bf.grad.dtype == torch.bfloat16 and torch.isfinite(bf.grad.float()).all()
    torch.testing.assert_close(token_entropy(bf.detach(), chunk_size=8), token_entropy_reference(bf.detach().float()))


def test_banned_tokens_with_minus_inf():
    # −inf logits (a banned token) contribute 0 to the entropy and keep gradients finite
    x = torch.tensor([[[0.0, 0.0, float("-inf"), 0.0]]], dtype=torch.float64, requires_grad=True)
    h = token_entropy(x)
    assert h.item() == pytest.approx(math.log(3))
    h.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[0, 0, 2] == 0
    lp = token_logprobs(x.detach(), torch.tensor([[1]]))
    assert lp.item() == pytest.approx(-math.log(3))


def test_no_grad_path_and_default_chunk():
    logits, ids, _ = _case()
    with torch.no_grad():
        out = token_logprobs(logits, ids)
    assert not out.requires_grad
    assert default_chunk_size(32000) == 32 * 2**20 // (4 * 32000)


def test_bad_input():
    logits, ids, _ = _case()
    with pytest.raises(ValueError, match=r"token_ids: expected shape \(3, 17\).*found \(3, 16\)"):
        token_logprobs(logits, ids[:, :-1])
    bad = ids.clone()
    bad[1, 4] = 50
    with pytest.raises(ValueError, match=r"token_ids: row 1, position 4: expected ids in \[0, 50\), found 50"):
        token_logprobs(logits, bad)
    with pytest.raises(ValueError, match=r"token_ids: expected an integer dtype"):
        token_logprobs(logits, ids.double())
    with pytest.raises(ValueError, match=r"logits: expected a \(B, L, V\) or \(N, V\)"):
        token_entropy(torch.zeros(5))
    with pytest.raises(ValueError, match=r"chunk_size: expected a positive integer"):
        token_entropy(logits, chunk_size=0)
    with pytest.raises(ValueError, match=r"temperature: expected a positive number"):
        token_entropy(logits, temperature=0)
