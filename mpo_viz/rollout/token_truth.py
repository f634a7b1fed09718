"""Monte-Carlo truth inside a turn: the true advantage ``Â_t`` of the tokens that can carry credit.

``mc_token_truth(batch, policy, m=16)`` replays every episode of ``batch`` to its turn states
(:mod:`mpo_viz.rollout.replay`), picks the tokens to measure (:mod:`mpo_viz.rollout.positions`: by
default the ones the policy itself was uncertain about, plus a random control per turn), branches
``m`` continuation pairs from each token's prefix (:mod:`mpo_viz.rollout.inturn`: one that writes the
recorded token first, one that does not, or the policy's own choice) and returns the batch with
per-token fields (one entry per response token, NaN where not measured):

* ``mc_tok_adv`` — ``Â_t``, the token's true advantage ``Q(h_t, a_t) − V(h_t)`` under the policy (the
  estimator of ``estimator``: :data:`~mpo_viz.rollout.inturn.ESTIMATORS`);
* ``mc_tok_adv_se`` — its standard error; ``mc_tok_adv_a`` / ``mc_tok_adv_b`` — the estimates of the
  two halves of the pairs (independent: their correlation over tokens is the split-half reliability);
* ``mc_tok_measured`` — 1 on the measured tokens (0 elsewhere), ``mc_tok_control`` — 1 on those drawn as
  controls; ``mc_tok_pi`` — ``π(a_t | h_t)``, the policy's probability of the recorded token there under
  the distribution its continuations sample from.

The file metadata's ``mc_truth`` gains ``tokens``: the positions rule and its options, ``m``, the seed,
the estimator, the policy, the sampling options and the seconds taken (a turn-level ``mc_truth`` of
:func:`~mpo_viz.rollout.truth.mc_truth` already there is kept beside it).

**The scripted expert as the policy** (``NoisyExpert(noise=p)``): no model runs. The expert finishes a
partial turn by drawing its action among those whose text starts with the prefix, weighted by
``π(a|s)`` (the posterior :mod:`mpo_viz.envs.oracle` uses), so on an expert file the token advantages
must agree with the exact ``oracle_token_adv`` within their standard errors. Its uncertainty about
each token (for ``positions="uncertain"``) is its own, exactly (:meth:`~mpo_viz.envs.oracle.Oracle.token_probs`).
"""

from __future__ import annotations

import time

import numpy as np

from mpo_viz.checks import OptionError
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.envs.base import TextEnv
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.oracle import Oracle
from mpo_viz.models.policy import Policy
from mpo_viz.rollout.inturn import (
    ESTIMATORS,
    expert_token_returns,
    model_token_returns,
    summarize_token_returns,
)
from mpo_viz.rollout.positions import RULES, TokenPosition, choose_positions
from mpo_viz.rollout.replay import TurnState, env_of, replay, word_layout_of
from mpo_viz.rollout.truth import SAMPLING, sampling_config

__all__ = ["mc_token_truth", "MC_TOKEN_FIELDS", "expert_uncertainty"]

#: the per-token fields :func:`mc_token_truth` writes
MC_TOKEN_FIELDS = (
    "mc_tok_adv",
    "mc_tok_adv_se",
    "mc_tok_adv_a",
    "mc_tok_adv_b",
    "mc_tok_measured",
    "mc_tok_control",
    "mc_tok_pi",
)


def expert_uncertainty(batch: TrajectoryBatch, rows: list[list[TurnState]], expert: NoisyExpert, layout) -> list:
    """Per row ``1 − π(a_t | h_t)`` over its response under the scripted expert (NaN off the action
    tokens, and from the first token of a turn the expert would never write)."""
    out = []
    for i, states in enumerate(rows):
        u = np.full(int(batch.lengths[i]), np.nan)
        orc = None
        for st in states:
            if orc is None:
                orc = Oracle(st.env, expert, task=st.env.task, encode=layout.action)
            u[st.start : st.end] = 1.0 - orc.token_probs(st.env.state, st.action_ids)
        out.append(u)
    return out


def _check(m, estimator, positions) -> None:
    if isinstance(m, bool) or not isinstance(m, int) or m < 2:
        raise OptionError("m", f"expected at least 2 continuation pairs (one has no standard error), found {m!r}")
    if estimator not in ESTIMATORS:
        raise OptionError("estimator", f"expected one of {', '.join(ESTIMATORS)}, found {estimator!r}")
    if positions not in RULES:
        raise OptionError("positions", f"expected one of {', '.join(RULES)}, found {positions!r}")


def _progress(n: int, progress: bool | None):
    from tqdm.auto import tqdm

    disable = (not progress) if progress is not None else None
    return tqdm(total=n, desc="token truth", unit="cont", disable=disable, leave=False)


