"""What the plugin reads from a verl batch: token rewards (moved onto action tokens), values, the
response mask (whose runs are the turns), the uid groups. (Conversion of a whole batch to
``mpo_viz.trajectory/v1`` rows is :func:`mpo_viz.adapters.verl.from_verl`.)

verl's layout (``verl/experimental/agent_loop/agent_loop.py``, ``AgentLoopManager`` output):
``prompts`` (B, P) left-padded, ``responses`` (B, R) right-padded, ``attention_mask`` (B, P + R),
``response_mask`` (B, R) = 1 on LLM-generated tokens, 0 on tool/observation and padding tokens,
``rm_scores``/``token_level_rewards`` (B, R) with the outcome score on the **last valid** response
token — a tool reply when the episode ended on one. ``non_tensor_batch["uid"]`` (B,) groups the
samples of one prompt.

This module touches only tensors and numpy arrays (no verl import): a ``DataProto`` is read through
``data.batch`` (a TensorDict, ``keys()`` and ``[]``), ``data.non_tensor_batch`` (a dict) and
``data.meta_info``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Inputs", "move_observation_rewards", "read_inputs"]


@dataclass
class Inputs:
    """The estimator inputs of one verl batch (all ``(B, R)`` unless noted, on the batch's device).

    ``rewards``: ``token_level_rewards`` with every reward on a non-action token moved to the last
    action token before it (float, as verl's); ``mask``: ``response_mask`` as 0/1 in the rewards'
    dtype; ``values``: the critic's per-token values or None; ``uid``: object array ``(B,)`` or None;
    ``moved``: how many rewards were moved; ``dropped``: how many sat in rows without any action
    token (their rows get zero advantage from every estimator anyway).
    """

    rewards: torch.Tensor
    mask: torch.Tensor
    values: torch.Tensor | None
    uid: np.ndarray | None
    moved: int
    dropped: int


def move_observation_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Move rewards that sit on non-action tokens to the last action token before them.

    verl writes the outcome score on the last valid response token, which is a tool/observation
    token when an episode ends on a tool reply; mpo_viz estimators require rewards on action tokens
    only (a reward is credit for an action). Shapes: ``rewards``, ``mask`` (B, R). Returns
    ``(moved_rewards, n_moved, n_dropped)``; a reward before the first action token of its row
    goes to the row's first action token (it is still that trajectory's reward); a reward in a row
    without any action token is dropped and counted.
    """
    m = mask != 0
    off = (~m) & (rewards != 0)
    n_off = int(off.sum())
    if n_off == 0:
        return rewards, 0, 0
    B, R = rewards.shape
    pos = torch.arange(R, device=rewards.device).expand(B, R)
    last_action = torch.where(m, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # (B, R)
    has_action = m.any(dim=1, keepdim=True).expand(B, R)
    first_action = torch.where(m, pos, torch.full_like(pos, R)).min(dim=1, keepdim=True).values.expand(B, R)
    target = torch.where(last_action >= 0, last_action, first_action)
    movable = off & has_action
    out = torch.where(off, torch.zeros_like(rewards), rewards)
    out = out.scatter_add(
        1,
        torch.where(movable, target, torch.zeros_like(target)),
        torch.where(movable, rewards, torch.zeros_like(rewards)),
    )
    dropped = int((off & ~has_action).sum())
    return out, n_off - dropped, dropped


def _has(data, key: str) -> bool:
    return key in data.batch.keys()


def read_inputs(data) -> Inputs:
    """The estimator inputs of a verl ``DataProto`` (see :class:`Inputs`).

    Needs ``data.batch["token_level_rewards"]`` and ``["response_mask"]``; ``["values"]`` and
    ``non_tensor_batch["uid"]`` are read when present.
    """
    for key in ("token_level_rewards", "response_mask"):
        if not _has(data, key):
            raise ValueError(
                f"data.batch[{key!r}]: expected a (B, R) tensor in the verl batch, found none "
                f"(keys: {', '.join(sorted(data.batch.keys()))})"
            )
    raw = data.batch["token_level_rewards"]
    if not raw.is_floating_point():
        raw = raw.float()
    mask = data.batch["response_mask"].to(raw.dtype)
    if mask.shape != raw.shape:
        raise ValueError(
            f"data.batch['response_mask']: expected shape {tuple(raw.shape)} (token_level_rewards'), "
            f"found {tuple(mask.shape)}"
        )
    rewards, moved, dropped = move_observation_rewards(raw, mask)
    values = data.batch["values"] if _has(data, "values") else None
    if values is not None and values.shape != raw.shape:
        raise ValueError(f"data.batch['values']: expected shape {tuple(raw.shape)}, found {tuple(values.shape)}")
    uid = data.non_tensor_batch.get("uid") if data.non_tensor_batch is not None else None
    return Inputs(
        rewards=rewards,
        mask=mask,
        values=values,
        uid=None if uid is None else np.asarray(uid, dtype=object),
        moved=moved,
        dropped=dropped,
    )
