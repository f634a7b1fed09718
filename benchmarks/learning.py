"""Does MPO's credit assignment help? A fixed grid of training runs, with seeds and confidence intervals.

    python benchmarks/learning.py --size small                 # run (or continue) the grid
    python benchmarks/learning.py --size small --report-only   # tables and figures from what ran
    python benchmarks/learning.py --size small --status        # which runs are done, partial, missing

Everything is fixed here, before any run: the methods, the cells (environment variants), the
budgets, the seeds and the statistics. ``docs/results.md`` states the comparisons and reads the
results.

**Methods** (estimator + policy loss): ``mpo`` (mpo + turn_ppo), ``mpo_token`` (mpo + token_ppo: the
estimator alone), ``turn_gae`` (turn_gae + turn_ppo: the macro scale alone, MAE at β = 0), ``ppo``
(gae + token_ppo), ``grpo`` (grpo + token_ppo), ``rloo`` (rloo + token_ppo), ``vapo`` (vapo +
token_ppo with its clip-higher 0.2/0.28), ``sao`` (gae + sao).

**Cells**: ``search`` and ``automation`` (default difficulty, all methods, G = 4); the single-rollout
regime ``*-g1`` (G = 1, where GRPO/RLOO are undefined: mpo vs ppo); in ``full`` also a horizon sweep
on automation (3, 6, 12 expert turns) and its slip probability (0, 0.1, 0.3), with mpo, turn_gae,
ppo and grpo.

**Budgets**: every method of a cell gets the same episodes per iteration, iterations, epochs and
minibatches (equal episodes and equal gradient steps), and starts from the same model folder per
(environment, seed): one SFT warm start on the noisy expert, then one critic warm-up (Monte-Carlo
returns) that every critic-based method starts from (critic-free methods ignore the critic). The
greedy evaluation tasks are fixed by the seed and the same for every method.

**Resume**: every run is a trainer run folder under ``OUT/runs/``; a finished run is skipped, a
partial one continues from its last checkpoint (``Trainer.resume``), so the grid can be stopped
(Ctrl-C, a kill) and started again with the same command. The results are rebuilt from the run
folders each time. Order: seed by seed, so a partial grid has balanced seeds across cells.

**Outputs** (in ``OUT``, default ``runs/learning-SIZE``): ``results.jsonl`` (one row per run and
evaluation point), ``summary.jsonl`` (one row per cell and method), ``comparisons.jsonl``,
``tables.md`` and ``figures/*.png``; ``--export DIR`` copies them (not the run folders) for committing.

**Statistics** (fixed): over seeds, the mean of final greedy eval success with a 95% bootstrap CI
(10,000 resamples of seeds) and the IQM (mean of the middle 50%); environment steps (assistant turns
played in RL iterations) and wall time to reach 50% and 80% eval success; the across/within split of
the learned critic's values over training; credit accuracy: the correlation of the advantages each
method trained on with the oracle's, per token and per turn, over training. Comparisons are paired by
seed (same start, same evaluation tasks): mean difference of final eval success with a 95% bootstrap CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# --------------------------------------------------------------------------------------------- the grid

#: method -> (estimator, estimator options, loss, loss options)
METHODS = {
    "mpo": ("mpo", {}, "turn_ppo", {}),
    "mpo_token": ("mpo", {}, "token_ppo", {}),
    "turn_gae": ("turn_gae", {}, "turn_ppo", {}),
    "ppo": ("gae", {}, "token_ppo", {}),
    "grpo": ("grpo", {}, "token_ppo", {}),
    "rloo": ("rloo", {}, "token_ppo", {}),
    "vapo": ("vapo", {}, "token_ppo", {"clip_low": 0.2, "clip_high": 0.28}),
    "sao": ("gae", {}, "sao", {}),
}
SWEEP_METHODS = ("mpo", "turn_gae", "ppo", "grpo")
G1_METHODS = ("mpo", "ppo")

#: the comparisons stated in advance (docs/results.md): (label, method a, method b)
COMPARISONS = [
    ("MPO vs GRPO", "mpo", "grpo"),
    ("MPO vs PPO", "mpo", "ppo"),
    ("MPO vs turn GAE (β = 1 vs β = 0)", "mpo", "turn_gae"),
    ("turn_ppo vs token_ppo (MPO vs MPO-token)", "mpo", "mpo_token"),
]


@dataclasses.dataclass(frozen=True)
class Cell:
    """One environment variant of the grid."""

    name: str
    env: str
    methods: tuple
    group_size: int = 4
    difficulty: object = None  # None: the environment's default; int: a fixed horizon; (min, max)
    env_options: tuple = ()  # ((key, value), ...)

    @property
    def start_key(self) -> str:
        """Cells with the same environment share their start (SFT + critic warm-up) per seed."""
        opts = "".join(f"-{k}{v}" for k, v in self.env_options)
        d = self.difficulty
        d = "" if d is None else f"-d{d}" if isinstance(d, int) else f"-d{d[0]}-{d[1]}"
        return f"{self.env}{d}{opts}"


MAIN = tuple(METHODS)
CELLS = {
    "search": Cell("search", "search", MAIN, difficulty=(2, 3)),
    "automation": Cell("automation", "automation", MAIN),
    "search-g1": Cell("search-g1", "search", G1_METHODS, group_size=1, difficulty=(2, 3)),
    "automation-g1": Cell("automation-g1", "automation", G1_METHODS, group_size=1),
    "automation-h3": Cell("automation-h3", "automation", SWEEP_METHODS, difficulty=3),
    "automation-h6": Cell("automation-h6", "automation", SWEEP_METHODS, difficulty=6),
    "automation-h12": Cell("automation-h12", "automation", SWEEP_METHODS, difficulty=12),
    "automation-slip0": Cell("automation-slip0", "automation", SWEEP_METHODS, env_options=(("slip", 0.0),)),
    "automation-slip0.3": Cell("automation-slip0.3", "automation", SWEEP_METHODS, env_options=(("slip", 0.3),)),
}
# (automation at slip 0.1 is the main automation cell: 0.1 is the environment's default.) search runs
# at 2-3 expert turns: at its default 3-6, 100 SFT steps left the 1M policy at 0 greedy and 0 sampled
# success (trajectories/trained/), an RL problem with no signal for any method.

#: size -> the grid's cells, seeds and budgets
SIZES = {
    # a smoke run of the whole pipeline (seconds): nothing here learns
    "tiny": dict(cells=("automation",), methods=("mpo", "grpo"), seeds=(0,), iterations=1, episodes=4,
                 eval_episodes=4, eval_interval=1, sft_steps=1, sft_target=0.4, warmup_steps=1, epochs=1, minibatches=2,
                 max_turn_tokens=16, max_total_tokens=96),
    # the documented results: about 90 minutes on a quiet 2-core machine (estimated from ~9k tokens/s
    # training and ~2k tokens/s sampling with the 1M-parameter model)
    "small": dict(cells=("search", "automation", "search-g1", "automation-g1"), methods=None, seeds=(0, 1, 2, 3, 4),
                  iterations=8, episodes=16, eval_episodes=32, eval_interval=2, sft_steps=1500, sft_target=0.4, warmup_steps=4,
                  epochs=2, minibatches=2, max_turn_tokens=64, max_total_tokens=1024),
    # everything, with room to learn (many hours on 2 cores; meant for a larger machine)
    "full": dict(cells=tuple(CELLS), methods=None, seeds=tuple(range(10)), iterations=40, episodes=32,
                 eval_episodes=64, eval_interval=4, sft_steps=1500, sft_target=0.4, warmup_steps=8, epochs=2, minibatches=4,
                 max_turn_tokens=64, max_total_tokens=1024),
}


#: the seed of the shared starts (SFT and critic warm-up)
START_SEED = 0


def plan(size: str, cells=None) -> list[tuple[int, Cell, str]]:
    """The runs of a size in the order they run: seed by seed, cell by cell, method by method
    (``cells``: only these of the size's cells)."""
    s = SIZES[size]
    out = []
    for seed in s["seeds"]:
        for name in s["cells"]:
            if cells and name not in cells:
                continue
            cell = CELLS[name]
            for m in cell.methods:
                if s["methods"] is None or m in s["methods"]:
                    out.append((seed, cell, m))
    return out


def base_config(size: str, cell: Cell, seed: int, **changes):
    from mpo_viz.train import Config

    s = SIZES[size]
    d = cell.difficulty
    kw = dict(env=cell.env, difficulty=list(d) if isinstance(d, tuple) else d, env_options=dict(cell.env_options), model_size="1m",
              seed=seed, episodes=s["episodes"], group_size=cell.group_size, iterations=s["iterations"],
              epochs=s["epochs"], minibatches=s["minibatches"], eval_episodes=s["eval_episodes"],
              eval_interval=s["eval_interval"], save_trajectories_every=s["eval_interval"], keep_checkpoints=1,
              max_turn_tokens=s["max_turn_tokens"], max_total_tokens=s["max_total_tokens"])
    kw.update(changes)
    return Config(**kw)


def run_config(size: str, cell: Cell, method: str, seed: int, start: Path):
    est, est_opts, loss, loss_opts = METHODS[method]
    cfg = base_config(size, cell, seed, estimator=est, estimator_options=dict(est_opts), loss=loss,
                      loss_options=dict(loss_opts), model_dir=str(start), sft_steps=0)
    if cfg.uses_critic:
        cfg = cfg.replace(critic_warmup_steps=0)  # the shared start's critic is already warmed up
    return cfg


# --------------------------------------------------------------------------------------------- running


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_start(size: str, cell: Cell, out: Path) -> Path:
    """The shared start of an environment variant: SFT on the noisy expert, then a critic warm-up on
    Monte-Carlo returns, made once with seed 0 and used by every method and every seed of the cells
    that share ``cell.start_key``. Written to ``OUT/starts/KEY/model`` (policy/ and critic/)."""
    from mpo_viz import models
    from mpo_viz.train import Trainer

    s = SIZES[size]
    d = out / "starts" / cell.start_key
    model = d / "model"
    if (model / "policy").is_dir() and (model / "critic").is_dir() and (d / "start.json").is_file():
        return model
    if d.exists():
        shutil.rmtree(d)  # an interrupted start is redone whole
    t0 = time.perf_counter()
    seed = START_SEED
    sft_cfg = base_config(size, cell, seed, estimator="grpo", loss="token_ppo", group_size=4, sft_steps=s["sft_steps"],
                          sft_target_success=s["sft_target"], eval_episodes=64)
    sft_tr = Trainer(sft_cfg, d / "sft", quiet=True)
    sft = sft_tr.sft()
    models.save(d / "sft_model", sft_tr.policy)
    warm_cfg = base_config(size, cell, seed, estimator="gae", estimator_options={"lam": 1.0}, loss="token_ppo",
                           group_size=4, model_dir=str(d / "sft_model"), sft_steps=0,
                           critic_warmup_steps=s["warmup_steps"])
    warm_tr = Trainer(warm_cfg, d / "warmup", quiet=True)
    warm = warm_tr.warmup_critic()
    models.save(d / "tmp_model", warm_tr.policy, warm_tr.critic)
    (d / "tmp_model").rename(model)
    info = {"sft": sft, "warmup": warm, "seconds": time.perf_counter() - t0, "seed": seed,
            "sft_config_hash": sft_cfg.hash(), "warmup_config_hash": warm_cfg.hash()}
    (d / "start.json").write_text(json.dumps(info, indent=1, default=float) + "\n")
    log(f"start {cell.start_key}: SFT {sft.get('sft_steps')} steps, greedy success "
        f"{sft.get('sft_success', math.nan):.3f}; critic warm-up explained variance "
        f"{warm.get('warmup_explained_var', math.nan):.3f} ({info['seconds']:.0f} s)")
    return model


def run_dir(out: Path, cell: Cell, method: str, seed: int) -> Path:
    return out / "runs" / cell.name / method / f"seed={seed}"


def run_state(d: Path, iterations: int) -> str:
    """``done``, ``partial`` or ``missing``."""
    from mpo_viz.train.runfolder import read_metrics_file

    if not (d / "checkpoints" / "latest").exists():
        return "missing"
    recs = read_metrics_file(d / "metrics.jsonl")
    its = [r.get("iteration", 0) for r in recs if r.get("phase") in ("rl", "eval")]
    finished = any(r.get("phase") in ("rl", "eval") and r.get("iteration") == iterations and r.get("eval_success") is not None
                   for r in recs)
    return "done" if its and finished else "partial"


def run_one(size: str, cell: Cell, method: str, seed: int, out: Path) -> None:
    from mpo_viz.train import Trainer

    s = SIZES[size]
    d = run_dir(out, cell, method, seed)
    state = run_state(d, s["iterations"])
    if state == "done":
        return
    start = make_start(size, cell, out)
    cfg = run_config(size, cell, method, seed, start)
    t0 = time.perf_counter()
    if state == "partial":
        tr = Trainer.resume(d, cfg, quiet=True)
    else:
        if d.exists():
            shutil.rmtree(d)  # a folder without a checkpoint holds nothing to keep
        tr = Trainer(cfg, d, quiet=True)
    tr.run_all(log=lambda line: None)
    if tr.interrupted:
        raise KeyboardInterrupt
    ev = [r for r in tr.run.metrics() if r.get("eval_success") is not None]
    log(f"{cell.name:16s} {method:10s} seed {seed}: eval success {ev[-1]['eval_success']:.3f} "
        f"({time.perf_counter() - t0:.0f} s, config {cfg.hash()})")


# --------------------------------------------------------------------------------------------- results


def credit_accuracy(path: Path) -> dict:
    """Correlation of the advantages a run trained on with the oracle's, per token and per turn."""
    import mpo_viz as mv
    from mpo_viz.analysis import turn_table

    b = mv.load(path)
    if not (b.has("advantages") and b.has("oracle_token_adv")):
        return {}
    m = b.mask.bool().numpy()
    a = b.padded("advantages").numpy()
    o = b.padded("oracle_token_adv").numpy()
    out = {"credit_token_corr": _corr(a[m], o[m])}
    t = turn_table(b, {"adv": b.padded("advantages")})
    try:
        ot = np.concatenate([np.asarray(json.loads(x)["oracle"]["turn_adv"], dtype=float) for x in b.field("extra_json")])
    except (KeyError, TypeError, ValueError):
        return out
    if len(ot) == len(t):
        ok = np.isfinite(ot)
        out["credit_turn_corr"] = _corr(t["adv_adv"].to_numpy()[ok], ot[ok])
    return out


def _corr(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def collect(size: str, out: Path) -> list[dict]:
    """One row per run and evaluation point, from the run folders (finished or not)."""
    from mpo_viz.train import Config
    from mpo_viz.train.runfolder import read_metrics_file

    rows = []
    for seed, cell, method in plan(size):
        d = run_dir(out, cell, method, seed)
        recs = read_metrics_file(d / "metrics.jsonl")
        if not recs:
            continue
        cfg = Config.load(d / "config.json")
        state = run_state(d, SIZES[size]["iterations"])
        env_steps, episodes = 0.0, 0
        rl_by_it = {0: (0.0, 0, {})}  # the evaluation before RL: no environment step yet
        for r in recs:
            if r.get("phase") == "rl":
                env_steps += cfg.episodes * float(r.get("turns_mean") or 0.0)
                episodes += cfg.episodes
                rl_by_it[r["iteration"]] = (env_steps, episodes, r)
        for r in recs:
            if r.get("eval_success") is None:
                continue
            it = int(r.get("iteration", 0))
            steps, eps, rl = rl_by_it.get(it, (env_steps, episodes, {}))
            row = {"cell": cell.name, "env": cell.env, "method": method, "seed": seed, "iteration": it,
                   "episodes": eps, "env_steps": steps, "time_s": r.get("time_s"),
                   "eval_success": r["eval_success"], "sampled_success": rl.get("success"),
                   "values_across": rl.get("values_across"), "values_within": rl.get("values_within"),
                   "values_across_within_ratio": rl.get("values_across_within_ratio"),
                   "oracle_across_within_ratio": rl.get("oracle_across_within_ratio"),
                   "critic_explained_var": rl.get("critic_explained_var"), "run_state": state,
                   "config_hash": cfg.hash()}
            traj = d / "trajectories" / f"iter={it:06d}.parquet"
            if traj.is_file():
                row.update(credit_accuracy(traj))
            rows.append(row)
    return rows


def bootstrap_ci(x, *, n: int = 10_000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean over the values (seeds) ``x``."""
    x = np.asarray([v for v in x if v is not None and np.isfinite(v)], float)
    if len(x) == 0:
        return math.nan, math.nan
    if len(x) == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n, len(x)))].mean(1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def iqm(x) -> float:
    """Interquartile mean: the mean of the middle 50% (sorted, a quarter cut from each end)."""
    x = np.sort(np.asarray([v for v in x if v is not None and np.isfinite(v)], float))
    if len(x) == 0:
        return math.nan
    k = len(x) // 4
    return float(x[k: len(x) - k].mean())


def _first_reach(rows: list[dict], key: str, threshold: float) -> float:
    for r in sorted(rows, key=lambda r: r["iteration"]):
        if r["eval_success"] >= threshold:
            return float(r[key])
    return math.nan


def summarize(size: str, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(per cell and method, paired comparisons) from the result rows of finished runs."""
    iters = SIZES[size]["iterations"]
    by = {}
    for r in rows:
        by.setdefault((r["cell"], r["method"], r["seed"]), []).append(r)
    final = {k: max(v, key=lambda r: r["iteration"]) for k, v in by.items()}
    done = {k for k, v in final.items() if v["iteration"] == iters and v["run_state"] == "done"}
    summary = []
    for seed_, cell, method in plan(size):
        if seed_ != SIZES[size]["seeds"][0]:
            continue
        keys = [(cell.name, method, s) for s in SIZES[size]["seeds"] if (cell.name, method, s) in done]
        vals = [final[k]["eval_success"] for k in keys]
        lo, hi = bootstrap_ci(vals)
        steps50 = [_first_reach(by[k], "env_steps", 0.5) for k in keys]
        steps80 = [_first_reach(by[k], "env_steps", 0.8) for k in keys]
        time50 = [_first_reach(by[k], "time_s", 0.5) for k in keys]

        def fin(name, keys=keys):
            v = [final[k].get(name) for k in keys]
            v = [x for x in v if x is not None and np.isfinite(x)]
            return float(np.mean(v)) if v else math.nan

        summary.append({
            "cell": cell.name, "method": method, "seeds_done": len(keys), "seeds_planned": len(SIZES[size]["seeds"]),
            "final_eval_mean": float(np.mean(vals)) if vals else math.nan, "final_eval_ci_low": lo, "final_eval_ci_high": hi,
            "final_eval_iqm": iqm(vals),
            "reached_50": int(np.isfinite(steps50).sum()) if keys else 0,
            "env_steps_to_50_median": float(np.nanmedian(steps50)) if np.isfinite(steps50).any() else math.nan,
            "reached_80": int(np.isfinite(steps80).sum()) if keys else 0,
            "env_steps_to_80_median": float(np.nanmedian(steps80)) if np.isfinite(steps80).any() else math.nan,
            "seconds_to_50_median": float(np.nanmedian(time50)) if np.isfinite(time50).any() else math.nan,
            "final_critic_across_within": fin("values_across_within_ratio"),
            "final_credit_token_corr": fin("credit_token_corr"), "final_credit_turn_corr": fin("credit_turn_corr"),
            "seconds_per_run": fin("time_s"),
        })
    comps = []
    for name in SIZES[size]["cells"]:
        for label, a, b in COMPARISONS:
            seeds = [s for s in SIZES[size]["seeds"] if (name, a, s) in done and (name, b, s) in done]
            if a not in CELLS[name].methods or b not in CELLS[name].methods:
                continue
            diff = [final[(name, a, s)]["eval_success"] - final[(name, b, s)]["eval_success"] for s in seeds]
            lo, hi = bootstrap_ci(diff)
            if not seeds:
                verdict = "not run"
            elif lo > 0:
                verdict = f"{a} higher"
            elif hi < 0:
                verdict = f"{b} higher"
            else:
                verdict = "inside the noise (CI contains 0)"
            comps.append({"cell": name, "comparison": label, "a": a, "b": b, "paired_seeds": len(seeds),
                          "mean_diff": float(np.mean(diff)) if diff else math.nan, "ci_low": lo, "ci_high": hi,
                          "verdict": verdict})
    return summary, comps


def _fmt(x, nd=3) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{nd}f}"


def tables(size: str, summary: list[dict], comps: list[dict], n_done: int, n_planned: int) -> str:
    lines = [f"Grid `{size}`: {n_done} of {n_planned} runs finished.", "",
             "| cell | method | seeds | final eval success (95% CI) | IQM | env steps to 50% (reached) | "
             "env steps to 80% (reached) | critic across/within | credit corr token / turn |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(
            f"| {s['cell']} | {s['method']} | {s['seeds_done']}/{s['seeds_planned']} | "
            f"{_fmt(s['final_eval_mean'])} ({_fmt(s['final_eval_ci_low'])}–{_fmt(s['final_eval_ci_high'])}) | "
            f"{_fmt(s['final_eval_iqm'])} | {_fmt(s['env_steps_to_50_median'], 0)} ({s['reached_50']}) | "
            f"{_fmt(s['env_steps_to_80_median'], 0)} ({s['reached_80']}) | {_fmt(s['final_critic_across_within'], 2)} | "
            f"{_fmt(s['final_credit_token_corr'], 2)} / {_fmt(s['final_credit_turn_corr'], 2)} |")
    lines += ["", "| cell | comparison | paired seeds | mean difference of final eval success (95% CI) | verdict |",
              "|---|---|---|---|---|"]
    for c in comps:
        lines.append(f"| {c['cell']} | {c['comparison']} | {c['paired_seeds']} | {_fmt(c['mean_diff'])} "
                     f"({_fmt(c['ci_low'])} to {_fmt(c['ci_high'])}) | {c['verdict']} |")
    return "\n".join(lines) + "\n"


def figures(size: str, rows: list[dict], fig_dir: Path) -> list[Path]:
    """One PNG per cell: eval success vs environment steps and vs wall time (mean over seeds with a
    95% bootstrap band), the learned critic's across/within ratio and the token credit accuracy over
    training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    colours = dict(zip(METHODS, ["#d62728", "#ff7f0e", "#9467bd", "#1f77b4", "#2ca02c", "#17becf", "#8c564b", "#7f7f7f"]))
    for name in SIZES[size]["cells"]:
        cell_rows = [r for r in rows if r["cell"] == name]
        if not cell_rows:
            continue
        fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
        panels = [("env_steps", "eval_success", "environment steps", "greedy eval success"),
                  ("time_s", "eval_success", "seconds of training", "greedy eval success"),
                  ("iteration", "values_across_within_ratio", "iteration", "critic across/within (median)"),
                  ("iteration", "credit_token_corr", "iteration", "corr(advantage, oracle), tokens")]
        for ax, (xk, yk, xl, yl) in zip(axes, panels):
            for method in CELLS[name].methods:
                rs = [r for r in cell_rows if r["method"] == method and r.get(yk) is not None]
                if not rs:
                    continue
                its = sorted({r["iteration"] for r in rs})
                xs, ys, lo, hi = [], [], [], []
                for it in its:
                    at = [r for r in rs if r["iteration"] == it and np.isfinite(r[yk])]
                    if not at:
                        continue
                    v = [r[yk] for r in at]
                    xs.append(float(np.mean([r[xk] for r in at])))
                    ys.append(float(np.mean(v)))
                    a, b = bootstrap_ci(v, n=2000)
                    lo.append(a)
                    hi.append(b)
                n = len({r["seed"] for r in rs})
                ax.plot(xs, ys, marker="o", ms=3, color=colours[method], label=f"{method} ({n})")
                ax.fill_between(xs, lo, hi, color=colours[method], alpha=0.12, linewidth=0)
            ax.set_xlabel(xl)
            ax.set_ylabel(yl)
            ax.grid(alpha=0.3)
        axes[0].set_ylim(0, 1)
        axes[1].set_ylim(0, 1)
        if any(line.get_ydata().size and np.nanmax(line.get_ydata()) > 0 for line in axes[2].get_lines()):
            axes[2].set_yscale("log")
        axes[0].legend(fontsize=7, title="method (seeds)", title_fontsize=7)
        fig.suptitle(f"{name} — grid {size}: mean over seeds, 95% bootstrap band", fontsize=10)
        fig.tight_layout()
        p = fig_dir / f"learning_{size}_{name}.png"
        fig.savefig(p, dpi=80)
        plt.close(fig)
        paths.append(p)
    return paths


def report(size: str, out: Path) -> str:
    rows = collect(size, out)
    with open(out / "results.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    summary, comps = summarize(size, rows)
    for name, data in (("summary.jsonl", summary), ("comparisons.jsonl", comps)):
        with open(out / name, "w") as fh:
            for r in data:
                fh.write(json.dumps(r) + "\n")
    runs = plan(size)
    n_done = sum(run_state(run_dir(out, c, m, s), SIZES[size]["iterations"]) == "done" for s, c, m in runs)
    text = tables(size, summary, comps, n_done, len(runs))
    (out / "tables.md").write_text(text)
    figures(size, rows, out / "figures")
    return text


def status(size: str, out: Path) -> str:
    lines = []
    for seed, cell, method in plan(size):
        lines.append(f"{cell.name:18s} {method:10s} seed {seed}: {run_state(run_dir(out, cell, method, seed), SIZES[size]['iterations'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=list(SIZES), default="small")
    ap.add_argument("--out", type=Path, default=None, help="results and run folders (default runs/learning-SIZE)")
    ap.add_argument("--report-only", action="store_true", help="tables and figures from the run folders; run nothing")
    ap.add_argument("--status", action="store_true", help="list each run as done, partial or missing")
    ap.add_argument("--export", type=Path, default=None, help="copy results, tables and figures into this folder")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--cells", nargs="+", default=None, metavar="CELL",
                    help="run only these cells of the size (e.g. one process per environment on 2 cores)")
    args = ap.parse_args(argv)
    bad = [c for c in args.cells or () if c not in SIZES[args.size]["cells"]]
    if bad:
        ap.error(f"--cells: {bad} not in the {args.size} grid's cells {list(SIZES[args.size]['cells'])}")
    out = args.out or REPO / "runs" / f"learning-{args.size}"
    out.mkdir(parents=True, exist_ok=True)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.status:
        print(status(args.size, out))
        return 0
    if not args.report_only:
        runs = plan(args.size, args.cells)
        meta = {"size": args.size, "grid": SIZES[args.size], "runs": len(runs), "python": sys.version.split()[0],
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "command": " ".join(sys.argv)}
        (out / "grid.json").write_text(json.dumps({**meta, "runs": len(plan(args.size))}, indent=1) + "\n")
        t0 = time.perf_counter()
        log(f"grid {args.size}: {len(runs)} runs into {out}")
        try:
            for i, (seed, cell, method) in enumerate(runs):
                run_one(args.size, cell, method, seed, out)
                if (i + 1) % len(CELLS[cell.name].methods) == 0:
                    report(args.size, out)  # results as they come
        except KeyboardInterrupt:
            log("interrupted: the finished runs stay, a partial one resumes from its last checkpoint")
            print(report(args.size, out))
            return 130
        log(f"grid {args.size} done in {time.perf_counter() - t0:.0f} s")
    print(report(args.size, out))
    if args.export:
        args.export.mkdir(parents=True, exist_ok=True)
        for name in ("results.jsonl", "summary.jsonl", "comparisons.jsonl", "tables.md", "grid.json"):
            if (out / name).is_file():
                shutil.copy(out / name, args.export / name)
        for p in (out / "figures").glob("*.png"):
            shutil.copy(p, args.export / p.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
