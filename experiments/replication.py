"""Does MPO's turn-level credit help? Replication v2: a pre-registered grid of training runs.

    python -m experiments.replication --size v2                  # run (or continue) the grid
    python -m experiments.replication --size v2 --seeds 0 2 4    # a share of it (e.g. one process per core;
                                                                 # arms of one seed split too: its warm-up is made once)
    python -m experiments.replication --size v2 --report-only    # records, tables and figures from what ran
    python -m experiments.replication --size v2 --status         # which runs are done, partial, missing

Everything is fixed here, before any run: the arms, the cells, the budgets, the seeds and the
statistics. ``docs/results.md`` states them in words and reads the results. (The first grid, v1,
was run by this runner as ``benchmarks/learning.py`` at commit 14b590f; its records are in
``experiments/records/small/``.)

**Start.** The shipped automation start (``trajectories/starts/automation``: SFT on the noise-0.3
expert), the same policy for every arm and seed. Replication v3's E3 (``--size v3-e3``, 5–6 turns)
starts from ``trajectories/starts/automation-d5-6`` instead: that SFT continued at 5–6 turns
(docs/results.md says why).

**Cells.** ``automation-d3-4`` (3–4 expert turns) first; ``automation-d5-6`` (5–6 turns: MPO's
claim is about long horizons) after it.

**Arms** (G = 4 for every arm, so that all see the same tasks and episodes): ``grpo`` (grpo +
token_ppo), ``ppo`` (gae + token_ppo), ``turn_gae`` (turn_gae + token_ppo), ``mpo_token`` (mpo +
token_ppo), ``mpo`` (mpo + turn_ppo at its default token band 2), ``mpo_bare`` (mpo + turn_ppo,
``token_clip=None``), ``mpo_oracle`` (mpo + turn_ppo with ``critic="expert"``: the exact values of
the noise-0.3 expert).

**Critic warm-up**, once per (cell, seed) and shared by every learned-critic arm of that seed (a
saved model folder, so their critics start equal): 512 episodes of the start, a fifth held out,
fitted to Monte-Carlo returns at lr 1e-3 until the held-out explained variance reaches 0.2 or 256
steps end. During RL the critic gets 4 epochs per iteration at lr 3e-4.

**Critic target**: during RL every learned critic trains on the Monte-Carlo returns
(``--value-target mc``, the default: the trainer's ``value_target="mc"``), so an arm differs from
another only by the estimator or loss it names, not by what its critic learns (turn_gae's own
returns bootstrap on the critic and are flat inside turns; docs/training.md). Every row of the
records says which (``value_target``; null for arms that train no critic). The v2 grid as recorded
in experiments/records/ ran with each estimator's own returns (``--value-target estimator`` reproduces it;
there only the turn_gae arm's target differed, the others' own returns being Monte-Carlo).

**Budget**, equal for every arm: 20 iterations × 32 episodes (8 tasks × 4), 2 policy epochs × 4
minibatches (160 policy steps) at lr 1e-4.

**Evaluation**: sampled (T = 1) and greedy success on 128 held-out tasks, fixed by the seed and
the same for every arm of that seed (``eval_seed``), before RL (iteration 0), every 5 iterations
and at the end; pass@k (k = 1…8) of each final policy on the first 64 of those tasks with 8
samples each (the unbiased estimator).

**Seeds**: 6 (0–5). A seed fixes RL sampling, minibatch order, the warm-up pool and the
evaluation tasks.

**Statistics**: primary = final held-out sampled success, paired by seed: the mean difference,
its 95% t-interval, a two-sided paired t-test, Holm-corrected over the 6 comparisons of a cell
(:data:`COMPARISONS`). A verdict names a winner only when the Holm-corrected p < 0.05. Secondary:
pass@k, greedy success, collapses (rollout success < 0.05 at any iteration after the 4th), the
critic's explained variance and across/within ratio over training, per-turn credit correlation
with the oracle.

**Matched step sizes** (``--calibrate-step``; not part of the v2 grid as run). At one learning
rate turn_ppo takes larger steps than token_ppo (its band bounds only a turn's mean log-ratio and
weights each token by ρ_k instead of its own r_j: docs/concepts.md §7.7); in v2 its arms had
1.5–2.3× the per-update ``approx_kl``. The rule, fixed before any calibration run: on the seed's
start (its warm-up folder, policy = the start), run ``mpo_token`` (mpo + token_ppo) and mpo +
turn_ppo with each token band ``token_clip`` of :data:`TOKEN_CLIP_LADDER` in order (loosest first,
the default 2 at its head) for :data:`CALIBRATION_ITERATIONS` iterations of the grid's budget at
the same learning rate; the chosen band is the first whose mean per-update ``approx_kl`` lies
within :data:`KL_BAND` (±20%) of token_ppo's; when none does, the one closest in log ratio, recorded
as not matched. ``OUT/calibration.jsonl`` records every KL measured and the choice, per cell and
seed; a grid that compares turn_ppo with token_ppo at matched steps runs turn_ppo at that band.

**Resume**: every run is a trainer run folder under ``OUT/runs/``; a finished run is skipped, a
partial one continues from its last checkpoint, a warm-up folder is made once. Stop the grid
(Ctrl-C, a kill) and start it again with the same command. Results are rebuilt from the folders.
``--archive DIR`` keeps a finished run's records (config, metrics, pass@k, the seed's warm-up line
and the per-iteration credit accuracy, a few hundred KB, no model) under ``DIR/runs/``: a grid
that spans machines whose run folders do not survive skips the archived runs and rebuilds its
results from the archive where the folder is gone. The first grid run into an archive writes its
``DIR/grid.json``; a grid whose start, budgets, arm specs or value target differ from it is refused
with the differing fields named, so the runs of one grid are never skipped as another's (a share of
the cells, seeds or arms is the same grid).

**Outputs** (``OUT``, default ``runs/learning-SIZE``): ``results.jsonl`` (one row per cell, arm,
seed and iteration), ``final.jsonl`` (one row per run: final success, pass@k, collapse),
``comparisons.jsonl``, ``tables.md``, ``figures/*.png``; ``--export DIR`` copies them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from experiments.grids import (
    REPO,
    SIZES,
    VALUE_TARGET,
    grid_meta,
    plan,
    start_of,
)
from experiments.report import (
    calibration_table,
    report,
    start_table,
    status,
)
from experiments.runner import (
    calibrate_step,
    claim_archive,
    log,
    measure_start,
    restore_calibration,
    run_one,
    write_atomic,
)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m experiments.replication", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=list(SIZES), default="v2")
    ap.add_argument("--out", type=Path, default=None, help="results and run folders (default runs/learning-SIZE)")
    ap.add_argument("--report-only", action="store_true", help="records, tables and figures from the run folders")
    ap.add_argument("--status", action="store_true", help="list each run as done, partial or missing")
    ap.add_argument("--export", type=Path, default=None, help="copy the records, tables and figures into this folder")
    ap.add_argument(
        "--archive",
        type=Path,
        default=None,
        help="keep each finished run's records here (no models) and skip the runs found here: a grid "
        "that spans machines whose run folders do not survive (refused when ARCHIVE/grid.json "
        "names another start, budget, arm spec or value target)",
    )
    ap.add_argument("--cells", nargs="+", default=None, metavar="CELL", help="run only these cells")
    ap.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=None,
        metavar="SEED",
        help="run only these seeds (e.g. even seeds in one process, odd in another)",
    )
    ap.add_argument(
        "--arms",
        nargs="+",
        default=None,
        metavar="ARM",
        help="run only these arms (the report still reads every arm found)",
    )
    ap.add_argument(
        "--calibrate-step",
        action="store_true",
        help="only apply the matched-step rule (turn_ppo's token band) to the planned cells and seeds, "
        "writing OUT/calibration.jsonl",
    )
    ap.add_argument(
        "--measure-start",
        action="store_true",
        help="only measure the size's start on each planned seed's held-out tasks (greedy and sampled "
        "success, as before RL), writing OUT/start.jsonl",
    )
    ap.add_argument(
        "--value-target",
        choices=("mc", "estimator"),
        default=VALUE_TARGET,
        help="what every learned critic trains on during RL: Monte-Carlo returns (default) or each "
        "estimator's own returns (the v2 grid as recorded)",
    )
    return ap


def check_filters(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error for a ``--cells`` or ``--arms`` value the size's grid does not have."""
    for flag, given in (("cells", args.cells), ("arms", args.arms)):
        bad = [x for x in given or () if x not in SIZES[args.size][flag]]
        if bad:
            ap.error(f"--{flag}: {bad} not in the {args.size} grid's {flag} {list(SIZES[args.size][flag])}")


