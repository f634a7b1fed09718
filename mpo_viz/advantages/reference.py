"""Reference estimators: plain per-trajectory Python loops, written to be read, not to be fast.

This module is the executable specification of the estimators (docs/concepts.md explains them). Each function mirrors
the fast
function of the same name in :mod:`mpo_viz.advantages` (same arguments and options) but loops over
trajectories and tokens in Python floats (float64) and returns numpy float64 arrays ``(B, L)``.
It does not validate its input (the fast functions do); tests feed both the same valid batches and
check the results equal.

Conventions shared by all loops:
* a trajectory's *action tokens* are the positions with ``mask == 1``; every recurrence runs over
  them only (observation tokens neither advance the clock nor carry values);
* turns are the groups of action tokens with equal ``turn_ids`` (mask runs when ``turn_ids`` is
  None);
* the value after the last action token is ``bootstrap_value[i]`` when finite, else 0.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

__all__ = [
    "gae",
    "vapo",
    "turn_gae",
    "mae",
    "grpo",
    "drgrpo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "gigpo",
    "turns_of",
    "row_lambda",
    "bilevel_gae",
    "mt_grpo",
    "empg",
]


# ----------------------------------------------------------------------------- helpers


def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _bootstrap(bootstrap_value, i: int) -> float:
    if bootstrap_value is None:
        return 0.0
    b = float(_np(bootstrap_value)[i])
    return b if math.isfinite(b) else 0.0


def turns_of(mask_row, turn_ids_row=None) -> list[list[int]]:
    """The action-token positions of each turn of one trajectory: ``[[t, ...] for k in 0..K−1]``."""
    positions = [t for t, m in enumerate(mask_row) if m != 0]
    turns: list[list[int]] = []
    if turn_ids_row is None:
        prev = None
        for t in positions:
            if prev is None or t != prev + 1:  # a new maximal run of mask == 1
                turns.append([])
            turns[-1].append(t)
            prev = t
        return turns
    for t in positions:
        k = int(turn_ids_row[t])
        while len(turns) <= k:
            turns.append([])
        turns[k].append(t)
    return turns


def _whiten(adv: np.ndarray, mask) -> np.ndarray:
    """``(A − mean)/sqrt(var_unbiased + 1e-8)`` over the action tokens; masked stay 0."""
    mask = _np(mask)
    xs = [adv[i, t] for i in range(adv.shape[0]) for t in range(adv.shape[1]) if mask[i, t] != 0]
    if not xs:
        return adv
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
    out = adv.copy()
    for i in range(adv.shape[0]):
        for t in range(adv.shape[1]):
            if mask[i, t] != 0:
                out[i, t] = (adv[i, t] - mean) / math.sqrt(var + 1e-8)
    return out


def _row_turns(mask, turn_ids, i):
    return turns_of(mask[i], None if turn_ids is None else _np(turn_ids)[i])


# ----------------------------------------------------------------------------- token GAE, VAPO


def _gae_row(r, v, positions, gamma, lam, last_value):
    """Token GAE over the given action positions of one row: dict t -> (A_t, G_t)."""
    out = {}
    next_value = last_value
    next_adv = 0.0
    for t in reversed(positions):
        delta = r[t] + gamma * next_value - v[t]
        a = delta + gamma * lam * next_adv
        out[t] = (a, a + v[t])
        next_value, next_adv = v[t], a
    return out


def row_lambda(lam_rule, lam, length, alpha=0.05, q=0.5):
    """One row's λ for ``lam_rule``; ``length`` ℓ = its action tokens (gae) or turns (turn λ_T)."""
    if lam_rule == "fixed":
        return lam
    if lam_rule == "vapo":  # 1 − 1/(α·ℓ), clamped to [0, 1); ℓ = 0 gives 0
        return min(max(1.0 - 1.0 / (alpha * length), 0.0), math.nextafter(1.0, 0.0)) if length else 0.0
    if lam_rule == "relative_position":  # q^{1/(ℓ−1)}; ℓ = 1 gives 1, ℓ = 0 gives 0
        return q ** (1.0 / (length - 1)) if length > 1 else float(length == 1)
    raise ValueError(f"lam_rule: unknown {lam_rule!r}")


