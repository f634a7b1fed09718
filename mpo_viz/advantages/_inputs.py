"""Input handling shared by the fast estimators: conversion, dtype rule, validation, whitening.

Inputs may be torch tensors or numpy arrays (or nested lists) of shape ``(B, L)``. The compute
dtype is float64 when rewards or values arrive as float64, else float32; rewards, values and mask
are brought to it (no copy when they already are), turn ids to int64. Outputs are torch tensors in
that dtype, on the device of the first torch input (CPU when none).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache

import numba
import numpy as np
import torch

from mpo_viz.advantages import kernels as K
from mpo_viz.data.turns import turn_ids_from_mask
from mpo_viz.options import Option, interval

__all__ = [
    "Prepared",
    "prepare",
    "to_torch",
    "whiten_",
    "whiten_buffers",
    "whiten_reference",
    "merge_moments",
    "group_codes",
    "scalar_check",
    "WHITEN_SPANS",
    "ThreadClock",
    "rewrite_in_parallel",
]


def _to_numpy(x, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return x.numpy()
    try:
        return np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name}: expected a (B, L) array or tensor, found {type(x).__name__} ({exc})") from None


def _float_dtype(*arrays) -> np.dtype:
    for a in arrays:
        if a is not None and a.dtype == np.float64:
            return np.dtype(np.float64)
    return np.dtype(np.float32)


def _as(a: np.ndarray, dtype, name: str) -> np.ndarray:
    if a.dtype.kind not in "fiub":
        raise ValueError(f"{name}: expected a numeric array, found dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=dtype)


@dataclass
class Prepared:
    """Converted kernel inputs. ``values``/``turn_ids`` are empty ``(B, 0)`` arrays when unused."""

    rewards: np.ndarray
    values: np.ndarray
    mask: np.ndarray
    turn_ids: np.ndarray
    bootstrap: np.ndarray  # float64 (B,), NaN = terminal
    nturns: np.ndarray | None  # int64 (B,), set by validate()
    dtype: np.dtype
    device: torch.device
    originals: tuple  # (rewards, values, mask) as given, for messages
    check_values: bool
    check_turns: bool

    @property
    def shape(self) -> tuple[int, int]:
        return self.mask.shape

    def validate(self) -> np.ndarray:
        """Check every token; raise ``ValueError`` on the first bad row, else set and return ``nturns``."""
        B = self.shape[0]
        err_code = np.empty(B, dtype=np.int64)
        err_pos = np.empty(B, dtype=np.int64)
        nturns = np.empty(B, dtype=np.int64)
        K.validate_kernel(
            self.rewards,
            self.values,
            self.mask,
            self.turn_ids,
            int(self.check_values),
            int(self.check_turns),
            err_code,
            err_pos,
            nturns,
        )
        if err_code.any():
            row = int(np.flatnonzero(err_code)[0])
            r0, v0, m0 = self.originals
            _raise(int(err_code[row]), row, int(err_pos[row]), r0, v0, m0, self.turn_ids)
        self.nturns = nturns
        return nturns

    def check_bad(self, bad: np.ndarray) -> None:
        """After a fused kernel: raise the precise message if it flagged any row."""
        if bad.any():
            self.validate()
            row = int(np.flatnonzero(bad)[0])  # pragma: no cover - the validator always finds it
            raise AssertionError(f"internal: kernel flagged row {row} but validation found no problem")


def _device_of(*xs) -> torch.device:
    for x in xs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def prepare(
    rewards,
    mask,
    *,
    values=None,
    need_values: bool = False,
    turn_ids=None,
    need_turns: bool = False,
    bootstrap_value=None,
    validate: bool = True,
) -> Prepared:
    """Convert and validate estimator inputs; raise ``ValueError`` naming argument and first bad row.

    With ``validate=False`` only shapes and options are checked here: the caller runs a kernel that
    checks the tokens on the way and calls :meth:`Prepared.validate` when it reports a bad row
    (one pass over the data instead of two).

    Checks: shapes; mask entries 0/1; rewards finite on action tokens and exactly 0 on masked ones;
    values finite on action tokens (``need_values``); turn ids (``need_turns``; derived from the mask
    runs when ``None``) on action tokens: integers ≥ 0, non-decreasing, 0..K−1 with none skipped
    (ids on masked positions are ignored, whatever they are: −1 padding, NaN);
    ``bootstrap_value`` shaped ``(B,)`` (NaN = terminal).
    """
    device = _device_of(rewards, values, mask)
    m0 = _to_numpy(mask, "mask")
    if m0.ndim != 2:
        raise ValueError(f"mask: expected a 2-D (B, L) array, found shape {tuple(m0.shape)}")
    B, L = m0.shape
    r0 = _to_numpy(rewards, "rewards")
    if r0.shape != (B, L):
        raise ValueError(f"rewards: expected shape {(B, L)} (the mask's), found {tuple(r0.shape)}")
    v0 = None
    if need_values:
        if values is None:
            raise ValueError("values: this estimator needs critic values, found None")
        v0 = _to_numpy(values, "values")
        if v0.shape != (B, L):
            raise ValueError(f"values: expected shape {(B, L)} (the mask's), found {tuple(v0.shape)}")
    dtype = _float_dtype(r0, v0)
    r = _as(r0, dtype, "rewards")
    m = _as(m0, dtype, "mask")
    v = _as(v0, dtype, "values") if v0 is not None else np.empty((B, 0), dtype=dtype)
    tid = _turn_ids(turn_ids, m, B, L) if need_turns else np.empty((B, 0), dtype=np.int64)
    boot = _bootstrap(bootstrap_value, B)
    p = Prepared(r, v, m, tid, boot, None, dtype, device, (r0, v0, m0), bool(need_values), bool(need_turns))
    if validate:
        p.validate()
    return p


def _turn_ids(turn_ids, m: np.ndarray, B: int, L: int) -> np.ndarray:
    """Turn ids as int64 ``(B, L)``: derived from the mask runs when None; given ones must be integers
    on action tokens (NaN or -1 padding on masked ones is fine and becomes 0)."""
    if turn_ids is None:
        return np.ascontiguousarray(turn_ids_from_mask(m != 0), dtype=np.int64)
    t0 = _to_numpy(turn_ids, "turn_ids")
    if t0.shape != (B, L):
        raise ValueError(f"turn_ids: expected shape {(B, L)} (the mask's), found {tuple(t0.shape)}")
    if t0.dtype.kind == "f":  # only action tokens matter: NaN or -1 padding elsewhere is fine
        bad = (~np.isfinite(t0) | (t0 != np.round(t0))) & (m != 0)
        if bad.any():
            row = int(np.argmax(bad.any(1)))
            pos = int(np.argmax(bad[row]))
            raise ValueError(
                f"turn_ids: row {row}, position {pos}: expected an integer id on an action "
                f"token, found {_py(t0[row, pos])!r}"
            )
        t0 = np.where(m != 0, t0, 0.0)
    elif t0.dtype.kind not in "iub":
        raise ValueError(f"turn_ids: expected integer ids, found dtype {t0.dtype}")
    return np.ascontiguousarray(t0, dtype=np.int64)


def _bootstrap(bootstrap_value, B: int) -> np.ndarray:
    """The bootstrap values as float64 ``(B,)``: NaN (terminal) when None; no infinities."""
    if bootstrap_value is None:
        return np.full(B, np.nan)
    boot = np.ascontiguousarray(_to_numpy(bootstrap_value, "bootstrap_value"), dtype=np.float64)
    if boot.shape != (B,):
        raise ValueError(
            f"bootstrap_value: expected shape ({B},) (one per row, NaN = terminal), found {tuple(boot.shape)}"
        )
    if np.isinf(boot).any():
        row = int(np.argmax(np.isinf(boot)))
        raise ValueError(f"bootstrap_value: row {row}: expected a finite value or NaN (terminal), found {boot[row]}")
    return boot


def _py(x):
    return x.item() if isinstance(x, np.generic) else x


def _raise(code: int, row: int, pos: int, r, v, m, tid) -> None:
    at = f"row {row}, position {pos}"
    if code == K.E_MASK:
        raise ValueError(f"mask: {at}: expected 0 or 1, found {_py(m[row, pos])!r}")
    if code == K.E_TID_NEG:
        raise ValueError(f"turn_ids: {at}: expected ids >= 0 on action tokens, found {int(tid[row, pos])}")
    if code == K.E_TID_DEC:
        prev = int(np.flatnonzero(m[row, :pos] != 0)[-1])
        raise ValueError(
            f"turn_ids: {at}: expected non-decreasing ids on action tokens, found {int(tid[row, prev])} "
            f"(position {prev}) then {int(tid[row, pos])}"
        )
    if code == K.E_TID_FIRST:
        raise ValueError(f"turn_ids: {at}: expected the first action token in turn 0, found turn {int(tid[row, pos])}")
    if code == K.E_TID_SKIP:
        raise ValueError(
            f"turn_ids: {at}: expected consecutive turn ids on action tokens, found turn {int(tid[row, pos])} "
            "after a lower turn (a turn id with no action token)"
        )
    if code == K.E_REWARD_NONFINITE:
        raise ValueError(f"rewards: {at}: expected a finite reward on an action token, found {_py(r[row, pos])!r}")
    if code == K.E_VALUE_NONFINITE:
        raise ValueError(f"values: {at}: expected a finite value on an action token, found {_py(v[row, pos])!r}")
    if code == K.E_REWARD_MASKED:
        raise ValueError(
            f"rewards: {at}: expected 0 on a masked (observation/padding) token, found {_py(r[row, pos])!r} "
            "(rewards belong on action tokens; adapters move them there)"
        )
    raise AssertionError(f"unknown validation code {code}")  # pragma: no cover


def to_torch(a: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(a)
    return t if device.type == "cpu" else t.to(device)


#: Added to the variance before the square root when whitening (verl's ``masked_whiten``).
WHITEN_EPS = 1e-8


def whiten_reference(adv: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """In place over the ``mask == 1`` tokens: ``A ← (A − mean)/sqrt(var_unbiased + 1e-8)``.

    Masked positions stay 0. With fewer than two action tokens the variance is taken as 0. The
    readable form (numpy: gather, two-pass mean and variance, scatter) that :func:`whiten_` is
    tested against; the estimators use :func:`whiten_`.
    """
    sel = mask != 0
    n = int(sel.sum())
    if n == 0:
        return adv
    x = adv[sel].astype(np.float64)
    mean = x.mean()
    var = ((x - mean) ** 2).sum() / (n - 1) if n > 1 else 0.0
    adv[sel] = (x - mean) / np.sqrt(var + WHITEN_EPS)
    return adv


def merge_moments(moments: np.ndarray) -> tuple[int, float, float]:
    """The batch's ``(N, mean, std)`` from per-row statistics ``(n_i, mean_i, M2_i, …)`` (float64 ``(B, ≥3)``).

    Chan's pairwise merge: ``N = Σ n_i``, ``mean = Σ n_i·mean_i / N`` (computed as a shift, the
    first non-empty row's mean, plus the mean offset: a constant batch gives its constant exactly),
    ``M2 = Σ M2_i + Σ n_i (mean_i − mean)²``, ``std = sqrt(M2/(N − 1) + 1e-8)`` (variance 0 when
    ``N < 2``). ``N = 0`` gives ``(0, 0.0, 1.0)``.
    """
    n = moments[:, 0]
    total = float(n.sum())
    if total == 0:
        return 0, 0.0, 1.0
    mu = moments[:, 1]
    shift = float(mu[int(np.argmax(n > 0))])
    mean = shift + float((n * (mu - shift)).sum()) / total
    m2 = float(moments[:, 2].sum()) + float((n * (mu - mean) ** 2).sum())
    var = m2 / (total - 1) if total > 1 else 0.0
    return int(total), mean, math.sqrt(var + WHITEN_EPS)


#: spans of action tokens an estimator kernel records per row for the whitening rewrite (a row with
#: more is rewritten whole); 64 holds every row of the benchmark's rollouts (up to 40 turns)
WHITEN_SPANS = 64


def whiten_buffers(B: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What an estimator kernel writes for the fused whitening (``wh = 1``; module docstring of
    :mod:`mpo_viz.advantages.kernels`): the row moments ``wst`` float64 ``(B, 4)``, the spans
    ``wsp`` int32 ``(B, WHITEN_SPANS, 2)`` and their counts ``wsn`` int64 ``(B,)``."""
    return np.empty((B, 4)), np.empty((B, WHITEN_SPANS, 2), dtype=np.int32), np.empty(B, dtype=np.int64)


