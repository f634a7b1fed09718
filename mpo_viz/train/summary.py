"""What a run says to its user in the console, from its metrics records.

One line after SFT (:func:`sft_line`), after the critic warm-up (:func:`warmup_line`), per
iteration (:func:`progress_line`) and per evaluation (:func:`eval_line`); a collapse warning
(:func:`collapse_warning`); and at the end, did sampled and greedy success move, and if not, what
to look at.

Invariant: pure functions of metrics records (``metrics.jsonl`` lines, in order, or one of them):
nothing here reads a file, a model or a clock, so the console says what the metrics say.

:func:`success_moves` compares the first evaluation (iteration 0: the start, before any RL update)
with the last one, on the same fixed held-out tasks. A change counts as a move when it is more than
twice its standard error, ``se = sqrt(p0 (1 − p0) / n + p1 (1 − p1) / n)`` with ``n`` the
evaluation tasks (the binomial error of two independent rates: conservative for the paired tasks
here). :func:`hints` reads the run's RL lines for the usual reasons a run does not move;
:func:`summary_lines` puts both into the lines ``mpo-viz train`` ends with, and :func:`phase_line`
where the time went (:func:`phase_seconds`: the ``timings`` and ``seconds`` of every record, added
up by phase).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Move",
    "success_moves",
    "hints",
    "summary_lines",
    "value_target_line",
    "phase_seconds",
    "phase_line",
    "sft_line",
    "warmup_line",
    "progress_line",
    "eval_line",
    "collapse_warning",
    "WARMUP_CONSTANT_ADVICE",
    "DOCS_NOT_LEARNING",
    "MOVE_SE",
    "PHASES",
]

#: the docs section on runs that do not learn
DOCS_NOT_LEARNING = "docs/training.md#when-a-run-does-not-learn"
#: a move is a change of more than this many standard errors
MOVE_SE = 2.0
#: a mean approx_kl below this is a policy that barely moved (GRPO from the shipped start moves
#: sampled success by ~0.2 at approx_kl 1e-4 to 1e-3 per iteration)
APPROX_KL_STILL = 1e-5
_KINDS = (("sampled", "eval_sampled_success"), ("greedy", "eval_success"))
#: the phases of a run, in order, and the keys of its records' ``timings`` (each RL iteration's
#: ``rollout`` ... ``checkpoint``) and ``seconds`` (the SFT line's ``sft``/``eval``, the warm-up's
#: ``warmup_pool``/``warmup_fit``, each evaluation line's ``eval``) each adds up; ``rollout_oracle``
#: is a part of ``rollout``; ``after_update`` (what the update did, on saved iterations) counts as update
PHASES = (
    ("sft", ("sft",)),
    ("warm-up pool", ("warmup_pool",)),
    ("warm-up fit", ("warmup_fit",)),
    ("rollout", ("rollout",)),
    ("monte-carlo values", ("mc",)),
    ("values", ("values",)),
    ("advantages", ("advantages",)),
    ("update", ("update", "after_update")),
    ("eval", ("eval",)),
    ("write", ("write", "checkpoint")),
)


@dataclass(frozen=True)
class Move:
    """One success rate from the start to the end: ``kind`` (sampled, greedy), ``start``, ``end``,
    ``se`` (standard error of the change), ``n`` (tasks) and ``verdict`` (``"rose"``, ``"fell"``,
    ``"did not move"``)."""

    kind: str
    start: float
    end: float
    se: float
    n: int

    @property
    def change(self) -> float:
        return self.end - self.start

    @property
    def verdict(self) -> str:
        if abs(self.change) <= MOVE_SE * self.se:
            return "did not move"
        return "rose" if self.change > 0 else "fell"

    def text(self) -> str:
        return (
            f"{self.kind} success {self.start:.3f} -> {self.end:.3f} ({self.change:+.3f}, standard error "
            f"{self.se:.3f} on {self.n} tasks): {self.verdict}"
        )


def _evals(records) -> list[dict]:
    return [r for r in records if r.get("eval_success") is not None]


def success_moves(records) -> list[Move]:
    """Sampled and greedy success from the evaluation at iteration 0 to the last evaluation after
    it (empty when the run has no such pair)."""
    ev = _evals(records)
    start = next((r for r in ev if r.get("iteration") == 0), None)
    if start is None or ev[-1] is start or ev[-1].get("iteration", 0) == 0:
        return []
    end = ev[-1]
    out = []
    for kind, key in _KINDS:
        p0, p1 = start.get(key), end.get(key)
        n = int(end.get("n_eval_tasks") or start.get("n_eval_tasks") or 0)
        if p0 is None or p1 is None or n < 1:
            continue
        se = math.sqrt(p0 * (1 - p0) / n + p1 * (1 - p1) / n)
        out.append(Move(kind, float(p0), float(p1), se, n))
    return out


def _mean(records, key) -> float | None:
    vals = [r[key] for r in records if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return sum(vals) / len(vals) if vals else None


def hints(records) -> list[str]:
    """The usual reasons a run does not move, each naming the metric that shows it (in the order
    worth checking): a collapse flagged, a warm-up with nothing to learn or that missed its gate, a
    start that never succeeds, a policy that barely moved, a critic that explains little, few
    iterations."""
    rl = [r for r in records if r.get("phase") == "rl"]
    out = []
    flagged = sorted({m for r in records for m in (r.get("collapse") or [])})
    if flagged:
        out.append(
            f"collapse signatures were flagged ({', '.join(flagged)}): see docs/training.md#when-a-run-collapses"
        )
    warm = next((r for r in records if r.get("phase") == "critic_warmup"), None)
    if warm is not None and warm.get("warmup_constant") is not None:  # the pool's returns left nothing to learn
        out.append(
            f"the critic warm-up had nothing to learn (warmup_stop {warm.get('warmup_stop')}: the pool's "
            f"returns, or its held-out ones, were all equal) and set the critic to the constant "
            f"{warm['warmup_constant']:.4g}: a start that succeeds sometimes (more SFT), a larger pool "
            f"(--critic-warmup-episodes), or shaped rewards"
        )
    elif warm is not None and warm.get("warmup_passed") is False:
        ev = warm.get("warmup_explained_var")
        out.append(
            f"the critic warm-up missed its gate (warmup_explained_var {'undefined' if ev is None else f'{ev:.3f}'}"
            f" < {warm.get('warmup_gate')}): critic-based estimators ran on weak values; raise "
            f"--critic-warmup-steps or try --critic mc (the policy's own Monte-Carlo values)"
        )
    s = _mean(rl, "success")
    if s is not None and s < 0.05:
        out.append(
            f"almost no rollout succeeded (success {s:.3f} on average): RL has little to reinforce; start "
            f"from a stronger policy (more SFT, or --model-dir trajectories/starts/automation)"
        )
    kl = _mean(rl, "approx_kl")
    if kl is not None and kl < APPROX_KL_STILL:
        out.append(
            f"the policy barely moved per iteration (approx_kl {kl:.1e} on average): raise --policy-lr, "
            f"--epochs or --iterations"
        )
    ev = _mean(rl, "critic_explained_var")
    mc = any(isinstance(r.get("timings"), dict) and "mc" in r["timings"] for r in rl)  # critic="mc": no critic trained
    if ev is not None and ev < 0.1 and mc:
        out.append(
            f"the policy's Monte-Carlo values explain little of the returns (critic_explained_var {ev:.3f} on "
            f"average; no critic is trained with --critic mc): each is a mean of --mc-samples continuations, "
            f"so raise --mc-samples, or compare with a critic-free estimator (grpo)"
        )
    elif ev is not None and ev < 0.1:
        out.append(
            f"the critic explains little of the returns (critic_explained_var {ev:.3f} on average): a longer "
            f"warm-up, or a critic-free estimator (grpo) for comparison"
        )
    if 0 < len(rl) < 10:
        out.append(
            f"only {len(rl)} iterations: from the shipped start, sampled success needs ~16 iterations of "
            f"32 episodes to rise by ~0.2"
        )
    return out


#: what each ``value_target`` of the RL records means, in the summary's words
VALUE_TARGET_TEXT = {
    "estimator": "the estimator's own returns (value_target 'estimator')",
    "mc": "the Monte-Carlo returns (value_target 'mc')",
}


def value_target_line(records) -> str | None:
    """What the learned critic was trained on during RL (None when no critic was trained)."""
    seen = list(dict.fromkeys(r["value_target"] for r in records if r.get("phase") == "rl" and r.get("value_target")))
    if not seen:
        return None
    return "the critic trained on " + " then ".join(VALUE_TARGET_TEXT.get(t, repr(t)) for t in seen)


def phase_seconds(records) -> dict[str, float]:
    """Seconds per phase (:data:`PHASES`, in order; phases with no time left out) summed over the
    ``timings`` and ``seconds`` of ``records`` (metrics lines, or a trainer's ``history``)."""
    out = {}
    tables = [r[f] for r in records for f in ("timings", "seconds") if isinstance(r.get(f), dict)]
    for phase, keys in PHASES:
        total = sum(float(t[k]) for t in tables for k in keys if isinstance(t.get(k), (int, float)))
        if total > 0:
            out[phase] = total
    return out


def phase_line(records, wall: float | None = None) -> str:
    """``seconds per phase: sft 12.3, warm-up pool 8.1, ... (sum 61.0 of 64.2 s wall)``; with
    ``wall`` the rest (start-up, model loading, checkpoints before RL) is what the sum leaves."""
    sec = phase_seconds(records)
    if not sec:
        return "seconds per phase: none recorded"
    total = sum(sec.values())
    tail = f"sum {total:.1f} s" + (f" of {wall:.1f} s wall" if wall is not None else "")
    return "seconds per phase: " + ", ".join(f"{k} {v:.1f}" for k, v in sec.items()) + f" ({tail})"


def summary_lines(records) -> list[str]:
    """The end of a run in words: one line per success rate (start -> end, moved or not), what the
    learned critic trained on (:func:`value_target_line`) and, when neither rate rose, what to look
    at (:func:`hints`, and the docs section)."""
    moves = success_moves(records)
    if not moves:
        return ["no evaluation before and after RL to compare (eval_interval 0 and no iterations?)"]
    lines = [m.text() for m in moves]
    target = value_target_line(records)
    if target is not None:
        lines.append(target)
    if not any(m.verdict == "rose" for m in moves):
        found = hints(records)
        lines.append(
            "what to look at: "
            + ("; ".join(found) if found else "the curves of the dashboard")
            + f" (see {DOCS_NOT_LEARNING})"
        )
    return lines


def sft_line(rec: dict, start: Path | None) -> str:
    """The line after SFT: steps, greedy success against the target (a missed target said so, in
    the same line), and where the start was kept."""
    steps, succ, target = rec.get("sft_steps"), rec.get("sft_success", math.nan), rec.get("sft_target_success")
    if steps == 0:
        return f"sft: none needed, the start's greedy success {succ:.3f} already meets the target {target:g}"
    head = f"sft: {steps} steps, greedy success {succ:.3f}, loss {rec.get('sft_loss', math.nan):.3f}"
    if target is not None and not succ >= target:
        head += (
            f"; MISSED the target {target:g} (the budget of {steps} steps ended first): RL starts from a weak "
            f"policy; raise --sft-steps or start from a saved start (--model-dir)"
        )
    return head + (f"; start kept in {start} (--model-dir {start})" if start is not None else "")


#: what to do when the warm-up's pool taught the critic nothing but a constant (critic_fit.CONSTANT_STOPS)
WARMUP_CONSTANT_ADVICE = (
    "RL starts from a critic that predicts that constant, and critic-based advantages are then "
    "the bare returns; what helps: a start that succeeds sometimes (more SFT: --sft-steps, "
    "or --model-dir of a stronger start), a larger pool (--critic-warmup-episodes), or "
    "shaped rewards (per-turn rewards of the environment)"
)


def warmup_line(rec: dict) -> str:
    """The one line the critic warm-up ends with: the fit's summary (steps, held-out EV, why it
    stopped); when the pool's returns left nothing to learn, what happened and what to do."""
    steps, ev, stop = rec.get("warmup_steps"), rec.get("warmup_explained_var", math.nan), rec.get("warmup_stop")
    if stop == "constant":
        return (
            f"critic warm-up: stopped at once (0 steps): every return of the {rec.get('warmup_episodes')} pool "
            f"episodes is {rec.get('warmup_constant'):.4g}, so there is nothing for a critic to learn and the "
            f"gate cannot pass; the critic was set to that constant. {WARMUP_CONSTANT_ADVICE}"
        )
    if stop == "heldout_constant":
        return (
            f"critic warm-up: stopped at once (0 steps): the returns of the {rec.get('warmup_heldout_episodes')} "
            f"held-out pool episodes are all equal, so their explained variance is undefined and the gate "
            f"{rec.get('warmup_gate'):g} cannot pass; the critic was set to the training episodes' mean return "
            f"{rec.get('warmup_constant'):.4g}. {WARMUP_CONSTANT_ADVICE}"
        )
    return rec.get("warmup_summary") or f"critic fit: {steps} steps, held-out explained variance {ev:.3f}"


def progress_line(rec: dict, total: int | None = None) -> str:
    """One line per iteration for the shell and the log."""
    it = rec.get("iteration")
    head = f"iter {it}" + (f"/{total}" if total else "")
    bits = [
        head,
        f"success {rec.get('success', float('nan')):.3f}",
        f"reward {rec.get('reward_mean', float('nan')):+.3f}",
    ]
    if "eval_success" in rec:
        bits.append(f"eval {rec['eval_success']:.3f}")
    for k, fmt in (
        ("policy_loss", "{:+.4f}"),
        ("value_loss", "{:.4f}"),
        ("approx_kl", "{:.4f}"),
        ("clipfrac", "{:.3f}"),
        ("critic_explained_var", "{:.3f}"),
    ):
        if k in rec and rec[k] is not None:
            bits.append(f"{k} " + fmt.format(rec[k]))
    tm = rec.get("timings", {})
    if tm:
        bits.append(f"{tm.get('total', float('nan')):.1f}s")
    if rec.get("collapse"):
        since = rec.get("collapse_since") or [None] * len(rec["collapse"])
        bits.append(
            "collapse? "
            + ", ".join(m if it is None else f"{m} since iteration {it}" for m, it in zip(rec["collapse"], since))
        )
    return " | ".join(bits)


def eval_line(rec: dict, *, final: bool = False) -> str:
    """The console line of an evaluation's metrics line: the one before RL (iteration 0, with the
    number of tasks) or the ``final`` one (after the last iteration)."""
    if final:
        return f"final eval: sampled success {rec['eval_sampled_success']:.3f}, greedy {rec['eval_success']:.3f}"
    return (
        f"eval before RL: sampled success {rec['eval_sampled_success']:.3f}, greedy {rec['eval_success']:.3f} "
        f"({rec['n_eval_tasks']} tasks)"
    )


def collapse_warning(message: str, first: int, run_dir) -> str:
    """The console warning of a collapse signature a line newly shows: what it is, the iteration the run
    first flagged it at, and the command that lists the episodes behind it."""
    return f"warning: {message}; first flagged at iteration {first}, its episodes: mpo-viz runs explain {run_dir}"
