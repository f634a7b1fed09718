"""The critics of mpo_viz.models built for a batch's ids: a tiny trunk over the ids a batch uses only
(compact_critic), equal to the trunk over the whole vocabulary at those ids."""

import numpy as np
import torch

from mpo_viz.models import COMPACT_MIN_VOCAB, RemappedCritic, compact_critic, vocab_critic
from mpo_viz.train.fitted_critic import fit_critic
from tests.train.critic_helpers import label_batch, spread


def test_a_large_vocabulary_gets_embedding_rows_for_the_ids_used_only():
    b = spread(label_batch(12), 49152)
    used = sorted({int(i) for f in ("prompt_ids", "response_ids") for x in b.field(f) for i in x})
    c = compact_critic(b, seed=2)
    assert isinstance(c, RemappedCritic) and c.trunk.embed_tokens.num_embeddings == len(used) + 1 == 9
    # the reference: the same trunk over the whole vocabulary, the compact rows at the ids they stand for
    full = vocab_critic(49152, seed=2)
    state = {k: v for k, v in c.inner.trunk.state_dict().items() if k != "embed_tokens.weight"}
    full.trunk.load_state_dict(state, strict=False)
    full.head.load_state_dict(c.head.state_dict())
    with torch.no_grad():
        full.trunk.embed_tokens.weight[used] = c.trunk.embed_tokens.weight[: len(used)]
        seq = torch.tensor([[used[0], used[3], used[1], used[5]]])
        np.testing.assert_allclose(c(seq).numpy(), full(seq).numpy(), rtol=1e-5, atol=1e-6)
        # an id the batch never used (inside or past the table) reads the one "unseen" row
        assert c.rows(torch.tensor([used[0] + 1, 60000, used[2]])).tolist() == [8, 8, 2]
    # small or dense vocabularies stay as they were (the shipped sets' fits do not change)
    assert not isinstance(compact_critic(label_batch(12)), RemappedCritic)
    assert not isinstance(compact_critic(spread(label_batch(12), COMPACT_MIN_VOCAB)), RemappedCritic)
    # fit_critic uses it, and its critic takes the batch's own ids
    res = fit_critic(b, steps=2, holdout=0.25, progress=False)
    assert isinstance(res.critic, RemappedCritic)
    seq = torch.tensor([[*b.field("prompt_ids")[0], *b.field("response_ids")[0]]])
    with torch.no_grad():
        np.testing.assert_allclose(
            res.batch.values[0, :5].numpy(), res.critic(seq)[0, 1:6].numpy(), rtol=1e-5, atol=1e-6
        )