def gae(
    rewards,
    values,
    mask,
    *,
    gamma=1.0,
    lam=1.0,
    lam_rule="fixed",
    alpha=0.05,
    q=0.5,
    bootstrap_value=None,
    whiten=False,
):
    r, v, m = _np(rewards), _np(values), _np(mask)
    adv, ret = np.zeros_like(m), np.zeros_like(m)
    for i in range(m.shape[0]):
        positions = [t for t in range(m.shape[1]) if m[i, t] != 0]
        lam_i = row_lambda(lam_rule, lam, len(positions), alpha, q)
        for t, (a, g) in _gae_row(r[i], v[i], positions, gamma, lam_i, _bootstrap(bootstrap_value, i)).items():
            adv[i, t], ret[i, t] = a, g
    return (_whiten(adv, m) if whiten else adv), ret


def vapo(rewards, values, mask, *, gamma=1.0, alpha=0.05, bootstrap_value=None, whiten=False):
    r, v, m = _np(rewards), _np(values), _np(mask)
    adv, ret = np.zeros_like(m), np.zeros_like(m)
    for i in range(m.shape[0]):
        positions = [t for t in range(m.shape[1]) if m[i, t] != 0]
        n = len(positions)
        lam = min(max(1.0 - 1.0 / (alpha * n), 0.0), math.nextafter(1.0, 0.0)) if n else 0.0
        last = _bootstrap(bootstrap_value, i)
        for t, (a, _) in _gae_row(r[i], v[i], positions, gamma, lam, last).items():
            adv[i, t] = a
        for t, (_, g) in _gae_row(r[i], v[i], positions, gamma, 1.0, last).items():
            ret[i, t] = g
    return (_whiten(adv, m) if whiten else adv), ret


# ----------------------------------------------------------------------------- turn GAE and MAE


def _clock(turns, gamma, turn_gamma):
    """The discount from each action token to the next one (dict t -> d_t): γ inside a turn,
    γ_T from a turn's last token to the next turn's first (or to the bootstrap value)."""
    return {t: (turn_gamma if j == len(tk) - 1 else gamma) for tk in turns for j, t in enumerate(tk)}


def _turn_gae_row(r, v, turns, gamma, turn_gamma, turn_lam, value_at, last_value):
    """Per turn k: (V(s_k), R_k, A^T_k, G^T_k), SMDP-discounted.

    ``R_k = Σ_j γ^j r_{k,j}`` (j counts turn k's action tokens from 0) and the discount from
    ``V(s_k)`` to ``V(s_{k+1})`` is ``Γ_k = γ^{n_k−1}·γ_T``, the product of the token clock over
    the turn: the Monte-Carlo return at a turn's first token is exactly ``R_k + Γ_k·G_{k+1}``.
    """
    K = len(turns)
    if value_at == "first":
        vs = [v[tk[0]] for tk in turns]
    elif value_at == "last":
        vs = [v[tk[-1]] for tk in turns]
    else:
        vs = [sum(v[t] for t in tk) / len(tk) for tk in turns]
    rs = [sum(gamma**j * r[t] for j, t in enumerate(tk)) for tk in turns]
    big_g = [gamma ** (len(tk) - 1) * turn_gamma for tk in turns]
    at = [0.0] * K
    nxt_v, nxt_a = last_value, 0.0
    for k in reversed(range(K)):
        delta = rs[k] + big_g[k] * nxt_v - vs[k]
        at[k] = delta + big_g[k] * turn_lam * nxt_a
        nxt_v, nxt_a = vs[k], at[k]
    return vs, rs, at, [at[k] + vs[k] for k in range(K)]


def turn_gae(
    rewards,
    values,
    mask,
    *,
    turn_ids=None,
    gamma=1.0,
    turn_gamma=1.0,
    turn_lam=0.9,
    value_at="first",
    lam_rule="fixed",
    alpha=0.05,
    q=0.5,
    bootstrap_value=None,
    whiten=False,
):
    r, v, m = _np(rewards), _np(values), _np(mask)
    adv, ret = np.zeros_like(m), np.zeros_like(m)
    for i in range(m.shape[0]):
        turns = _row_turns(m, turn_ids, i)
        tlam = row_lambda(lam_rule, turn_lam, len(turns), alpha, q)
        _, _, at, gt = _turn_gae_row(
            r[i], v[i], turns, gamma, turn_gamma, tlam, value_at, _bootstrap(bootstrap_value, i)
        )
        for k, tk in enumerate(turns):
            for t in tk:
                adv[i, t], ret[i, t] = at[k], gt[k]
    return (_whiten(adv, m) if whiten else adv), ret


