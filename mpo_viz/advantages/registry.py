"""String registry of estimators and ``compute(batch, name, **options)`` on a TrajectoryBatch.

Each entry declares what it *needs* from a batch (``values``, ``groups``, ``turns``, or any other
field name such as ``prompt_ids``) so callers can check a batch up front (:func:`missing`), and its
options (the estimator's keyword-only arguments with their defaults), which :func:`compute` fills in
and records in the result.

Register your own::

    @register("my_est", needs=("values",))
    def my_est(batch, *, scale=1.0):
        '''One line shown by ``describe()``.'''
        return adv, ret          # (B, L) tensors

"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from mpo_viz.advantages import group as G
from mpo_viz.advantages import token as T

__all__ = ["Estimator", "AdvantageResult", "register", "available", "get", "missing", "compute", "turn_table"]

# What each kind of need means and how to check it on a batch.
NEED_TEXT = {
    "values": "critic values per token (field 'values')",
    "groups": "group ids (field 'group_id') so trajectories of the same task can be compared",
    "turns": "turn structure (field 'turn_ids', or derived from loss_mask runs)",
    "prompt_ids": "prompt token ids (field 'prompt_ids')",
    "response_ids": "response token ids (field 'response_ids')",
}


def _has(batch, need: str) -> bool:
    if need == "values":
        return batch.has("values")
    if need == "groups":
        return batch.has("group_id")
    if need == "turns":
        return batch.has("loss_mask") or batch.has("turn_ids")
    return batch.has(need)


@dataclass(frozen=True)
class Estimator:
    """A registered estimator.

    Attributes:
        name: the registry name.
        fn: the callable doing the work, called as ``fn(*inputs(batch)[0], **inputs(batch)[1], **options)``.
        inputs: maps a batch to the ``(args, kwargs)`` taken from it (tensors, ids, ...).
        needs: what the batch must carry (see :data:`NEED_TEXT`).
        options: option name -> default (the keyword-only arguments of ``fn`` not taken from the batch).
        doc: the first line of ``fn``'s docstring.
    """

    name: str
    fn: Callable
    inputs: Callable
    needs: tuple[str, ...]
    options: dict
    doc: str = ""


_REGISTRY: dict[str, Estimator] = {}


def _options_of(fn: Callable, bound: tuple[str, ...]) -> dict:
    sig = inspect.signature(fn)
    return {
        p.name: p.default
        for p in sig.parameters.values()
        if p.kind == inspect.Parameter.KEYWORD_ONLY and p.name not in bound
    }


def register(name: str, *, needs: tuple[str, ...] = (), inputs: Callable | None = None,
             bound: tuple[str, ...] = ()):
    """Decorator registering ``fn`` under ``name``; raises ``ValueError`` if the name is taken.

    Without ``inputs`` the function is called as ``fn(batch, **options)``. With ``inputs``, a
    callable ``batch -> (args, kwargs)``, it is called as ``fn(*args, **kwargs, **options)``;
    ``bound`` lists the keyword names ``inputs`` supplies (they are not options).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, found {name!r}")

    def deco(fn: Callable) -> Callable:
        if name in _REGISTRY:
            raise ValueError(f"estimator {name!r} is already registered (by {_REGISTRY[name].fn.__module__}."
                             f"{_REGISTRY[name].fn.__qualname__}); pick another name")
        get_inputs = inputs if inputs is not None else (lambda b: ((b,), {}))
        doc = (inspect.getdoc(fn) or "").split("\n", 1)[0]
        _REGISTRY[name] = Estimator(name, fn, get_inputs, tuple(needs), _options_of(fn, bound), doc)
        return fn

    return deco


def available() -> list[str]:
    """Registered estimator names, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> Estimator:
    """The :class:`Estimator` registered as ``name`` (``ValueError`` listing the names if unknown)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"name: unknown estimator {name!r}; available: {', '.join(available())}") from None


def _check_batch(batch) -> None:
    from mpo_viz.trajectory import TrajectoryBatch

    if not isinstance(batch, TrajectoryBatch):
        raise ValueError(f"batch: expected a TrajectoryBatch (mv.load(...) or TrajectoryBatch.from_rows), found "
                         f"{type(batch).__name__}; on plain (B, L) tensors call the estimator function itself, "
                         f"e.g. mpo_viz.advantages.mae(rewards, values, mask, turn_ids=...)")


