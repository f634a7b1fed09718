"""A grid's records from its run folders (or their archive): per-iteration rows, final rows, the
pre-registered comparisons, summaries, markdown tables and figures.

Invariant: the records are a pure function of the run folders and the archive, so ``--report-only``
into a fresh folder rebuilds the committed tables byte for byte.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from scipy import stats as sps

from experiments.grids import (
    COLLAPSE_AFTER,
    COLLAPSE_LEVEL,
    COLOURS,
    SIZES,
    comparisons_of,
    plan,
    uses_warmup,
)
from experiments.runner import (
    archived,
    credit_accuracy,
    run_dir,
    run_state,
    warm_dir,
    write_atomic,
)
from experiments.stats import (
    finite_or_none,
    holm,
    ms_change,
    paired_half,
    paired_test,
)
from mpo_viz.data.runfolder import read_metrics
from mpo_viz.train import Config


def start_table(recs: list[dict]) -> str:
    """Markdown: the start's success per seed and the mean with its 95% t-interval over seeds."""
    lines = ["| cell | start | seed | greedy success | sampled success |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['cell']} | {r['start']} | {r['seed']} | {r['greedy_success']:.3f} | {r['sampled_success']:.3f} |"
        for r in recs
    ]
    for cell in dict.fromkeys(r["cell"] for r in recs):
        rs = [r for r in recs if r["cell"] == cell]
        g, smp = (paired_test([r[k] for r in rs]) for k in ("greedy_success", "sampled_success"))
        lines.append(
            f"| {cell} | mean of {len(rs)} (95% CI) | – | {fmt(g['mean_diff'])} ({fmt(g['ci_low'])} to "
            f"{fmt(g['ci_high'])}) | {fmt(smp['mean_diff'])} ({fmt(smp['ci_low'])} to {fmt(smp['ci_high'])}) |"
        )
    return "\n".join(lines)


def collapsed(recs: list[dict]) -> bool:
    """Rollout (sampled) success below :data:`COLLAPSE_LEVEL` at any RL iteration after the 4th."""
    return any(
        r.get("phase") == "rl" and r["iteration"] > COLLAPSE_AFTER and r.get("success", 1.0) < COLLAPSE_LEVEL
        for r in recs
    )


def critic_target(cfg) -> str | None:
    """What the values an arm's estimator reads are fitted to or come from: the learned critic's
    ``value_target`` (``mc`` / ``estimator``), ``policy_mc`` (critic="mc": the policy's own
    Monte-Carlo values, no critic), ``expert`` (the scripted expert's exact values), None (no critic)."""
    if not cfg.uses_critic:
        return None
    if cfg.critic == "learned":
        return cfg.critic_option("value_target")
    return {"mc": "policy_mc", "expert": "expert"}[cfg.critic]


def run_records(out: Path, archive: Path | None, cell: str, arm: str, seed: int, iterations: int):
    """``(folder, state, warmup.json path, credit by iteration or None)`` of one planned run: its
    run folder when that has metrics, else its archive folder (state ``done``), else None."""

    d = run_dir(out, cell, arm, seed)
    if read_metrics(d / "metrics.jsonl").records:
        return d, run_state(d, iterations), warm_dir(out, cell, seed) / "warmup.json", None
    a = run_dir(archive, cell, arm, seed) if archive is not None else None
    if not archived(a):
        return None
    credit = {}
    if (a / "credit.jsonl").is_file():
        for line in (a / "credit.jsonl").read_text().splitlines():
            r = json.loads(line)
            credit[int(r.pop("iteration"))] = r
    return a, "done", a / "warmup.json", credit