def _within_row(r, v, turns, within, gamma, lam, turn_gamma, last_value):
    """The within-turn signal u_t for every action token of one row (dict t -> u_t).

    Every token recurrence runs on the one clock of :func:`_clock` (γ inside a turn, γ_T across a
    boundary), the same clock as the Monte-Carlo returns.
    """
    positions = [t for tk in turns for t in tk]
    clock = _clock(turns, gamma, turn_gamma)
    next_value = {}  # value at the next action token (the next turn's first; last_value at the end)
    for j, t in enumerate(positions):
        next_value[t] = v[positions[j + 1]] if j + 1 < len(positions) else last_value
    delta = {t: r[t] + clock[t] * next_value[t] - v[t] for t in positions}
    u = {}
    if within == "intra":
        for tk in turns:
            for j, t in enumerate(tk):  # u_t = Σ_l (γλ)^l (γ·V_{t+l+1} − V_{t+l}) inside the turn
                u[t] = sum(
                    (gamma * lam) ** lag * (gamma * v[tk[j + lag + 1]] - v[tk[j + lag]])
                    for lag in range(len(tk) - 1 - j)
                )
    elif within == "local":
        for tk in turns:
            for j, t in enumerate(tk):  # token GAE truncated at the turn's end
                u[t] = sum((gamma * lam) ** lag * delta[tk[j + lag]] for lag in range(len(tk) - j))
    elif within == "global":  # A_t = δ_t + d_t·λ·A_{t'} over the whole row
        a = 0.0
        for t in reversed(positions):
            a = delta[t] + clock[t] * lam * a
            u[t] = a
    elif within == "td":
        u = delta
    elif within == "baseline":  # needs V(s_k): mae() computes it beside the turn GAE
        raise ValueError("within='baseline' is computed by mae(), not by _within_row")
    else:
        raise ValueError(f"within: unknown {within!r}")
    return u


def mae(
    rewards,
    values,
    mask,
    *,
    turn_ids=None,
    gamma=1.0,
    lam=0.95,
    turn_gamma=1.0,
    turn_lam=0.9,
    beta=1.0,
    within="intra",
    value_at="first",
    critic_target="mc",
    lam_rule="fixed",
    alpha=0.05,
    q=0.5,
    bootstrap_value=None,
    whiten=False,
):
    r, v, m = _np(rewards), _np(values), _np(mask)
    adv, ret = np.zeros_like(m), np.zeros_like(m)
    for i in range(m.shape[0]):
        turns = _row_turns(m, turn_ids, i)
        last = _bootstrap(bootstrap_value, i)
        tlam = row_lambda(lam_rule, turn_lam, len(turns), alpha, q)
        vs, _, at, gt = _turn_gae_row(r[i], v[i], turns, gamma, turn_gamma, tlam, value_at, last)
        if within == "baseline":  # u = V(s_k) − γ^j·V_t (j: the token's place in its turn), not centred
            for k, tk in enumerate(turns):
                for j, t in enumerate(tk):
                    adv[i, t] = at[k] + beta * (vs[k] - gamma**j * v[i, t])
        else:
            u = _within_row(r[i], v[i], turns, within, gamma, lam, turn_gamma, last)
            for k, tk in enumerate(turns):
                u_mean = sum(u[t] for t in tk) / len(tk)
                for t in tk:
                    adv[i, t] = at[k] + beta * (u[t] - u_mean)
        # critic targets
        if critic_target == "turn":
            for k, tk in enumerate(turns):
                for t in tk:
                    ret[i, t] = gt[k]
        else:  # Monte-Carlo on the same clock: γ inside a turn, γ_T across a boundary (and onto the bootstrap)
            clock = _clock(turns, gamma, turn_gamma)
            g = last
            for t in reversed([t for tk in turns for t in tk]):
                g = r[i, t] + clock[t] * g
                ret[i, t] = g
    return (_whiten(adv, m) if whiten else adv), ret


# ----------------------------------------------------------------------------- group baselines


def _groups(group_ids) -> dict:
    if hasattr(group_ids, "tolist"):
        group_ids = group_ids.tolist()
    groups: dict = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    return groups