def run_grid(ap: argparse.ArgumentParser, args: argparse.Namespace, out: Path) -> int:
    """Every planned run not yet done, with the records rebuilt after each whole seed; 130 when interrupted."""
    runs = plan(args.size, args.cells, args.seeds, args.arms)
    start = start_of(args.size)
    if not start.is_dir():  # a start fixed by its rule and not made yet (v4-e6): say how, before any folder
        ap.error(
            f"the {args.size} grid starts from {start.relative_to(REPO)}, which is not there; make it first "
            "(trajectories/starts/make_start.py says how)"
        )
    meta = grid_meta(args.size, args.value_target)
    if args.archive is not None:
        try:
            claim_archive(args.archive, meta)
        except ValueError as e:
            ap.error(str(e))
    (out / "grid.json").write_text(json.dumps(meta, indent=1) + "\n")
    t0 = time.perf_counter()
    log(f"grid {args.size}: {len(runs)} runs into {out}")
    try:
        for i, (cell, seed, arm) in enumerate(runs):
            run_one(args.size, cell, arm, seed, out, args.value_target, args.archive)
            if (i + 1) % len(SIZES[args.size]["arms"]) == 0:
                report(args.size, out, args.archive)  # results as they come
    except KeyboardInterrupt:
        log("interrupted: the finished runs stay, a partial one resumes from its last checkpoint")
        print(report(args.size, out, args.archive))
        return 130
    log(f"grid {args.size}: {len(runs)} runs done in {time.perf_counter() - t0:.0f} s")
    return 0


