"""Branch rollouts inside a turn: the returns behind one token's true advantage.

For token ``a_t`` of turn ``k`` (its ``t``-th action token, from 0), the prefix ``h_t`` is the episode
up to and including the turn's first ``t`` action tokens; the environment is at the turn's start state
``s_k`` (it sees the turn only when the turn ends). Three kinds of continuation start there, each
writing the rest of the turn with the policy, handing the whole turn to a
:meth:`~mpo_viz.envs.TextEnv.fork` of the environment and playing the episode to its end:

* ``forced`` — the recorded ``a_t`` first: its return ``G`` is a sample of ``Q(h_t, a_t)``;
* ``free`` — the policy's own first token: a sample of ``V(h_t)``;
* ``other`` — a first token drawn from the policy's distribution with ``a_t`` removed (renormalized):
  a sample of ``Q(h_t, ≠a_t)``, the value of not writing ``a_t``.

**Estimators of Â_t** (:data:`ESTIMATORS`), each from M pairs ``(forced_c, alternative_c)``; ``q`` is
``π(a_t | h_t)`` under the distribution the continuations sample from (temperature, top-p:
:func:`~mpo_viz.rollout.engine.sampling_probs`; the expert's posterior for the scripted expert):

* ``"plain"``: ``Â = mean_c(G^forced_c − G^free_c)``, the two sets on independent random streams.
* ``"crn"``: the same, but pair ``c`` shares its random numbers (sampling uniforms after the first
  token, environment dynamics): whenever the free continuation draws ``a_t`` (probability ``q``) it
  replays the forced one exactly and the pair's difference is 0. Unbiased (each side keeps its law).
* ``"pi"`` (default): since ``V(h) = q·Q(h, a_t) + (1 − q)·Q(h, ≠a_t)``,

      A(h_t, a_t) = Q(h_t, a_t) − V(h_t) = (1 − q)·(Q(h_t, a_t) − Q(h_t, ≠a_t)),

  estimated by ``Â = (1 − q)·mean_c(G^forced_c − G^other_c)`` (pairs sharing random numbers). Unbiased
  because ``q`` is known exactly; its variance ``(1 − q)²·Var(G^f − G^o)/M`` is below the plain one's
  ``(Var(G^f) + Var(G^free))/M`` for every ``q`` (``Var(G^free) ≥ (1 − q)·Var(G^o)`` by the law of total
  variance, and ``(1 − q)² ≤ 1 − q``), and it is exactly 0 (no continuation run) when ``q = 1``.

The standard error is ``std_c(d_c)/√M`` of the pairs' differences ``d_c`` (weighted by ``1 − q`` for
``pi``), the halves ``Â^a``/``Â^b`` the means over the first ``M // 2`` pairs and over the others.

**Prefix sharing** (model policies). The turns whose positions are admitted together go through the
model once each: the turn-start prefix and the turn's tokens up to the last position needed, the
logits kept at every one of those positions (:meth:`~mpo_viz.rollout.engine.Engine.forward_tail`).
Each continuation's row is a copy of its turn's row with the slots after its own prefix masked off
and dropped (``Engine.keep_rows``), so a position inside a turn costs no forward of its own.

**Seeds.** Continuation ``c`` of token ``t`` of turn ``k`` of ``traj_id`` draws from streams seeded by
``(seed, traj_id, k, t, c)`` and, for ``plain`` only, its kind (:func:`token_seed`): results do not
depend on the batch size, on the order of the positions, or on which others are measured.
"""

from __future__ import annotations

import random
import time
import zlib
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from mpo_viz.checks import OptionError
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.oracle import Oracle
from mpo_viz.models.policy import Policy
from mpo_viz.rollout.branch import turn_return
from mpo_viz.rollout.engine import Engine, grouped_attention, sampling_probs
from mpo_viz.rollout.episodes import Episode, obs_len, record_turn
from mpo_viz.rollout.plan import RolloutConfig
from mpo_viz.rollout.play import decode_turn, feed
from mpo_viz.rollout.replay import TurnState
from mpo_viz.timer import Timer

__all__ = ["ESTIMATORS", "token_seed", "model_token_returns", "expert_token_returns", "summarize_token_returns"]

#: the estimators of a token's true advantage (module docstring)
ESTIMATORS = ("pi", "crn", "plain")
_CODES = {"forced": 1, "free": 2, "other": 3}


def alternative(estimator: str) -> str:
    """The kind of continuation an estimator compares the forced one with: ``other`` for ``pi``, else
    ``free``."""
    if estimator not in ESTIMATORS:
        raise OptionError("estimator", f"expected one of {', '.join(ESTIMATORS)}, found {estimator!r}")
    return "other" if estimator == "pi" else "free"


