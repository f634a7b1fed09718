"""Semantic checks of trajectory data beyond the format: the silent misalignments frameworks' users report.

``mpo-viz validate`` says whether a file is trajectory/v1; the doctor says whether what loads would
train what you meant. Each check is named after its symptom and the public report it comes from, and
returns the rows it hit with example ids (docs/doctor.md shows each with a small failing example):

========================================  ==================  =================================================
check                                     from                fires when
========================================  ==================  =================================================
``reward_on_observation``                 verl #7278          a reward sits on a token outside the loss mask
                                                              (rows the loader refused for it)
``return_dropped_before_observation``     verl #7278          logged returns (or advantages) are exactly 0 on
                                                              a whole turn before an observation span while a
                                                              later turn's are not
``terminal_reward_on_masked_tail``        miles PR #1827      a terminal row ends in masked tokens and its
                                                              logged return at the last action token is not
                                                              the reward there (lost or decayed)
``masked_values_read``                    ROLL PR #447        non-finite values on masked positions, or a
                                                              logged return that bootstrapped from the value
                                                              on the masked tail
``values_shifted``                        VAGEN #33           the values fit the returns at least ``1/ratio``
                                                              times better when shifted by one token
``flat_groups``                           GRPO                at least ``max_flat_share`` of the groups have
                                                              all-equal scores (no group-relative signal)
``missing_reward``                        -                   a row has no outcome, turn or token reward
``turn_collapse``                         verl PR #4998       the mean turn count at the last ``step`` fell to
                                                              ``1 − collapse_drop`` of its earlier peak
``explained_variance_per_microbatch``     RLinf PR #1297      a logged explained variance differs from the one
                                                              over the step's whole batch
========================================  ==================  =================================================

A check whose fields are absent is *skipped* (it says what it needs). :func:`diagnose` runs
:data:`CHECKS` on a batch in hand; :func:`examine_stream` on a file, folder or run folder chunk by
chunk, in memory set by the chunk size (what ``mpo-viz doctor`` runs); :func:`examine` loads it all
first (``errors="collect"`` both: rows the loader refuses are reported, not dropped), with the
metrics of a run folder's ``metrics.jsonl``. :class:`Doctor` is the streaming core: each check takes
a few numbers of each row from a chunk and judges them over every row at the end, so a file in chunks
gets the findings, counts and example ids of the whole file. Where a check needs returns and the
file logs none, it reads :func:`mpo_viz.advantages.mc_returns` at the file's γ; a run folder's
metrics come from :func:`mpo_viz.data.runfolder.read_metrics`.

Invariant: the doctor only reads — a check never changes the batch, and its verdict depends on the
rows (and metrics) it was given alone, not on how they were cut into chunks.

Conventions (trajectories/README.md): values[t] is the value before token t; "terminal" = no finite
``bootstrap_value`` and not ``truncated``; the masked tail = the tokens after the last action token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from mpo_viz.advantages import mc_returns
from mpo_viz.data.io import PIECE_ROWS, pieces
from mpo_viz.data.moments import ExplainedVariance, Moments
from mpo_viz.data.runfolder import read_metrics
from mpo_viz.data.schema import Problem
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.options import Option

__all__ = [
    "CHECKS",
    "Check",
    "Hits",
    "Finding",
    "Evidence",
    "Tally",
    "Doctor",
    "OPTIONS",
    "EV_KEYS",
    "diagnose",
    "examine",
    "examine_stream",
]

OPTIONS = (
    Option(
        "max_flat_share",
        0.5,
        low=0.0,
        high=1.0,
        doc="flat_groups fires when at least this share of the groups of two or more rows have all-equal scores",
    ),
    Option(
        "shift_ratio",
        0.5,
        low=0.0,
        high=1.0,
        low_open=True,
        doc="values_shifted fires when a one-token shift brings the values' mean squared error to the "
        "returns below this share of the aligned one",
    ),
    Option(
        "collapse_drop",
        0.5,
        low=0.0,
        high=1.0,
        low_open=True,
        high_open=True,
        doc="turn_collapse fires when the last step's mean turn count is at most (1 - this) times the "
        "peak of the earlier steps",
    ),
    Option(
        "ev_tol",
        0.05,
        low=0.0,
        low_open=True,
        doc="explained_variance_per_microbatch fires when a logged explained variance and the one over "
        "the step's batch differ by more than this",
    ),
)
_DEFAULTS = {o.name: o.default for o in OPTIONS}

#: metric names that hold the critic's explained variance (ours, verl's, RLinf's)
EV_KEYS = ("critic_explained_var", "critic/vf_explained_var", "critic/explained_variance", "vf_explained_var")
_TOL = 1e-4  # float32 logs: returns agree to this (relative to max(1, |reward|))


# ---------------------------------------------------------------------------- the evidence
@dataclass
class Evidence:
    """What the checks read of one batch (the whole input, or one chunk of it): the ``batch``
    (``(B, L)`` padded views below), the loader's ``rejected`` problems, the per-row ``steps`` (NaN
    where unknown) and the run's ``metrics`` (one dict per logged iteration), with the thresholds of
    :data:`OPTIONS`. ``gamma``: the discount of the input's metadata (the first file's, for every chunk)."""

    batch: TrajectoryBatch
    rejected: list = field(default_factory=list)
    steps: np.ndarray | None = None
    metrics: list | None = None
    options: dict = field(default_factory=dict)
    gamma: float = 1.0

    def opt(self, name: str) -> float:
        return float(self.options.get(name, _DEFAULTS[name]))

    @cached_property
    def mask(self) -> np.ndarray:
        return self.batch.mask.numpy() != 0

    @cached_property
    def inside(self) -> np.ndarray:
        """``(B, L)`` bool: the position lies inside the row's response (not right padding)."""
        lengths = self.batch.lengths.numpy()
        return np.arange(self.mask.shape[1])[None, :] < lengths[:, None]

    @cached_property
    def last_action(self) -> np.ndarray:
        """``(B,)`` position of each row's last action token (−1 without one)."""
        m = self.mask
        if not m.size:
            return np.full(len(self.batch), -1)
        rev = np.argmax(m[:, ::-1], axis=1)
        return np.where(m.any(1), m.shape[1] - 1 - rev, -1)

    @cached_property
    def masked_tail(self) -> np.ndarray:
        """``(B,)`` bool: the response ends in masked tokens after an action token."""
        return (self.last_action >= 0) & (self.last_action < self.batch.lengths.numpy() - 1)

    @cached_property
    def terminal(self) -> np.ndarray:
        """``(B,)`` bool: no finite bootstrap value and not truncated."""
        trunc = (
            np.array([bool(x) for x in self.batch.field("truncated")])
            if self.batch.has("truncated")
            else np.zeros(len(self.batch), dtype=bool)
        )
        return ~np.isfinite(self.batch.bootstrap_value.numpy()) & ~trunc

    @cached_property
    def rewards(self) -> np.ndarray:
        """``(B, L)`` float64: the rewards an estimator sees."""
        return self.batch.padded("rewards", dtype=torch.float64).numpy()

    def token(self, name: str) -> np.ndarray:
        """``(B, L)`` float64 of a per-token field, NaN where a row lacks it (all NaN when no row has it)."""
        if not self.batch.has(name):
            return np.full(self.mask.shape, math.nan)
        return self.batch.padded(name, dtype=torch.float64, fill=math.nan).numpy()

    def present(self, name: str) -> np.ndarray:
        """``(B,)`` bool: the row carries the optional per-token or per-turn field ``name``."""
        c = self.batch.columns
        if name in c.present:
            return c.present[name]
        if name in c.turn:
            return c.turn[name][2]
        return np.zeros(len(self.batch), dtype=bool)

    @cached_property
    def tail(self) -> dict:
        """:func:`_last_action_terms` as ``(B,)`` arrays (NaN / False outside its rows)."""
        B = len(self.batch)
        sel, g, r, r_turn, v_tail, tol = _last_action_terms(self)
        out = {
            "sel": np.zeros(B, dtype=bool),
            "g": np.full(B, math.nan),
            "r": np.full(B, math.nan),
            "r_turn": np.full(B, math.nan),
            "v_tail": np.full(B, math.nan),
            "tol": np.full(B, math.nan),
        }
        for k, x in (("g", g), ("r", r), ("r_turn", r_turn), ("v_tail", v_tail), ("tol", tol)):
            out[k][sel] = x
        out["sel"][sel] = True
        return out

    def ids(self, rows) -> list[str]:
        tids = self.batch.traj_ids
        return [tids[int(i)] for i in rows]