#: the whitening rewrite runs on every thread only when the estimator kernel just before it got at
#: least this share of numba's threads (:func:`rewrite_in_parallel`)
PARALLEL_SHARE = 0.75


class ThreadClock:
    """``with ThreadClock() as c: kernel(...)``: ``c.got``, the threads the kernel actually had on
    average (the process's CPU seconds over the wall seconds)."""

    got: float = math.inf

    def __enter__(self) -> ThreadClock:
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.got = (time.process_time() - self._cpu) / max(time.perf_counter() - self._wall, 1e-9)


def rewrite_in_parallel(got: float = math.inf) -> bool:
    """Whether the whitening rewrite should run on numba's threads (else in the calling thread).

    On all of them when there are several and the estimator kernel just before got at least
    :data:`PARALLEL_SHARE` of them (``got``, :class:`ThreadClock`). On a machine whose cores are
    busy with other work it did not: a parallel pass then waits for a thread the OS has not
    scheduled yet — milliseconds, more than the whole rewrite, which is bound by memory bandwidth —
    so the rewrite runs in the calling thread instead (measured at 512 × 8192 with two threads on
    two busy cores: whitened gae 1.46x the plain call with a parallel rewrite, 1.11x without). The
    numbers are the same either way."""
    n = numba.get_num_threads()
    return n > 1 and got >= PARALLEL_SHARE * n


