"""Seeded synthetic multi-turn batches for benchmarks, property tests and demos.

Each trajectory alternates assistant turns (action tokens) and tool/environment replies
(observation tokens), starting with an assistant turn. The numbers mimic what an agent rollout
with a critic looks like:

* tasks come in groups of ``group_size`` samples; each task has a latent success probability
  ``p`` and each sample succeeds with probability ``p`` (outcome reward 1 or 0 on the last action
  token, the default of docs/concepts.md §3);
* critic values move mostly *between* turns — the turn value drifts from ``p`` towards the
  outcome as the trajectory advances — and only a little *inside* a turn (a small random walk),
  the pattern the MPO paper reports (across ≫ within);
* ``old_logprobs`` are negative (a mix of confident and uncertain tokens), ``rollout_logprobs`` and
  ``ref_logprobs`` differ from them by small noise.

Everything is a pure function of ``seed`` and the arguments.
"""

from __future__ import annotations

import numpy as np

from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = ["make_batch", "make_rows", "strip_arrays"]


def _draw(rng: np.random.Generator, spec, size=None):
    """An integer from ``spec``: an int, or an inclusive range ``(lo, hi)``."""
    if isinstance(spec, (int, np.integer)):
        return np.full(size, int(spec)) if size is not None else int(spec)
    lo, hi = spec
    return rng.integers(lo, hi + 1, size=size)


