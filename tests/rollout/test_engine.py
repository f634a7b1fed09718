"""sample_tokens' entropy: that of the policy's own distribution softmax(logits) at temperature 1,
against values by hand and a NumPy computation, whatever temperature and top-p sampled the token."""

import math

import numpy as np
import pytest
import torch

from mpo_viz.rollout import sample_tokens

INF = float("inf")
# rows whose entropy is known by hand: two equal logits (log 2), three (log 3), one finite (0)
BY_HAND = [([0.0, 0.0, -INF, -INF], math.log(2)), ([1.0, 1.0, 1.0, -INF], math.log(3)), ([-INF, 5.0, -INF, -INF], 0.0)]
OTHER = [[0.0, 1.0, 2.0, -1.0], [3.0, 3.0, -50.0, 0.0], [100.0, 0.0, -INF, -100.0], [-2.0, -INF, 0.5, 0.25]]


def _numpy_entropy(row) -> float:
    """−Σ p log p of softmax(row) in float64, over the tokens with p > 0 (0·log 0 = 0)."""
    x = np.asarray(row, dtype=np.float64)
    z = np.exp(x - x.max())
    p = z / z.sum()
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def test_numpy_reference_agrees_with_the_hand_values():
    for row, want in BY_HAND:
        assert _numpy_entropy(row) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (0.7, 1.0), (1.0, 1.0), (1.0, 0.6), (0.7, 0.6)])
def test_entropy_is_that_of_the_temperature_one_distribution(temperature, top_p):
    rows = [r for r, _ in BY_HAND] + OTHER
    want = np.array([h for _, h in BY_HAND] + [_numpy_entropy(r) for r in OTHER])
    logits = torch.tensor(rows, dtype=torch.float32)
    for u in (torch.full((len(rows),), 0.05, dtype=torch.float64), torch.linspace(0.1, 0.95, len(rows)).double()):
        tok, roll, old, ent = sample_tokens(logits, u, temperature, top_p)
        assert ent.dtype == torch.float32 and ent.shape == (len(rows),)
        assert torch.isfinite(ent).all()  # -inf logits add 0, not NaN
        np.testing.assert_allclose(ent.numpy(), want, rtol=1e-6, atol=1e-6)
        # the other outputs are unchanged by it: old = log softmax(logits)[tok]
        assert torch.equal(old, torch.log_softmax(logits, -1).gather(1, tok[:, None])[:, 0])


def test_entropy_of_the_sampled_distribution_would_differ():
    """At T = 0.7 the tempered distribution's entropy is another number: the one returned is T = 1's."""
    row = OTHER[0]
    _, _, _, ent = sample_tokens(torch.tensor([row]), torch.tensor([0.3], dtype=torch.float64), 0.7, 1.0)
    tempered = _numpy_entropy(np.asarray(row) / 0.7)
    assert abs(tempered - _numpy_entropy(row)) > 0.1
    assert float(ent[0]) == pytest.approx(_numpy_entropy(row), abs=1e-6)
