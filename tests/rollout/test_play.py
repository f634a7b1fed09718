"""The rollout records the policy's per-token entropy: equal, on every action token, to the entropy
of log_softmax at that position in one teacher-forced forward of ``prompt + response``; 0 on
observation tokens; the same at any temperature and top-p (always the T = 1 distribution)."""

import numpy as np
import pytest
import torch

from mpo_viz import models as M
from mpo_viz.advantages import compute
from mpo_viz.envs import build_tokenizer, make_env
from mpo_viz.rollout import rollout

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def _policy(name):
    env = make_env(name, difficulty=make_env(name).min_difficulty)
    pol = M.tiny_policy(build_tokenizer(env), "1m", seed=1)
    with torch.no_grad():  # sharper logits: entropies that differ from token to token (a fresh model's ≈ log V)
        pol.model.get_output_embeddings().weight.mul_(2.5)
        pol.model.get_output_embeddings().weight[pol.layout.eot] *= 2.0
    return env, pol


def _teacher_forced_entropy(model, prompt_ids, response_ids) -> np.ndarray:
    """``−Σ_v p_v log p_v`` of softmax(logits) at the position before each response token (float64)."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    x = logits[len(prompt_ids) - 1 : -1].numpy()
    lp = x - x.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    return -(np.exp(lp) * lp).sum(-1)


@pytest.mark.parametrize("name", ["search", "tooluse", "automation"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "top_p": 0.8}, {"temperature": 0.0}])
def test_recorded_entropy_equals_a_teacher_forced_recomputation(name, sampling):
    env, pol = _policy(name)
    batch = rollout(pol, env, 4, group_size=2, seed=3, batch_size=3, max_turn_tokens=6, **sampling)
    assert "entropy" in batch.fields
    spread = []
    for i in range(len(batch)):
        r = batch.row(i)
        ent = batch.field("entropy")[i]
        assert ent.dtype == np.float32 and len(ent) == len(r["response_ids"])
        m = np.asarray(r["loss_mask"]).astype(bool)
        ref = _teacher_forced_entropy(pol.model, r["prompt_ids"], r["response_ids"])
        np.testing.assert_allclose(ent[m], ref[m], atol=1e-5, rtol=0)
        assert (ent[~m] == 0).all()
        spread += ent[m].tolist()
    assert max(spread) - min(spread) > 0.05  # not one number on every token


def test_empg_runs_on_a_fresh_rollout():
    env, pol = _policy("search")
    batch = rollout(pol, env, 4, group_size=2, seed=0, max_turn_tokens=6)
    res = compute(batch, "empg")
    m = batch.mask.bool()
    assert torch.isfinite(res.advantages[m]).all() and float(res.advantages[m].abs().max()) > 0