def missing(batch, name: str) -> list[str]:
    """What the batch lacks for estimator ``name`` (empty when it can run)."""
    _check_batch(batch)
    return [n for n in get(name).needs if not _has(batch, n)]


@dataclass
class AdvantageResult:
    """What :func:`compute` returns.

    Attributes:
        name: the estimator's registry name.
        advantages: float32/float64 tensor ``(B, L)``, 0 on masked positions.
        returns: critic targets ``(B, L)`` (the estimator's ``returns``), 0 on masked positions.
        turns: one row per assistant turn: ``traj_id``, ``group_id``, ``turn``, ``n_tokens``,
            ``turn_reward`` (R_k), ``turn_value`` (V(s_k) per ``value_at``; NaN without values),
            ``turn_advantage`` (mean advantage over the turn's action tokens *before whitening* —
            A^T_k for mae and turn_gae whatever ``whiten`` is, in the units of ``turn_reward`` and
            ``turn_value``; with ``whiten=True`` the token ``advantages`` are whitened and a turn's
            mean of them is ``(turn_advantage − μ)/σ``, μ and σ the mean and std of the unwhitened
            advantages over the batch's action tokens), ``turn_return`` (mean return over the
            turn's action tokens).
        options: every option used, defaults filled in.
        wall_time_s: seconds for the whole call.
        timings: seconds per phase: ``inputs`` (batch → tensors), ``estimate``, ``turn_table``
            (with ``whiten=True`` it includes a second, unwhitened estimate for ``turns``).
        traj_ids: the batch's trajectory ids, row order.
    """

    name: str
    advantages: torch.Tensor
    returns: torch.Tensor
    turns: pd.DataFrame
    options: dict
    wall_time_s: float
    timings: dict = field(default_factory=dict)
    traj_ids: list = field(default_factory=list)

    def attach(self, batch, *, advantages: str = "advantages", returns: str = "returns"):
        """``batch.with_token_fields`` with these advantages and returns under the given names."""
        return batch.with_token_fields(**{advantages: self.advantages, returns: self.returns})

    def __repr__(self) -> str:
        B, L = tuple(self.advantages.shape)
        return (f"AdvantageResult({self.name!r}, B={B}, L={L}, turns={len(self.turns)}, "
                f"wall_time_s={self.wall_time_s:.4f}, options={self.options})")


def turn_table(batch, advantages, returns, *, value_at: str = "first") -> pd.DataFrame:
    """One row per assistant turn of ``batch`` with the turn's reward, value, mean advantage and
    mean return (columns as :class:`AdvantageResult.turns`)."""
    m = batch.mask.numpy() != 0
    tid = batch.turn_ids.numpy()
    rows, cols = np.nonzero(m)
    k = tid[rows, cols]
    if len(rows):
        first = np.r_[True, (rows[1:] != rows[:-1]) | (k[1:] != k[:-1])]
    else:
        first = np.zeros(0, dtype=bool)
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(rows)] - 1
    n = np.diff(np.r_[starts, len(rows)])

    def per_turn_sum(x):
        return np.add.reduceat(x, starts) if len(starts) else np.zeros(0)

    rew = batch.padded("rewards", torch.float64).numpy()[rows, cols]
    a = advantages.detach().cpu().double().numpy()[rows, cols]
    g = returns.detach().cpu().double().numpy()[rows, cols]
    if batch.has("values"):
        v = batch.values.double().numpy()[rows, cols]
        if value_at == "last":
            tv = v[ends]
        elif value_at == "mean":
            tv = per_turn_sum(v) / n
        else:
            tv = v[starts]
    else:
        tv = np.full(len(starts), np.nan)
    trow = rows[starts]
    traj = np.asarray(batch.traj_ids, dtype=object)
    grp = np.asarray(batch.group_ids, dtype=object)
    return pd.DataFrame({
        "traj_id": traj[trow] if len(trow) else np.zeros(0, dtype=object),
        "group_id": grp[trow] if len(trow) else np.zeros(0, dtype=object),
        "turn": k[starts],
        "n_tokens": n,
        "turn_reward": per_turn_sum(rew),
        "turn_value": tv,
        "turn_advantage": per_turn_sum(a) / np.maximum(n, 1),
        "turn_return": per_turn_sum(g) / np.maximum(n, 1),
    })


