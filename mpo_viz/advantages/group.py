"""Critic-free estimators with group baselines: GRPO, Dr. GRPO, RLOO, REINFORCE++ (and its group
baseline variant), GiGPO.

Inputs: rewards and mask ``(B, L)`` (torch or numpy), ``group_ids`` any array-like of B strings or
ints. Outputs ``(advantages, returns)`` torch ``(B, L)`` (float64 in → float64 out, else float32),
zero on masked positions. ``returns`` are the advantages before any whitening (group estimators
have no critic; for REINFORCE++ these are the discounted token returns).

A *group of one* (a ``group_id`` held by a single row) has no other sample to compare against; each
estimator then falls back to a fixed rule — GRPO ``s/(1 + ε)`` (mean 0, std 1, as verl: 0.999999·s),
Dr. GRPO and the REINFORCE++ baseline the raw score ``s``, RLOO 0 — and warns once per process.

The trajectory score is ``s_i = Σ_t r_{i,t}`` (rewards on masked tokens are an input error, so
this is the sum over action tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mpo_viz.advantages import kernels as K
from mpo_viz.advantages._inputs import group_codes, prepare, scalar_check, to_torch, whiten_
from mpo_viz.checks import TensorLike, warn_once

__all__ = ["grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gigpo", "group_stats"]


def group_stats(x: np.ndarray, codes: np.ndarray):
    """Per-element group count, mean and unbiased std (NaN for groups of one) of float64 ``x``."""
    g = int(codes.max()) + 1 if codes.size else 0
    cnt = np.bincount(codes, minlength=g).astype(np.float64)
    mean = np.bincount(codes, weights=x, minlength=g) / np.maximum(cnt, 1)
    dev = x - mean[codes]
    with np.errstate(invalid="ignore", divide="ignore"):
        var = np.bincount(codes, weights=dev * dev, minlength=g) / (cnt - 1)
    return cnt[codes], mean[codes], np.sqrt(var)[codes]


#: What each estimator gives a group of one (for the warning).
SINGLETON_RULE = {
    "grpo": "A = s/(1 + eps) (mean 0, std 1, as verl: 0.999999·s at eps = 1e-6)",
    "drgrpo": "A = s, the raw score (mean 0)",
    "rloo": "A = 0 (no other sample to leave out)",
    "reinforce_pp_baseline": "A = s, the raw score (baseline 0), before whitening",
    "gigpo": "an episode-level A^E = s/(1 + eps), as GRPO",
}


def warn_groups_of_one(codes: np.ndarray, group_ids, estimator: str) -> None:
    """Warn once per process and estimator when some group holds a single row."""
    if codes.size == 0:
        return
    cnt = np.bincount(codes)
    single = np.flatnonzero(cnt[codes] == 1)
    if single.size:
        i = int(single[0])
        warn_once(
            f"groups-of-one:{estimator}",
            f"group_ids: {single.size} of {cnt.size} groups hold a single trajectory (e.g. row {i}, group "
            f"{list(group_ids)[i]!r}); with no other sample of the task to compare against, {estimator} gives "
            f"{SINGLETON_RULE[estimator]}. Sample several trajectories per task under one group_id.",
            stacklevel=4,
        )


def _grpo_scores(s, codes, eps, norm_by_std):
    n, mean, std = group_stats(s, codes)
    one = n == 1
    mean = np.where(one, 0.0, mean)  # verl: a group of one has mean 0, std 1
    std = np.where(one, 1.0, std)
    return (s - mean) / (std + eps) if norm_by_std else s - mean


def _broadcast(p, per_row, whiten):
    adv = (per_row[:, None] * (p.mask != 0)).astype(p.dtype)
    ret = adv.copy()
    if whiten:
        whiten_(adv, p.mask)
    return to_torch(adv, p.device), to_torch(ret, p.device)


def _scores(p) -> np.ndarray:
    return p.rewards.sum(axis=1, dtype=np.float64)


def grpo(
    rewards: TensorLike, mask: TensorLike, group_ids: TensorLike, *, eps: float = 1e-6, norm_by_std: bool = True,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (verl): ``A_i = (s_i − mean_g)/(std_g + ε)`` broadcast over row i's action tokens.

    ``std_g`` is the unbiased std of the scores in i's group; a group of one uses mean 0, std 1
    (so ``s_i/(1 + ε)``) and warns once. ``norm_by_std=False`` is Dr. GRPO: ``A_i = s_i − mean_g``
    (a group of one: ``s_i``). Shapes: rewards, mask ``(B, L)``, group_ids ``(B,)``; returns
    ``(advantages, returns)`` ``(B, L)`` with returns = advantages (before whitening).
    """
    eps = scalar_check("eps", eps, 0.0, None)
    p = prepare(rewards, mask)
    codes = group_codes(group_ids, p.shape[0])
    warn_groups_of_one(codes, group_ids, "grpo" if norm_by_std else "drgrpo")
    return _broadcast(p, _grpo_scores(_scores(p), codes, eps, bool(norm_by_std)), whiten)


