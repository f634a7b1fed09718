"""One episode's state and its steps: reset and prompt, the environment's turn, the oracle's
columns (see :mod:`mpo_viz.rollout`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from mpo_viz.checks import OptionError
from mpo_viz.envs.base import TextEnv
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.oracle import Oracle
from mpo_viz.rollout.plan import RolloutConfig
from mpo_viz.timer import Timer

_UBLOCK = 64  # uniforms drawn per episode at a time


@dataclass
class Episode:
    """One episode's state during the rollout (internal)."""

    index: int
    group: int
    sample: int
    task_seed: int
    seed: int
    env: TextEnv
    oracle: Oracle | None
    prompt: list[int]
    rng: np.random.Generator
    pending: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    old_lp: list[float] = field(default_factory=list)
    roll_lp: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    o_values: list[float] = field(default_factory=list)
    o_adv: list[float] = field(default_factory=list)
    o_dec: list[int] = field(default_factory=list)
    o_turn: dict = field(default_factory=lambda: {"turn_v": [], "turn_q": [], "turn_adv": [], "turn_actions": []})
    rewards: list[float] = field(default_factory=list)
    success: bool = False
    stop_reason: str | None = None
    _ubuf: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _upos: int = 0

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.ids)

    def uniform(self) -> float:
        if self._upos >= len(self._ubuf):
            self._ubuf = self.rng.random(_UBLOCK)
            self._upos = 0
        u = self._ubuf[self._upos]
        self._upos += 1
        return float(u)


def make_episodes(env: TextEnv, plan, cfg: RolloutConfig, oracle, layout, timer: Timer) -> list[Episode]:
    """The episodes of the plan, reset and prompted, in task then sample order."""
    episodes: list[Episode] = []
    for gi, (ts, sample_seeds) in enumerate(plan):
        task = env.make_task(ts)
        orc = None
        for j, es in enumerate(sample_seeds):
            # each episode plays a new environment with the options of ``env`` (TextEnv.spawn: a deep
            # copy of the options, not of the episode the caller's instance last played)
            e = env.spawn()
            e.reset(seed=es, task=task)
            if oracle is not None and orc is None:
                orc = _make_oracle(e, oracle, layout)
            t0 = time.perf_counter()
            prompt = layout.prompt(e.messages)
            timer.add("tokenize", t0)
            if len(prompt) >= cfg.max_total_tokens:
                raise OptionError(
                    "max_total_tokens",
                    f"expected more than the prompt of task {ts} ({len(prompt)} tokens), found {cfg.max_total_tokens}",
                )
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([cfg.seed, ts, es, 0x6D706F])))
            episodes.append(
                Episode(
                    index=len(episodes),
                    group=gi,
                    sample=j,
                    task_seed=ts,
                    seed=es,
                    env=e,
                    oracle=orc,
                    prompt=prompt,
                    rng=rng,
                    pending=list(prompt),
                )
            )
    return episodes


@dataclass
class Turn:
    """One batch turn as decoded: per row the sampled tokens, their rollout and old log-probs and the
    entropy of the policy's T = 1 distribution at each (``(B, W)``; row ``b``'s first ``counts[b]``
    columns), and the total budget left before it."""

    tokens: torch.Tensor
    rollout_logp: torch.Tensor
    old_logp: torch.Tensor
    entropy: torch.Tensor
    counts: list
    budget_total: list