def whiten_(
    adv: np.ndarray,
    mask: np.ndarray,
    moments: np.ndarray | None = None,
    spans: tuple[np.ndarray, np.ndarray] | None = None,
    parallel: bool | None = None,
) -> np.ndarray:
    """In place over the ``mask == 1`` tokens: ``A ← (A − mean)/sqrt(var_unbiased + 1e-8)``; returns ``adv``.

    Same map as :func:`whiten_reference` (masked positions keep their value, 0 for estimator
    outputs; < 2 action tokens: variance 0), computed in at most two parallel passes:
    ``moments`` (float64 ``(B, 4)``, per-row ``(n_i, mean_i, M2_i, end_i)``, see
    :mod:`mpo_viz.advantages.kernels`) when an estimator kernel produced them on the way
    (``wh = 1``; its masked outputs are 0; rows with ``M2_i < 0`` are recomputed here), else
    :func:`~mpo_viz.advantages.kernels.moments_kernel`; then :func:`merge_moments` and one
    rewrite of the action tokens (:func:`~mpo_viz.advantages.kernels.whiten_apply_kernel`),
    restricted to the spans ``(wsp, wsn)`` that hold them when the kernel recorded those.
    ``parallel``: the rewrite on numba's threads or in the calling thread (the same numbers; default
    :func:`rewrite_in_parallel` without a measurement: parallel when there are several threads).
    Shapes: adv, mask ``(B, L)``.
    """
    from_kernel = moments is not None
    B = adv.shape[0]
    wsp, wsn = spans if spans is not None else (np.empty((B, 0, 2), dtype=np.int32), np.full(B, -1, dtype=np.int64))
    if moments is None:
        moments = np.empty((B, 4))
        K.moments_kernel(adv, mask, moments)
    else:
        redo = np.flatnonzero(moments[:, 2] < 0)  # rows whose plain-sum M2 cancelled: exactly
        if redo.size:
            sub = np.empty((redo.size, 4))
            K.moments_kernel(np.ascontiguousarray(adv[redo]), np.ascontiguousarray(mask[redo]), sub)
            moments[redo] = sub
    n, mean, std = merge_moments(moments)
    if n > 0:
        rewrite = (
            K.whiten_apply_kernel
            if (rewrite_in_parallel() if parallel is None else parallel)
            else K.whiten_apply_serial
        )
        rewrite(adv, mask, mean, 1.0 / std, moments, int(from_kernel), wsp, wsn)
    return adv