def _broadcast(per_row, m):
    adv = np.zeros_like(m)
    for i in range(m.shape[0]):
        for t in range(m.shape[1]):
            if m[i, t] != 0:
                adv[i, t] = per_row[i]
    return adv


def _grpo_row_values(scores, groups, eps, norm_by_std):
    out = [0.0] * len(scores)
    for members in groups.values():
        xs = [scores[i] for i in members]
        if len(xs) == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = statistics.fmean(xs), statistics.stdev(xs)
        for i in members:
            out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return out


def grpo(rewards, mask, group_ids, *, eps=1e-6, norm_by_std=True, whiten=False):
    r, m = _np(rewards), _np(mask)
    scores = [float(sum(r[i])) for i in range(m.shape[0])]
    adv = _broadcast(_grpo_row_values(scores, _groups(group_ids), eps, norm_by_std), m)
    return (_whiten(adv, m) if whiten else adv), adv.copy()


def drgrpo(rewards, mask, group_ids, *, whiten=False):
    return grpo(rewards, mask, group_ids, norm_by_std=False, whiten=whiten)


def rloo(rewards, mask, group_ids, *, whiten=False):
    r, m = _np(rewards), _np(mask)
    scores = [float(sum(r[i])) for i in range(m.shape[0])]
    per_row = [0.0] * len(scores)
    for members in _groups(group_ids).values():
        for i in members:
            others = [scores[j] for j in members if j != i]
            per_row[i] = scores[i] - sum(others) / len(others) if others else 0.0
    adv = _broadcast(per_row, m)
    return (_whiten(adv, m) if whiten else adv), adv.copy()


def reinforce_pp(rewards, mask, *, gamma=1.0, whiten=True):
    r, m = _np(rewards), _np(mask)
    g_all = np.zeros_like(m)
    for i in range(m.shape[0]):
        g = 0.0
        for t in reversed(range(m.shape[1])):
            if m[i, t] != 0:
                g = r[i, t] + gamma * g
                g_all[i, t] = g
    return (_whiten(g_all, m) if whiten else g_all.copy()), g_all


def reinforce_pp_baseline(rewards, mask, group_ids, *, whiten=True):
    r, m = _np(rewards), _np(mask)
    scores = [float(sum(r[i])) for i in range(m.shape[0])]
    adv = _broadcast(_grpo_row_values(scores, _groups(group_ids), 0.0, False), m)
    return (_whiten(adv, m) if whiten else adv), adv.copy()


def _gigpo_episode(scores, groups, turns_all, episode_stats, eps, divide):
    """A^E per row: the group's statistics over its turns (each carrying its row's score; "steps")
    or over its rows ("trajectories"); a single value (or none): mean 0, std 1."""
    out = [0.0] * len(scores)
    for members in groups.values():
        if episode_stats == "steps":
            xs = [scores[i] for i in members for _ in turns_all[i]]
        else:
            xs = [scores[i] for i in members]
        if len(xs) <= 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = statistics.fmean(xs), statistics.stdev(xs)
        for i in members:
            out[i] = (scores[i] - mean) / (std + eps) if divide else scores[i] - mean
    return out