def compute(batch, name: str, **options) -> AdvantageResult:
    """Run estimator ``name`` on a TrajectoryBatch; returns an :class:`AdvantageResult`.

    Checks up front that the batch carries what the estimator needs (``ValueError`` naming what is
    missing) and that every option is known (``ValueError`` listing the valid ones).
    """
    t0 = time.perf_counter()
    est = get(name)
    lacks = missing(batch, name)
    if lacks:
        what = "; ".join(f"{n}: {NEED_TEXT.get(n, f'field {n!r}')}" for n in lacks)
        alt = [e for e in available() if not [n for n in _REGISTRY[e].needs if not _has(batch, n)]]
        raise ValueError(f"estimator {name!r} needs what this batch lacks — {what}. "
                         f"Estimators this batch supports: {', '.join(alt) or 'none'}")
    if "values" in est.needs:
        no_values = [i for i, v in enumerate(batch.field("values")) if v is None]
        if no_values:
            i = no_values[0]
            raise ValueError(f"values: row {i} (traj_id {batch.traj_ids[i]!r}) has no critic values; estimator "
                             f"{name!r} needs them on every row ({len(no_values)} rows lack them)")
    unknown = [o for o in options if o not in est.options]
    if unknown:
        raise ValueError(f"options: estimator {name!r} has no option {', '.join(map(repr, unknown))}; "
                         f"valid options: {', '.join(est.options) or 'none'}")
    used = {**est.options, **options}
    args, kwargs = est.inputs(batch)
    t1 = time.perf_counter()
    adv, ret = est.fn(*args, **kwargs, **used)
    t2 = time.perf_counter()
    raw = adv
    if used.get("whiten"):  # the per-turn table keeps the estimator's own units (A^T_k), not whitened ones
        raw, _ = est.fn(*args, **kwargs, **{**used, "whiten": False})
    turns = turn_table(batch, raw, ret, value_at=used.get("value_at", "first"))
    t3 = time.perf_counter()
    return AdvantageResult(
        name=name, advantages=adv, returns=ret, turns=turns, options=used, wall_time_s=t3 - t0,
        timings={"inputs": t1 - t0, "estimate": t2 - t1, "turn_table": t3 - t2},
        traj_ids=list(batch.traj_ids),
    )


# ----------------------------------------------------------------------------- built-in estimators

def _critic_inputs(b):
    return (b.rewards, b.values, b.mask), {"bootstrap_value": b.bootstrap_value}


def _turn_inputs(b):
    return (b.rewards, b.values, b.mask), {"bootstrap_value": b.bootstrap_value, "turn_ids": b.turn_ids}


def _group_inputs(b):
    return (b.rewards, b.mask, b.group_ids), {}


def _gigpo_inputs(b):
    return (b.rewards, b.mask, b.group_ids), {
        "turn_ids": b.turn_ids, "prompt_ids": b.field("prompt_ids"), "response_ids": b.field("response_ids"),
    }


_TURN_BOUND = ("bootstrap_value", "turn_ids")
register("gae", needs=("values",), inputs=_critic_inputs, bound=("bootstrap_value",))(T.gae)
register("vapo", needs=("values",), inputs=_critic_inputs, bound=("bootstrap_value",))(T.vapo)
register("turn_gae", needs=("values", "turns"), inputs=_turn_inputs, bound=_TURN_BOUND)(T.turn_gae)
register("mae", needs=("values", "turns"), inputs=_turn_inputs, bound=_TURN_BOUND)(T.mae)
register("mpo", needs=("values", "turns"), inputs=_turn_inputs, bound=_TURN_BOUND)(T.mae)
register("grpo", needs=("groups",), inputs=_group_inputs)(G.grpo)
register("drgrpo", needs=("groups",), inputs=_group_inputs)(G.drgrpo)
register("rloo", needs=("groups",), inputs=_group_inputs)(G.rloo)
register("reinforce_pp", inputs=lambda b: ((b.rewards, b.mask), {}))(G.reinforce_pp)
register("reinforce_pp_baseline", needs=("groups",), inputs=_group_inputs)(G.reinforce_pp_baseline)
register("gigpo", needs=("groups", "turns", "prompt_ids", "response_ids"), inputs=_gigpo_inputs,
         bound=("turn_ids", "prompt_ids", "response_ids"))(G.gigpo)