def step_envs(live: list[Episode], turn: Turn, cfg: RolloutConfig, layout, timer: Timer, bar) -> list[int]:
    """3. Each environment reads its row's turn; the rows whose episode goes on (their pending
    tokens set: the last sampled token and the observation), the finished ones counted."""
    keep = []
    for b, ep in enumerate(live):
        n, bt = turn.counts[b], turn.budget_total[b]
        ids = turn.tokens[b, :n].tolist()
        ended_by_stop = ids[-1] in layout.stop_ids
        cut_by_total = (not ended_by_stop) and n >= bt and bt <= cfg.max_turn_tokens
        record_turn(
            ep,
            ids,
            turn.rollout_logp[b, :n].tolist(),
            turn.old_logp[b, :n].tolist(),
            layout,
            timer,
            final_cut=cut_by_total,
            entropy=turn.entropy[b, :n].tolist(),
        )
        ep.pending = [ids[-1]]  # the last sampled token was never fed
        if ep.stop_reason is None and ep.length >= cfg.max_total_tokens:
            ep.stop_reason = "max_total_tokens"
        if ep.stop_reason is None:
            ep.pending += ep.ids[len(ep.ids) - obs_len(ep) :]
            keep.append(b)
        else:
            bar.update(1)
    return keep


def _make_oracle(env: TextEnv, expert: NoisyExpert, layout) -> Oracle | None:
    if not getattr(env, "finite_model", True):  # a protocol environment: no model to enumerate
        return None
    try:
        orc = Oracle(env, expert, gamma=1.0, encode=layout.action)
        orc.value(env.state)
        return orc
    except NotImplementedError:  # an environment without an exact model: no oracle columns
        return None


def obs_len(ep: Episode) -> int:
    n = 0
    for m in reversed(ep.mask):
        if m:
            break
        n += 1
    return n


def record_turn(
    ep: Episode,
    turn: list[int],
    rlp: list[float],
    olp: list[float],
    layout,
    timer: Timer,
    *,
    final_cut: bool,
    entropy: list[float],
) -> None:
    """Append one sampled turn (and, unless cut by the total budget, the environment's reply): per
    action token its rollout and old log-probs ``rlp``/``olp`` and the policy's entropy ``entropy``
    (each of the turn's length); 0 in all three on the reply's tokens."""
    k = len(ep.rewards)
    t0 = time.perf_counter()
    text = layout.text(turn)
    t0 = timer.add("tokenize", t0)
    env = ep.env
    state = env.state
    ep.ids += turn
    ep.mask += [1] * len(turn)
    ep.turn_ids += [k] * len(turn)
    ep.roll_lp += rlp
    ep.old_lp += olp
    ep.entropy += entropy
    if final_cut:  # the total budget cut this turn: the environment never sees it
        if ep.oracle is not None:
            to = ep.oracle.turn(state, turn, None)
            ep.o_values += to.values.tolist()
            ep.o_adv += to.token_adv.tolist()
            ep.o_dec += to.decisive.astype(int).tolist()
            timer.add("oracle", t0)
        ep.rewards.append(0.0)
        ep.stop_reason = "max_total_tokens"
        return
    obs, r, term, trunc, info = env.step(text)
    t0 = timer.add("env", t0)
    ep.rewards.append(float(r))
    ep.success = bool(info["success"])
    if term:
        ep.stop_reason = "terminated"
    elif trunc:
        ep.stop_reason = "turn_limit"
    otoks = layout.observation(env.obs_role, obs, final=env.done)
    t0 = timer.add("tokenize", t0)
    ep.ids += otoks
    ep.mask += [0] * len(otoks)
    ep.turn_ids += [k] * len(otoks)
    ep.roll_lp += [0.0] * len(otoks)
    ep.old_lp += [0.0] * len(otoks)
    ep.entropy += [0.0] * len(otoks)
    if ep.oracle is not None:
        to = ep.oracle.turn(state, turn, info["action"])
        v_next = 0.0 if env.done else ep.oracle.value(env.state)
        ep.o_values += to.values.tolist() + [v_next] * len(otoks)
        ep.o_adv += to.token_adv.tolist() + [0.0] * len(otoks)
        ep.o_dec += to.decisive.astype(int).tolist() + [0] * len(otoks)
        o = ep.o_turn
        o["turn_v"].append(to.v)
        o["turn_q"].append(to.q)
        o["turn_adv"].append(to.q - to.v)
        o["turn_actions"].append(info["action"])
        timer.add("oracle", t0)
