"""aggregate(): every mode by hand, with scale, turn ids, masks and empty batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpo_viz.losses import AGG_MODES, aggregate

# row 0: action tokens at 0,1 | 3,4 (two turns by mask runs), values 1 2 | 4 5; row 1: one turn
# (positions 1,2) with 20 30; row 2: no action token. Masked entries hold garbage.
L = torch.tensor(
    [[1.0, 2.0, float("inf"), 4.0, 5.0], [10.0, 20.0, 30.0, 40.0, 50.0], [float("nan")] * 5], dtype=torch.float64
)
M = torch.tensor([[1, 1, 0, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
# sums: row 0 = 12 over 4 tokens, row 1 = 50 over 2 tokens; 6 action tokens; B' = 2; 3 turns

CASES = [
    ("token-mean", None, None, 62 / 6),
    ("token-mean", None, 10.0, 62 / 10),
    ("seq-mean-token-sum", None, None, (12 + 50) / 2),
    ("seq-mean-token-sum", None, 4.0, (12 + 50) / 4),
    ("seq-mean-token-mean", None, None, (12 / 4 + 50 / 2) / 2),
    ("seq-mean-token-mean", None, 8.0, (12 / 4 + 50 / 2) / 8),
    ("seq-mean-token-sum-norm", None, None, 62 / 5),  # C = padded length 5, no 1/B
    ("seq-mean-token-sum-norm", None, 2.0, 62 / 2),
    ("turn-mean", None, None, (1.5 + 4.5 + 25) / 3),  # each turn weighs 1
    ("turn-mean", None, 4.0, (1.5 + 4.5 + 25) / 4),
    # given ids: row 0 is one turn (the obs at 2 inside it) → mean 3
    ("turn-mean", [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]], None, (3 + 25) / 2),
]


@pytest.mark.parametrize("mode,tid,scale,expected", CASES)
def test_modes_by_hand(mode, tid, scale, expected):
    x = L.clone().requires_grad_(True)
    out = aggregate(x, M, mode, turn_ids=tid, scale=scale)
    assert out.dim() == 0 and out.dtype == torch.float64
    assert out.item() == pytest.approx(expected)
    out.backward()
    assert torch.isfinite(x.grad).all() and (x.grad[M == 0] == 0).all()


def test_gradients_by_hand():
    x = L.clone().requires_grad_(True)
    aggregate(x, M, "token-mean").backward()
    np.testing.assert_allclose(x.grad.numpy(), M.numpy() / 6)
    x.grad = None
    aggregate(x, M, "seq-mean-token-mean").backward()
    np.testing.assert_allclose(x.grad.numpy(), [[1 / 8] * 2 + [0] + [1 / 8] * 2, [0, 1 / 4, 1 / 4, 0, 0], [0] * 5])
    x.grad = None
    aggregate(x, M, "turn-mean").backward()  # turns of 2, 2, 2 tokens: 1/(3·2) each
    np.testing.assert_allclose(x.grad.numpy(), M.numpy() / 6)


def test_none_is_the_masked_matrix():
    out = aggregate(L, M, "none")
    np.testing.assert_array_equal(out.numpy(), np.where(M.numpy() == 1, np.nan_to_num(L.numpy()), 0.0))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_empty_mask_gives_zero_with_zero_gradient(mode):
    x = torch.full((2, 3), float("nan"), requires_grad=True)
    out = aggregate(x, torch.zeros(2, 3), mode)
    assert (out == 0).all() and out.dtype == torch.float32
    out.sum().backward()
    assert (x.grad == 0).all()


def test_numpy_input_and_dtypes():
    out = aggregate(np.ones((2, 2), dtype=np.float32), np.ones((2, 2)), "token-mean")
    assert out.dtype == torch.float32 and out.item() == 1.0
    assert aggregate(np.ones((2, 2)), np.ones((2, 2)), "token-mean").dtype == torch.float64


def test_bad_input():
    with pytest.raises(ValueError, match=r"mode: expected one of token-mean.*found 'mean'"):
        aggregate(L, M, "mean")
    with pytest.raises(ValueError, match=r"loss_matrix: expected shape \(3, 5\).*found \(3, 4\)"):
        aggregate(L[:, :4], M, "token-mean")
    with pytest.raises(ValueError, match=r"scale: expected a positive number"):
        aggregate(L, M, "token-mean", scale=0)
    with pytest.raises(ValueError, match=r"scale: expected None with mode='none'"):
        aggregate(L, M, "none", scale=3)
    with pytest.raises(ValueError, match=r"turn_ids: row 0, position 3: expected consecutive"):
        aggregate(L, M, "turn-mean", turn_ids=[[0, 0, 0, 2, 2], [0] * 5, [0] * 5])