def collect(size: str, out: Path, archive: Path | None = None) -> tuple[list[dict], list[dict]]:
    """``(rows, finals)``: one row per (cell, arm, seed, iteration 0..N) of every run folder (or,
    where the folder is gone, its archived records), and one row per finished run."""

    rows, finals = [], []
    iters = SIZES[size]["iterations"]
    for cell, seed, arm in plan(size):
        found = run_records(out, archive, cell, arm, seed, iters)
        if found is None:
            continue
        d, state, warm, credit = found
        recs = read_metrics(d / "metrics.jsonl").records
        cfg = Config.load(d / "config.json")
        coll = collapsed(recs)
        wrec = json.loads(warm.read_text()) if warm.is_file() and uses_warmup(arm) else {}
        by_it: dict[int, dict] = {}
        for r in recs:
            if r.get("phase") in ("rl", "eval"):
                by_it.setdefault(int(r["iteration"]), {}).update(r)
        for it in sorted(by_it):
            r = by_it[it]
            row = {
                "cell": cell,
                "method": arm,
                "seed": seed,
                "iteration": it,
                "sampled_success": finite_or_none(r.get("eval_sampled_success")),
                "greedy_success": finite_or_none(r.get("eval_success")),
                "n_eval_tasks": r.get("n_eval_tasks"),
                "eval_seed": r.get("eval_seed", cfg.eval_key),
                "rollout_success": finite_or_none(r.get("success")),
                "critic_explained_var": finite_or_none(r.get("critic_explained_var")),
                "values_across_within_ratio": finite_or_none(r.get("values_across_within_ratio")),
                "oracle_across_within_ratio": finite_or_none(r.get("oracle_across_within_ratio")),
                "approx_kl": finite_or_none(r.get("approx_kl")),
                "ratio_max": finite_or_none(r.get("ratio_max")),
                "turn_ratio_max": finite_or_none(r.get("turn_ratio_max")),
                "clipfrac": finite_or_none(r.get("clipfrac")),
                "entropy": finite_or_none(r.get("entropy")),
                "collapsed": coll,
                "run_state": state,
                "value_target": cfg.critic_option("value_target") if cfg.learns_critic else None,
                "critic_target": critic_target(cfg),
                "config_hash": cfg.hash(),
            }
            if it == 0 and wrec:  # before RL: the warm-up's held-out fit
                row["critic_explained_var"] = finite_or_none(wrec.get("warmup_explained_var"))
                row["values_across_within_ratio"] = finite_or_none(wrec.get("warmup_values_across_within_ratio"))
            traj = d / "trajectories" / f"iter={it:06d}.parquet"
            if credit is not None:
                row.update(credit.get(it, {}))
            elif traj.is_file():
                row.update({k: finite_or_none(v) for k, v in credit_accuracy(traj).items()})
            rows.append(row)
        pk_path = d / "pass_at_k.json"
        if state == "done":
            ev = [by_it[i] for i in sorted(by_it) if "eval_sampled_success" in by_it[i]]
            finals.append(
                {
                    "cell": cell,
                    "method": arm,
                    "seed": seed,
                    "start_sampled": ev[0]["eval_sampled_success"],
                    "start_greedy": ev[0]["eval_success"],
                    "final_sampled": ev[-1]["eval_sampled_success"],
                    "final_greedy": ev[-1]["eval_success"],
                    "collapsed": coll,
                    "warmup_explained_var": finite_or_none(wrec.get("warmup_explained_var")),
                    "warmup_stop": wrec.get("warmup_stop"),
                    "value_target": cfg.critic_option("value_target") if cfg.learns_critic else None,
                    "critic_target": critic_target(cfg),
                    "approx_kl": finite_or_none(
                        float(
                            np.nanmean(
                                [finite_or_none(r.get("approx_kl")) for r in recs if r.get("phase") == "rl"]
                                or [math.nan]
                            )
                        )
                    ),
                    **json.loads(pk_path.read_text()),
                }
            )
    return rows, finals