def gigpo(
    rewards,
    mask,
    group_ids,
    *,
    prompt_ids,
    response_ids,
    turn_ids=None,
    omega=1.0,
    step_gamma=0.95,
    norm="mean_std_norm",
    episode_stats="steps",
    eps=1e-6,
    whiten=False,
):
    r, m = _np(rewards), _np(mask)
    B = m.shape[0]
    groups = _groups(group_ids)
    gid = list(group_ids.tolist() if hasattr(group_ids, "tolist") else group_ids)
    scores = [float(sum(r[i])) for i in range(B)]
    turns_all = [_row_turns(m, turn_ids, i) for i in range(B)]
    # "mean_std_norm": both levels divide by their std; "mean_norm": neither; "step_mean_norm": the episode's only
    a_e = _gigpo_episode(scores, groups, turns_all, episode_stats, eps, norm != "mean_norm")
    step_groups: dict = {}  # (group id, anchor tokens) -> [(row, turn, step return)]
    a_s_zero = []  # (row, turn) of turns without an anchor
    for i in range(B):
        turns = turns_all[i]
        resp = [int(x) for x in np.asarray(response_ids[i]).reshape(-1)]
        rk = [sum(r[i, t] for t in tk) for tk in turns]
        for k, tk in enumerate(turns):
            step_return = sum(step_gamma ** (k2 - k) * rk[k2] for k2 in range(k, len(turns)))
            prev_end = turns[k - 1][-1] if k > 0 else -1
            obs = resp[prev_end + 1 : tk[0]]
            if k > 0 and not obs:  # an empty observation is no anchor: the turn's A^S is 0
                a_s_zero.append((i, k))
                continue
            anchor = [int(x) for x in np.asarray(prompt_ids[i]).reshape(-1)] + obs if k == 0 else obs
            step_groups.setdefault((gid[i], tuple(anchor)), []).append((i, k, step_return))
    a_s = {key: 0.0 for key in a_s_zero}
    for members in step_groups.values():
        xs = [x for _, _, x in members]
        for i, k, x in members:
            if len(xs) == 1:
                a_s[i, k] = 0.0
            elif norm == "mean_std_norm":
                a_s[i, k] = (x - statistics.fmean(xs)) / (statistics.stdev(xs) + eps)
            else:
                a_s[i, k] = x - statistics.fmean(xs)
    adv = np.zeros_like(m)
    for i in range(B):
        for k, tk in enumerate(turns_all[i]):
            for t in tk:
                adv[i, t] = a_e[i] + omega * a_s[i, k]
    return (_whiten(adv, m) if whiten else adv), adv.copy()


# ----------------------------------------------------------------------------- bi-level GAE


def _reward_turns(r_row, m_row) -> list[list[int]]:
    """RAGEN's turns of one row: a turn ends at each action token with a non-zero reward, and at the
    row's last action token."""
    turns: list[list[int]] = []
    current: list[int] = []
    for t in range(len(m_row)):
        if m_row[t] == 0:
            continue
        current.append(t)
        if r_row[t] != 0:
            turns.append(current)
            current = []
    if current:
        turns.append(current)
    return turns


def bilevel_gae(
    rewards,
    values,
    mask,
    *,
    turn_ids=None,
    gamma=1.0,
    lam=1.0,
    turn_gamma=0.95,
    turn_ends="turns",
    bootstrap_value=None,
    whiten=True,
):
    r, v, m = _np(rewards), _np(values), _np(mask)
    adv, ret = np.zeros_like(m), np.zeros_like(m)
    for i in range(m.shape[0]):
        turns = _row_turns(m, turn_ids, i) if turn_ends == "turns" else _reward_turns(r[i], m[i])
        ends = [tk[-1] for tk in turns]
        high = [0.0] * len(turns)
        next_v, next_a = _bootstrap(bootstrap_value, i), 0.0
        for k in reversed(range(len(turns))):  # turn level, over the turns' last tokens, γ_H
            e = ends[k]
            high[k] = r[i, e] + turn_gamma * next_v - v[i, e] + turn_gamma * lam * next_a
            next_v, next_a = v[i, e], high[k]
        for k, tk in enumerate(turns):  # token level inside the turn; its last token carries A^H_k
            a = high[k]
            adv[i, tk[-1]] = a
            for j in reversed(range(len(tk) - 1)):
                t, t_next = tk[j], tk[j + 1]
                a = r[i, t] + gamma * v[i, t_next] - v[i, t] + gamma * lam * a
                adv[i, t] = a
            for t in tk:
                ret[i, t] = adv[i, t] + v[i, t]
    return (_whiten(adv, m) if whiten else adv), ret


# ----------------------------------------------------------------------------- MT-GRPO, EMPG


def _turn_sums(r, turns):
    return [sum(r[t] for t in tk) for tk in turns]


def _per_turn_broadcast(m, turns_all, per_turn):
    adv = np.zeros_like(m)
    for i, turns in enumerate(turns_all):
        for k, tk in enumerate(turns):
            for t in tk:
                adv[i, t] = per_turn[i][k]
    return adv


def _inter(sums, j, k):
    """The intermediate reward of row j at turn k (0: no such turn, or its last)."""
    return sums[j][k] if k < len(sums[j]) - 1 else 0.0


def _mt_grpo_loo(sums, outcome, groups, gid, turn_coef):
    per_turn = []
    for i in range(len(sums)):
        others = [j for j in groups[gid[i]] if j != i]
        row = []
        for k in range(len(sums[i])):
            if not others:
                row.append(0.0)
                continue
            base = sum(outcome[j] + turn_coef * _inter(sums, j, k) for j in others) / len(others)
            row.append(outcome[i] + turn_coef * _inter(sums, i, k) - base)
        per_turn.append(row)
    return per_turn