def token_seed(seed: int, traj_id: str, turn: int, t: int, c: int, kind: str, estimator: str) -> list[int]:
    """The seed words of continuation ``c`` of token ``t`` of turn ``turn`` (its sampling and its
    environment's dynamics); the pair's two kinds share them unless ``estimator`` is ``plain``."""
    code = _CODES[kind] if estimator == "plain" else 0
    return [int(seed) & 0xFFFFFFFF, zlib.crc32(traj_id.encode()), int(turn), int(t), int(c), code, 0x544F4B]


def summarize_token_returns(q: np.ndarray, forced: np.ndarray, alt: np.ndarray, estimator: str) -> dict:
    """Per position (rows of ``forced``/``alt``, ``(P, M)``): ``adv`` ``Â``, ``se``, and the halves ``a``,
    ``b`` from the pairs' differences ``d_c = w·(G^forced_c − G^alt_c)``, ``w = 1 − q`` for ``pi``, else 1
    (module docstring)."""
    m = forced.shape[1]
    w = (1.0 - np.asarray(q, dtype=np.float64)) if estimator == "pi" else np.ones(len(forced))
    d = w[:, None] * (forced - alt)
    h = m // 2
    return {"adv": d.mean(1), "se": d.std(1, ddof=1) / np.sqrt(m), "a": d[:, :h].mean(1), "b": d[:, h:].mean(1)}


# --------------------------------------------------------------------------------------------- the scripted expert


def _pick(actions: list[str], pi: dict, u: float) -> str:
    """The action of ``actions`` at CDF position ``u`` of ``π`` restricted to them."""
    w = np.array([pi[a] for a in actions], dtype=np.float64)
    k = int(np.searchsorted(np.cumsum(w), u * w.sum(), side="right"))
    return actions[min(k, len(actions) - 1)]


def expert_token_returns(
    expert: NoisyExpert,
    items: list[tuple[TurnState, int]],
    m: int,
    *,
    seed: int,
    layout,
    estimator: str = "pi",
    turn_gamma: float = 1.0,
    bar=None,
) -> dict:
    """``{"q": (P,), "forced": (P, m), "alt": (P, m)}`` for the positions ``items`` (a turn state and a
    token index ``t`` inside its turn), with the scripted noisy expert continuing: it finishes a partial
    turn by drawing its action from the posterior over the actions whose text starts with the prefix,
    weighted by ``π(a|s)`` (:meth:`~mpo_viz.envs.oracle.Oracle.consistent`), writes that action's text,
    and plays on. ``OptionError`` when a recorded turn is not a text the expert writes."""
    alt_kind = alternative(estimator)
    P = len(items)
    out = {"q": np.ones(P), "forced": np.zeros((P, m)), "alt": np.zeros((P, m))}
    oracles: dict[int, Oracle] = {}
    for j, (st, t) in enumerate(items):
        orc = oracles.get(st.row)
        if orc is None:
            orc = oracles[st.row] = Oracle(st.env, expert, task=st.env.task, encode=layout.action)
        state = st.env.state
        pi, tx = orc.policy(state[1]), orc.texts(state[1])
        cons = orc.consistent(state, st.action_ids[:t])
        with_at = [a for a in cons if len(tx[a]) > t and tx[a][t] == st.action_ids[t]]
        if not with_at:
            raise OptionError(
                "policy",
                f"trajectory {st.traj_id!r}, turn {st.turn}: the expert never writes this "
                f"turn's first {t + 1} tokens ({layout.text(st.action_ids[: t + 1])!r}): it "
                "continues only turns it could have written (expert files)",
            )
        rest = [a for a in cons if a not in with_at]
        q = 1.0 if not rest else sum(pi[a] for a in with_at) / sum(pi[a] for a in cons)
        out["q"][j] = q
        if estimator == "pi" and not rest:  # q = 1: Â = 0 exactly, nothing to run
            if bar is not None:
                bar.update(2 * m)
            continue
        for c in range(m):
            for kind in ("forced", alt_kind):
                words = token_seed(seed, st.traj_id, st.turn, t, c, kind, estimator)
                env = st.env.fork("-".join(map(str, words)))
                rng = random.Random("expert-token-" + "-".join(map(str, words)))
                u0, u1 = rng.random(), rng.random()  # every kind draws both: the streams stay aligned
                if kind == "forced" or (kind == "free" and (u0 < q or not rest)):
                    a = _pick(with_at, pi, u1)
                else:
                    a = _pick(rest, pi, u1)
                rewards = [float(env.step(expert.text(env, env.task, state[1], a))[1])]
                while not env.done:
                    rewards.append(float(env.step(expert.act(env, rng)[1])[1]))
                out["forced" if kind == "forced" else "alt"][j, c] = turn_return(rewards, turn_gamma)
                if bar is not None:
                    bar.update(1)
    return out