def compare(size: str, finals: list[dict]) -> list[dict]:
    """The pre-registered comparisons of final held-out sampled success, paired by seed, per cell."""
    f = {(r["cell"], r["method"], r["seed"]): r for r in finals}
    out = []
    for cell in SIZES[size]["cells"]:
        rows = []
        for label, a, b in comparisons_of(size):
            seeds = [s for s in SIZES[size]["seeds"] if (cell, a, s) in f and (cell, b, s) in f]
            diff = [f[(cell, a, s)]["final_sampled"] - f[(cell, b, s)]["final_sampled"] for s in seeds]
            rows.append(
                {
                    "cell": cell,
                    "comparison": label,
                    "a": a,
                    "b": b,
                    "paired_seeds": len(seeds),
                    "diffs": diff,
                    **paired_test(diff),
                }
            )
        for r, ph in zip(rows, holm([r["p_value"] for r in rows])):
            r["p_holm"] = ph
            r["comparisons"] = len(comparisons_of(size))
            if r["paired_seeds"] == 0:
                r["verdict"] = "not run"
            elif math.isfinite(ph) and ph < 0.05:
                r["verdict"] = f"{r['a'] if r['mean_diff'] > 0 else r['b']} higher (Holm p < 0.05)"
            else:
                r["verdict"] = "no difference shown (Holm p >= 0.05)"
        out += rows
    return out


def summarize(size: str, finals: list[dict]) -> list[dict]:
    """Per cell and arm: mean and 95% t-interval of the final sampled success over seeds, the start,
    the change, greedy, pass@1 and pass@8, collapses."""
    out = []
    for cell in SIZES[size]["cells"]:
        for arm in SIZES[size]["arms"]:
            rs = [r for r in finals if r["cell"] == cell and r["method"] == arm]
            if not rs:
                continue

            def ms(key, rs=rs):
                v = np.array([r[key] for r in rs if r.get(key) is not None], float)
                if len(v) == 0:
                    return math.nan, math.nan
                half = (
                    float(sps.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
                )
                return float(v.mean()), half

            k = SIZES[size]["pass_samples"]
            fs, fh = ms("final_sampled")
            ch, chh = ms_change(rs)
            out.append(
                {
                    "cell": cell,
                    "method": arm,
                    "seeds": len(rs),
                    "start_sampled": ms("start_sampled")[0],
                    "final_sampled": fs,
                    "final_sampled_ci": fh,
                    "change": ch,
                    "change_ci": chh,
                    "final_greedy": ms("final_greedy")[0],
                    "start_greedy": ms("start_greedy")[0],
                    "pass@1": ms("pass@1")[0],
                    f"pass@{k}": ms(f"pass@{k}")[0],
                    "collapsed": sum(bool(r["collapsed"]) for r in rs),
                    "warmup_explained_var": ms("warmup_explained_var")[0],
                }
            )
    return out


def fmt(x, nd=3) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{nd}f}"


