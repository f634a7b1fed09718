"""CPU ``DataProto`` batches laid out like verl's multi-turn agent loop output.

``verl/experimental/agent_loop/agent_loop.py`` (``AgentLoopManager``): ``prompts`` (B, P) left-padded,
``responses`` (B, R) right-padded, ``attention_mask`` (B, P + R), ``response_mask`` (B, R) = 1 on
LLM tokens and 0 on tool replies and padding, ``rm_scores`` with the score on the last *valid*
response token (``attention_mask[:, P:].sum(1) - 1``), which is a tool token when the episode ended
on a tool reply; ``non_tensor_batch["uid"]`` groups the samples of one prompt.
"""

from __future__ import annotations

import numpy as np
import torch
from verl import DataProto

PAD = 0


def segments_row(spec):
    """``spec``: list of ("a", n) assistant spans and ("t", n) tool spans → response mask list."""
    out = []
    for kind, n in spec:
        out += [1 if kind == "a" else 0] * n
    return out


def make_batch(
    specs, scores, uids, *, P=6, R=None, seed=0, values=None, with_values=True, dtype=torch.float32
) -> DataProto:
    """A verl batch: one row per ``specs[i]`` (see :func:`segments_row`), outcome score ``scores[i]``
    on the last valid response token, uid ``uids[i]``. ``values``: list of per-row value lists over
    the valid response tokens (default: seeded random values, garbage on padding)."""
    rng = np.random.default_rng(seed)
    rows = [segments_row(s) for s in specs]
    R = R or max(len(r) for r in rows) + 3
    B = len(rows)
    prompts = np.full((B, P), PAD, dtype=np.int64)
    responses = np.full((B, R), PAD, dtype=np.int64)
    att = np.zeros((B, P + R), dtype=np.int64)
    rmask = np.zeros((B, R), dtype=np.int64)
    scores_t = np.zeros((B, R), dtype=np.float32)
    vals = rng.normal(0.3, 0.4, size=(B, R)).astype(np.float32)  # padding keeps these (garbage)
    old = -rng.uniform(0.05, 3.0, size=(B, R)).astype(np.float32)
    for i, m in enumerate(rows):
        n_prompt = 3 + i % (P - 2)
        prompts[i, P - n_prompt :] = rng.integers(5, 50, n_prompt)
        att[i, P - n_prompt : P] = 1
        n = len(m)
        responses[i, :n] = rng.integers(5, 50, n)
        att[i, P : P + n] = 1
        rmask[i, :n] = m
        scores_t[i, n - 1] = scores[i]
        if values is not None:
            vals[i, :n] = values[i]
    tensors = {
        "prompts": torch.from_numpy(prompts),
        "responses": torch.from_numpy(responses),
        "input_ids": torch.from_numpy(np.concatenate([prompts, responses], axis=1)),
        "attention_mask": torch.from_numpy(att),
        "response_mask": torch.from_numpy(rmask),
        "token_level_scores": torch.from_numpy(scores_t).to(dtype),
        "token_level_rewards": torch.from_numpy(scores_t).to(dtype),
        "old_log_probs": torch.from_numpy(old).to(dtype),
    }
    if with_values:
        tensors["values"] = torch.from_numpy(vals).to(dtype)
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array(uids, dtype=object)})


#: a multi-turn batch: 3 prompts x 2 samples; tool spans between turns; rows 1 and 4 end on a tool
#: reply (their score sits on an observation token); row 3 has one-token turns; row 5 one turn
SPECS = [
    [("a", 4), ("t", 3), ("a", 2), ("t", 2), ("a", 3)],
    [("a", 3), ("t", 2), ("a", 5), ("t", 4)],
    [("a", 2), ("t", 1), ("a", 2), ("t", 3), ("a", 1), ("t", 2), ("a", 4)],
    [("a", 1), ("t", 2), ("a", 1), ("t", 1), ("a", 1)],
    [("a", 6), ("t", 3)],
    [("a", 7)],
]
SCORES = [1.0, 0.25, 1.0, 0.5, 1.0, 0.0]
UIDS = ["p0", "p0", "p1", "p1", "p2", "p2"]


def multi_turn_batch(**kw) -> DataProto:
    return make_batch(SPECS, SCORES, UIDS, **kw)


def copy(data: DataProto) -> DataProto:
    """A deep copy (verl's compute_advantage writes into the batch)."""
    return DataProto.from_dict(
        tensors={k: v.clone() for k, v in data.batch.items()},
        non_tensors={k: v.copy() for k, v in data.non_tensor_batch.items()},
        meta_info=dict(data.meta_info),
    )