# --------------------------------------------------------------------------------------------- a model policy


@dataclass
class _Row:
    """A continuation's row: its episode, its position ``j`` and sample ``c``, its kind, the turn's
    tokens already written (``head``, fed but not yet in ``ep.ids``) and the token its first draw
    excludes (-1: none)."""

    ep: Episode
    j: int
    c: int
    k: int
    kind: str
    head: list[int]
    exclude: int


class _Bar:
    def __init__(self, bar):
        self.bar = bar

    def update(self, n: int) -> None:
        if self.bar is not None and n:
            self.bar.update(n)


def model_token_returns(
    policy: Policy,
    items: list[tuple[TurnState, int]],
    m: int,
    *,
    seed: int,
    cfg: RolloutConfig,
    estimator: str = "pi",
    turn_gamma: float = 1.0,
    share_prefix: bool = True,
    bar=None,
    timings: dict | None = None,
) -> dict:
    """``{"q": (P,), "forced": (P, m), "alt": (P, m)}`` for the positions ``items`` (a turn state and a
    token index ``t`` inside its turn) with ``policy`` continuing (module docstring). ``cfg``: the
    sampling options and ``batch_size`` (rows decoded together; at least ``2m``: a position's pairs are
    admitted together). A position must be reachable under ``cfg``'s budgets (``t < max_turn_tokens``
    and ``len(prefix) + t < max_total_tokens``). ``share_prefix=False`` feeds every continuation its own
    copy of its prefix (the baseline of ``benchmarks/truth.py --tokens``; the same numbers). ``timings``
    receives the rollout's phase seconds and ``tokens`` (continuation tokens decoded)."""
    alt_kind = alternative(estimator)
    P = len(items)
    out = {"q": np.ones(P), "forced": np.zeros((P, m)), "alt": np.zeros((P, m))}
    timer = Timer()
    pad_id = policy.tokenizer.pad_token_id
    pad_id = int(pad_id) if pad_id is not None else min(policy.layout.stop_ids)
    model = policy.model
    was_training = model.training
    model.eval()
    run = _Run(policy, Engine(model, pad_id), m, seed, cfg, estimator, alt_kind, turn_gamma, timer, _Bar(bar), out)
    run.share = share_prefix
    try:
        with torch.no_grad(), grouped_attention(model):
            run.play(items)
    finally:
        if was_training:
            model.train()
    if timings is not None:
        timings.update(timer.t)
        timings["tokens"] = timings.get("tokens", 0) + run.tokens
    return out


