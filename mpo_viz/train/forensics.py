"""Collapse forensics: which collapse signature fired in a run folder, from which iteration, and the
episodes and turns behind it (``mpo-viz runs explain RUN_DIR``).

:func:`explain` reads ``metrics.jsonl`` and ``config.json``, runs :func:`~mpo_viz.train.collapse.collapse_flags`
on the lines as the trainer did (its thresholds, the loss's ``span_ratio``), and for each signature
that fired finds its first flagged iteration ``N`` (:func:`~mpo_viz.train.collapse.stretches`) and
the saved episodes that produced it: the first ``trajectories/iter=M`` with ``M >= T``, where

* ``T = N`` for ``success`` (the iteration's own rollout scored it);
* ``T = N - policy_lag`` for ``entropy`` and ``ratio_max`` (measured by the update of iteration
  ``N``, which trains on the rollout of ``policy_lag`` iterations before);
* ``T = N + 1`` for ``eval_success`` / ``eval_sampled_success`` (an evaluation line at ``N``
  scores the policy after ``N`` updates; iteration ``N + 1`` is the first rollout of that policy;
  without a later file, the file at ``N`` and a note saying it was sampled before the update).

The episodes and turns are ranked (:mod:`mpo_viz.analysis.ranking`) by what the saved file
carries that relates to the metric: success by the lowest reward; entropy by the lowest saved
``entropy``, else the lowest surprisal ``-log pi(a)`` of the sampled tokens; ``ratio_max`` by the
largest saved token ``ratio``, else the largest old-vs-rollout log-prob gap when the two differ,
else the largest ``|advantage|``. The text says which. :func:`explanation_text` writes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from mpo_viz.analysis.ranking import RANKINGS, available, episode_scores, rank_episodes, rank_turns
from mpo_viz.data.io import load
from mpo_viz.data.runfolder import RunFolder
from mpo_viz.losses import get_loss
from mpo_viz.train.collapse import SUCCESS_METRICS, Signal, collapse_flags, rule_text, stretches

__all__ = ["Finding", "Explanation", "explain", "explanation_text", "GAP_TOL"]

#: an old-vs-rollout log-prob gap below this everywhere means the two are one computation
GAP_TOL = 1e-4
#: metrics measured by the update (on the rollout ``policy_lag`` iterations before)
UPDATE_METRICS = ("entropy", "ratio_max")


@dataclass
class Finding:
    """One signature that fired: ``metric``, ``first`` (its first flagged iteration), ``spans``
    (``[(first, last)]`` iterations of each stretch of flagged lines), ``signal`` (the first
    :class:`~mpo_viz.train.collapse.Signal`), ``rule`` (in words), and the episodes behind it:
    ``episodes`` (the file, or None), ``episodes_iteration``, ``note`` (why that file, or why
    none), ``ranking`` (a name of :data:`~mpo_viz.analysis.ranking.RANKINGS`), ``ranking_why``,
    ``top_episodes`` / ``top_turns`` (tables of :func:`~mpo_viz.analysis.ranking.rank_episodes` /
    :func:`~mpo_viz.analysis.ranking.rank_turns`), ``n_episodes`` and ``tied`` (episodes sharing
    the best score)."""

    metric: str
    first: int
    spans: list[tuple]
    signal: Signal
    rule: str
    episodes: Path | None = None
    episodes_iteration: int | None = None
    note: str = ""
    ranking: str | None = None
    ranking_why: str = ""
    top_episodes: pd.DataFrame | None = None
    top_turns: pd.DataFrame | None = None
    n_episodes: int = 0
    tied: int = 0


@dataclass
class Explanation:
    """What :func:`explain` found in ``run_dir``: ``n_lines`` metrics lines read, ``loss`` (or
    None), ``span_ratio`` (whether the ratio_max rule was judged), ``saved`` (iterations with saved
    episodes) and one :class:`Finding` per signature that fired, in the order they first fired."""

    run_dir: Path
    n_lines: int
    loss: str | None
    span_ratio: bool
    saved: list[int]
    findings: list[Finding] = field(default_factory=list)


def _config(run: RunFolder) -> dict:
    if not run.config_path.is_file():
        return {}
    try:
        cfg = json.loads(run.config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{run.config_path}: expected a JSON object, found unreadable text ({exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{run.config_path}: expected a JSON object, found {type(cfg).__name__}")
    return cfg


def _span_ratio(loss: str | None) -> bool:
    if loss is None:
        return True
    try:
        return bool(get_loss(loss).span_ratio)
    except (KeyError, ValueError):
        return True  # a loss this installation does not know: judge the rule, as for a span-ratio loss


def explain(run_dir, *, top: int = 5, metric: str | None = None) -> Explanation:
    """The collapse forensics of a run folder (see the module docstring). ``top``: episodes and turns
    listed per signature; ``metric``: only that signature (it must have fired)."""
    if top < 1:
        raise ValueError(f"top: expected >= 1, found {top}")
    run = RunFolder(run_dir)
    if not run.metrics_path.is_file():
        raise ValueError(f"run_dir: expected a run folder with metrics.jsonl, found none in {str(run.path)!r}")
    records = run.metrics()
    cfg = _config(run)
    loss = cfg.get("loss")
    span = _span_ratio(loss)
    flags = collapse_flags(records, span_ratio=span)
    fired = list(dict.fromkeys(s.metric for fl in flags for s in fl))
    if metric is not None and metric not in fired:
        raise ValueError(
            f"metric: expected a signature that fired ({', '.join(fired) or 'none did'}), found {metric!r}"
        )
    files = run.trajectory_files()
    out = Explanation(run.path, len(records), loss, span, list(files))
    for m in [metric] if metric else fired:
        spans = stretches(records, flags, m)
        f = Finding(m, spans[0][0], [(a, b) for a, b, _ in spans], spans[0][2], rule_text(m))
        _episodes(f, files, _phase_of(records, flags, m), int(cfg.get("policy_lag") or 0), top)
        out.findings.append(f)
    return out


def _phase_of(records, flags, metric: str) -> str:
    """The phase of the first line flagged for ``metric``."""
    for rec, fl in zip(records, flags):
        if any(s.metric == metric for s in fl):
            return str(rec.get("phase", "rl"))
    return "rl"


def _target(f: Finding, phase: str, lag: int) -> tuple[int, str]:
    if f.metric in UPDATE_METRICS:
        return f.first - lag, (
            f"the rollout the update of iteration {f.first} trained on" + (f" (policy_lag {lag})" if lag else "")
        )
    if phase == "eval" or f.metric != "success":
        return f.first + 1, f"the first rollout of the policy the evaluation at iteration {f.first} scored"
    return f.first, f"the rollout that scored iteration {f.first}"


def _episodes(f: Finding, files: dict, phase: str, lag: int, top: int) -> None:
    """Fill ``f``'s episodes: the file, the ranking and the top tables."""
    target, what = _target(f, phase, lag)
    later = [it for it in files if it >= target]
    if later:
        it = later[0]
        f.note = (
            what if it == target else f"the next saved rollout: {what} is iteration {target}'s, which was not saved"
        )
    elif phase == "eval" and f.first in files:
        it = f.first
        f.note = (
            f"sampled before the update of iteration {it}, by the policy before it: the run saved no "
            f"episodes after iteration {it}"
        )
    else:
        saved = ", ".join(map(str, files)) or "none"
        f.note = (
            f"no saved episodes at or after iteration {target} (saved iterations: {saved}; see "
            f"save_trajectories_every and trajectories_max_mb)"
        )
        return
    f.episodes, f.episodes_iteration = files[it], it
    batch = load(files[it])
    f.ranking, f.ranking_why = _ranking(f.metric, batch)
    f.n_episodes = len(batch)
    s = episode_scores(batch, f.ranking)
    best = np.nanmin(s) if not RANKINGS[f.ranking].descending else np.nanmax(s)
    f.tied = int(np.sum(s == best))
    f.top_episodes = rank_episodes(batch, f.ranking, top=top)
    f.top_turns = rank_turns(batch, f.ranking, top=top) if f.ranking != "reward" or batch.has("advantages") else None