def tables(size: str, summary: list[dict], comps: list[dict], n_done: int, n_planned: int) -> str:
    k = SIZES[size]["pass_samples"]
    lines = [
        f"Grid `{size}`: {n_done} of {n_planned} runs finished.",
        "",
        f"| cell | arm | seeds | sampled success: start → final (95% CI) | change (95% CI) | greedy start → final "
        f"| pass@1 | pass@{k} | collapsed | warm-up EV |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['cell']} | {s['method']} | {s['seeds']} | {fmt(s['start_sampled'])} → {fmt(s['final_sampled'])} "
            f"(± {fmt(s['final_sampled_ci'])}) | {s['change']:+.3f} (± {fmt(s['change_ci'])}) | "
            f"{fmt(s['start_greedy'])} → {fmt(s['final_greedy'])} | {fmt(s['pass@1'])} | {fmt(s[f'pass@{k}'])} | "
            f"{s['collapsed']} of {s['seeds']} | {fmt(s['warmup_explained_var'], 2)} |"
        )
    lines += [
        "",
        "| cell | comparison (a vs b) | paired seeds | mean difference of final sampled success (95% CI) "
        f"| p | p (Holm, {len(comparisons_of(size))}) | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in comps:
        lines.append(
            f"| {c['cell']} | {c['comparison']} | {c['paired_seeds']} | {fmt(c['mean_diff'])} "
            f"({fmt(c['ci_low'])} to {fmt(c['ci_high'])}) | {fmt(c['p_value'])} | {fmt(c['p_holm'])} "
            f"| {c['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def figures(size: str, rows: list[dict], fig_dir: Path) -> list[Path]:
    """One PNG per cell: held-out sampled success and rollout success against iteration, and the
    critic's explained variance against iteration — mean over seeds with a 95% t-band per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    panels = [
        ("sampled_success", "held-out sampled success (128 tasks)"),
        ("rollout_success", "rollout success (32 episodes)"),
        ("critic_explained_var", "explained variance of the values"),
    ]
    for cell in SIZES[size]["cells"]:
        cell_rows = [r for r in rows if r["cell"] == cell]
        if not cell_rows:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
        for ax, (key, label) in zip(axes, panels):
            for arm in SIZES[size]["arms"]:
                pts = {}
                for r in cell_rows:
                    if r["method"] == arm and r.get(key) is not None:
                        pts.setdefault(r["iteration"], []).append(r[key])
                if not pts:
                    continue
                its = sorted(pts)
                mean = np.array([np.mean(pts[i]) for i in its])
                half = np.array([paired_half(pts[i]) for i in its])
                n = max(len(v) for v in pts.values())
                ax.plot(its, mean, marker="o", ms=2.5, color=COLOURS[arm], label=f"{arm} ({n})")
                ok = np.isfinite(half)
                ax.fill_between(
                    np.array(its)[ok], (mean - half)[ok], (mean + half)[ok], color=COLOURS[arm], alpha=0.12, linewidth=0
                )
            ax.set_xlabel("iteration")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].set_ylim(0, 1)
        axes[1].set_ylim(0, 1)
        axes[0].legend(fontsize=7, title="arm (seeds)", title_fontsize=7)
        fig.suptitle(f"{cell} — grid {size}: mean over seeds, 95% t-band", fontsize=10)
        fig.tight_layout()
        p = fig_dir / f"learning_{size}_{cell}.png"
        tmp = p.with_name(f".{p.stem}.{os.getpid()}.png")
        fig.savefig(tmp, dpi=80)
        tmp.replace(p)
        plt.close(fig)
        paths.append(p)
    return paths


def report(size: str, out: Path, archive: Path | None = None) -> str:
    rows, finals = collect(size, out, archive)
    comps = compare(size, finals)
    summary = summarize(size, finals)
    for name, data in (
        ("results.jsonl", rows),
        ("final.jsonl", finals),
        ("comparisons.jsonl", comps),
        ("summary.jsonl", summary),
    ):
        write_atomic(out / name, "".join(json.dumps(r) + "\n" for r in data))
    runs = plan(size)
    n_done = len(finals)
    text = tables(size, summary, comps, n_done, len(runs))
    write_atomic(out / "tables.md", text)
    figures(size, rows, out / "figures")
    return text


def calibration_table(recs: list[dict]) -> str:
    """One line per (cell, seed): token_ppo's per-update KL, turn_ppo's at each band tried, the choice."""
    lines = [
        "| cell | seed | token_ppo approx_kl | turn_ppo approx_kl by token_clip | chosen | ratio | matched |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        tried = ", ".join(f"{k}: {v:.2e}" for k, v in r["kls"].items())
        lines.append(
            f"| {r['cell']} | {r['seed']} | {r['reference_kl']:.2e} | {tried} | {r['token_clip']} | "
            f"{r['kl_ratio']:.2f} | {'yes' if r['matched'] else 'no'} |"
        )
    return "\n".join(lines)


def status(size: str, out: Path, archive: Path | None = None) -> str:
    def state(c, a, s):
        if archive is not None and archived(run_dir(archive, c, a, s)):
            return "done (archived)"
        return run_state(run_dir(out, c, a, s), SIZES[size]["iterations"])

    return "\n".join(f"{c:16s} {a:10s} seed {s}: {state(c, a, s)}" for c, s, a in plan(size))