def _mt_grpo_index(sums, outcome, groups, gid, turn_coef, eps, whole_group):
    """Both "index" rules: A^O + λ·A^T_k on a row's intermediate turns, A^O on its last. "index"
    (``whole_group``): A^T_k normalises R̃_{·,k} over the whole group, and a row of one turn gets GRPO
    of its total score; "index_present": over the rows that have an intermediate turn k."""
    a_o = _grpo_row_values(outcome, groups, eps, True)
    a_c = _grpo_row_values([sum(s) for s in sums], groups, eps, True)
    per_turn = []
    for i in range(len(sums)):
        n_turns = len(sums[i])
        if whole_group and n_turns <= 1:  # no tool call: the combined (turn + outcome) reward's advantage
            per_turn.append([a_c[i]] * n_turns)
            continue
        row = []
        for k in range(n_turns):
            a_t = 0.0
            if k < n_turns - 1:
                members = groups[gid[i]]
                if whole_group:
                    pool = [_inter(sums, j, k) for j in members]
                else:
                    pool = [sums[j][k] for j in members if k < len(sums[j]) - 1]
                if len(pool) > 1:
                    a_t = (sums[i][k] - statistics.fmean(pool)) / (statistics.stdev(pool) + eps)
            row.append(a_o[i] + turn_coef * a_t)
        per_turn.append(row)
    return per_turn


def mt_grpo(rewards, mask, group_ids, *, turn_ids=None, turn_coef=1.0, turn_baseline="loo", eps=1e-4, whiten=False):
    r, m = _np(rewards), _np(mask)
    B = m.shape[0]
    gid = list(group_ids.tolist() if hasattr(group_ids, "tolist") else group_ids)
    groups = _groups(gid)
    turns_all = [_row_turns(m, turn_ids, i) for i in range(B)]
    sums = [_turn_sums(r[i], turns_all[i]) for i in range(B)]
    outcome = [s[-1] if s else 0.0 for s in sums]
    if turn_baseline == "loo":
        per_turn = _mt_grpo_loo(sums, outcome, groups, gid, turn_coef)
    else:
        per_turn = _mt_grpo_index(sums, outcome, groups, gid, turn_coef, eps, turn_baseline == "index")
    adv = _per_turn_broadcast(m, turns_all, per_turn)
    return (_whiten(adv, m) if whiten else adv), adv.copy()


def empg(
    rewards,
    mask,
    group_ids,
    *,
    entropy,
    turn_ids=None,
    entropy_k=1.0,
    clarity_k=1.0,
    zeta=0.1,
    eps=1e-6,
    norm_by_std=True,
    center=True,
    whiten=False,
):
    r, m, h = _np(rewards), _np(mask), _np(entropy)
    B = m.shape[0]
    scores = [float(sum(r[i])) for i in range(B)]
    base = _grpo_row_values(scores, _groups(group_ids), eps, norm_by_std)
    turns_all = [_row_turns(m, turn_ids, i) for i in range(B)]
    steps = [[sum(h[i, t] for t in tk) / len(tk) for tk in turns] for i, turns in enumerate(turns_all)]
    flat = [x for row in steps for x in row]
    per_turn = [[0.0] * len(row) for row in steps]
    if flat:
        lo, hi = min(flat), max(flat)
        norm = [[(x - lo) / (hi - lo + 1e-8) for x in row] for row in steps]
        g_raw = [[math.exp(-entropy_k * x) for x in row] for row in norm]
        g_mean = sum(x for row in g_raw for x in row) / len(flat)
        for i, row in enumerate(norm):
            for k in range(len(row)):
                bonus = math.exp(-clarity_k * row[k + 1]) if k + 1 < len(row) else 0.0
                per_turn[i][k] = g_raw[i][k] / (g_mean + 1e-8) * base[i] + zeta * bonus
        if center:
            mean = sum(x for row in per_turn for x in row) / len(flat)
            per_turn = [[x - mean for x in row] for row in per_turn]
    adv = _per_turn_broadcast(m, turns_all, per_turn)
    return (_whiten(adv, m) if whiten else adv), adv.copy()
