"""Branch rollouts: M continuations of a policy from each replayed turn state, prefixes fed once.

For every :class:`~mpo_viz.rollout.replay.TurnState` (the state ``s_k`` before turn ``k`` and the
token prefix the policy read there), M continuations play the episode on to its end with the
policy, each in its own :meth:`~mpo_viz.envs.TextEnv.fork` of the environment; their returns
``Σ_{j ≥ 0} γ_T^j R_{k+j}`` (the rewards of turn ``k`` on) are Monte-Carlo samples of ``V^π(s_k)``.
With ``forced=True`` each continuation first plays the *recorded* turn ``k`` (its tokens as
written, the environment's outcome drawn afresh) and the policy continues after it: samples of
``Q^π(s_k, a_k)``.

**Prefix sharing.** A boundary's prefix goes through the model once, as one row of the shared
cache; that row's keys and values are then duplicated M times (the engine gathers rows by index)
and the M continuations decode on from there, side by side with other boundaries' continuations
(the rollout's batch turns: feed, decode, step). ``share_prefix=False`` feeds every continuation its
own copy of the prefix (the baseline of ``benchmarks/truth.py``; the same numbers).

**Seeds.** Continuation ``m`` of turn ``k`` of trajectory ``traj_id`` draws its sampling noise and its
environment's dynamics from streams seeded by ``(seed, traj_id, k, m, forced)``, so the returns do
not depend on the batch size, on the order of the boundaries, or on which others are computed.
"""

from __future__ import annotations

import time
import zlib
from collections import deque

import numpy as np
import torch

from mpo_viz.models.policy import Policy
from mpo_viz.rollout.engine import Engine, grouped_attention
from mpo_viz.rollout.episodes import Episode, Timer, obs_len, record_turn, step_envs
from mpo_viz.rollout.plan import RolloutConfig
from mpo_viz.rollout.play import decode_turn, feed
from mpo_viz.rollout.replay import TurnState

__all__ = ["branch_returns", "continuation_seed", "turn_return"]


def continuation_seed(seed: int, traj_id: str, turn: int, m: int, forced: bool) -> list[int]:
    """The seed words of continuation ``m`` of turn ``turn`` of ``traj_id`` (sampling and dynamics)."""
    return [int(seed) & 0xFFFFFFFF, zlib.crc32(traj_id.encode()), int(turn), int(m), int(forced), 0x4D43]


def turn_return(rewards, turn_gamma: float = 1.0) -> float:
    """``Σ_j γ_T^j R_j`` over a continuation's turn rewards (from the branching turn on)."""
    return float(sum(float(r) * turn_gamma**j for j, r in enumerate(rewards)))


class _Bar:
    def __init__(self, bar):
        self.bar = bar

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)


def _root(st: TurnState, index: int, forced: bool) -> Episode:
    """The row that feeds a boundary's prefix (never decoded itself); forced: the prefix and the
    recorded turn's tokens."""
    resp = st.prefix[st.prompt_len :]
    k = st.turn
    return Episode(
        index=index,
        group=index,
        sample=-1,
        task_seed=0,
        seed=0,
        env=st.env,
        oracle=None,
        prompt=st.prefix[: st.prompt_len],
        rng=np.random.default_rng(0),
        pending=list(st.prefix) + (list(st.action_ids) if forced else []),
        ids=list(resp),
        mask=[1] * len(resp),
        turn_ids=[0] * len(resp),
        old_lp=[0.0] * len(resp),
        roll_lp=[0.0] * len(resp),
        entropy=[0.0] * len(resp),
        rewards=[0.0] * k,
    )


