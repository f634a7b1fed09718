"""Exact oracle values under the noisy expert, by enumeration with memoization.

For one task of one environment and a :class:`~mpo_viz.envs.expert.NoisyExpert` π with turn
discount γ (default 1), over full states ``x = (t, s)``:

    Q(x, a) = Σ_o P(o | x, a) · (r_o + γ · V(x'_o))      (V = 0 after termination or truncation)
    V(x)    = Σ_a π(a | s) · Q(x, a)

Both are memoized on the hashable state, so a task costs O(#reachable states · |A|) — the
environments keep that small (a few hundred states).

**Partial turns.** The expert's text ``T(s, a)`` (token ids, end-of-turn included) is a
deterministic function of the state and the chosen action, and distinct actions give distinct
texts, so the texts are prefix-free. Before action token ``j`` of a turn whose tokens so far are
``y_{<j}``, the value is the expectation over the actions consistent with that prefix, weighted by
the policy (the posterior over the action given the prefix):

    V(x, y_{<j}) = Σ_{a: T(s,a)[:j] = y_{<j}} π(a|s) Q(x, a)  /  Σ_{a: T(s,a)[:j] = y_{<j}} π(a|s)

so ``V(x, ∅) = V(x)`` at the first token (docs/concepts.md §1–2: the value before token t; the first action
token of turn k carries V(s_k)), and after the last token (the action is known) the value is
``Q(x, a)``. Tokens shared by all consistent actions (the reasoning filler, the end-of-turn token)
leave the value unchanged; a token is *decisive* when it rules out at least one valid action.
If the text leaves the expert's support (a model wrote something the expert never would), the
remaining tokens carry ``Q(x, executed action)`` — the value once that action is fixed.

The exact token-level advantage of token ``j`` is ``V(x, y_{≤j}) − V(x, y_{<j})`` (for the last
token, ``Q(x, a) − V(x, y_{<last})``); its sum over the turn is the turn-level advantage
``Q(x, a) − V(x)``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

from mpo_viz.envs.base import FAILURE, SUCCESS, TextEnv
from mpo_viz.envs.expert import NoisyExpert

__all__ = ["Oracle", "TurnOracle"]


class TurnOracle:
    """Token-level oracle of one turn (the result of :meth:`Oracle.turn`).

    Fields: ``values`` float64 (n,) — the value before each of the turn's n tokens; ``q`` — the
    value after the last (``Q(x, a)`` of the executed action); ``v`` — ``V(x)``; ``decisive`` bool
    (n,) — the token ruled out at least one valid action; ``token_adv`` float64 (n,) — exact
    token-level advantages (sum = ``q − v``); ``on_support`` — the text is one the expert writes.
    """

    __slots__ = ("values", "q", "v", "decisive", "token_adv", "on_support")

    def __init__(self, values, q, v, decisive, on_support):
        self.values = np.asarray(values, dtype=np.float64)
        self.q, self.v = float(q), float(v)
        self.decisive = np.asarray(decisive, dtype=bool)
        self.on_support = bool(on_support)
        nxt = np.append(self.values[1:], self.q)
        self.token_adv = nxt - self.values


class Oracle:
    """Exact values of one task under a noisy expert (see the module docstring).

    ``encode(text) -> token ids`` (end-of-turn appended) is only needed for :meth:`turn`.
    """

    def __init__(
        self,
        env: TextEnv,
        expert: NoisyExpert,
        task=None,
        *,
        gamma: float = 1.0,
        encode: Callable[[str], Sequence[int]] | None = None,
    ):
        self.env = env
        self.expert = expert
        self.task = env.task if task is None else task
        if self.task is None:
            raise ValueError("task: expected a task (call env.reset() first or pass task=)")
        self.gamma = float(gamma)
        self.encode = encode
        self._v: dict[Hashable, float] = {}
        self._q: dict[tuple, float] = {}
        self._pi: dict[Hashable, dict[str, float]] = {}
        self._texts: dict[Hashable, dict[str, tuple]] = {}

    # -- policy
    def policy(self, s) -> dict[str, float]:
        """π(· | s) over the noise support."""
        pi = self._pi.get(s)
        if pi is None:
            pi = self._pi[s] = self.expert.probs(self.env, self.task, s)
        return pi

    # -- values
    def value(self, state) -> float:
        """V(x) for the full state ``x = (t, s)``; 0 for terminal inner states."""
        v = self._v.get(state)
        if v is not None:
            return v
        s = state[1]
        if s in (SUCCESS, FAILURE):
            v = 0.0
        else:
            v = sum(p * self.q(state, a) for a, p in self.policy(s).items() if p > 0.0)
        self._v[state] = v
        return v

    def q(self, state, action: str | None) -> float:
        """Q(x, a) for a canonical action, or ``None`` for a malformed one (a turn spent)."""
        key = (state, action)
        q = self._q.get(key)
        if q is not None:
            return q
        q = 0.0
        for o in self.env.transitions(self.task, state, action):
            cont = 0.0 if (o.terminated or o.truncated) else self.value(o.state)
            q += o.prob * (o.reward + self.gamma * cont)
        self._q[key] = q
        return q

    def advantage(self, state, action: str | None) -> float:
        """Turn-level advantage Q(x, a) − V(x)."""
        return self.q(state, action) - self.value(state)

    # -- partial turns
    def texts(self, s) -> dict[str, tuple]:
        """Token ids of the expert's text for every action of the support at inner state ``s``."""
        tx = self._texts.get(s)
        if tx is None:
            if self.encode is None:
                raise ValueError("encode: expected a text -> token ids function for partial-turn values")
            tx = {a: tuple(self.encode(self.expert.text(self.env, self.task, s, a))) for a in self.policy(s)}
            if len(set(tx.values())) != len(tx):
                raise ValueError(f"{self.env.name}: two actions share one expert text at state {s!r}")
            self._texts[s] = tx
        return tx

    def consistent(self, state, prefix: Sequence[int]) -> list[str]:
        """The actions of the support (in ``env.actions`` order) whose expert text starts with the token
        ids ``prefix`` (every action for an empty prefix): the support of the posterior over the action
        given a partial turn, whose weights are ``π(a | s)`` (module docstring)."""
        tx = self.texts(state[1])
        j = len(prefix)
        pre = tuple(prefix)
        return [a for a in self.policy(state[1]) if tx[a][:j] == pre]

    def token_probs(self, state, tokens: Sequence[int]) -> np.ndarray:
        """The expert's own probability of each token of a turn given the tokens before it, float64 (n,):

            π(y_j | y_<j) = Σ_{a: T(s,a)[:j+1] = y_≤j} π(a|s)  /  Σ_{a: T(s,a)[:j] = y_<j} π(a|s)

        1 on tokens every consistent action shares (filler), < 1 on the decisive ones; NaN from the first
        token the expert never writes after that prefix on (the text left its support)."""
        s = state[1]
        pi, tx = self.policy(s), self.texts(s)
        alive = list(pi)
        w = sum(pi[a] for a in alive)
        out = np.full(len(tokens), np.nan)
        for j, tok in enumerate(tokens):
            nxt = [a for a in alive if len(tx[a]) > j and tx[a][j] == tok]
            w_next = sum(pi[a] for a in nxt)
            if not nxt or w <= 0:
                break
            out[j] = 1.0 if len(nxt) == len(alive) else w_next / w
            alive, w = nxt, w_next
        return out

    def turn(self, state, tokens: Sequence[int], action: str | None) -> TurnOracle:
        """Values before each token of the turn ``tokens`` taken at ``state``; ``action`` is what
        the environment executed (parsed from the text; ``None`` if malformed)."""
        s = state[1]
        pi, tx = self.policy(s), self.texts(s)
        q = {a: self.q(state, a) for a in pi}
        q_exec = self.q(state, action)
        alive = list(pi)
        vals, dec = [], []
        v = self.value(state)  # the posterior over all of the support: V(x) exactly
        for j, tok in enumerate(tokens):
            vals.append(v)
            nxt = [a for a in alive if len(tx[a]) > j and tx[a][j] == tok]
            dec.append(len(nxt) < len(alive))
            if len(nxt) < len(alive):  # recompute only when the token rules something out (no float drift)
                w = sum(pi[a] for a in nxt)
                if len(nxt) == 1 and w > 0:
                    v = q[nxt[0]]
                else:
                    v = sum(pi[a] * q[a] for a in nxt) / w if w > 0 else q_exec
            alive = nxt
        on = len(alive) == 1 and tx[alive[0]] == tuple(tokens)
        return TurnOracle(vals, q_exec, self.value(state), dec, on)
