"""Critic-free estimators with group baselines: GRPO, Dr. GRPO, RLOO, REINFORCE++ (and its group
baseline variant), GiGPO, MT-GRPO (turn rewards), EMPG (entropy-modulated).

Inputs: rewards and mask ``(B, L)`` (torch or numpy), ``group_ids`` any array-like of B strings or
ints. Outputs ``(advantages, returns)`` torch ``(B, L)`` (float64 in → float64 out, else float32),
zero on masked positions. ``returns`` are the advantages before any whitening (group estimators
have no critic; for REINFORCE++ these are the discounted token returns).

A *group of one* (a ``group_id`` held by a single row) has no other sample to compare against; each
estimator then falls back to a fixed rule — GRPO ``s/(1 + ε)`` (mean 0, std 1, as verl: 0.999999·s),
Dr. GRPO and the REINFORCE++ baseline the raw score ``s``, RLOO 0 (mpo_viz's rule: verl's RLOO gives
the raw score ``s`` there) — and warns once per process.

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

__all__ = [
    "grpo",
    "drgrpo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "gigpo",
    "mt_grpo",
    "empg",
    "group_stats",
    "turn_reward_sums",
    "TURN_BASELINES",
    "GIGPO_NORMS",
    "GIGPO_EPISODE_STATS",
]


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
    "rloo": "A = 0 (no other sample to leave out; verl's RLOO gives the raw score s)",
    "reinforce_pp_baseline": "A = s, the raw score (baseline 0), before whitening",
    "gigpo": "an episode-level A^E = s/(1 + eps) when its statistics hold one value (s with norm='mean_norm'), "
    "as verl-agent: always with episode_stats='trajectories'; with 'steps' (the default) when the "
    "trajectory has one turn, and A^E = 0 when it has several (each turn counts its score once)",
    "mt_grpo": "A = 0 with turn_baseline='loo' (no other sample to leave out); with 'index' the outcome part "
    "O/(1 + eps), as GRPO, and no turn part (MT-GRPO's code gives NaN there), likewise with "
    "'index_present'",
    "empg": "the base advantage s/(1 + eps) (as GRPO) before the entropy modulation",
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
    rewards: TensorLike,
    mask: TensorLike,
    group_ids: TensorLike,
    *,
    eps: float = 1e-6,
    norm_by_std: bool = True,
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
    rewards: TensorLike,
    mask: TensorLike,
    group_ids: TensorLike,
    *,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr. GRPO: ``A_i = s_i − mean_g`` (GRPO without the std division). Shapes as :func:`grpo`."""
    return grpo(rewards, mask, group_ids, norm_by_std=False, whiten=whiten)