def _ranking(metric: str, batch) -> tuple[str, str]:
    """The ranking for ``metric`` on what ``batch`` carries, and why (empty when it is the first choice)."""
    have = available(batch)
    if metric in SUCCESS_METRICS:
        return "reward", ""
    if metric == "entropy":
        if "entropy" in have:
            return "entropy", ""
        return "surprisal", "the saved episodes carry no per-token entropy"
    if "ratio" in have:
        return "ratio", ""
    if "logprob_gap" in have:
        gap = float(np.nanmax(episode_scores(batch, "logprob_gap")))
        if gap > GAP_TOL:
            return "logprob_gap", "the saved episodes carry no per-token ratio"
        why = (
            f"the saved episodes carry no per-token ratio, and their old and rollout log-probs agree "
            f"(largest gap {gap:.2g})"
        )
    else:
        why = "the saved episodes carry no per-token ratio nor both old and rollout log-probs"
    return "abs_advantage", why + "; the tokens the update pushed hardest instead"


def _table(df: pd.DataFrame, score: str) -> str:
    t = df.drop(columns=["row"]).rename(columns={"score": score})
    return "\n".join("    " + line for line in t.to_string(index=False, float_format=lambda v: f"{v:.4g}").splitlines())


def explanation_text(e: Explanation) -> str:
    """:func:`explain`'s findings as text, one block per signature."""
    head = [
        f"run {e.run_dir}: {e.n_lines} metrics lines, loss {e.loss or 'unknown (no config.json)'}"
        + ("" if e.span_ratio else " (clips each token's own ratio: the ratio_max rule is not judged)")
    ]
    if not e.findings:
        return "\n".join(head + ["no collapse signature fired (see docs/training.md#when-a-run-collapses)"])
    head.append("collapse signatures fired: " + ", ".join(f.metric for f in e.findings))
    return "\n\n".join(["\n".join(head)] + [_finding_text(f) for f in e.findings])


def _finding_text(f: Finding) -> str:
    """One signature's block: the rule and first iteration, the file, the ranking, the top tables."""
    spans = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in f.spans)
    lines = [
        f"{f.metric}: first crossed its threshold at iteration {f.first} ({f.rule}); flagged on iterations {spans}",
        f"  {f.signal.message}",
    ]
    if f.episodes is None or f.ranking is None or f.top_episodes is None:
        return "\n".join(lines + [f"  episodes: {f.note}"])
    r = RANKINGS[f.ranking]
    lines.append(f"  episodes: {f.episodes} ({f.n_episodes} episodes of iteration {f.episodes_iteration}: {f.note})")
    lines.append(f"  ranked by {r.label}" + (f" ({f.ranking_why})" if f.ranking_why else ""))
    if f.tied > 1:
        lines.append(f"  {f.tied} episodes tie at the top score; ties keep the file's order")
    lines += [f"  top {len(f.top_episodes)} episodes:", _table(f.top_episodes, r.column)]
    if f.top_turns is not None:
        lines += [
            f"  top {len(f.top_turns)} turns by {r.turn_label}:",
            _table(f.top_turns, r.column if r.name != "reward" else "mean_adv"),
        ]
    return "\n".join(lines)
