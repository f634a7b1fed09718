"""Monte-Carlo truth for a policy: ``V̂^π(s_k)`` (and ``Q̂^π(s_k, a_k)``) at every turn boundary.

``mc_truth(batch, policy, m=8)`` replays every episode of ``batch`` to its turn states
(:mod:`mpo_viz.rollout.replay`), continues ``policy`` ``m`` times from each (branch rollouts,
:mod:`mpo_viz.rollout.branch`; or the scripted noisy expert, ``NoisyExpert(noise=p)``) and returns
the batch with per-turn fields (one entry per assistant turn):

* ``mc_value`` — ``V̂(s_k) = (1/m) Σ_i G_i``, the mean return of the continuations from the state
  before turn ``k`` (``G_i = Σ_{j ≥ 0} γ_T^j R_{k+j}``, the rewards from turn ``k`` on);
* ``mc_value_se`` — its standard error ``std(G, ddof=1)/√m``;
* ``mc_value_a`` / ``mc_value_b`` — the means of the first and of the second half of the
  continuations (two independent estimates: their correlation across turns is the split-half
  reliability of anything computed from them, see docs/concepts.md);
* with ``q=True``: ``mc_q`` / ``mc_q_se`` — the same for continuations that first play the
  recorded turn ``k`` (its outcome drawn afresh), samples of ``Q^π(s_k, a_k)``;
  ``mc_q − mc_value`` estimates the turn's true advantage directly.

The file metadata gains ``mc_truth``: the policy, ``m``, the seed, ``q``, ``turn_gamma``, the
sampling options and the seconds taken. These are the values of *this* policy; the environments'
``oracle_*`` columns are the scripted expert's, biased for any other policy.
"""

from __future__ import annotations

import random
import time

import numpy as np

from mpo_viz.checks import OptionError
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.envs.base import TextEnv
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.models.policy import Policy
from mpo_viz.rollout.branch import branch_returns, continuation_seed, turn_return
from mpo_viz.rollout.plan import RolloutConfig
from mpo_viz.rollout.replay import TurnState, env_of, replay, word_layout_of

__all__ = ["mc_truth", "MC_TURN_FIELDS", "expert_returns", "summarize_returns"]

#: the per-turn fields :func:`mc_truth` writes (``mc_q``/``mc_q_se`` only with ``q=True``)
MC_TURN_FIELDS = ("mc_value", "mc_value_se", "mc_value_a", "mc_value_b", "mc_q", "mc_q_se")
SAMPLING = ("temperature", "top_p", "max_turn_tokens", "max_total_tokens")


def expert_returns(
    expert: NoisyExpert,
    states: list[TurnState],
    m: int,
    *,
    seed: int,
    layout,
    forced: bool = False,
    turn_gamma: float = 1.0,
    bar=None,
) -> np.ndarray:
    """``(len(states), m)`` returns of the noisy expert continued from each state (as
    :func:`~mpo_viz.rollout.branch.branch_returns`, without a model: the expert acts on the state)."""
    out = np.zeros((len(states), m))
    for j, st in enumerate(states):
        for c in range(m):
            words = continuation_seed(seed, st.traj_id, st.turn, c, forced)
            env = st.env.fork("-".join(map(str, words)))
            rng = random.Random("expert-" + "-".join(map(str, words)))
            rewards = []
            if forced:
                if st.cut:  # the budget cut the recorded turn: the episode ended there
                    rewards.append(0.0)
                else:
                    rewards.append(float(env.step(layout.text(st.action_ids))[1]))
            while not env.done:
                rewards.append(float(env.step(expert.act(env, rng)[1])[1]))
            out[j, c] = turn_return(rewards, turn_gamma)
            if bar is not None:
                bar.update(1)
    return out


def summarize_returns(g: np.ndarray) -> dict[str, np.ndarray]:
    """Per row of ``g`` ``(n, m)``: ``mean``, ``se`` (``std(ddof=1)/√m``), ``a`` and ``b`` (the means of
    the first ``m // 2`` and of the other continuations)."""
    m = g.shape[1]
    h = m // 2
    return {"mean": g.mean(1), "se": g.std(1, ddof=1) / np.sqrt(m), "a": g[:, :h].mean(1), "b": g[:, h:].mean(1)}


def sampling_config(batch: TrajectoryBatch, batch_size: int, overrides: dict) -> RolloutConfig:
    """The continuations sample as the file's rollout did (its ``generator``), unless told otherwise."""
    raw = batch.meta.get("generator")
    gen: dict = raw if isinstance(raw, dict) else {}
    kw = {k: gen[k] for k in SAMPLING if k in gen}
    kw.update({k: v for k, v in overrides.items() if v is not None})
    cfg = RolloutConfig(batch_size=batch_size, **kw)
    cfg.validate()
    return cfg


def _progress(n: int, progress: bool | None):
    from tqdm.auto import tqdm

    disable = (not progress) if progress is not None else None
    return tqdm(total=n, desc="truth", unit="cont", disable=disable, leave=False)


