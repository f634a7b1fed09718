"""Collapse signatures in a run's metrics stream: one pure function the trainer calls per line.

:func:`collapse_flags` reads the ``metrics.jsonl`` records of a run in order and returns, for each,
the collapse signatures it shows (a list of :class:`Signal`, empty for a healthy line):

* ``success`` (and ``eval_sampled_success``, ``eval_success``) — the value fell to ~0
  (``<= SUCCESS_FLOOR``) after an earlier line of the same metric reached a healthy level
  (``>= SUCCESS_HEALTHY``);
* ``entropy`` — the policy's mean per-token entropy fell below ``ENTROPY_FRACTION`` of its first
  RL value while the rollout success is no higher than it was then (a policy that became sure of
  itself without getting better);
* ``ratio_max`` — a token's importance ratio is far outside the turn's (``ratio_max >=
  RATIO_FAR``) while the turn ratio sits in its clip (``turn_ratio_max <= TURN_RATIO_IN_CLIP``):
  the bare turn-level trust region letting single tokens move freely. Judged only for a loss
  whose clip acts on a span's ratio (``span_ratio``: turn_ppo, gspo); under token_ppo each token's
  own ratio is clipped and a large ``ratio_max`` is no such sign.

The thresholds are module constants (keyword arguments of :func:`collapse_flags`; :func:`rule_text`
says each rule with them in words). The trainer marks a line (:func:`mark_line`) with
``"collapse": [metric, ...]`` and ``"collapse_since": [iteration, ...]`` (where each signature's
stretch of flagged lines began, :func:`stretches`) and warns in the console when a signature
appears (:func:`new_signals`);
``mpo-viz runs explain RUN`` (:mod:`mpo_viz.train.forensics`) names the first iteration of each and
the episodes behind it; docs/training.md, section "When a run collapses", says what to read and try.

Invariant: a line's flags depend on it and the lines before it only, so the marks written while
the run goes are the ones a later reading of the whole stream gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Signal", "collapse_flags", "new_signals", "stretches", "mark_line", "rule_text", "DOCS", "SUCCESS_METRICS"]

#: where the reader is sent
DOCS = "docs/training.md#when-a-run-collapses"
#: success metrics watched, in the order they are reported
SUCCESS_METRICS = ("success", "eval_sampled_success", "eval_success")
SUCCESS_HEALTHY = 0.2
SUCCESS_FLOOR = 0.05
ENTROPY_FRACTION = 0.1
#: a single token's ratio this far out (in the v2 grid, healthy runs with the token band reached
#: ratio_max 3.5-14; the collapsed ones 27, 37 and 113; at 10 the check fired on runs that learned)
RATIO_FAR = 20.0
TURN_RATIO_IN_CLIP = 1.5


@dataclass(frozen=True)
class Signal:
    """One collapse signature of one line: the ``metric`` that shows it, its ``value``, the
    ``reference`` it is compared with, and the console ``message`` (naming the metric and the docs)."""

    metric: str
    value: float
    reference: float
    message: str


def _num(rec: dict, key: str) -> float | None:
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _message(it, what: str) -> str:
    return f"collapse? iteration {it}: {what}; see {DOCS}"


def collapse_flags(
    records,
    *,
    healthy: float = SUCCESS_HEALTHY,
    floor: float = SUCCESS_FLOOR,
    entropy_fraction: float = ENTROPY_FRACTION,
    ratio_far: float = RATIO_FAR,
    turn_in_clip: float = TURN_RATIO_IN_CLIP,
    span_ratio: bool = True,
) -> list[list[Signal]]:
    """The collapse signatures of each record of ``records`` (metrics.jsonl lines, in order), read
    with what the records before it showed; see the module docstring for the three rules. A metric
    absent from a line (or null) is not judged on that line. ``span_ratio=False`` (a loss that clips
    each token's own ratio) turns the ``ratio_max`` rule off."""
    best: dict[str, float] = {}
    start: dict[str, float] = {}
    out = []
    for rec in records:
        it = rec.get("iteration")
        flags = []
        for key in SUCCESS_METRICS:
            v = _num(rec, key)
            if v is None:
                continue
            b = best.get(key, -math.inf)
            if b >= healthy and v <= floor:
                flags.append(Signal(key, v, b, _message(it, f"{key} fell to {v:.3f} from {b:.3f}")))
            best[key] = max(b, v)
        ent, succ = _num(rec, "entropy"), _num(rec, "success")
        if ent is not None and rec.get("phase", "rl") == "rl":
            start.setdefault("entropy", ent)
            if succ is not None:
                start.setdefault("success", succ)
            e0, s0 = start["entropy"], start.get("success", math.inf)
            if e0 > 0 and ent < entropy_fraction * e0 and (succ is None or succ <= s0):
                flags.append(
                    Signal(
                        "entropy",
                        ent,
                        e0,
                        _message(
                            it,
                            f"entropy fell to {ent:.4f} from {e0:.4f} at the first iteration, with no gain in success",
                        ),
                    )
                )
        r, tr = _num(rec, "ratio_max"), _num(rec, "turn_ratio_max")
        if span_ratio and r is not None and tr is not None and r >= ratio_far and tr <= turn_in_clip:
            flags.append(
                Signal(
                    "ratio_max",
                    r,
                    tr,
                    _message(
                        it,
                        f"ratio_max {r:.1f} while turn_ratio_max is {tr:.2f}: single tokens move far while the turn "
                        f"ratio sits in its clip",
                    ),
                )
            )
        out.append(flags)
    return out


def new_signals(records, *, span_ratio: bool = True, flags: list[list[Signal]] | None = None) -> list[Signal]:
    """The signatures of the last record that the previous record carrying the same metric did not
    already show: what the console warns about, once per stretch of collapse. ``flags``: the
    records' :func:`collapse_flags`, when the caller has them already."""
    flags = collapse_flags(records, span_ratio=span_ratio) if flags is None else flags
    if not flags:
        return []
    return [s for s in flags[-1] if not _flagged_before(records[:-1], flags[:-1], s.metric)]


def _flagged_before(records, flags, metric: str) -> bool:
    """Whether the last of ``records`` that carries ``metric`` was flagged for it."""
    for rec, fl in zip(reversed(records), reversed(flags)):
        if _num(rec, metric) is not None:
            return any(s.metric == metric for s in fl)
    return False


def stretches(records, flags: list[list[Signal]], metric: str) -> list[tuple]:
    """The stretches of lines flagged for ``metric``: ``[(first iteration, last iteration,
    first Signal), ...]`` in order. Lines that do not carry the metric neither extend nor break a
    stretch (an iteration line between two evaluation lines), as :func:`new_signals` reads them."""
    out: list[tuple] = []
    open_ = False
    for rec, fl in zip(records, flags):
        if _num(rec, metric) is None:
            continue
        hit = next((s for s in fl if s.metric == metric), None)
        if hit is None:
            open_ = False
        elif open_:
            out[-1] = (out[-1][0], rec.get("iteration"), out[-1][2])
        else:
            out.append((rec.get("iteration"), rec.get("iteration"), hit))
            open_ = True
    return out


def mark_line(rec: dict, earlier, *, span_ratio: bool = True) -> list[tuple[str, int]]:
    """Mark the new line ``rec`` (read after the run's ``earlier`` lines) with the signatures it shows:
    ``rec["collapse"]`` (their metrics) and ``rec["collapse_since"]`` (where each one's stretch of
    flagged lines began). Returns ``(message, first iteration the run ever flagged it at)`` of each
    signature the previous line did not show (:func:`new_signals`): what the console warns about."""
    stream = list(earlier) + [rec]
    flags = collapse_flags(stream, span_ratio=span_ratio)
    if flags[-1]:
        rec["collapse"] = [f.metric for f in flags[-1]]
        rec["collapse_since"] = [stretches(stream, flags, m)[-1][0] for m in rec["collapse"]]
    return [(f.message, stretches(stream, flags, f.metric)[0][0]) for f in new_signals(stream, flags=flags)]


def rule_text(metric: str) -> str:
    """The rule that flags ``metric``, with the thresholds :func:`collapse_flags` uses by default."""
    if metric in SUCCESS_METRICS:
        return f"{metric} <= {SUCCESS_FLOOR:g} after an earlier line reached >= {SUCCESS_HEALTHY:g}"
    if metric == "entropy":
        return (
            f"entropy < {ENTROPY_FRACTION:g} x its first RL value, with success no higher than at that first iteration"
        )
    if metric == "ratio_max":
        return f"ratio_max >= {RATIO_FAR:g} while turn_ratio_max <= {TURN_RATIO_IN_CLIP:g} (a span-ratio loss)"
    raise ValueError(
        f"metric: expected one of {', '.join((*SUCCESS_METRICS, 'entropy', 'ratio_max'))}, found {metric!r}"
    )
