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
:data:`CHECKS` on a loaded batch; :func:`examine` loads a file, folder or run folder first
(``errors="collect"``: rows the loader refuses are reported, not dropped), with the metrics of a run
folder's ``metrics.jsonl`` (:func:`mpo_viz.data.runfolder.read_metrics`). Where a check needs returns
and the file logs none, it reads :func:`mpo_viz.advantages.mc_returns` at the file's γ.

Invariant: the doctor only reads — a check never changes the batch, and its verdict depends on the
rows (and metrics) it was given alone.

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
from mpo_viz.analysis.critic import explained_variance
from mpo_viz.data.io import files_of, load
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
    "OPTIONS",
    "EV_KEYS",
    "diagnose",
    "examine",
    "merge_findings",
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
    """What the checks read: the loaded ``batch`` (``(B, L)`` padded views below), the loader's
    ``rejected`` problems, the per-row ``steps`` (NaN where unknown) and the run's ``metrics``
    (one dict per logged iteration), with the thresholds of :data:`OPTIONS`."""

    batch: TrajectoryBatch
    rejected: list = field(default_factory=list)
    steps: np.ndarray | None = None
    metrics: list | None = None
    options: dict = field(default_factory=dict)

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

    @cached_property
    def gamma(self) -> float:
        g = self.batch.meta.get("gamma", 1.0)
        return float(g) if isinstance(g, (int, float)) and math.isfinite(g) else 1.0

    def token(self, name: str) -> np.ndarray:
        """``(B, L)`` float64 of a per-token field, NaN where a row lacks it (all NaN when no row has it)."""
        if not self.batch.has(name):
            return np.full(self.mask.shape, math.nan)
        return self.batch.padded(name, dtype=torch.float64, fill=math.nan).numpy()

    def ids(self, rows) -> list[str]:
        tids = self.batch.traj_ids
        return [tids[int(i)] for i in rows]


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
    and ``run(evidence) -> Hits``."""

    name: str
    source: str
    symptom: str
    fix: str
    run: Callable[[Evidence], Hits]


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
def _unique(ids: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def _observation_reward(p: Problem) -> bool:
    return p.field == "token_rewards" and p.expected.startswith("0 on observation tokens")


def reward_on_observation(ev: Evidence) -> Hits:
    """Rows the loader refused for a token reward on a masked token (the loader enforces the rule;
    the doctor names the symptom and counts them). Data that loads has no reward off the mask."""
    refused = [p.traj_id or p.where() for p in ev.rejected if _observation_reward(p)]
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


def return_dropped_before_observation(ev: Evidence) -> Hits:
    """A turn before the last whose logged returns (else advantages) are exactly 0 on every action
    token while the last turn's are not: the return was reset at the observation span after it."""
    name = "returns" if ev.batch.has("returns") else "advantages" if ev.batch.has("advantages") else None
    if name is None:
        return Hits(skipped="needs logged returns or advantages")
    nonzero, exists = _turn_table(ev, ev.token(name))
    k = ev.batch.num_turns
    last_nonzero = nonzero[np.arange(len(k)), np.maximum(k - 1, 0)]
    earlier_zero = (exists & ~nonzero & (np.arange(nonzero.shape[1])[None, :] < (k - 1)[:, None])).any(1)
    rows = np.flatnonzero((k >= 2) & last_nonzero & earlier_zero)
    return Hits(
        rows=ev.ids(rows),
        detail=f"read logged {name}; {len(rows)} of {int((k >= 2).sum())} multi-turn rows "
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
    r_turn = np.where(same_turn, ev.rewards[sel], 0.0).sum(1)
    v_tail = values[sel, la + 1]
    tol = _TOL * np.maximum(1.0, np.abs(r_last))
    return sel, g_last, r_last, r_turn, v_tail, tol


def terminal_reward_on_masked_tail(ev: Evidence) -> Hits:
    """Terminal rows ending in masked tokens whose logged return at the last action token is neither
    the reward there nor the last turn's reward (the terminal reward was lost or decayed on the tail),
    and is not explained by a bootstrapped tail value (that is ``masked_values_read``)."""
    if not (ev.batch.has("values") and ev.batch.has("returns")):
        return Hits(skipped="needs logged values and returns")
    sel, g, r, r_turn, v_tail, tol = _last_action_terms(ev)
    read_tail = np.isfinite(v_tail) & (v_tail != 0) & (np.abs(g - (r + ev.gamma * v_tail)) <= tol)
    off = (np.abs(g - r) > tol) & (np.abs(g - r_turn) > tol) & ~read_tail
    rows = sel[off]
    worst = f"; e.g. return {g[off][0]:.4g} where the reward is {r[off][0]:.4g}" if off.any() else ""
    return Hits(rows=ev.ids(rows), detail=f"{len(sel)} terminal rows end in masked tokens{worst}")


def masked_values_read(ev: Evidence) -> Hits:
    """Non-finite values on masked positions (a mask multiplication keeps NaN·0 = NaN), and terminal
    rows whose logged return at the last action token is ``r + γ·V`` of the masked tail's value."""
    if not ev.batch.has("values"):
        return Hits(skipped="needs values")
    values = ev.token("values")
    nonfinite = (~ev.mask & ev.inside & ~np.isfinite(values)).any(1)
    rows: list[int] = list(np.flatnonzero(nonfinite))
    detail = f"{int(nonfinite.sum())} row(s) with non-finite values on masked positions"
    if ev.batch.has("returns"):
        sel, g, r, _, v_tail, tol = _last_action_terms(ev)
        read = (
            np.isfinite(v_tail) & (v_tail != 0) & (np.abs(g - r) > tol) & (np.abs(g - (r + ev.gamma * v_tail)) <= tol)
        )
        rows += list(sel[read])
        detail += f"; {int(read.sum())} terminal row(s) whose last return bootstrapped from the masked tail's value"
    else:
        detail += "; whether the tail's value was read needs logged returns"
    return Hits(rows=_unique(ev.ids(sorted(set(rows)))), detail=detail)


def _mc_returns(ev: Evidence) -> np.ndarray:
    """``(B, L)`` Monte-Carlo returns over action tokens (:func:`mpo_viz.advantages.mc_returns` with
    γ from the file's metadata, on every token: γ_T = γ), NaN elsewhere."""
    return np.where(ev.mask, mc_returns(ev.batch, gamma=ev.gamma).numpy(), math.nan)


def values_shifted(ev: Evidence) -> Hits:
    """Pooled over action tokens with both neighbours inside the response: the mean squared error of
    ``V[t±1]`` against ``G[t]`` below ``shift_ratio`` times that of ``V[t]`` (G: logged returns, else
    the reward-to-go). Rows hit: those whose own shifted error is below the ratio too."""
    if not ev.batch.has("values"):
        return Hits(skipped="needs values")
    values = ev.token("values")
    target = ev.token("returns") if ev.batch.has("returns") else _mc_returns(ev)
    src = "logged returns" if ev.batch.has("returns") else "the reward-to-go"
    v = np.pad(values, ((0, 0), (1, 1)), constant_values=math.nan)
    ok = ev.mask & np.isfinite(target) & np.isfinite(v[:, 1:-1]) & np.isfinite(v[:, :-2]) & np.isfinite(v[:, 2:])
    err = {s: np.where(ok, (v[:, 1 + s : v.shape[1] - 1 + s] - target) ** 2, 0.0) for s in (-1, 0, 1)}
    n = ok.sum()
    if n < 2:
        return Hits(skipped="needs action tokens with values and returns")
    pooled = {s: float(e.sum() / n) for s, e in err.items()}
    ratio = ev.opt("shift_ratio")
    best = min((-1, 1), key=lambda s: pooled[s])
    fired = pooled[0] > 1e-12 and pooled[best] < ratio * pooled[0]
    per_row = {s: e.sum(1) for s, e in err.items()}
    rows = np.flatnonzero((per_row[best] < ratio * per_row[0]) & (per_row[0] > 0)) if fired else np.zeros(0, int)
    word = "later" if best == 1 else "earlier"
    detail = (
        f"mean squared error vs {src}: aligned {pooled[0]:.4g}, value one token {word} {pooled[best]:.4g} "
        f"(fires below {ratio:g}x)"
    )
    return Hits(rows=ev.ids(rows), detail=detail, fired=fired)


def flat_groups(ev: Evidence) -> Hits:
    """Groups of two or more rows whose scores (the sum of the rewards an estimator sees) are all equal:
    GRPO gives them zero advantage. Fires when their share reaches ``max_flat_share``."""
    score = ev.rewards.sum(1)
    g = pd.DataFrame({"g": ev.batch.group_ids, "s": score}).groupby("g")["s"]
    size, spread = g.size(), g.max() - g.min()
    multi = size[size >= 2].index
    if not len(multi):
        return Hits(skipped="needs groups of two or more rows")
    flat = [k for k in multi if spread[k] <= 1e-12]
    share = len(flat) / len(multi)
    rows = np.flatnonzero(np.isin(np.asarray(ev.batch.group_ids, dtype=object), np.asarray(flat, dtype=object)))
    return Hits(
        rows=ev.ids(rows),
        fired=share >= ev.opt("max_flat_share"),
        detail=f"{len(flat)} of {len(multi)} groups ({share:.0%}) have all-equal scores "
        f"(fires at {ev.opt('max_flat_share'):.0%})",
    )


def missing_reward(ev: Evidence) -> Hits:
    """Rows with a NaN ``reward`` and neither ``token_rewards`` nor ``turn_rewards``: every estimator
    reads a reward of 0."""
    none = np.isnan(ev.batch.outcome_reward)
    for f in ("token_rewards", "turn_rewards"):
        if ev.batch.has(f):
            none &= np.array([x is None for x in ev.batch.field(f)])
    return Hits(rows=ev.ids(np.flatnonzero(none)), detail=f"{int(none.sum())} of {len(none)} rows have no reward")


def turn_collapse(ev: Evidence) -> Hits:
    """Mean turn count per ``step``; fires when the last step's is at most ``1 − collapse_drop`` times
    the peak of the earlier steps (the agent stopped calling tools). Rows hit: the last step's rows
    with fewer turns than that peak."""
    if ev.steps is None or not np.isfinite(ev.steps).any():
        return Hits(skipped="needs a step column (or a run folder's iterations)")
    known = np.isfinite(ev.steps)
    per = pd.Series(ev.batch.num_turns[known].astype(float)).groupby(ev.steps[known]).mean().sort_index()
    if len(per) < 3:
        return Hits(skipped=f"needs three steps or more, found {len(per)}")
    peak, last = float(per.iloc[:-1].max()), float(per.iloc[-1])
    fired = last <= (1 - ev.opt("collapse_drop")) * peak
    at_last = known & (ev.steps == per.index[-1]) & (ev.batch.num_turns < peak)
    rows = np.flatnonzero(at_last) if fired else np.zeros(0, int)
    return Hits(
        rows=ev.ids(rows),
        fired=fired,
        detail=f"mean turns per row: peak {peak:.3g} (step {per.iloc[:-1].idxmax():g}), "
        f"last step {per.index[-1]:g}: {last:.3g}",
    )


def explained_variance_per_microbatch(ev: Evidence) -> Hits:
    """Per logged step with a critic explained variance (one of :data:`EV_KEYS`) and rows of that
    step with values and returns: ``1 − Var(G − V)/Var(G)`` over the step's whole batch vs the logged
    number; fires when they differ by more than ``ev_tol`` (averaging it per micro-batch is not the
    batch's)."""
    if not ev.metrics:
        return Hits(skipped="needs a run's metrics (a run folder, or --metrics FILE)")
    if ev.steps is None or not (ev.batch.has("values") and ev.batch.has("returns")):
        return Hits(skipped="needs rows with a step, values and returns")
    values, returns = ev.token("values"), ev.token("returns")
    off, compared = [], 0
    for rec in ev.metrics:
        key = next((k for k in EV_KEYS if isinstance(rec.get(k), (int, float))), None)
        step = rec.get("step", rec.get("iteration"))
        if key is None or step is None or not math.isfinite(rec[key]):
            continue
        rows = np.flatnonzero(ev.steps == step)
        if not len(rows):
            continue
        ok = ev.mask[rows] & np.isfinite(values[rows]) & np.isfinite(returns[rows])
        batch_ev = explained_variance(np.nan_to_num(returns[rows]), np.nan_to_num(values[rows]), ok)
        if not math.isfinite(batch_ev):
            continue
        compared += 1
        if abs(batch_ev - rec[key]) > ev.opt("ev_tol"):
            off.append((step, rec[key], batch_ev, rows))
    if not compared:
        return Hits(skipped="no logged explained variance matches a step of these rows")
    rows_hit = [i for *_, rows in off for i in rows]
    head = "; ".join(f"step {s}: logged {a:.3g}, over the batch {b:.3g}" for s, a, b, _ in off[:3])
    return Hits(
        rows=ev.ids(rows_hit), detail=f"{len(off)} of {compared} step(s) differ" + (f" ({head})" if head else "")
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "reward_on_observation",
        "verl #7278",
        "a reward on a token outside the loss mask",
        "move each reward to the last action token before it (mpo-viz convert does, and counts the moves)",
        reward_on_observation,
    ),
    Check(
        "return_dropped_before_observation",
        "verl #7278",
        "returns reset at an observation span: earlier turns get none",
        "carry the running return across masked tokens; recompute with mpo-viz advantages",
        return_dropped_before_observation,
    ),
    Check(
        "terminal_reward_on_masked_tail",
        "miles PR #1827",
        "the terminal reward lost or decayed on a masked tail",
        "run the recursion over action tokens only, with the reward on the last action token",
        terminal_reward_on_masked_tail,
    ),
    Check(
        "masked_values_read",
        "ROLL PR #447",
        "values on masked positions reach valid advantages",
        "mask the values before the advantage recursion (and never write NaN there)",
        masked_values_read,
    ),
    Check(
        "values_shifted",
        "VAGEN #33",
        "values shifted by one token against the mask",
        "align values[t] with the state before token t (the value head at position t-1)",
        values_shifted,
    ),
    Check(
        "flat_groups",
        "GRPO",
        "groups whose rewards are all equal carry no group-relative signal",
        "sample harder or easier tasks, larger groups, or drop flat groups (dynamic sampling)",
        flat_groups,
    ),
    Check(
        "missing_reward",
        "trajectory/v1",
        "rows without any reward",
        "log the outcome reward (or turn/token rewards) for every row",
        missing_reward,
    ),
    Check(
        "turn_collapse",
        "verl PR #4998",
        "the turn count collapses over the run's steps",
        "reward the tool use the task needs; watch turns per step",
        turn_collapse,
    ),
    Check(
        "explained_variance_per_microbatch",
        "RLinf PR #1297",
        "explained variance averaged per micro-batch",
        "compute 1 - Var(G - V)/Var(G) from sums over the whole batch",
        explained_variance_per_microbatch,
    ),
)