def _row_sum(x: np.ndarray) -> np.ndarray:
    """``(B,)`` sums of a ``(B, L)`` array along its rows, added left to right: a row's sum does not
    depend on how far the batch pads it (a pairwise sum would), so a row gives the same bits in
    every chunk it could sit in."""
    if not x.shape[1]:
        return np.zeros(x.shape[0], dtype=x.dtype)
    return np.cumsum(x, axis=1)[:, -1].copy()  # a copy: a view would keep the whole (B, L) sums alive


class Tally:
    """What a check judges: the per-row numbers its ``rows`` function took from every batch, joined in
    input order (``t[key]``), the common ones (``traj_id``, ``step``, ``turns``, ``has:<field>``),
    the thresholds and the run's metrics. The same numbers whether the input came whole or in chunks."""

    def __init__(self, columns: dict, own: dict, n: int, options: dict, metrics):
        self._columns, self._own, self.n, self.options, self.metrics = columns, own, n, options, metrics

    def __getitem__(self, key: str):
        return self._own[key] if key in self._own else self._columns[key]

    def opt(self, name: str) -> float:
        return float(self.options.get(name, _DEFAULTS[name]))

    def has(self, name: str) -> bool:
        """Whether any row of the input carries ``name`` (a per-token or per-turn field)."""
        return bool(self._columns[f"has:{name}"].any())

    def ids(self, rows) -> list[str]:
        tids = self._columns["traj_id"]
        return [str(tids[int(i)]) for i in rows]


@dataclass
class Hits:
    """What one check found: the trajectory ids it hit, a sentence with the measured numbers,
    ``fired`` (default: any row hit) and ``skipped`` (why the check could not run, or empty)."""

    rows: list = field(default_factory=list)
    detail: str = ""
    fired: bool | None = None
    skipped: str = ""