def mc_token_truth(
    batch: TrajectoryBatch,
    policy: Policy | NoisyExpert,
    *,
    m: int = 16,
    seed: int = 0,
    positions: str = "uncertain",
    threshold: float = 0.01,
    max_per_turn: int = 4,
    controls: int = 1,
    estimator: str = "pi",
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
    """The batch with the true advantages of the chosen tokens under ``policy`` (module docstring).

    Args:
        batch: episodes the toolkit wrote (replayable: ``generator`` metadata and seeds).
        policy: a :class:`~mpo_viz.models.Policy` (the file's tokenizer), or a
            :class:`~mpo_viz.envs.NoisyExpert` (no model; its results must agree with the exact oracle).
        m: continuation pairs per measured token (≥ 2).
        seed: seeds every continuation (with the trajectory, the turn, the token and the pair) and the
            draws of the controls.
        positions: ``"uncertain"``, ``"decisive"`` or ``"all"`` (:mod:`mpo_viz.rollout.positions`).
        threshold, max_per_turn, controls: the ``"uncertain"`` rule (and the controls of ``"decisive"``).
        estimator: ``"pi"`` (default), ``"crn"`` or ``"plain"`` (:mod:`mpo_viz.rollout.inturn`).
        env: the environment to replay in (default: rebuilt from the metadata).
        turn_gamma: discount per turn of the returns.
        batch_size: continuation rows decoded together (model policies; at least ``2m`` are used).
        temperature, top_p, max_turn_tokens, max_total_tokens: the continuations' sampling (default: the
            file's own rollout options).
        progress: a progress bar over continuations, with its ETA (None: on a terminal or notebook).
        timings: receives ``replay``, ``positions``, ``branch`` seconds, ``tokens`` and the rollout's phases.

    Raises:
        OptionError: bad options; ``positions="uncertain"`` with a model on a file without log-probs;
            ``"decisive"`` on a file without the ``decisive`` column; the expert on turns it never writes.
        ReplayError: a row that cannot be replayed.
    """
    _check(m, estimator, positions)
    if not isinstance(policy, (Policy, NoisyExpert)):
        raise OptionError("policy", f"expected a mpo_viz.models.Policy or a NoisyExpert, found {type(policy).__name__}")
    t_start = time.perf_counter()
    env = env if env is not None else env_of(batch)
    layout = policy.layout if isinstance(policy, Policy) else word_layout_of(env)
    rows = replay(batch, layout, env=env)
    t_replay = time.perf_counter() - t_start
    cfg = sampling_config(
        batch,
        batch_size,
        dict(temperature=temperature, top_p=top_p, max_turn_tokens=max_turn_tokens, max_total_tokens=max_total_tokens),
    )
    unc, source = None, None
    if positions == "uncertain":
        if isinstance(policy, NoisyExpert):
            unc, source = expert_uncertainty(batch, rows, policy, layout), "the expert's own π"
        else:
            source = next((f for f in ("old_logprobs", "rollout_logprobs") if batch.has(f)), None)
    chosen = choose_positions(
        batch, positions, threshold=threshold, max_per_turn=max_per_turn, controls=controls, seed=seed, uncertainty=unc
    )
    items, kept, skipped = _reachable(rows, chosen, cfg, isinstance(policy, Policy))
    t_pos = time.perf_counter() - t_start - t_replay
    tm: dict = {}
    bar = _progress(2 * m * len(items), progress)
    try:
        if isinstance(policy, NoisyExpert):
            res = expert_token_returns(
                policy, items, m, seed=seed, layout=layout, estimator=estimator, turn_gamma=turn_gamma, bar=bar
            )
        else:
            res = model_token_returns(
                policy, items, m, seed=seed, cfg=cfg, estimator=estimator, turn_gamma=turn_gamma, bar=bar, timings=tm
            )
    finally:
        bar.close()
    stats = summarize_token_returns(res["q"], res["forced"], res["alt"], estimator)
    out = _with_fields(batch, kept, stats, res["q"])
    seconds = time.perf_counter() - t_start
    name = policy.name if isinstance(policy, Policy) else f"expert(noise={policy.noise})"
    meta = {
        "policy": name,
        "positions": positions,
        "threshold": threshold,
        "max_per_turn": max_per_turn,
        "controls": controls,
        "m": m,
        "seed": seed,
        "estimator": estimator,
        "turn_gamma": turn_gamma,
        "uncertainty": source,
        "measured": len(kept),
        "measured_controls": sum(p.control for p in kept),
        "skipped": skipped,
        "seconds": round(seconds, 3),
    }
    if isinstance(policy, Policy):
        meta.update({k: getattr(cfg, k) for k in SAMPLING})
    if timings is not None:
        timings.update(tm)
        timings.update(replay=t_replay, positions=t_pos, total=seconds)
    prev = out.meta.get("mc_truth")
    return out.with_meta(mc_truth={**(prev if isinstance(prev, dict) else {}), "tokens": meta})


def _reachable(rows: list[list[TurnState]], chosen: list[TokenPosition], cfg, model: bool):
    """``(items, kept positions, skipped)``: each chosen position with its turn state, unless a model's
    continuations could never be at it (``t ≥ max_turn_tokens`` or the prefix at the total budget, under
    sampling options other than the file's)."""
    items, kept, skipped = [], [], 0
    for p in chosen:
        st = rows[p.row][p.turn]
        if model and (p.t >= cfg.max_turn_tokens or len(st.prefix) + p.t >= cfg.max_total_tokens):
            skipped += 1
            continue
        items.append((st, p.t))
        kept.append(p)
    return items, kept, skipped


def _with_fields(batch: TrajectoryBatch, kept: list[TokenPosition], stats: dict, q: np.ndarray) -> TrajectoryBatch:
    """The per-token fields of every row (NaN / 0 where not measured) from the flat per-position results."""
    lengths = batch.lengths.numpy()
    fields = {
        name: [np.full(int(n), np.nan) for n in lengths]
        for name in ("mc_tok_adv", "mc_tok_adv_se", "mc_tok_adv_a", "mc_tok_adv_b", "mc_tok_pi")
    }
    flags = {name: [np.zeros(int(n), dtype=np.int8) for n in lengths] for name in ("mc_tok_measured", "mc_tok_control")}
    for j, p in enumerate(kept):
        for name, key in (("mc_tok_adv", "adv"), ("mc_tok_adv_se", "se"), ("mc_tok_adv_a", "a"), ("mc_tok_adv_b", "b")):
            fields[name][p.row][p.col] = stats[key][j]
        fields["mc_tok_pi"][p.row][p.col] = q[j]
        flags["mc_tok_measured"][p.row][p.col] = 1
        flags["mc_tok_control"][p.row][p.col] = int(p.control)
    return batch.with_token_fields(**fields, **flags)