def export(out: Path, dest: Path) -> None:
    """Copy the records, tables, grid.json and figures of ``out`` into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("results.jsonl", "final.jsonl", "comparisons.jsonl", "summary.jsonl", "tables.md", "grid.json"):
        if (out / name).is_file():
            shutil.copy(out / name, dest / name)
    for p in (out / "figures").glob("*.png"):
        shutil.copy(p, dest / p.name)


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    check_filters(ap, args)
    out = args.out or REPO / "runs" / f"learning-{args.size}"
    out.mkdir(parents=True, exist_ok=True)
    if args.archive is not None:
        restore_calibration(args.archive, out)
    if args.status:
        print(status(args.size, out, args.archive))
        return 0
    pairs = dict.fromkeys((c, s) for c, s, _ in plan(args.size, args.cells, args.seeds))  # (cell, seed), in order
    if args.measure_start:
        recs = [measure_start(args.size, c, s, out) for c, s in pairs]
        write_atomic(out / "start.jsonl", "".join(json.dumps(r) + "\n" for r in recs))
        print(start_table(recs))
        return 0
    if args.calibrate_step:
        recs = [calibrate_step(args.size, c, s, out, args.value_target) for c, s in pairs]
        write_atomic(out / "calibration.jsonl", "".join(json.dumps(r) + "\n" for r in recs))
        print(calibration_table(recs))
        return 0
    if not args.report_only and run_grid(ap, args, out) == 130:
        return 130
    print(report(args.size, out, args.archive))
    if args.export:
        export(out, args.export)
    return 0


if __name__ == "__main__":
    sys.exit(main())