def rloo(
    rewards: TensorLike,
    mask: TensorLike,
    group_ids: TensorLike,
    *,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: ``A_i = s_i − mean_{j≠i, j∈g} s_j`` (leave-one-out); a group of one gets 0 (and warns once).

    The group of one is mpo_viz's own rule (nothing to leave out, so no signal): verl's
    ``compute_rloo_outcome_advantage`` gives such a row its raw score ``s_i`` instead (mean 0).
    Elsewhere the two agree. Shapes as :func:`grpo`; returns = advantages (before whitening).
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
    rewards: TensorLike,
    mask: TensorLike,
    *,
    gamma: float = 1.0,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted token returns ``G_t = r_t + γ·G_{t'}`` over action tokens (t' = next
    action token; observation tokens are skipped and the return carried over them, as verl does
    since 2026-08, verl-project/verl PR #7300; before that verl reset the return at every masked
    token), then whitened over the batch's action tokens (``whiten=True``, the algorithm's
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
    rewards: TensorLike,
    mask: TensorLike,
    group_ids: TensorLike,
    *,
    whiten: bool = True,
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
    R = (
        np.bincount(rows * kmax + kk, weights=p.rewards[rows, cols].astype(np.float64), minlength=B * kmax).reshape(
            B, kmax
        )
        if kmax
        else np.zeros((B, 0))
    )
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
            raise ValueError(
                f"response_ids: row {i}: expected at least {spans[-1][1] + 1} tokens "
                f"(aligned with the mask), found {resp.shape[0]}"
            )
        prev_end = -1
        for k, (first, last) in enumerate(spans):
            obs = resp[prev_end + 1 : first]
            prev_end = last
            if k > 0 and obs.size == 0:  # no observation, no anchor: A^S stays 0
                continue
            anchor = np.concatenate([prompts[i], obs]) if k == 0 else obs
            key = (int(codes[i]), anchor.tobytes())
            members_row.append(i)
            members_turn.append(k)
            members_code.append(keys.setdefault(key, len(keys)))
    return (members_row, members_turn, members_code), spans_all


#: ``norm`` of :func:`gigpo`: which levels divide by the group std. "mean_std_norm" and "mean_norm"
#: are verl-agent's ``algorithm.gigpo.mode`` (both levels, neither level); "step_mean_norm" divides
#: at the episode level only.
GIGPO_NORMS = ("mean_std_norm", "mean_norm", "step_mean_norm")
#: ``episode_stats`` of :func:`gigpo`: what the episode-level mean and std run over
GIGPO_EPISODE_STATS = ("steps", "trajectories")
#: the former ``norm`` names and what they are now
_GIGPO_RENAMED = {
    "std": "norm='mean_std_norm', episode_stats='trajectories'",
    "mean": "norm='step_mean_norm', episode_stats='trajectories'",
}


def _gigpo_episode(s: np.ndarray, codes: np.ndarray, weight: np.ndarray, eps: float, divide: bool) -> np.ndarray:
    """``A^E_i = (s_i − mean)/(std + ε)`` (``divide``) or ``s_i − mean``, the mean and unbiased std
    of i's group taken over its rows' scores each counted ``weight`` times (a turn count, or 1);
    statistics over a single value (or none) use mean 0, std 1, as verl-agent."""
    g = int(codes.max()) + 1 if codes.size else 0
    n = np.bincount(codes, weights=weight, minlength=g)
    tot = np.bincount(codes, weights=weight * s, minlength=g)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 1, tot / np.maximum(n, 1), 0.0)
        dev = s - mean[codes]
        var = np.bincount(codes, weights=weight * dev * dev, minlength=g) / np.maximum(n - 1, 1)
    std = np.where(n > 1, np.sqrt(var), 1.0)
    a = s - mean[codes]
    return a / (std[codes] + eps) if divide else a