def make_rows(
    n_traj: int,
    seed: int = 0,
    *,
    turns=(2, 6),
    turn_len=(20, 200),
    obs_len=(20, 300),
    prompt_len=(16, 64),
    group_size: int = 4,
    max_len: int | None = None,
    vocab_size: int = 32_000,
    final_obs: bool = False,
    within_noise: float = 0.01,
    across_noise: float = 0.05,
) -> list[dict]:
    """Rows (dicts of trajectory/v1 fields, numpy arrays inside) of a synthetic batch.

    Arguments are documented in :func:`make_batch`, which validates these rows into a batch.
    """
    if n_traj < 0:
        raise ValueError(f"n_traj: expected >= 0, found {n_traj}")
    if group_size < 1:
        raise ValueError(f"group_size: expected >= 1, found {group_size}")
    if turns is None and max_len is None:
        raise ValueError("turns=None (fill up to max_len) needs max_len")
    rng = np.random.default_rng(seed)
    n_groups = -(-n_traj // group_size) if n_traj else 0
    task_p = rng.beta(1.2, 1.2, size=n_groups)
    rows = []
    for i in range(n_traj):
        g = i // group_size
        p = task_p[g]
        success = rng.random() < p
        seg_len, is_act = _segments(rng, turns, turn_len, obs_len, max_len, final_obs)
        n_turns = int(is_act.sum())
        length = int(seg_len.sum())
        mask = np.repeat(is_act.astype(np.int8), seg_len)
        turn_ids = np.repeat(np.cumsum(is_act) - 1, seg_len).astype(np.int64)
        reward = 1.0 if success else 0.0
        values = _values(rng, p, reward, seg_len, turn_ids, n_turns, within_noise, across_noise)
        old_lp, rollout_lp, ref_lp = _logprobs(rng, mask, length)
        rows.append(
            {
                "traj_id": f"s{seed}-t{i:06d}",
                "group_id": f"s{seed}-g{g:06d}",
                "prompt_ids": rng.integers(4, vocab_size, size=_draw(rng, prompt_len)),
                "response_ids": rng.integers(4, vocab_size, size=length),
                "loss_mask": mask,
                "turn_ids": turn_ids,
                "reward": reward,
                "values": values,
                "old_logprobs": old_lp,
                "rollout_logprobs": rollout_lp,
                "ref_logprobs": ref_lp,
                "sample_idx": i % group_size,
                "num_turns": n_turns,
            }
        )
    return rows


def _segments(rng, turns, turn_len, obs_len, max_len, final_obs) -> tuple[np.ndarray, np.ndarray]:
    """The lengths of a trajectory's alternating action and observation segments (empty ones
    dropped) and which are actions; with ``turns=None`` drawn until ``max_len`` is filled."""
    k = _draw(rng, turns) if turns is not None else max(1, max_len // 20)
    a_len = _draw(rng, turn_len, size=k)
    o_len = _draw(rng, obs_len, size=k)
    if not final_obs:
        o_len[-1] = 0
    seg_len = np.stack([a_len, o_len], axis=1).reshape(-1)
    if max_len is not None:
        ends = np.cumsum(seg_len)
        cut = np.searchsorted(ends, max_len, side="left")  # segment in which max_len is reached
        if cut < len(seg_len):
            seg_len = seg_len[: cut + 1].copy()
            seg_len[-1] -= ends[cut] - max_len
            if len(seg_len) % 2 == 0 and seg_len[-1] == 0:
                seg_len = seg_len[:-1]
    is_act = np.zeros(len(seg_len), dtype=bool)
    is_act[0::2] = True
    keep = seg_len > 0
    return seg_len[keep], is_act[keep]


def _values(
    rng, p: float, reward: float, seg_len, turn_ids, n_turns: int, within_noise: float, across_noise: float
) -> np.ndarray:
    """Critic-like values: a turn-level value drifting from the task's p to the outcome, plus noise
    across turns, and a small random walk within each turn (reset at each turn start)."""
    length = int(seg_len.sum())
    frac = (np.arange(n_turns) / max(n_turns, 1)) ** 1.5
    v_turn = p + (reward - p) * frac + rng.normal(0, across_noise, size=n_turns)
    values = v_turn[turn_ids] + np.cumsum(rng.normal(0, within_noise, size=length)) * 0.5
    starts = np.concatenate([[0], np.cumsum(seg_len)[:-1]])
    walk_base = np.repeat((values - v_turn[turn_ids])[starts], seg_len)
    return np.clip(values - walk_base, -0.5, 1.5).astype(np.float32)


def _logprobs(rng, mask: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Old, rollout and reference log-probs: mostly confident tokens, 0 on observation tokens."""
    confident = rng.random(length) < 0.7
    old_lp = np.where(confident, -rng.exponential(0.05, length), -rng.exponential(1.5, length))
    old_lp = np.where(mask == 1, old_lp, 0.0).astype(np.float32)
    rollout_lp = np.where(mask == 1, old_lp + rng.normal(0, 0.01, length), 0.0).astype(np.float32)
    ref_lp = np.where(mask == 1, old_lp + rng.normal(0, 0.05, length), 0.0).astype(np.float32)
    return old_lp, rollout_lp, ref_lp


def make_batch(n_traj: int, seed: int = 0, **options) -> TrajectoryBatch:
    """A realistic random multi-turn batch of ``n_traj`` trajectories.

    Args:
        n_traj: number of trajectories (groups of ``group_size`` consecutive ones share a task).
        seed: the only source of randomness.

    Options (keyword-only; :func:`make_rows` holds the signature and defaults):
        turns: assistant turns per trajectory, an int or inclusive range; ``None`` keeps adding
            turns until ``max_len`` tokens (benchmark shape: every row ends at ``max_len``).
        turn_len: action tokens per assistant turn (int or inclusive range).
        obs_len: observation tokens after each turn but the last (int or range).
        prompt_len: prompt tokens (int or range).
        group_size: samples per task (GRPO-style groups).
        max_len: truncate responses to this many tokens (the cut may fall inside a turn).
        vocab_size: token ids are drawn from ``[4, vocab_size)``.
        final_obs: also put an observation after the last turn.
        within_noise / across_noise: scale of value variation inside / between turns.

    Returns a validated :class:`TrajectoryBatch` with ``values``, ``old_logprobs``,
    ``rollout_logprobs``, ``ref_logprobs``, ``turn_ids`` and an outcome ``reward`` in {0, 1}.
    """
    rows = make_rows(n_traj, seed, **options)
    return TrajectoryBatch.from_rows(rows, {"source_framework": "mpo_viz.data.synthetic", "values_source": "synthetic"})


_STRIP_WORDS = np.array(["the", " search", " result", " for", "\n", " tool", "(", "x", ")", " 42", " Paris", " answer"])


def strip_arrays(n: int, seed: int = 0) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
    """One long random trajectory as the token strip takes it (``mpo_viz.render.strip.payload_from_arrays``):
    ``(tokens, mask, channels)`` for ``n`` tokens.

    Assistant spans of 20–200 tokens alternate with tool spans of 20–300 (the first span is an
    assistant one); tokens are drawn from a few words; channels (float64 ``(n,)``): ``adv_mpo``,
    ``adv_gae``, ``adv_grpo`` (N(0, 0.3²)), ``value`` (a random walk), ``td`` (N(0, 0.05²)),
    ``logprob`` (−Exp(1)). For strip rendering benchmarks and browser tests.
    """
    rng = np.random.default_rng(seed)
    mask = np.zeros(n, dtype=np.int64)
    pos = 0
    while pos < n:
        a, o = int(rng.integers(20, 200)), int(rng.integers(20, 300))
        mask[pos : pos + a] = 1
        pos += a + o
    tokens = _STRIP_WORDS[rng.integers(0, len(_STRIP_WORDS), n)].tolist()
    channels = {f"adv_{k}": rng.normal(0, 0.3, n) for k in ("mpo", "gae", "grpo")}
    channels |= {
        "value": np.cumsum(rng.normal(0, 0.01, n)),
        "td": rng.normal(0, 0.05, n),
        "logprob": -rng.exponential(1, n),
    }
    return tokens, mask, channels