def group_codes(group_ids, B: int, name: str = "group_ids") -> np.ndarray:
    """Integer codes 0..G−1 (first appearance order) for any array-like of strings or ints (B,)."""
    if isinstance(group_ids, torch.Tensor):
        group_ids = group_ids.detach().cpu().numpy()
    try:
        n = len(group_ids)
    except TypeError:
        raise ValueError(f"{name}: expected one id per row ({B}), found {type(group_ids).__name__}") from None
    if n != B:
        raise ValueError(f"{name}: expected {B} ids (one per row), found {n}")
    ids = list(group_ids)
    for i, g in enumerate(ids):
        if g is None or (isinstance(g, float) and np.isnan(g)):
            raise ValueError(f"{name}: row {i}: expected a group id, found {g!r}")
        if isinstance(g, np.ndarray) and g.ndim > 0:
            raise ValueError(f"{name}: row {i}: expected a scalar id (string or int), found an array")
    table: dict = {}
    codes = np.empty(B, dtype=np.int64)
    for i, g in enumerate(ids):
        key = g.item() if isinstance(g, np.generic) else g
        codes[i] = table.setdefault(key, len(table))
    return codes


def scalar_check(name: str, value, lo=None, hi=None, *, lo_open=False, hi_open=False) -> float:
    """A float option within bounds as a float, else :class:`~mpo_viz.checks.OptionError` (a
    ``ValueError``) naming it: the check of :class:`~mpo_viz.options.Option`, with the bounds
    written as the tensor functions give them (``[0.0, 1.0]``)."""
    _bounded(name, lo, hi, lo_open, hi_open).check(value)
    return float(value)


@lru_cache(maxsize=256)
def _bounded(name: str, lo, hi, lo_open: bool, hi_open: bool) -> Option:
    """The Option of a bounded float (built once: the estimators check their options on every call)."""
    words = f"a value in {interval(lo, hi, lo_open, hi_open, fmt=str)}"
    return Option(name, low=lo, high=hi, low_open=lo_open, high_open=hi_open, expect=words)