def drgrpo(
    rewards: TensorLike, mask: TensorLike, group_ids: TensorLike, *, whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr. GRPO: ``A_i = s_i − mean_g`` (GRPO without the std division). Shapes as :func:`grpo`."""
    return grpo(rewards, mask, group_ids, norm_by_std=False, whiten=whiten)


def rloo(
    rewards: TensorLike, mask: TensorLike, group_ids: TensorLike, *, whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: ``A_i = s_i − mean_{j≠i, j∈g} s_j`` (leave-one-out); a group of one gets 0 (and warns once).

    Shapes as :func:`grpo`; returns = advantages (before whitening).
    """
    p = prepare(rewards, mask)
    codes = group_codes(group_ids, p.shape[0])
    warn_groups_of_one(codes, group_ids, "rloo")
    s = _scores(p)
    n, mean, _ = group_stats(s, codes)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = np.where(n > 1, (s - mean) * n / np.maximum(n - 1, 1), 0.0)
    return _broadcast(p, a, whiten)


def reinforce_pp(
    rewards: TensorLike, mask: TensorLike, *, gamma: float = 1.0, whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted token returns ``G_t = r_t + γ·G_{t'}`` over action tokens (t' = next
    action token; observation tokens are skipped and the return carried over them — verl resets
    there instead), then whitened over the batch's action tokens (``whiten=True``, the algorithm's
    default). Shapes: rewards, mask ``(B, L)``; returns ``(advantages, returns)`` with returns =
    the unwhitened ``G``.
    """
    gamma = scalar_check("gamma", gamma, 0.0, 1.0)
    p = prepare(rewards, mask, validate=False)
    g = np.empty(p.shape, dtype=p.dtype)
    bad = np.empty(p.shape[0], dtype=np.int64)
    moments = np.empty((p.shape[0], 4))
    K.discounted_kernel(p.rewards, p.mask, gamma, g, bad, int(whiten), moments)
    p.check_bad(bad)
    adv = whiten_(g.copy(), p.mask, moments) if whiten else g.copy()
    return to_torch(adv, p.device), to_torch(g, p.device)


def reinforce_pp_baseline(
    rewards: TensorLike, mask: TensorLike, group_ids: TensorLike, *, whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline: ``(s_i − mean_g)`` broadcast over row i's action tokens,
    then whitened over the batch (``whiten=True`` default). A group of one has baseline 0 (as in
    GRPO) and warns once. Shapes as :func:`grpo`; returns = the unwhitened advantages.
    """
    p = prepare(rewards, mask)
    codes = group_codes(group_ids, p.shape[0])
    warn_groups_of_one(codes, group_ids, "reinforce_pp_baseline")
    return _broadcast(p, _grpo_scores(_scores(p), codes, 0.0, False), whiten)


def _ragged(x, B: int, name: str) -> list[np.ndarray]:
    if x is None:
        raise ValueError(f"{name}: GiGPO needs the token ids to find each turn's anchor observation, found None")
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    if len(x) != B:
        raise ValueError(f"{name}: expected {B} rows (one per trajectory), found {len(x)}")
    return [np.asarray(row).reshape(-1).astype(np.int64) for row in x]


def turn_spans(mask_row: np.ndarray, tid_row: np.ndarray) -> list[tuple[int, int]]:
    """``(first, last)`` action-token positions of each turn k = 0..K−1 of one row."""
    pos = np.flatnonzero(mask_row != 0)
    if pos.size == 0:
        return []
    k = tid_row[pos]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    ends = np.r_[starts[1:] - 1, pos.size - 1]
    return list(zip(pos[starts].tolist(), pos[ends].tolist()))


def _step_returns(p, kmax: int, step_gamma: float) -> np.ndarray:
    """``(B, kmax)`` discounted step returns ``Σ_{k'≥k} γ^{k'−k} R_{k'}`` of the turn reward sums."""
    B = p.shape[0]
    rows, cols = np.nonzero(p.mask != 0)
    kk = p.turn_ids[rows, cols]
    R = np.bincount(rows * kmax + kk, weights=p.rewards[rows, cols].astype(np.float64),
                    minlength=B * kmax).reshape(B, kmax) if kmax else np.zeros((B, 0))
    step_ret = np.zeros((B, kmax))
    nxt = np.zeros(B)
    for k in range(kmax - 1, -1, -1):
        nxt = np.where(k < p.nturns, R[:, k] + step_gamma * nxt, 0.0)
        step_ret[:, k] = nxt
    return step_ret


def _step_groups(p, codes: np.ndarray, prompts: list, responses: list) -> tuple[tuple[list, list, list], list]:
    """The (row, turn, step-group code) of every turn with an anchor (turns with identical anchors in
    the same group share a code), and each row's turn spans."""
    keys: dict = {}
    members_row, members_turn, members_code = [], [], []
    spans_all = []
    for i in range(p.shape[0]):
        spans = turn_spans(p.mask[i], p.turn_ids[i])
        spans_all.append(spans)
        resp = responses[i]
        if spans and resp.shape[0] < spans[-1][1] + 1:
            raise ValueError(f"response_ids: row {i}: expected at least {spans[-1][1] + 1} tokens "
                             f"(aligned with the mask), found {resp.shape[0]}")
        prev_end = -1
        for k, (first, last) in enumerate(spans):
            obs = resp[prev_end + 1:first]
            prev_end = last
            if k > 0 and obs.size == 0:  # no observation, no anchor: A^S stays 0
                continue
            anchor = np.concatenate([prompts[i], obs]) if k == 0 else obs
            key = (int(codes[i]), anchor.tobytes())
            members_row.append(i)
            members_turn.append(k)
            members_code.append(keys.setdefault(key, len(keys)))
    return (members_row, members_turn, members_code), spans_all


def gigpo(
    rewards: TensorLike, mask: TensorLike, group_ids: TensorLike, *, prompt_ids: Sequence | TensorLike,
    response_ids: Sequence | TensorLike, turn_ids: TensorLike | None = None, omega: float = 1.0,
    step_gamma: float = 0.95, norm: str = "std", eps: float = 1e-6, whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO: ``A = A^E + ω·A^S``, constant over a turn's action tokens.

    * Episode level ``A^E``: GRPO over the group (``eps``; std normalization; a group of one
      gives ``s/(1 + ε)`` and warns once).
    * Step level: turn k's *anchor* is the token ids of the observation just before it — the
      response tokens between turn k−1's last and turn k's first action token; for k = 0 the
      prompt ids followed by any observation tokens before the first action token. An empty
      observation is no anchor: a turn k > 0 that directly follows turn k−1 (adjacent turn ids, no
      observation token between) joins no step group and gets ``A^S = 0``. Turns with identical
      anchors in the same group form a step group. Step return
      ``Σ_{k'≥k} γ^{k'−k} R_{k'}`` (γ = ``step_gamma``, ``R_k`` = the turn's reward sum);
      ``A^S = (ret − mean)/(std + ε)`` in the step group (unbiased std; ``norm="mean"``: no
      division); a step group of one gives ``A^S = 0``.

    Shapes: rewards, mask, turn_ids ``(B, L)``; group_ids ``(B,)``; prompt_ids and response_ids:
    B token-id sequences (ragged lists or padded ``(B, ·)`` arrays; response_ids aligned with the
    mask). Returns ``(advantages, returns)`` ``(B, L)``, returns = advantages before whitening.
    """
    omega = scalar_check("omega", omega, None, None)
    step_gamma = scalar_check("step_gamma", step_gamma, 0.0, 1.0)
    eps = scalar_check("eps", eps, 0.0, None)
    if norm not in ("std", "mean"):
        raise ValueError(f"norm: expected 'std' or 'mean', found {norm!r}")
    p = prepare(rewards, mask, turn_ids=turn_ids, need_turns=True)
    B, L = p.shape
    codes = group_codes(group_ids, B)
    warn_groups_of_one(codes, group_ids, "gigpo")
    prompts = _ragged(prompt_ids, B, "prompt_ids")
    responses = _ragged(response_ids, B, "response_ids")
    a_e = _grpo_scores(_scores(p), codes, eps, True)

    kmax = int(p.nturns.max()) if B and p.nturns is not None else 0
    act = p.mask != 0
    step_ret = _step_returns(p, kmax, step_gamma)
    (members_row, members_turn, members_code), spans_all = _step_groups(p, codes, prompts, responses)
    a_s = np.zeros((B, kmax))
    if members_row:
        mr, mt, mc = (np.asarray(x, dtype=np.int64) for x in (members_row, members_turn, members_code))
        x = step_ret[mr, mt]
        n, mean, std = group_stats(x, mc)
        with np.errstate(invalid="ignore", divide="ignore"):
            val = (x - mean) / (std + eps) if norm == "std" else x - mean
        a_s[mr, mt] = np.where(n > 1, val, 0.0)

    adv = np.zeros((B, L), dtype=p.dtype)
    for i in range(B):
        for k, (first, last) in enumerate(spans_all[i]):
            seg = slice(first, last + 1)
            adv[i, seg] = (a_e[i] + omega * a_s[i, k]) * act[i, seg]
    ret = adv.copy()
    if whiten:
        whiten_(adv, p.mask)
    return to_torch(adv, p.device), to_torch(ret, p.device)