@dataclass(frozen=True)
class Check:
    """One semantic check: its ``name`` (the symptom), the public report it comes from, what to fix,
    ``rows(evidence) -> {key: (B,) array}`` (the numbers it needs of each row of a batch: each depends
    on its row alone, so a chunk gives the numbers the whole file would; a list instead of an array
    for what comes from the loader's problems) and ``judge(tally) -> Hits`` on every row's numbers."""

    name: str
    source: str
    symptom: str
    fix: str
    rows: Callable[[Evidence], dict]
    judge: Callable[[Tally], Hits]

    def run(self, ev: Evidence) -> Hits:
        """The check on one batch alone (:func:`diagnose` of it)."""
        doc = Doctor(metrics=ev.metrics, checks=(self,), **ev.options)
        doc.add(ev.batch, rejected=ev.rejected, steps=ev.steps, gamma=ev.gamma)
        return doc.hits()[0]


@dataclass
class Finding:
    """A check's outcome, as the table and ``--json`` show it."""

    check: str
    source: str
    symptom: str
    status: str  # "fired", "ok" or "skipped"
    rows_hit: int
    examples: list
    detail: str
    fix: str

    @property
    def fired(self) -> bool:
        return self.status == "fired"

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------- the checks
# Each check is two functions: ``_<name>_rows(ev)`` takes its numbers of each row of a batch, and
# ``<name>(t)`` judges them all. A row's numbers never depend on the other rows of its batch (sums
# along a row are added left to right, :func:`_row_sum`; a field some rows lack reads NaN there), and
# what depends on the whole input (which fields it has, pooled errors, groups, steps) is decided in
# the judge, over every row: so the findings are the same for a whole file and for that file in chunks.
def _unique(ids: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def _observation_reward(p: Problem) -> bool:
    return p.field == "token_rewards" and p.expected.startswith("0 on observation tokens")


def _refused_rows(ev: Evidence) -> dict:
    return {"refused": [p.traj_id or p.where() for p in ev.rejected if _observation_reward(p)]}


def reward_on_observation(t: Tally) -> Hits:
    """Rows the loader refused for a token reward on a masked token (the loader enforces the rule;
    the doctor names the symptom and counts them). Data that loads has no reward off the mask."""
    refused = t["refused"]
    return Hits(
        rows=_unique(refused), detail=f"{len(refused)} row(s) refused by the loader for token_rewards on masked tokens"
    )


def _turn_table(ev: Evidence, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(B, Kmax)``: whether turn k has a non-zero ``x`` on an action token, and whether turn k exists."""
    k = ev.batch.num_turns
    kmax = int(k.max()) if len(k) else 0
    tid = ev.batch.turn_ids.numpy()
    rows, cols = np.nonzero(ev.mask)
    nonzero = np.zeros((len(k), max(kmax, 1)), dtype=bool)
    np.logical_or.at(nonzero, (rows, tid[rows, cols]), np.nan_to_num(x[rows, cols], nan=1.0) != 0)
    exists = np.arange(max(kmax, 1))[None, :] < k[:, None]
    return nonzero, exists


def _dropped_rows(ev: Evidence) -> dict:
    """Per row: two turns or more, and (for logged returns, and for logged advantages) an all-zero
    turn before a non-zero last turn (a row without the field: never; its NaN reads as non-zero)."""
    k = ev.batch.num_turns
    out = {"multi": k >= 2}
    for name in ("returns", "advantages"):
        out[name] = np.zeros(len(k), dtype=bool)
        if ev.present(name).any():
            nonzero, exists = _turn_table(ev, ev.token(name))
            last_nonzero = nonzero[np.arange(len(k)), np.maximum(k - 1, 0)]
            earlier_zero = (exists & ~nonzero & (np.arange(nonzero.shape[1])[None, :] < (k - 1)[:, None])).any(1)
            out[name] = (k >= 2) & last_nonzero & earlier_zero
    return out


def return_dropped_before_observation(t: Tally) -> Hits:
    """A turn before the last whose logged returns (else advantages) are exactly 0 on every action
    token while the last turn's are not: the return was reset at the observation span after it."""
    name = "returns" if t.has("returns") else "advantages" if t.has("advantages") else None
    if name is None:
        return Hits(skipped="needs logged returns or advantages")
    rows = np.flatnonzero(t[name])
    return Hits(
        rows=t.ids(rows),
        detail=f"read logged {name}; {len(rows)} of {int(t['multi'].sum())} multi-turn rows "
        "have an all-zero turn before a non-zero last turn",
    )


def _last_action_terms(ev: Evidence):
    """Per terminal row with a masked tail, logged values and returns: ``(rows, G_last, r_last,
    R_last_turn, V_tail, tol)`` at the last action token."""
    values, returns = ev.token("values"), ev.token("returns")
    sel = np.flatnonzero(ev.terminal & ev.masked_tail & np.isfinite(returns[np.arange(len(ev.batch)), ev.last_action]))
    la = ev.last_action[sel]
    g_last = returns[sel, la]
    r_last = ev.rewards[sel, la]
    tid = ev.batch.turn_ids.numpy()
    same_turn = ev.mask[sel] & (tid[sel] == tid[sel, la][:, None])
    r_turn = _row_sum(np.where(same_turn, ev.rewards[sel], 0.0))
    v_tail = values[sel, la + 1]
    tol = _TOL * np.maximum(1.0, np.abs(r_last))
    return sel, g_last, r_last, r_turn, v_tail, tol


def _tail_rows(ev: Evidence) -> dict:
    """Per row: a terminal row ending in masked tokens with a logged return at its last action token
    (``sel``), whose return is neither the reward there nor the last turn's reward nor explained by
    the tail's value (``off``), and that return and reward."""
    tl = ev.tail
    g, r, v_tail, tol = tl["g"], tl["r"], tl["v_tail"], tl["tol"]
    with np.errstate(invalid="ignore"):
        read_tail = np.isfinite(v_tail) & (v_tail != 0) & (np.abs(g - (r + ev.gamma * v_tail)) <= tol)
        off = tl["sel"] & (np.abs(g - r) > tol) & (np.abs(g - tl["r_turn"]) > tol) & ~read_tail
    return {"sel": tl["sel"], "off": off, "g": g, "r": r}


def terminal_reward_on_masked_tail(t: Tally) -> Hits:
    """Terminal rows ending in masked tokens whose logged return at the last action token is neither
    the reward there nor the last turn's reward (the terminal reward was lost or decayed on the tail),
    and is not explained by a bootstrapped tail value (that is ``masked_values_read``)."""
    if not (t.has("values") and t.has("returns")):
        return Hits(skipped="needs logged values and returns")
    rows = np.flatnonzero(t["off"])
    worst = f"; e.g. return {t['g'][rows[0]]:.4g} where the reward is {t['r'][rows[0]]:.4g}" if len(rows) else ""
    return Hits(rows=t.ids(rows), detail=f"{int(t['sel'].sum())} terminal rows end in masked tokens{worst}")


def _masked_values_rows(ev: Evidence) -> dict:
    """Per row: non-finite values on a masked position inside the response (a row that carries
    values), and a last return that is ``r + γ·V`` of the masked tail's value."""
    nonfinite = (~ev.mask & ev.inside & ~np.isfinite(ev.token("values"))).any(1) & ev.present("values")
    tl = ev.tail
    g, r, v_tail, tol = tl["g"], tl["r"], tl["v_tail"], tl["tol"]
    with np.errstate(invalid="ignore"):
        read = (
            tl["sel"]
            & np.isfinite(v_tail)
            & (v_tail != 0)
            & (np.abs(g - r) > tol)
            & (np.abs(g - (r + ev.gamma * v_tail)) <= tol)
        )
    return {"nonfinite": nonfinite, "read": read}


def masked_values_read(t: Tally) -> Hits:
    """Non-finite values on masked positions (a mask multiplication keeps NaN·0 = NaN), and terminal
    rows whose logged return at the last action token is ``r + γ·V`` of the masked tail's value."""
    if not t.has("values"):
        return Hits(skipped="needs values")
    nonfinite = t["nonfinite"]
    hit = nonfinite.copy()
    detail = f"{int(nonfinite.sum())} row(s) with non-finite values on masked positions"
    if t.has("returns"):
        hit |= t["read"]
        detail += (
            f"; {int(t['read'].sum())} terminal row(s) whose last return bootstrapped from the masked tail's value"
        )
    else:
        detail += "; whether the tail's value was read needs logged returns"
    return Hits(rows=_unique(t.ids(np.flatnonzero(hit))), detail=detail)


def _mc_returns(ev: Evidence) -> np.ndarray:
    """``(B, L)`` Monte-Carlo returns over action tokens (:func:`mpo_viz.advantages.mc_returns` with
    γ from the file's metadata, on every token: γ_T = γ), NaN elsewhere."""
    return np.where(ev.mask, mc_returns(ev.batch, gamma=ev.gamma).numpy(), math.nan)


def _shift_errors(ev: Evidence, values: np.ndarray, target: np.ndarray) -> dict:
    """Per row: the action tokens with both neighbours inside the response and a finite value, its
    two neighbours' and a finite target (``n``), and the squared errors of ``V[t−1]``, ``V[t]``,
    ``V[t+1]`` against the target summed over them (``e-1``, ``e0``, ``e1``)."""
    v = np.pad(values, ((0, 0), (1, 1)), constant_values=math.nan)
    ok = ev.mask & np.isfinite(target) & np.isfinite(v[:, 1:-1]) & np.isfinite(v[:, :-2]) & np.isfinite(v[:, 2:])
    out = {"n": ok.sum(1)}
    for s in (-1, 0, 1):
        out[f"e{s}"] = _row_sum(np.where(ok, (v[:, 1 + s : v.shape[1] - 1 + s] - target) ** 2, 0.0))
    return out


def _shifted_rows(ev: Evidence) -> dict:
    """:func:`_shift_errors` against the logged returns (``ret.*``) and, for a batch without any, against
    the reward-to-go (``mc.*``: what the judge reads when no row of the input has returns)."""
    B = len(ev.batch)
    zero = {"n": np.zeros(B, dtype=np.int64), **{f"e{s}": np.zeros(B) for s in (-1, 0, 1)}}
    ret = mc = zero  # a row without values (or without the target) has no such token
    if ev.present("values").any():
        values = ev.token("values")
        if ev.present("returns").any():
            ret = _shift_errors(ev, values, ev.token("returns"))
        else:
            mc = _shift_errors(ev, values, _mc_returns(ev))
    return {**{f"ret.{k}": x for k, x in ret.items()}, **{f"mc.{k}": x for k, x in mc.items()}}


def values_shifted(t: Tally) -> Hits:
    """Pooled over action tokens with both neighbours inside the response: the mean squared error of
    ``V[t±1]`` against ``G[t]`` below ``shift_ratio`` times that of ``V[t]`` (G: logged returns, else
    the reward-to-go). Rows hit: those whose own shifted error is below the ratio too."""
    if not t.has("values"):
        return Hits(skipped="needs values")
    tag, src = ("ret", "logged returns") if t.has("returns") else ("mc", "the reward-to-go")
    n = int(t[f"{tag}.n"].sum())
    if n < 2:
        return Hits(skipped="needs action tokens with values and returns")
    per_row = {s: t[f"{tag}.e{s}"] for s in (-1, 0, 1)}
    pooled = {s: float(e.sum() / n) for s, e in per_row.items()}
    ratio = t.opt("shift_ratio")
    best = min((-1, 1), key=lambda s: pooled[s])
    fired = pooled[0] > 1e-12 and pooled[best] < ratio * pooled[0]
    rows = np.flatnonzero((per_row[best] < ratio * per_row[0]) & (per_row[0] > 0)) if fired else np.zeros(0, int)
    word = "later" if best == 1 else "earlier"
    detail = (
        f"mean squared error vs {src}: aligned {pooled[0]:.4g}, value one token {word} {pooled[best]:.4g} "
        f"(fires below {ratio:g}x)"
    )
    return Hits(rows=t.ids(rows), detail=detail, fired=fired)


def _flat_rows(ev: Evidence) -> dict:
    return {"group": np.asarray(ev.batch.group_ids, dtype=object), "score": ev.batch.row_scores()}


def flat_groups(t: Tally) -> Hits:
    """Groups of two or more rows whose scores (the sum of the rewards an estimator sees) are all equal:
    GRPO gives them zero advantage. Fires when their share reaches ``max_flat_share``."""
    g = pd.DataFrame({"g": t["group"], "s": t["score"]}).groupby("g")["s"]
    size, spread = g.size(), g.max() - g.min()
    multi = size[size >= 2].index
    if not len(multi):
        return Hits(skipped="needs groups of two or more rows")
    flat = [k for k in multi if spread[k] <= 1e-12]
    share = len(flat) / len(multi)
    rows = np.flatnonzero(np.isin(t["group"], np.asarray(flat, dtype=object)))
    return Hits(
        rows=t.ids(rows),
        fired=share >= t.opt("max_flat_share"),
        detail=f"{len(flat)} of {len(multi)} groups ({share:.0%}) have all-equal scores "
        f"(fires at {t.opt('max_flat_share'):.0%})",
    )


def _missing_rows(ev: Evidence) -> dict:
    return {"none": np.isnan(ev.batch.outcome_reward) & ~ev.present("token_rewards") & ~ev.present("turn_rewards")}


def missing_reward(t: Tally) -> Hits:
    """Rows with a NaN ``reward`` and neither ``token_rewards`` nor ``turn_rewards``: every estimator
    reads a reward of 0."""
    none = t["none"]
    return Hits(rows=t.ids(np.flatnonzero(none)), detail=f"{int(none.sum())} of {len(none)} rows have no reward")


def _no_rows(ev: Evidence) -> dict:
    return {}  # the common numbers (steps, turns) are enough


def turn_collapse(t: Tally) -> Hits:
    """Mean turn count per ``step``; fires when the last step's is at most ``1 − collapse_drop`` times
    the peak of the earlier steps (the agent stopped calling tools). Rows hit: the last step's rows
    with fewer turns than that peak."""
    steps, turns = t["step"], t["turns"]
    if not np.isfinite(steps).any():
        return Hits(skipped="needs a step column (or a run folder's iterations)")
    known = np.isfinite(steps)
    per = pd.Series(turns[known].astype(float)).groupby(steps[known]).mean().sort_index()
    if len(per) < 3:
        return Hits(skipped=f"needs three steps or more, found {len(per)}")
    peak, last = float(per.iloc[:-1].max()), float(per.iloc[-1])
    fired = last <= (1 - t.opt("collapse_drop")) * peak
    at_last = known & (steps == per.index[-1]) & (turns < peak)
    rows = np.flatnonzero(at_last) if fired else np.zeros(0, int)
    return Hits(
        rows=t.ids(rows),
        fired=fired,
        detail=f"mean turns per row: peak {peak:.3g} (step {per.iloc[:-1].idxmax():g}), "
        f"last step {per.index[-1]:g}: {last:.3g}",
    )


def _moments(x: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row over ``ok``: count, mean and ``M2 = Σ (x − mean)²`` (two-pass, added left to right)."""
    n = ok.sum(1)
    mean = _row_sum(np.where(ok, x, 0.0)) / np.maximum(n, 1)
    m2 = _row_sum(np.where(ok, (x - mean[:, None]) ** 2, 0.0))
    return n, mean, m2


def _ev_rows(ev: Evidence) -> dict:
    """Per row, over its action tokens with finite values and returns: the moments of the returns G
    (``g.*``) and of the error G − V (``d.*``), what a step's explained variance merges."""
    if not ev.metrics:
        return {}  # nothing to compare with (the judge skips)
    B = len(ev.batch)
    if not (ev.present("values").any() and ev.present("returns").any()):
        return {
            f"{x}.{k}": np.zeros(B, dtype=np.int64 if k == "n" else np.float64)
            for x in ("g", "d")
            for k in ("n", "mean", "m2")
        }  # no action token with both
    values, returns = ev.token("values"), ev.token("returns")
    ok = ev.mask & np.isfinite(values) & np.isfinite(returns)
    g = np.nan_to_num(returns)
    out = {}
    for tag, x in (("g", g), ("d", g - np.nan_to_num(values))):
        out[f"{tag}.n"], out[f"{tag}.mean"], out[f"{tag}.m2"] = _moments(x, ok)
    return out


def _merged(n: np.ndarray, mean: np.ndarray, m2: np.ndarray) -> Moments:
    """Rows' moments merged (Chan et al., all at once, in row order: the same bits for the same rows)."""
    total = int(n.sum())
    if not total:
        return Moments()
    mu = float((n * mean).sum()) / total
    return Moments(total, mu, float(m2.sum()) + float((n * (mean - mu) ** 2).sum()))


def explained_variance_per_microbatch(t: Tally) -> Hits:
    """Per logged step with a critic explained variance (one of :data:`EV_KEYS`) and rows of that
    step with values and returns: ``1 − Var(G − V)/Var(G)`` over the step's whole batch vs the logged
    number; fires when they differ by more than ``ev_tol`` (averaging it per micro-batch is not the
    batch's)."""
    if not t.metrics:
        return Hits(skipped="needs a run's metrics (a run folder, or --metrics FILE)")
    if not t["step_given"].any() or not (t.has("values") and t.has("returns")):
        return Hits(skipped="needs rows with a step, values and returns")
    steps = t["step"]
    off, compared = [], 0
    for rec in t.metrics:
        key = next((k for k in EV_KEYS if isinstance(rec.get(k), (int, float))), None)
        step = rec.get("step", rec.get("iteration"))
        if key is None or step is None or not math.isfinite(rec[key]):
            continue
        rows = np.flatnonzero(steps == step)
        if not len(rows):
            continue
        batch_ev = ExplainedVariance(
            *(_merged(t[f"{x}.n"][rows], t[f"{x}.mean"][rows], t[f"{x}.m2"][rows]) for x in ("g", "d"))
        ).value
        if not math.isfinite(batch_ev):
            continue
        compared += 1
        if abs(batch_ev - rec[key]) > t.opt("ev_tol"):
            off.append((step, rec[key], batch_ev, rows))
    if not compared:
        return Hits(skipped="no logged explained variance matches a step of these rows")
    rows_hit = [i for *_, rows in off for i in rows]
    head = "; ".join(f"step {s}: logged {a:.3g}, over the batch {b:.3g}" for s, a, b, _ in off[:3])
    return Hits(
        rows=t.ids(rows_hit), detail=f"{len(off)} of {compared} step(s) differ" + (f" ({head})" if head else "")
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "reward_on_observation",
        "verl #7278",
        "a reward on a token outside the loss mask",
        "move each reward to the last action token before it (mpo-viz convert does, and counts the moves)",
        _refused_rows,
        reward_on_observation,
    ),
    Check(
        "return_dropped_before_observation",
        "verl #7278",
        "returns reset at an observation span: earlier turns get none",
        "carry the running return across masked tokens; recompute with mpo-viz advantages",
        _dropped_rows,
        return_dropped_before_observation,
    ),
    Check(
        "terminal_reward_on_masked_tail",
        "miles PR #1827",
        "the terminal reward lost or decayed on a masked tail",
        "run the recursion over action tokens only, with the reward on the last action token",
        _tail_rows,
        terminal_reward_on_masked_tail,
    ),
    Check(
        "masked_values_read",
        "ROLL PR #447",
        "values on masked positions reach valid advantages",
        "mask the values before the advantage recursion (and never write NaN there)",
        _masked_values_rows,
        masked_values_read,
    ),
    Check(
        "values_shifted",
        "VAGEN #33",
        "values shifted by one token against the mask",
        "align values[t] with the state before token t (the value head at position t-1)",
        _shifted_rows,
        values_shifted,
    ),
    Check(
        "flat_groups",
        "GRPO",
        "groups whose rewards are all equal carry no group-relative signal",
        "sample harder or easier tasks, larger groups, or drop flat groups (dynamic sampling)",
        _flat_rows,
        flat_groups,
    ),
    Check(
        "missing_reward",
        "trajectory/v1",
        "rows without any reward",
        "log the outcome reward (or turn/token rewards) for every row",
        _missing_rows,
        missing_reward,
    ),
    Check(
        "turn_collapse",
        "verl PR #4998",
        "the turn count collapses over the run's steps",
        "reward the tool use the task needs; watch turns per step",
        _no_rows,
        turn_collapse,
    ),
    Check(
        "explained_variance_per_microbatch",
        "RLinf PR #1297",
        "explained variance averaged per micro-batch",
        "compute 1 - Var(G - V)/Var(G) from sums over the whole batch",
        _ev_rows,
        explained_variance_per_microbatch,
    ),
)


# ---------------------------------------------------------------------------- running them
#: per-token / per-turn fields whose presence the judges ask about (``Tally.has``)
_HAS = ("values", "returns", "advantages", "token_rewards", "turn_rewards")


def _gamma_of(meta: dict) -> float:
    g = meta.get("gamma", 1.0)
    return float(g) if isinstance(g, (int, float)) and math.isfinite(g) else 1.0


def _check_options(options: dict) -> dict:
    options = dict(options)
    for o in OPTIONS:
        if o.name in options:
            options[o.name] = o.check(options[o.name])
    unknown = set(options) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"diagnose: unknown option(s) {sorted(unknown)}; expected {sorted(_DEFAULTS)}")
    return options


class Doctor:
    """The checks over an input that comes in batches (the chunks of a file, or one whole batch):
    :meth:`add` each batch with the loader's problems of its rows, then :meth:`findings`.

    Memory: one batch at a time, plus a few numbers per row (its id, step, turn count and each
    check's per-row numbers) and the ids of the refused rows. The findings are exactly those of
    the whole input in one batch: the checks' ``rows`` functions give each row's numbers from that
    row alone, and the judges decide over all of them (the groups of ``flat_groups``, the steps of
    ``turn_collapse``, the pooled errors of ``values_shifted``, which fields the input has).
    ``metrics``: the run's logged records; ``options``: thresholds of :data:`OPTIONS` by name.
    """

    def __init__(self, *, metrics=None, checks: Sequence[Check] = CHECKS, **options):
        self.options = _check_options(options)
        self.metrics = metrics
        self.checks = tuple(checks)
        self.rows = 0  # valid rows seen
        self.gamma: float | None = None  # the first batch's metadata's discount (the input's)
        self._common: dict[str, list] = {}
        self._own: list[dict[str, list]] = [{} for _ in self.checks]

    def add(
        self,
        batch: TrajectoryBatch,
        *,
        rejected: Sequence[Problem] | None = None,
        steps=None,
        gamma: float | None = None,
    ) -> None:
        """Take the numbers of one batch. ``rejected``: the loader's problems of its rows (default
        ``batch.rejected``); ``steps``: ``(B,)`` step per row (default the ``step`` column; NaN =
        unknown); ``gamma``: the input's discount (default: the first batch's metadata's)."""
        if self.gamma is None:
            self.gamma = gamma if gamma is not None else _gamma_of(batch.meta)
        given = steps is not None
        if steps is None and batch.has("step") and len(batch):
            steps, given = _step_column(batch), True
        ev = Evidence(
            batch,
            list(batch.rejected if rejected is None else rejected),
            None if steps is None else np.asarray(steps, dtype=np.float64),
            self.metrics,
            self.options,
            self.gamma,
        )
        self.rows += len(batch)
        parts = {
            "traj_id": np.asarray(batch.traj_ids, dtype=object),
            "step": ev.steps if ev.steps is not None else np.full(len(batch), math.nan),
            "step_given": np.full(len(batch), given),
            "turns": np.asarray(batch.num_turns),
        }
        parts |= {f"has:{f}": ev.present(f) for f in _HAS}
        for k, x in parts.items():
            self._common.setdefault(k, []).append(_kept(x))
        for c, own in zip(self.checks, self._own):
            if not len(batch) and c.rows is not _refused_rows:
                continue
            for k, x in c.rows(ev).items():
                own.setdefault(k, []).append(_kept(x))

    def hits(self) -> list[Hits]:
        """Each check's :class:`Hits` over everything added (``skipped`` with no valid row)."""
        common = {k: _join(v) for k, v in self._common.items()}
        if not common:
            common = {
                "traj_id": np.zeros(0, dtype=object),
                "step": np.zeros(0),
                "step_given": np.zeros(0, dtype=bool),
                "turns": np.zeros(0, dtype=np.int64),
                **{f"has:{f}": np.zeros(0, dtype=bool) for f in _HAS},
            }
        out = []
        for c, own in zip(self.checks, self._own):
            t = Tally(common, {k: _join(v) for k, v in own.items()}, self.rows, self.options, self.metrics)
            out.append(c.judge(t) if self.rows or c.rows is _refused_rows else Hits(skipped="no valid row"))
        return out

    def findings(self, max_examples: int = 3) -> list[Finding]:
        """One :class:`Finding` per check, over everything added."""
        out = []
        for c, h in zip(self.checks, self.hits()):
            fired = bool(h.rows) if h.fired is None else bool(h.fired)
            status = "skipped" if h.skipped else "fired" if fired else "ok"
            out.append(
                Finding(
                    c.name,
                    c.source,
                    c.symptom,
                    status,
                    len(h.rows),
                    list(h.rows[:max_examples]),
                    h.skipped or h.detail,
                    c.fix,
                )
            )
        return out


def _kept(x):
    """A per-row part as kept until the end: a list as it is, an array as a compact copy of its own
    (never a view that would hold a chunk's larger buffer alive)."""
    return x if isinstance(x, list) else np.array(x, copy=True)


def _join(parts: list):
    """Per-batch parts joined in order: arrays concatenated, lists chained."""
    if parts and isinstance(parts[0], list):
        return [x for p in parts for x in p]
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _step_column(b: TrajectoryBatch) -> np.ndarray:
    return np.array([math.nan if s is None else float(s) for s in b.field("step")])


def diagnose(
    batch: TrajectoryBatch,
    *,
    rejected: Sequence[Problem] = (),
    steps=None,
    metrics=None,
    checks: Sequence[Check] = CHECKS,
    max_examples: int = 3,
    **options,
) -> list[Finding]:
    """Run ``checks`` on ``batch`` (and the loader's ``rejected`` problems); one :class:`Finding` per
    check. ``steps``: ``(B,)`` step per row (default the ``step`` column); ``metrics``: the run's
    logged records; ``options``: thresholds of :data:`OPTIONS` by name. A batch in hand: for a file
    of any size, :func:`examine_stream` (or :class:`Doctor` over chunks) gives the same findings."""
    doc = Doctor(metrics=metrics, checks=checks, **options)
    doc.add(batch, rejected=list(rejected) or list(batch.rejected), steps=steps)
    return doc.findings(max_examples)


def _run_folder(p: Path, metrics) -> tuple[Path, object]:
    """The trajectories of ``p`` (a run folder's ``trajectories/``, else ``p``) and the metrics file
    to read (``metrics``, else a run folder's ``metrics.jsonl``, else None)."""
    run = p.is_dir() and (p / "metrics.jsonl").is_file() and (p / "trajectories").is_dir()
    if metrics is None and run:
        metrics = p / "metrics.jsonl"
    return (p / "trajectories" if run else p), metrics


def _records(metrics) -> list | None:
    """The records of the metrics file (None without one)."""
    if metrics is None:
        return None
    if not Path(metrics).is_file():
        raise FileNotFoundError(f"metrics: expected a metrics.jsonl file, found no such file {str(metrics)!r}")
    return read_metrics(metrics).records


def examine(path, *, metrics=None, **options) -> tuple[list[Finding], TrajectoryBatch]:
    """**Loads everything**: ``path`` (a file, a folder, or a run folder with ``metrics.jsonl`` and
    ``trajectories/``) as one batch with ``errors="collect"``, :func:`diagnose` d; returns the findings
    and the batch. A row's step is its ``step`` field, else its file's ``iteration`` metadata;
    ``metrics`` (a path) overrides a run folder's ``metrics.jsonl``. :func:`examine_stream` gives the
    same findings in memory that stays flat in the input's size."""
    data, metrics = _run_folder(Path(path), metrics)
    records = _records(metrics)
    parts = list(pieces(data, "collect", rows_per_chunk=4096))
    if not parts:
        parts = [TrajectoryBatch.from_rows([], None)]
    batch = TrajectoryBatch.concat(parts)
    rejected = [q for b in parts for q in b.rejected]
    doc = Doctor(metrics=records, **options)
    doc.add(
        batch, rejected=rejected, steps=np.concatenate([_steps_of(b) for b in parts]), gamma=_gamma_of(parts[0].meta)
    )
    return doc.findings(), batch


def examine_stream(path, *, metrics=None, max_tokens: int = 500_000, **options) -> tuple[list[Finding], int]:
    """**Streams**: :func:`examine` chunk by chunk (``max_tokens`` response tokens at a time; a longer
    trajectory comes alone), the same findings in memory set by the chunk size, not the input's;
    returns the findings and the number of valid rows. A folder of many files is one input; a run
    folder's files give each row its step."""
    data, metrics = _run_folder(Path(path), metrics)
    records = _records(metrics)
    doc = Doctor(metrics=records, **options)
    gamma = None  # the first file's (every piece of one file carries its metadata)
    pending: list[TrajectoryBatch] = []
    acc = 0
    for piece in pieces(data, "collect", rows_per_chunk=PIECE_ROWS):
        gamma = _gamma_of(piece.meta) if gamma is None else gamma
        if pending and acc + piece.num_tokens > max_tokens:
            _add_pieces(doc, pending, gamma)
            pending, acc = [], 0
        pending.append(piece)
        acc += piece.num_tokens
    if pending or not doc.rows:
        _add_pieces(doc, pending or [TrajectoryBatch.from_rows([], None)], gamma)
    return doc.findings(), doc.rows


def _add_pieces(doc: Doctor, parts: list[TrajectoryBatch], gamma: float | None) -> None:
    batch = TrajectoryBatch.concat(parts)
    doc.add(
        batch,
        rejected=[q for b in parts for q in b.rejected],
        steps=np.concatenate([_steps_of(b) for b in parts]),
        gamma=gamma,
    )


def _steps_of(b: TrajectoryBatch) -> np.ndarray:
    """A row's step: its ``step`` field, else its file's ``iteration`` metadata (a piece of the reader
    comes from one file), else NaN."""
    it = b.meta.get("iteration")
    fallback = float(it) if isinstance(it, (int, float)) and not isinstance(it, bool) else math.nan
    if b.has("step") and len(b):
        return np.array([fallback if s is None else float(s) for s in b.field("step")])
    return np.full(len(b), fallback)
