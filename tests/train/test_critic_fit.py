"""The fit loop's critic calls (train/critic_fit.py): the unmasked causal forward equals the masked one
on every real token, for a tiny critic and a pretrained trunk. (The fits themselves: tests/train/test_critic.py;
fit_critic: tests/train/test_fitted_critic.py.)"""

import numpy as np
import pytest
import torch

import mpo_viz as mv
from mpo_viz.models import compact_critic, trunk_critic
from mpo_viz.train.critic_fit import causal_values

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.mark.parametrize("lengths", [(2, 9, 5, 1), (4, 4, 4), (7,)], ids=["ragged", "no padding", "one row"])
def test_causal_values_equal_the_masked_forward(lengths, hf_dir):
    from mpo_viz.train.update import forward_critic, make_micro, rows_of

    rng = np.random.default_rng(0)
    rows = [
        {
            "traj_id": f"t{i}",
            "group_id": "g",
            "prompt_ids": [int(x) for x in rng.integers(1, 300, 3)],
            "response_ids": [int(x) for x in rng.integers(1, 300, n)],
            "loss_mask": [1] * n,
            "reward": 1.0,
        }
        for i, n in enumerate(lengths)
    ]
    b = mv.TrajectoryBatch.from_rows(rows)
    r = rows_of(b)
    mb = make_micro(r, np.arange(len(b)), 0, "cpu")
    for critic in (compact_critic(b, seed=1), trunk_critic(hf_dir, b, seed=1)):
        with torch.no_grad():
            want, got = forward_critic(critic, mb), causal_values(critic, mb)
        m = mb.take(r.mask)
        np.testing.assert_allclose(got[m].numpy(), want[m].numpy(), rtol=1e-5, atol=1e-6)  # every real token