# ---------------------------------------------------------------------------- running them
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
    logged records; ``options``: thresholds of :data:`OPTIONS` by name."""
    for o in OPTIONS:
        if o.name in options:
            options[o.name] = o.check(options[o.name])
    unknown = set(options) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"diagnose: unknown option(s) {sorted(unknown)}; expected {sorted(_DEFAULTS)}")
    if steps is None and batch.has("step"):
        steps = np.array([math.nan if s is None else float(s) for s in batch.field("step")])
    ev = Evidence(batch, list(rejected) or list(batch.rejected), steps, metrics, options)
    out = []
    for c in checks:
        h = c.run(ev) if len(batch) or c.name == "reward_on_observation" else Hits(skipped="no valid row")
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


def merge_findings(a: Sequence[Finding], b: Sequence[Finding], max_examples: int = 3) -> list[Finding]:
    """The findings of two chunks of one file as one list (``a`` empty: ``b``): a check fired if it
    fired in either, ran if it ran in either; rows hit add up; examples and the measurement come
    from the first chunk that fired (else the first that ran). Checks that compare rows across the
    file (groups split between chunks, turn counts over steps) are judged chunk by chunk."""
    if not a:
        return list(b)
    out = []
    rank = {"fired": 2, "ok": 1, "skipped": 0}
    for x, y in zip(a, b):
        first = x if rank[x.status] >= rank[y.status] else y
        out.append(
            Finding(
                x.check,
                x.source,
                x.symptom,
                first.status,
                x.rows_hit + y.rows_hit,
                (x.examples + y.examples)[:max_examples] if first is x else (y.examples + x.examples)[:max_examples],
                first.detail,
                x.fix,
            )
        )
    return out


def examine(path, *, metrics=None, **options) -> tuple[list[Finding], TrajectoryBatch]:
    """Load ``path`` (a file, a folder, or a run folder with ``metrics.jsonl`` and ``trajectories/``)
    with ``errors="collect"`` and :func:`diagnose` it. A run folder's files give each row its step
    (the ``step`` column, else the file's ``iteration`` metadata); ``metrics`` (a path) overrides
    the run's ``metrics.jsonl``."""
    p = Path(path)
    run = p.is_dir() and (p / "metrics.jsonl").is_file() and (p / "trajectories").is_dir()
    if metrics is None and run:
        metrics = p / "metrics.jsonl"
    if metrics is not None and not Path(metrics).is_file():
        raise FileNotFoundError(f"metrics: expected a metrics.jsonl file, found no such file {str(metrics)!r}")
    records = read_metrics(metrics).records if metrics is not None else None
    # a run folder's files one by one (each knows its iteration); anything else at once (duplicates across files)
    parts = [load(f, errors="collect") for f in files_of(p / "trajectories")] if run else [load(p, errors="collect")]
    batch = TrajectoryBatch.concat(parts) if len(parts) > 1 else parts[0]
    rejected = [q for b in parts for q in b.rejected]
    steps = np.concatenate([_steps_of(b) for b in parts]) if parts else None
    return diagnose(batch, rejected=rejected, steps=steps, metrics=records, **options), batch


def _steps_of(b: TrajectoryBatch) -> np.ndarray:
    if b.has("step") and len(b):
        return np.array([math.nan if s is None else float(s) for s in b.field("step")])
    it = b.meta.get("iteration")
    return np.full(len(b), float(it) if isinstance(it, (int, float)) else math.nan)
