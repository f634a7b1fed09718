"""The critic's values of finished episodes, in a second thread or after the last (see
:mod:`mpo_viz.rollout`)."""

from __future__ import annotations

import numpy as np
import torch

from mpo_viz.rollout.engine import side_pool
from mpo_viz.rollout.episodes import Episode


class CriticJobs:
    """The critic's values of finished episodes: with ``thread``, computed in one worker thread as
    each batch turn's finished episodes are handed in (:meth:`submit`), while the policy decodes the
    rest; otherwise (or for episodes never handed in) all at the end, in :meth:`result` (internal).
    The worker runs in a :func:`side_pool`."""

    def __init__(self, critic, batch_size: int, pad_id: int, *, thread: bool):
        self.critic, self.batch_size, self.pad_id = critic, batch_size, pad_id
        self.pool = side_pool() if thread else None
        self.jobs: list = []

    def submit(self, finished: list[Episode]) -> None:
        if self.pool is not None and finished:
            self.jobs.append((finished, self.pool.submit(self._values, finished)))

    def _values(self, eps: list[Episode]):
        return critic_values(self.critic, eps, self.batch_size, self.pad_id)

    def result(self, episodes: list[Episode]):
        """``(values, last)`` per episode index, as :func:`critic_values` gives them."""
        vals: list = [None] * len(episodes)
        last: list = [None] * len(episodes)
        for eps, fut in self.jobs:
            for ep, v, b in zip(eps, *fut.result()):
                vals[ep.index], last[ep.index] = v, b
        rest = [ep for ep in episodes if vals[ep.index] is None]
        if rest:
            for ep, v, b in zip(rest, *self._values(rest)):
                vals[ep.index], last[ep.index] = v, b
        return vals, last

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def critic_values(critic, episodes: list[Episode], batch_size: int, pad_id: int, per_sequence: bool | None = None):
    """Per episode: ``values`` (L,) with ``values[t]`` = critic output at ``P + t − 1``, and the output
    at the last position ``P + L − 1`` (the value after the response).

    On the CPU each finished sequence goes through the critic alone, unpadded: the trunk's matmuls
    then cost the real tokens only, and without an attention mask the causal attention skips the
    masked upper triangle (a padded batch pays for the padding and for the full ``(T, T)`` mask:
    twice the time at 64 episodes of 300–540 tokens). On an accelerator, where one sequence leaves
    the device idle, batches of ``batch_size`` sequences of similar lengths (right padding,
    positions 0..). Both give the direct forward's numbers (``critic(prompt + response)``).
    ``per_sequence``: force one way (None: unpadded on the CPU).
    """
    dev = next(critic.parameters()).device
    vals: list = [None] * len(episodes)
    last: list = [None] * len(episodes)
    step = 1 if (dev.type == "cpu" if per_sequence is None else per_sequence) else batch_size
    order = sorted(range(len(episodes)), key=lambda i: episodes[i].length)  # similar lengths together
    for s in range(0, len(order), step):
        chunk = order[s : s + step]
        width = max(episodes[i].length for i in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        att = torch.zeros((len(chunk), width), dtype=torch.long)
        for b, i in enumerate(chunk):
            seq = episodes[i].prompt + episodes[i].ids
            ids[b, : len(seq)] = torch.tensor(seq)
            att[b, : len(seq)] = 1
        with torch.no_grad():  # one unpadded row: no mask at all (the causal kernel)
            out = critic(ids.to(dev), attention_mask=None if len(chunk) == 1 else att.to(dev)).float().cpu()
        for b, i in enumerate(chunk):
            p, n = len(episodes[i].prompt), len(episodes[i].ids)
            vals[i] = out[b, p - 1 : p + n - 1].numpy().astype(np.float32)
            last[i] = float(out[b, p + n - 1])
    return vals, last
