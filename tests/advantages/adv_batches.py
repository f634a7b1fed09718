"""Small random batches with every edge case in them, for the advantage tests."""

from __future__ import annotations

import numpy as np


def random_batch(
    seed: int,
    B: int = 8,
    *,
    dtype=np.float64,
    adjacent_turns: bool = False,
    empty_row: bool = True,
    obs_inside: bool = False,
    leading_obs: bool = True,
    bootstrap: bool = True,
    reward_kind: str = "dense",
    vocab: int = 3,
):
    """A random (B, L) batch as numpy arrays with explicit turn ids.

    Rows: optional leading observation tokens, 1–4 turns of 1–4 action tokens with 0–3 observation
    tokens after each (≥ 1 between turns unless ``adjacent_turns``), right padding. ``obs_inside``
    puts masked tokens inside a turn's span (explicit ids only). Values on masked tokens are
    garbage (large random numbers) so any leak shows, entropies there NaN. Row 0 has no action token when
    ``empty_row``; row 1 is a single one-token turn.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(B):
        m, tid = [], []
        if leading_obs and rng.random() < 0.3:
            n = int(rng.integers(1, 3))
            m += [0] * n
            tid += [0] * n
        if empty_row and i == 0:
            n = int(rng.integers(1, 5))
            m, tid = [0] * n, [0] * n
        else:
            K = 1 if i == 1 else int(rng.integers(1, 5))
            for k in range(K):
                n = 1 if i == 1 else int(rng.integers(1, 5))
                for j in range(n):
                    m.append(1)
                    tid.append(k)
                    if obs_inside and j < n - 1 and rng.random() < 0.3:
                        m.append(0)
                        tid.append(k)
                lo = 0 if (adjacent_turns or k == K - 1) else 1
                n_obs = int(rng.integers(lo, 4))
                m += [0] * n_obs
                tid += [k] * n_obs
        rows.append((m, tid))
    L = max(len(m) for m, _ in rows) + int(rng.integers(0, 3))
    M = np.zeros((B, L))
    T = np.zeros((B, L), dtype=np.int64)
    for i, (m, tid) in enumerate(rows):
        M[i, : len(m)] = m
        T[i, : len(tid)] = tid
        T[i, len(tid) :] = tid[-1] if tid else 0
    act = M == 1
    if reward_kind == "dense":
        R = np.where(act & (rng.random((B, L)) < 0.4), rng.normal(size=(B, L)), 0.0)
    elif reward_kind == "outcome":  # 0/1 on the last action token
        R = np.zeros((B, L))
        for i in range(B):
            pos = np.flatnonzero(act[i])
            if pos.size:
                R[i, pos[-1]] = float(rng.random() < 0.5)
    elif reward_kind == "turn_end":
        R = np.zeros((B, L))
        for i in range(B):
            pos = np.flatnonzero(act[i])
            for k in np.unique(T[i, pos]):
                R[i, pos[T[i, pos] == k][-1]] = rng.normal()
    else:
        raise ValueError(reward_kind)
    V = np.where(act, rng.normal(size=(B, L)), rng.normal(size=(B, L)) * 1e3)
    H = np.where(act, rng.gamma(2.0, 0.5, size=(B, L)), np.nan)  # entropies; NaN where never read
    boot = np.where(rng.random(B) < 0.5, rng.normal(size=B), np.nan) if bootstrap else np.full(B, np.nan)
    n_groups = max(1, B // 2)
    group_ids = [f"g{int(x)}" for x in rng.integers(0, n_groups, size=B)]
    prompts = {g: rng.integers(0, 5, size=int(rng.integers(1, 4))) for g in set(group_ids)}
    prompt_ids = [prompts[g] for g in group_ids]
    response_ids = [
        np.where(M[i] == 1, rng.integers(10, 100, size=L), rng.integers(0, vocab, size=L)) for i in range(B)
    ]
    return {
        "rewards": R.astype(dtype),
        "values": V.astype(dtype),
        "mask": M.astype(dtype),
        "turn_ids": T,
        "bootstrap_value": boot,
        "group_ids": group_ids,
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "entropy": H,
    }