def gigpo(
    rewards: TensorLike,
    mask: TensorLike,
    group_ids: TensorLike,
    *,
    prompt_ids: Sequence | TensorLike,
    response_ids: Sequence | TensorLike,
    turn_ids: TensorLike | None = None,
    omega: float = 1.0,
    step_gamma: float = 0.95,
    norm: str = "mean_std_norm",
    episode_stats: str = "steps",
    eps: float = 1e-6,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO as verl-agent computes it: ``A = A^E + ω·A^S``, constant over a turn's action tokens.

    * Episode level: the score ``s_i`` against its group, ``A^E_i = (s_i − mean)/(std + ε)``
      (unbiased std). ``episode_stats="steps"`` (default; verl-agent's
      ``compute_mean_std_cross_steps=True``, the only setting its entry point uses): the mean and
      std run over the group's *turns*, each carrying its trajectory's score, so a trajectory of
      ``K_i`` turns counts ``K_i`` times; ``"trajectories"``: once per trajectory (GRPO; the GiGPO
      paper's Eq. 3). Statistics over a single value use mean 0, std 1 (``s/(1 + ε)``; a group of
      one warns once): with "steps" a lone trajectory of several turns has ``A^E = 0``.
    * Step level: turn k's *anchor* is the token ids of the observation just before it — the
      response tokens between turn k−1's last and turn k's first action token; for k = 0 the
      prompt ids followed by any observation tokens before the first action token. An empty
      observation is no anchor: a turn k > 0 that directly follows turn k−1 (adjacent turn ids, no
      observation token between) joins no step group and gets ``A^S = 0`` (verl-agent has an
      observation at every step). Turns with identical anchors in the same group form a step
      group. Step return ``Σ_{k'≥k} γ^{k'−k} R_{k'}`` (γ = ``step_gamma``, ``R_k`` = the turn's
      reward sum); ``A^S = (ret − mean)/(std + ε)`` in the step group (unbiased std); a step group
      of one gives ``A^S = 0``.
    * ``norm`` — which levels divide by their std: ``"mean_std_norm"`` (default) both,
      ``"mean_norm"`` neither (verl-agent's config default, ``A^E = s − mean``,
      ``A^S = ret − mean``), ``"step_mean_norm"`` the episode level only. verl-agent's
      ``algorithm.gigpo.mode=X`` is ``norm=X`` with the default ``episode_stats="steps"``
      (omega = ``step_advantage_w``, step_gamma = ``algorithm.gamma``, eps 1e-6). The former
      ``norm="std"`` is ``norm="mean_std_norm", episode_stats="trajectories"``; the former
      ``norm="mean"`` is ``norm="step_mean_norm", episode_stats="trajectories"``.

    Shapes: rewards, mask, turn_ids ``(B, L)``; group_ids ``(B,)``; prompt_ids and response_ids:
    B token-id sequences (ragged lists or padded ``(B, ·)`` arrays; response_ids aligned with the
    mask). Returns ``(advantages, returns)`` ``(B, L)``, returns = advantages before whitening.
    """
    omega = scalar_check("omega", omega, None, None)
    step_gamma = scalar_check("step_gamma", step_gamma, 0.0, 1.0)
    eps = scalar_check("eps", eps, 0.0, None)
    if norm not in GIGPO_NORMS:
        was = f" (the former {norm!r} is {_GIGPO_RENAMED[norm]})" if norm in _GIGPO_RENAMED else ""
        raise ValueError(f"norm: expected one of {', '.join(map(repr, GIGPO_NORMS))}, found {norm!r}{was}")
    if episode_stats not in GIGPO_EPISODE_STATS:
        raise ValueError(
            f"episode_stats: expected one of {', '.join(map(repr, GIGPO_EPISODE_STATS))}, found {episode_stats!r}"
        )
    p = prepare(rewards, mask, turn_ids=turn_ids, need_turns=True)
    B, L = p.shape
    codes = group_codes(group_ids, B)
    warn_groups_of_one(codes, group_ids, "gigpo")
    prompts = _ragged(prompt_ids, B, "prompt_ids")
    responses = _ragged(response_ids, B, "response_ids")
    assert p.nturns is not None  # prepare(need_turns=True) counts them
    weight = p.nturns.astype(np.float64) if episode_stats == "steps" else np.ones(B)
    a_e = _gigpo_episode(_scores(p), codes, weight, eps, norm != "mean_norm")

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
            val = (x - mean) / (std + eps) if norm == "mean_std_norm" else x - mean
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


# ----------------------------------------------------------------------------- MT-GRPO

#: ``turn_baseline`` of :func:`mt_grpo`
TURN_BASELINES = ("loo", "index", "index_present")


def turn_reward_sums(p) -> np.ndarray:
    """``(B, Kmax)`` float64: ``R_{i,k}`` = the sum of turn k's action-token rewards (0 past ``K_i``)."""
    B = p.shape[0]
    kmax = int(p.nturns.max()) if B else 0
    rows, cols = np.nonzero(p.mask != 0)
    flat = rows * kmax + p.turn_ids[rows, cols]
    return np.bincount(flat, weights=p.rewards[rows, cols].astype(np.float64), minlength=B * kmax).reshape(B, kmax)


def _loo_per_column(y: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``y_{i,k} − mean_{j≠i, j∈g(i)} y_{j,k}`` per column (0 for a group of one)."""
    g = int(codes.max()) + 1 if codes.size else 0
    cnt = np.bincount(codes, minlength=g).astype(np.float64)[codes][:, None]
    tot = np.zeros((g, y.shape[1]))
    np.add.at(tot, codes, y)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 1, y - (tot[codes] - y) / np.maximum(cnt - 1, 1), 0.0)


def _index_turn_advantages(R: np.ndarray, inter: np.ndarray, codes: np.ndarray, eps: float) -> np.ndarray:
    """``(R_{i,k} − mean)/(std + ε)`` over the rows of i's group that have an intermediate turn k
    (unbiased std; a pool of one gives 0); 0 where row i has none ("index_present")."""
    out = np.zeros_like(R)
    for k in range(R.shape[1]):
        rows = np.flatnonzero(inter[:, k])
        if rows.size == 0:
            continue
        _, c = np.unique(codes[rows], return_inverse=True)
        n, mean, std = group_stats(R[rows, k], c.reshape(-1))
        with np.errstate(invalid="ignore", divide="ignore"):
            out[rows, k] = np.where(n > 1, (R[rows, k] - mean) / (std + eps), 0.0)
    return out


def _mt_grpo_index(
    R: np.ndarray, inter: np.ndarray, outcome: np.ndarray, K: np.ndarray, codes: np.ndarray, eps: float, coef: float
) -> np.ndarray:
    """MT-GRPO's own rule (``"index"``), ``(B, Kmax)``: rows with an intermediate turn get
    ``A^O + λ·A^T_k`` on it and ``A^O`` on their last turn, ``A^T_k`` normalising ``R̃_{·,k}`` over
    the whole group (0 for rows without an intermediate turn k; a group of one: no turn part); rows
    of one turn get GRPO of their total score ``s`` (MT-GRPO's combined advantage)."""
    a_o = _grpo_scores(outcome, codes, eps, True)
    a_c = _grpo_scores(R.sum(axis=1), codes, eps, True)
    y = np.where(inter, R, 0.0)
    a_t = np.zeros_like(R)
    for k in range(R.shape[1]):
        n, mean, std = group_stats(y[:, k], codes)
        with np.errstate(invalid="ignore", divide="ignore"):
            a_t[:, k] = np.where(n > 1, (y[:, k] - mean) / (std + eps), 0.0)
    per_turn = a_o[:, None] + coef * np.where(inter, a_t, 0.0)
    return np.where((np.asarray(K) <= 1)[:, None], a_c[:, None], per_turn)


def _per_turn_to_tokens(p, per_turn: np.ndarray) -> np.ndarray:
    """``(B, L)``: ``per_turn[i, turn of t]`` on action tokens, 0 elsewhere (in the compute dtype)."""
    act = p.mask != 0
    adv = np.zeros(p.shape, dtype=p.dtype)
    rows, cols = np.nonzero(act)
    adv[rows, cols] = per_turn[rows, p.turn_ids[rows, cols]]
    return adv


def _outcome_and_intermediate(R: np.ndarray, K) -> tuple[np.ndarray, np.ndarray]:
    """``O_i = R_{i,K_i−1}`` (0 without a turn) ``(B,)`` and which turns are intermediate,
    ``k < K_i − 1``, bool ``(B, Kmax)``."""
    B, kmax = R.shape
    K = np.asarray(K, dtype=np.int64)
    outcome = R[np.arange(B), np.maximum(K - 1, 0)] if kmax else np.zeros(B)
    return np.where(K > 0, outcome, 0.0), np.arange(kmax)[None, :] < (K[:, None] - 1)


def mt_grpo(
    rewards: TensorLike,
    mask: TensorLike,
    group_ids: TensorLike,
    *,
    turn_ids: TensorLike | None = None,
    turn_coef: float = 1.0,
    turn_baseline: str = "loo",
    eps: float = 1e-4,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MT-GRPO (Zeng et al., 2025): an outcome advantage for every turn plus a turn-reward advantage
    for every turn but the last, constant over a turn's action tokens.

    Row i has turns ``k = 0..K_i−1`` with reward sums ``R_{i,k}`` (:func:`turn_reward_sums`: turn
    rewards on their turn, the outcome on the last action token). The outcome is the last turn's
    ``O_i = R_{i,K_i−1}``; the earlier turns' ``R_{i,k}`` are intermediate rewards, and
    ``R̃_{i,k} = R_{i,k}`` for ``k < K_i − 1``, 0 otherwise (a turn that ends the episode, or none);
    ``s_i = Σ_k R_{i,k}`` is the total score. With GRPO's ``Z_g(x)_i = (x_i − mean_g x)/(std_g x + ε)``
    (unbiased std over i's group ``g``)::

        "index" (MT-GRPO's own, its _assign_advantages):
            K_i ≥ 2:  A_{i,k} = Z_g(O)_i + λ·Z_g(R̃_{·,k})_i  (k < K_i − 1),   A_{i,K_i−1} = Z_g(O)_i
            K_i = 1:  A_{i,0} = Z_g(s)_i                   (no tool call: the combined reward's advantage)
        "index_present" (the turn term over the rows that have an intermediate turn k only):
            A_{i,k} = Z_g(O)_i + λ·(R_{i,k} − mean P_k)/(std P_k + ε)  (k < K_i − 1),   else Z_g(O)_i
            P_k = {R_{j,k}: j in i's group with an intermediate turn k}  (a pool of one: no turn part)
        "loo" (default; leave-one-out per turn index over the whole group):
            Y_{j,k} = O_j + λ·R̃_{j,k}      A_{i,k} = Y_{i,k} − mean_{j≠i, j∈g} Y_{j,k}

    λ = ``turn_coef`` (MT-GRPO's ``turn_advantage_coef``). "index" is MT-GRPO's code (SiliangZeng/
    Multi-Turn-RL-Agent @ 7dbdd08b): one turn reward per rollout, normalised over the whole group
    (0 for a rollout without a tool call), added before the first tool result, and a rollout
    without a tool result gets the advantage of turn + outcome reward. In mpo_viz's layout its turn
    reward is turn 0's; for intermediate rewards on later turns "index" applies the same rule per
    turn index. Both "index" rules are biased when the policy decides when to stop: the rows that
    take another turn are compared on a different footing from those that do not (docs/concepts.md
    works an example: "index" charges the level of the intermediate reward, scaled by its std, to
    the decision to continue; "index_present" centres that level away, a bonus for continuing).
    "loo" counts every row of the group once at every index, a row without an intermediate turn
    there with ``R̃ = 0``: its baseline never depends on the row itself, so the expected advantage
    of every turn-k choice is its true advantage for the return MT-GRPO credits turn k with,
    ``O + λ·R̃_k`` (at λ = 1 the plain return when no later turn has an intermediate reward).
    ``eps`` (1e-4, as MT-GRPO's code) is added to the "index" rules' unbiased stds; "loo" does not
    divide (a std over the group would bring the row back into its baseline). A group of one: 0
    ("loo"), ``O/(1 + ε)`` and no turn part (both "index" rules; MT-GRPO's code gives NaN, torch's
    std of one value); warns once.

    Shapes: rewards, mask, turn_ids ``(B, L)``; group_ids ``(B,)``. Returns ``(advantages, returns)``
    ``(B, L)``, returns = advantages before whitening.
    """
    turn_coef = scalar_check("turn_coef", turn_coef, 0.0, None)
    eps = scalar_check("eps", eps, 0.0, None)
    if turn_baseline not in TURN_BASELINES:
        raise ValueError(
            f"turn_baseline: expected one of {', '.join(map(repr, TURN_BASELINES))}, found {turn_baseline!r}"
        )
    p = prepare(rewards, mask, turn_ids=turn_ids, need_turns=True)
    codes = group_codes(group_ids, p.shape[0])
    warn_groups_of_one(codes, group_ids, "mt_grpo")
    R = turn_reward_sums(p)
    outcome, inter = _outcome_and_intermediate(R, p.nturns)
    if turn_baseline == "loo":
        per_turn = _loo_per_column(outcome[:, None] + turn_coef * np.where(inter, R, 0.0), codes)
    elif turn_baseline == "index":
        assert p.nturns is not None  # prepare(need_turns=True) counts them
        per_turn = _mt_grpo_index(R, inter, outcome, p.nturns, codes, eps, turn_coef)
    else:
        a_o = _grpo_scores(outcome, codes, eps, True)
        per_turn = a_o[:, None] + turn_coef * _index_turn_advantages(R, inter, codes, eps)
    adv = _per_turn_to_tokens(p, per_turn)
    ret = adv.copy()
    if whiten:
        whiten_(adv, p.mask)
    return to_torch(adv, p.device), to_torch(ret, p.device)


# ----------------------------------------------------------------------------- EMPG

#: added to the entropy range and to the mean of g in EMPG's normalisations (its pseudocode's 1e-8)
EMPG_EPS = 1e-8


def _entropy(entropy, p) -> np.ndarray:
    """The per-token entropy as float64 ``(B, L)``, checked finite on action tokens."""
    if entropy is None:
        raise ValueError(
            "entropy: EMPG needs the policy's per-token entropy (field 'entropy' of "
            "trajectory/v1, one value per response token), found None"
        )
    if hasattr(entropy, "detach"):
        entropy = entropy.detach().cpu().numpy()
    h = np.asarray(entropy, dtype=np.float64)
    if h.shape != p.shape:
        raise ValueError(f"entropy: expected shape {p.shape} (the mask's), found {tuple(h.shape)}")
    bad = ~np.isfinite(h) & (p.mask != 0)
    if bad.any():
        row = int(np.argmax(bad.any(1)))
        pos = int(np.argmax(bad[row]))
        raise ValueError(
            f"entropy: row {row}, position {pos}: expected a finite entropy on an action token, found {h[row, pos]!r}"
        )
    return np.where(p.mask != 0, h, 0.0)


def step_entropies(p, h: np.ndarray) -> np.ndarray:
    """``(B, Kmax)`` float64: the mean entropy over each turn's action tokens (NaN past ``K_i``)."""
    B = p.shape[0]
    kmax = int(p.nturns.max()) if B else 0
    rows, cols = np.nonzero(p.mask != 0)
    flat = rows * kmax + p.turn_ids[rows, cols]
    tot = np.bincount(flat, weights=h[rows, cols], minlength=B * kmax).reshape(B, kmax)
    cnt = np.bincount(flat, minlength=B * kmax).reshape(B, kmax)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)


def empg(
    rewards: TensorLike,
    mask: TensorLike,
    group_ids: TensorLike,
    *,
    entropy: TensorLike | None,
    turn_ids: TensorLike | None = None,
    entropy_k: float = 1.0,
    clarity_k: float = 1.0,
    zeta: float = 0.1,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    center: bool = True,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EMPG (Wang et al., 2025): the GRPO advantage re-scaled per step by the step's entropy, plus a
    bonus for a confident next step; constant over a step's (turn's) action tokens.

    With ``A_i`` GRPO's advantage (``eps``, ``norm_by_std``), ``H_{i,k}`` the mean token entropy of
    turn k, and over all steps of the batch::

        Ĥ = (H − min H)/(max H − min H + 1e-8)            (batch min–max normalisation)
        g = exp(−k·Ĥ) / (mean exp(−k·Ĥ) + 1e-8)            (self-calibrating: batch mean of g ≈ 1)
        f = exp(−k_f·Ĥ)                                    (future clarity)
        A_{i,k} = g_{i,k}·A_i + ζ·f_{i,k+1}                 (no bonus after a row's last step)
        center: A_{i,k} ← A_{i,k} − mean over the batch's steps of A

    k = ``entropy_k``, k_f = ``clarity_k``, ζ = ``zeta``. Confident steps (low entropy) get their
    advantage amplified, uncertain ones attenuated. Its authors published pseudocode for the
    normalisation, g and f (project page), not a repository; the bonus on the next step and the
    final centring follow the paper's description.

    Shapes: rewards, mask, turn_ids, entropy ``(B, L)`` (entropy read on action tokens only);
    group_ids ``(B,)``. Returns ``(advantages, returns)`` ``(B, L)``, returns = advantages before
    whitening.
    """
    entropy_k = scalar_check("entropy_k", entropy_k, 0.0, None)
    clarity_k = scalar_check("clarity_k", clarity_k, 0.0, None)
    zeta = scalar_check("zeta", zeta, 0.0, None)
    eps = scalar_check("eps", eps, 0.0, None)
    p = prepare(rewards, mask, turn_ids=turn_ids, need_turns=True)
    h = step_entropies(p, _entropy(entropy, p))
    codes = group_codes(group_ids, p.shape[0])
    warn_groups_of_one(codes, group_ids, "empg")
    base = _grpo_scores(_scores(p), codes, eps, bool(norm_by_std))
    per_step = np.zeros_like(h)
    have = ~np.isnan(h)
    if have.any():
        x = h[have]
        hn = np.full_like(h, np.nan)
        hn[have] = (x - x.min()) / (x.max() - x.min() + EMPG_EPS)
        g = np.exp(-entropy_k * hn)
        g = g / (float(g[have].mean()) + EMPG_EPS)
        f = np.exp(-clarity_k * hn)
        bonus = np.zeros_like(h)
        bonus[:, :-1] = np.where(have[:, 1:], f[:, 1:], 0.0)
        per_step = np.where(have, g * base[:, None] + zeta * bonus, 0.0)
        if center:
            per_step = np.where(have, per_step - float(per_step[have].mean()), 0.0)
    adv = _per_turn_to_tokens(p, per_step)
    ret = adv.copy()
    if whiten:
        whiten_(adv, p.mask)
    return to_torch(adv, p.device), to_torch(ret, p.device)