class _Run:
    """One call of :func:`model_token_returns`: the batch turns (admit positions while ``2m`` rows are
    free, shortest prefixes first; feed the live rows' pending tokens; step the continuations whose turn
    the forced token ended; decode one turn for every row; step the environments)."""

    def __init__(self, policy, engine, m, seed, cfg, estimator, alt_kind, turn_gamma, timer, bar, out):
        self.policy, self.engine, self.m, self.seed, self.cfg = policy, engine, m, seed, cfg
        self.estimator, self.alt_kind, self.turn_gamma = estimator, alt_kind, turn_gamma
        self.timer, self.bar, self.out = timer, bar, out
        self.layout = policy.layout
        self.stop = torch.tensor(sorted(policy.layout.stop_ids), dtype=torch.long, device=policy.device)
        self.tokens = 0
        self.share = True

    def play(self, items: list[tuple[TurnState, int]]) -> None:
        order = sorted(range(len(items)), key=lambda j: (len(items[j][0].prefix) + items[j][1], j))
        queue = deque(order)
        live: list[_Row] = []
        logits: torch.Tensor | None = None
        cap = max(self.cfg.batch_size, 2 * self.m)
        while queue or live:
            admit: list[int] = []
            while queue and len(live) + 2 * self.m * (len(admit) + 1) <= cap:
                admit.append(queue.popleft())
            if live:
                logits = self._feed(live, logits)
            if admit:
                rows, new_logits = self._admit([(j, *items[j]) for j in admit])
                live = live + rows
                logits = new_logits if logits is None else torch.cat([logits, new_logits])
                live, logits = self._complete_forced(live, logits, len(rows))
                if not live:
                    logits = None
                    continue
                logits = self._feed(live, logits)
            assert logits is not None
            turn = decode_turn(
                self.engine,
                [r.ep for r in live],
                logits,
                self.cfg,
                self.stop,
                self.timer,
                used=[len(r.head) for r in live],
                exclude=torch.tensor([r.exclude for r in live], dtype=torch.long),
            )
            self.tokens += int(sum(turn.counts))
            keep = self._step(live, turn)
            t0 = time.perf_counter()
            self.engine.keep_rows(keep)
            live = [live[b] for b in keep]
            logits = None
            self.timer.add("model", t0)

    # -- feeding
    def _feed(self, live: list[_Row], logits: torch.Tensor | None) -> torch.Tensor:
        """Feed the rows with pending tokens; the others keep their logits."""
        eps = [r.ep for r in live]
        flags = [len(ep.pending) > 0 for ep in eps]
        if not any(flags):
            assert logits is not None
            return logits
        new = feed(self.engine, eps, self.timer)
        if logits is None:
            return new
        return torch.where(torch.tensor(flags, device=new.device)[:, None], new, logits)

    def _admit(self, units: list[tuple[int, TurnState, int]]) -> tuple[list[_Row], torch.Tensor]:
        """The rows of the admitted positions: each turn among them fed once (its prefix and tokens up to
        the last position needed, logits kept at every position), its row copied per continuation and
        cut back to that continuation's own prefix; appended to the engine. The rows and their logits."""
        if not self.share:
            return self._admit_refed(units)
        t0 = time.perf_counter()
        groups: dict[int, tuple[TurnState, list[tuple[int, int]]]] = {}
        for j, st, t in units:
            groups.setdefault(id(st), (st, []))[1].append((j, t))
        roots = list(groups.values())
        seqs = [list(st.prefix) + list(st.action_ids[: max(t for _, t in pos) + 1]) for st, pos in roots]
        n_tail = max(len(s) - len(st.prefix) + 1 for s, (st, _) in zip(seqs, roots))
        sub = Engine(self.engine.model, self.engine.pad_id)
        sub.add_rows(len(roots))
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), sub.pad_id, dtype=torch.long)
        msk = torch.zeros((len(seqs), width), dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, width - len(s) :] = torch.tensor(s)
            msk[b, width - len(s) :] = 1
        pos = (torch.cumsum(msk, 1) - 1).clamp(min=0)
        dev = sub.device
        sub.next_pos = msk.sum(1).to(dev)
        tail = sub.forward_tail(ids.to(dev), msk.to(dev), pos.to(dev), n_tail)  # (G, n_tail, V)
        idx, rows, pick = [], [], []
        for g, (st, pos_list) in enumerate(roots):
            S, P0 = len(seqs[g]), len(st.prefix)
            for j, t in pos_list:
                h = tail[g, n_tail - S + P0 + t - 1]  # the logits at h_t (after its last token)
                q = float(sampling_probs(h[None], self.cfg.temperature, self.cfg.top_p)[0, st.action_ids[t]])
                self.out["q"][j] = q
                if self.estimator == "pi" and q >= 1.0:  # Â = 0 exactly: nothing to run
                    self.bar.update(2 * self.m)
                    continue
                for c in range(self.m):
                    for kind in ("forced", self.alt_kind):
                        n_head = t + 1 if kind == "forced" else t
                        idx.append(g)
                        pick.append((g, n_tail - S + P0 + n_head - 1, P0 + n_head, width - S))
                        rows.append(self._row(st, j, t, c, kind))
        if not rows:
            self.timer.add("model", t0)
            return [], tail.new_zeros(0, tail.shape[-1])
        sub.keep_rows(idx)
        # each row keeps the slots of its own prefix (its first `used` slots) and drops the rest
        for b, (_, _, used, left) in enumerate(pick):
            sub.attn[b, left + used :] = 0
            sub.next_pos[b] = used
        sub.keep_rows(list(range(len(rows))))
        logits = torch.stack([tail[g, k] for g, k, _, _ in pick])
        self.engine.append(sub)
        self.timer.add("model", t0)
        return rows, logits

    def _admit_refed(self, units: list[tuple[int, TurnState, int]]) -> tuple[list[_Row], torch.Tensor]:
        """:meth:`_admit` without sharing: every continuation feeds its own prefix (``π(a_t|h_t)`` read from
        the first alternative row of its position, whose logits are at ``h_t``)."""
        rows = [
            self._row(st, j, t, c, kind)
            for j, st, t in units
            for c in range(self.m)
            for kind in ("forced", self.alt_kind)
        ]
        for r, (_, st, _) in zip(rows, [u for u in units for _ in range(2 * self.m)]):
            r.ep.pending = list(st.prefix) + r.head
        sub = Engine(self.engine.model, self.engine.pad_id)
        sub.add_rows(len(rows))
        logits = feed(sub, [r.ep for r in rows], self.timer)
        keep = []
        for u, (j, st, t) in enumerate(units):
            first = 2 * self.m * u
            q = float(
                sampling_probs(logits[first + 1][None], self.cfg.temperature, self.cfg.top_p)[0, st.action_ids[t]]
            )
            self.out["q"][j] = q
            if self.estimator == "pi" and q >= 1.0:
                self.bar.update(2 * self.m)
                continue
            keep += list(range(first, first + 2 * self.m))
        if len(keep) < len(rows):
            sub.keep_rows(keep)
            rows, logits = [rows[b] for b in keep], logits[torch.tensor(keep, dtype=torch.long, device=logits.device)]
        if rows:
            self.engine.append(sub)
        return rows, logits

    def _row(self, st: TurnState, j: int, t: int, c: int, kind: str) -> _Row:
        words = token_seed(self.seed, st.traj_id, st.turn, t, c, kind, self.estimator)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))
        ep = Episode(
            index=j,
            group=j,
            sample=c,
            task_seed=0,
            seed=0,
            env=st.env.fork("-".join(map(str, words))),
            oracle=None,
            prompt=list(st.prefix),
            rng=rng,
            rewards=[0.0] * st.turn,
        )
        if kind == "forced":
            ep.uniform()  # the draw the other kind spends on its first token: the streams stay aligned
        head = list(st.action_ids[: t + 1] if kind == "forced" else st.action_ids[:t])
        return _Row(ep, j, c, st.turn, kind, head, st.action_ids[t] if kind == "other" else -1)

    # -- stepping
    def _record(self, r: _Row, ids: list[int], ended_by_stop: bool) -> bool:
        """Hand the row's whole turn ``ids`` to its environment; whether the episode goes on."""
        ep = r.ep
        bt = self.cfg.max_total_tokens - ep.length  # the total budget before the turn
        cut = (not ended_by_stop) and len(ids) >= bt and bt <= self.cfg.max_turn_tokens
        zeros = [0.0] * len(ids)
        record_turn(ep, ids, zeros, zeros, self.layout, self.timer, final_cut=cut, entropy=zeros)
        if ep.stop_reason is None and ep.length >= self.cfg.max_total_tokens:
            ep.stop_reason = "max_total_tokens"
        r.head, r.exclude = [], -1
        if ep.stop_reason is None:
            return True
        self._finish(r)
        return False

    def _finish(self, r: _Row) -> None:
        # rewards[:k] are placeholders for the turns before the branching one
        self.out["forced" if r.kind == "forced" else "alt"][r.j, r.c] = turn_return(
            r.ep.rewards[r.k :], self.turn_gamma
        )
        self.bar.update(1)

    def _complete_forced(self, live: list[_Row], logits: torch.Tensor, n_new: int):
        """The new forced rows whose turn ended with the forced token (a stop token, or a budget) hand it
        to the environment now: the observation becomes their pending tokens, or they finish."""
        keep = list(range(len(live) - n_new))
        for b in range(len(live) - n_new, len(live)):
            r = live[b]
            ep, n = r.ep, len(r.head)
            if r.kind != "forced" or not (
                r.head[-1] in self.layout.stop_ids
                or n >= self.cfg.max_turn_tokens
                or ep.length + n >= self.cfg.max_total_tokens
            ):
                keep.append(b)
                continue
            if self._record(r, r.head, r.head[-1] in self.layout.stop_ids):
                ep.pending = ep.ids[len(ep.ids) - obs_len(ep) :]
                keep.append(b)
        if len(keep) < len(live):
            t0 = time.perf_counter()
            self.engine.keep_rows(keep)
            logits = logits[torch.tensor(keep, dtype=torch.long, device=logits.device)]
            live = [live[b] for b in keep]
            self.timer.add("model", t0)
        return live, logits

    def _step(self, live: list[_Row], turn) -> list[int]:
        """Each row's turn (its head and what was decoded) to its environment, as ``step_envs`` does;
        the rows whose episode goes on (pending: the last decoded token and the observation)."""
        keep = []
        for b, r in enumerate(live):
            dec = turn.tokens[b, : turn.counts[b]].tolist()
            if self._record(r, r.head + dec, dec[-1] in self.layout.stop_ids):
                r.ep.pending = [dec[-1]] + r.ep.ids[len(r.ep.ids) - obs_len(r.ep) :]
                keep.append(b)
        return keep