def _clone(root: Episode, st: TurnState, m: int, seed: int, forced: bool) -> Episode:
    words = continuation_seed(seed, st.traj_id, st.turn, m, forced)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))
    return Episode(
        index=root.index,
        group=root.index,
        sample=m,
        task_seed=0,
        seed=0,
        env=st.env.fork("-".join(map(str, words))),
        oracle=None,
        prompt=root.prompt,
        rng=rng,
        ids=list(root.ids),
        mask=list(root.mask),
        turn_ids=list(root.turn_ids),
        old_lp=list(root.old_lp),
        roll_lp=list(root.roll_lp),
        entropy=list(root.entropy),
        rewards=list(root.rewards),
    )


def _force(ep: Episode, st: TurnState, cfg: RolloutConfig, layout, timer: Timer) -> bool:
    """Play the recorded turn in the continuation's environment (its tokens already fed); whether
    the continuation goes on (then its pending tokens are the observation)."""
    n = len(st.action_ids)
    record_turn(ep, list(st.action_ids), [0.0] * n, [0.0] * n, layout, timer, final_cut=False, entropy=[0.0] * n)
    if ep.stop_reason is None and ep.length >= cfg.max_total_tokens:
        ep.stop_reason = "max_total_tokens"
    if ep.stop_reason is not None:
        return False
    ep.pending = ep.ids[len(ep.ids) - obs_len(ep) :]
    return True


def _feed_some(engine: Engine, live: list[Episode], logits: torch.Tensor | None, timer: Timer) -> torch.Tensor:
    """Feed the rows that have pending tokens; rows without keep their logits."""
    flags = [len(ep.pending) > 0 for ep in live]
    if not any(flags):
        assert logits is not None
        return logits
    has = torch.tensor(flags, device=engine.device)
    new = feed(engine, live, timer)
    return new if logits is None else torch.where(has[:, None], new, logits)


def branch_returns(
    policy: Policy,
    states: list[TurnState],
    m: int,
    *,
    seed: int,
    cfg: RolloutConfig,
    forced: bool = False,
    turn_gamma: float = 1.0,
    share_prefix: bool = True,
    bar=None,
    timings: dict | None = None,
) -> np.ndarray:
    """Returns of ``m`` continuations from each state (module docstring): ``(len(states), m)`` float64.

    ``cfg``: the sampling options (temperature, top-p, turn and total token budgets) and
    ``batch_size`` (continuation rows decoded together; at least ``m``). ``bar``: a progress bar
    advanced once per finished continuation. ``timings``: receives the rollout's phase seconds and
    ``tokens`` (continuation action tokens decoded).
    """
    out = np.zeros((len(states), m), dtype=np.float64)
    timer = Timer()
    pad_id = policy.tokenizer.pad_token_id
    pad_id = int(pad_id) if pad_id is not None else min(policy.layout.stop_ids)
    todo = [j for j, st in enumerate(states) if not (forced and st.cut)]  # a cut turn ends the episode: Q = 0
    model = policy.model
    was_training = model.training
    model.eval()
    finished: list[Episode] = []
    try:
        with torch.no_grad(), grouped_attention(model):
            _play_branches(
                Engine(model, pad_id),
                [states[j] for j in todo],
                todo,
                m,
                seed,
                cfg,
                policy,
                forced,
                share_prefix,
                timer,
                _Bar(bar),
                finished,
            )
    finally:
        if was_training:
            model.train()
    tokens = 0
    for ep in finished:
        out[ep.index, ep.sample] = turn_return(ep.rewards[states[ep.index].turn :], turn_gamma)
        tokens += int(sum(ep.mask)) - states[ep.index].start + (0 if not forced else -len(states[ep.index].action_ids))
    if timings is not None:
        timings.update(timer.t)
        timings["tokens"] = timings.get("tokens", 0) + tokens
    return out