def mc_truth(
    batch: TrajectoryBatch,
    policy: Policy | NoisyExpert,
    *,
    m: int = 8,
    seed: int = 0,
    q: bool = False,
    env: TextEnv | None = None,
    turn_gamma: float = 1.0,
    batch_size: int = 64,
    temperature: float | None = None,
    top_p: float | None = None,
    max_turn_tokens: int | None = None,
    max_total_tokens: int | None = None,
    progress: bool | None = None,
    timings: dict | None = None,
) -> TrajectoryBatch:
    """The batch with Monte-Carlo values of ``policy`` at every turn start (module docstring).

    Args:
        batch: episodes the toolkit wrote (replayable: ``generator`` metadata and seeds).
        policy: a :class:`~mpo_viz.models.Policy` (the file's tokenizer), or a
            :class:`~mpo_viz.envs.NoisyExpert` (no model; its values must agree with the exact oracle).
        m: continuations per boundary (≥ 2: one has no standard error).
        seed: seeds every continuation (with the trajectory, the turn and the continuation's index).
        q: also estimate ``Q(s_k, a_k)`` (continuations after the recorded turn).
        env: the environment to replay in (default: rebuilt from the metadata).
        turn_gamma: discount per turn of the returns (1: the sum of the remaining rewards).
        batch_size: continuation rows decoded together (model policies).
        temperature, top_p, max_turn_tokens, max_total_tokens: sampling of the continuations
            (default: the file's own rollout options, else the rollout's defaults).
        progress: a progress bar over continuations, with its ETA (None: when the output is a
            terminal or notebook).
        timings: receives ``replay``, ``branch`` (seconds), ``tokens`` and the rollout's phases.

    Raises:
        OptionError: ``m < 2``, a policy that is neither.
        ReplayError: a row that cannot be replayed (what is missing, or which turn differs).
    """
    if isinstance(m, bool) or not isinstance(m, int) or m < 2:
        raise OptionError("m", f"expected at least 2 continuations (one has no standard error), found {m!r}")
    if not isinstance(policy, (Policy, NoisyExpert)):
        raise OptionError("policy", f"expected a mpo_viz.models.Policy or a NoisyExpert, found {type(policy).__name__}")
    t_start = time.perf_counter()
    env = env if env is not None else env_of(batch)
    layout = policy.layout if isinstance(policy, Policy) else word_layout_of(env)
    rows = replay(batch, layout, env=env)
    states = [st for r in rows for st in r]
    t_replay = time.perf_counter() - t_start
    tm: dict = {}
    passes = (False, True) if q else (False,)
    bar = _progress(len(states) * m * len(passes), progress)
    cfg = sampling_config(
        batch,
        batch_size,
        dict(temperature=temperature, top_p=top_p, max_turn_tokens=max_turn_tokens, max_total_tokens=max_total_tokens),
    )
    try:
        stats = {}
        for forced in passes:
            if isinstance(policy, NoisyExpert):
                g = expert_returns(
                    policy, states, m, seed=seed, layout=layout, forced=forced, turn_gamma=turn_gamma, bar=bar
                )
            else:
                g = branch_returns(
                    policy, states, m, seed=seed, cfg=cfg, forced=forced, turn_gamma=turn_gamma, bar=bar, timings=tm
                )
            stats[forced] = summarize_returns(g)
    finally:
        bar.close()
    out = _with_fields(batch, rows, stats)
    seconds = time.perf_counter() - t_start
    name = policy.name if isinstance(policy, Policy) else f"expert(noise={policy.noise})"
    meta = {
        "policy": name,
        "m": m,
        "seed": seed,
        "q": q,
        "turn_gamma": turn_gamma,
        "seconds": round(seconds, 3),
        "boundaries": len(states),
    }
    if isinstance(policy, Policy):
        meta.update({k: getattr(cfg, k) for k in SAMPLING})
    if timings is not None:
        timings.update(tm)
        timings.update(replay=t_replay, total=seconds)
    return out.with_meta(mc_truth=meta)


def _with_fields(batch: TrajectoryBatch, rows: list[list[TurnState]], stats: dict) -> TrajectoryBatch:
    """Per-turn lists of every row from the flat per-boundary statistics."""
    off = np.cumsum([0] + [len(r) for r in rows])
    k = batch.num_turns
    for i, r in enumerate(rows):
        if len(r) != k[i]:
            raise ValueError(f"trajectory {batch.traj_ids[i]!r}: replayed {len(r)} turns, the row has {k[i]}")

    def per_row(x):
        return [x[off[i] : off[i + 1]].tolist() for i in range(len(rows))]

    v = stats[False]
    fields = {
        "mc_value": per_row(v["mean"]),
        "mc_value_se": per_row(v["se"]),
        "mc_value_a": per_row(v["a"]),
        "mc_value_b": per_row(v["b"]),
    }
    if True in stats:
        fields.update(mc_q=per_row(stats[True]["mean"]), mc_q_se=per_row(stats[True]["se"]))
    return batch.with_turn_fields(**fields)