def _play_branches(
    engine: Engine,
    states: list[TurnState],
    index: list[int],
    m: int,
    seed: int,
    cfg: RolloutConfig,
    policy: Policy,
    forced: bool,
    share: bool,
    timer: Timer,
    bar: _Bar,
    finished: list,
) -> None:
    """The batch turns of the branch rollout: admit boundaries while ``m`` rows are free (shortest
    prefixes first), feed the live rows' pending tokens, feed the new prefixes in an engine of their
    own (padded only among themselves), duplicate each prefix row ``m`` times and append the rows;
    (forced: play the recorded turn, feed its observation); decode one turn for every row, step the
    environments."""
    order = sorted(range(len(states)), key=lambda j: len(states[j].prefix))
    queue = deque((states[j], index[j]) for j in order)
    live: list[Episode] = []
    logits: torch.Tensor | None = None
    rows = max(cfg.batch_size, m)
    stop = torch.tensor(sorted(policy.layout.stop_ids), dtype=torch.long, device=policy.device)
    while queue or live:
        roots: list[tuple[Episode, TurnState]] = []
        while queue and len(live) + (len(roots) + 1) * m <= rows:
            st, j = queue.popleft()
            roots.append((_root(st, j, forced), st))
        if live:
            logits = _feed_some(engine, live, logits, timer)
        if roots:
            new_live, new_logits = _admit(engine, roots, m, seed, forced, share, timer)
            live = live + new_live
            logits = new_logits if logits is None else torch.cat([logits, new_logits])
        if forced and roots:
            live, logits = _force_new(
                engine, live, logits, len(roots) * m, roots, cfg, policy.layout, timer, bar, finished, m
            )
            if not live:
                continue
        assert logits is not None
        turn = decode_turn(engine, live, logits, cfg, stop, timer)
        keep = step_envs(live, turn, cfg, policy.layout, timer, bar)
        kept = set(keep)
        finished.extend(ep for b, ep in enumerate(live) if b not in kept)
        t0 = time.perf_counter()
        engine.keep_rows(keep)
        live = [live[b] for b in keep]
        logits = None
        timer.add("model", t0)


def _admit(engine: Engine, roots, m: int, seed: int, forced: bool, share: bool, timer: Timer):
    """The new boundaries' rows: their prefixes through a separate engine (with prefix sharing once
    per boundary, the row then duplicated ``m`` times; without, once per continuation), appended to
    ``engine``; the continuations and their logits."""
    sub = Engine(engine.model, engine.pad_id)
    if share:
        heads = [r for r, _ in roots]
    else:  # every continuation feeds its own copy of the prefix
        heads = [c for r, st in roots for c in _with_prefix(r, st, m, seed, forced)]
    sub.add_rows(len(heads))
    logits = feed(sub, heads, timer)
    t0 = time.perf_counter()
    if share:
        idx = [i for i in range(len(roots)) for _ in range(m)]
        sub.keep_rows(idx)
        logits = logits[torch.tensor(idx, device=logits.device)]
        heads = [_clone(r, st, c, seed, forced) for r, st in roots for c in range(m)]
    engine.append(sub)
    timer.add("model", t0)
    return heads, logits


def _with_prefix(root: Episode, st: TurnState, m: int, seed: int, forced: bool) -> list[Episode]:
    clones = [_clone(root, st, c, seed, forced) for c in range(m)]
    for c in clones:
        c.pending = list(root.pending)
    return clones


def _force_new(engine, live, logits, n_new, roots, cfg, layout, timer, bar, finished, m):
    """Forced mode: the newest ``n_new`` rows play the recorded turn; the ones that go on get their
    observation fed (the others' logits are kept); the ones whose episode ended leave."""
    n_old = len(live) - n_new
    states = [st for _, st in roots for _ in range(m)]
    keep = list(range(n_old))
    for b in range(n_old, len(live)):
        ep, st = live[b], states[b - n_old]
        if st.cut is False and _force(ep, st, cfg, layout, timer):
            keep.append(b)
        else:
            finished.append(ep)
            bar.update(1)
    if len(keep) < len(live):
        engine.keep_rows(keep)
        logits = logits[torch.tensor(keep, device=logits.device)] if keep else logits[:0]
        live = [live[b] for b in keep]
    if not live:
        return live, None
    return live, _feed_some(engine, live, logits, timer)
