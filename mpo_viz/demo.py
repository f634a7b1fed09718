"""``make demo``: the main job on the shipped trajectories, headless, start to finish.

For every shipped set under ``trajectories/`` (or the folder given as the first argument):
validate every row, summarize, compute MPO and the baselines, print the across/within value
diagnostic (paper Fig. 2) and how the estimators agree, then write the advantage columns and one
self-contained HTML report per set under ``out/demo/``. Run: ``python -m mpo_viz.demo [FOLDER]``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import mpo_viz as mv
from mpo_viz import analysis
from mpo_viz.advantages import DEFAULT_ESTIMATORS, available_estimators, compute, missing
from mpo_viz.cli import main as cli

ESTIMATORS = ["mpo", "turn_gae", "gae", "grpo", "rloo", "gigpo"]


def _rule(title: str) -> None:
    print(f"\n{'=' * 8} {title} {'=' * max(0, 70 - len(title))}")


def run(folder: Path, out: Path) -> int:
    # trajectory/v1 sets: Parquet files, and folders of JSONL files with their _meta.json (not the
    # foreign-format logs of samples/, nor trained/, which has its own section below)
    sets = sorted(folder.glob("*.parquet")) + sorted(p for p in folder.iterdir() if (p / "_meta.json").is_file())
    if not sets:
        print(f"no trajectory sets under {folder}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    reports = []
    for k, path in enumerate(sets):
        name = path.stem if path.is_file() else path.name
        _rule(f"{name}: validate + info ({path})")
        if cli(["validate", str(path)]) != 0:
            return 1
        cli(["info", str(path)])
        batch = mv.load(path)

        _rule(f"{name}: advantages")
        names = [e for e in ESTIMATORS if e in available_estimators() and not missing(batch, e)]
        skipped = [e for e in ESTIMATORS if e not in names]
        results = {}
        print(f"{'estimator':<12} {'ms':>8} {'mean |A| (action tokens)':>26} {'turns':>8}")
        m = batch.mask.numpy() > 0
        for e in names:
            r = compute(batch, e)
            results[e] = r
            a = r.advantages.numpy()
            print(
                f"{e:<12} {r.wall_time_s * 1e3:>8.1f} {np.abs(a[m]).mean() if m.any() else 0:>26.4f} {len(r.turns):>8}"
            )
        if skipped:
            print(f"(skipped, the data lack what they need: {', '.join(skipped)})")
        if k == 0:
            print(
                "(ms: wall time of compute(); in a fresh process the first call of each numba kernel "
                "includes its compilation, a few seconds — the later sets show the running speed)"
            )

        if batch.values is not None:
            _rule(f"{name}: critic values across vs within turns (docs/concepts.md §7.8)")
            s = analysis.variance_summary(analysis.value_variance(batch))
            print(
                f"mean across {s['mean_across']:.5f}   mean within {s['mean_within']:.5f}   "
                f"median ratio {s['median_ratio']:.2f}   across > within in {s['share_across_gt_within']:.0%} "
                f"of trajectories   infinite ratios {s['n_inf_ratio']}"
            )
        if len(results) > 1:
            _rule(f"{name}: how the estimators agree")
            cmp = analysis.compare_estimators(batch, {k: v.advantages for k, v in results.items()})
            with_cols = [
                c
                for c in cmp.columns
                if c in ("a", "b", "token_corr", "sign_agreement", "turn_rank_agreement", "n_sign_flips")
            ]
            print(cmp[with_cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))

        _rule(f"{name}: advantage columns and report")
        est = ",".join(e for e in DEFAULT_ESTIMATORS if e in names)
        adv_out = out / f"{name}_advantages.parquet"
        if cli(["advantages", str(path), "-e", est, "-o", str(adv_out), "--no-progress"]) != 0:
            return 1
        rep = out / f"{name}_report.html"
        if (
            cli(["report", str(path), "-e", est, "-o", str(rep), "--no-progress", "--title", f"mpo_viz demo: {name}"])
            != 0
        ):
            return 1
        reports.append(rep)

    if (folder / "trained").is_dir():
        learned_critic(folder / "trained")

    _rule("done")
    for rep in reports:
        print(f"report: {rep.resolve()}")
    print("open a report in any browser (it works offline), or run `make lab` for the notebooks.")
    return 0


def learned_critic(folder: Path) -> None:
    """The across/within split of a *trained* critic (trajectories/trained/: MPO runs of the trainer),
    next to the oracle values of the same trajectories, early and late in training."""
    _rule(f"learned critic: values across vs within turns ({folder})")
    files = sorted(folder.glob("*_early.parquet")) + sorted(folder.glob("*_late.parquet"))
    if not files:
        print("(no *_early/*_late.parquet files here)")
        return
    print(
        f"{'set':<20} {'values':<8} {'mean across':>12} {'mean within':>12} {'median ratio':>13} "
        f"{'across > within':>16}"
    )
    for path in sorted(files, key=lambda p: (p.stem.rsplit("_", 1)[0], p.stem.endswith("late"))):
        batch = mv.load(path)
        for label, values in (
            ("critic", None),
            ("oracle", batch.padded("oracle_values") if batch.has("oracle_values") else None),
        ):
            if label == "oracle" and values is None:
                continue
            v = batch.values if values is None else values
            sd = float(v[batch.mask.bool()].std())
            if sd < CONSTANT_SD:  # across and within print as 0.00000: say what that means
                print(f"{path.stem:<20} {label:<8} {f'constant (sd {sd:.4f} over all tokens) — no signal':>55}")
                continue
            s = analysis.variance_summary(analysis.value_variance(batch, values))
            print(
                f"{path.stem:<20} {label:<8} {s['mean_across']:>12.5f} {s['mean_within']:>12.5f} "
                f"{s['median_ratio']:>13.2f} {s['share_across_gt_within']:>16.0%}"
            )
    print(
        "(critic: the values the trained critic gave during training; oracle: the exact values under the "
        "scripted expert on the same trajectories, for reference — see trajectories/README.md)"
    )


#: values whose standard deviation over all action tokens is below this (returns lie in [0, 1]) are a
#: constant critic: their across/within split is rounding noise, so the table says so instead
CONSTANT_SD = 0.01


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0]) if argv else Path("trajectories")
    out = Path(argv[1]) if len(argv) > 1 else Path("out/demo")
    t = time.perf_counter()
    rc = run(folder, out)
    print(f"\n(demo took {time.perf_counter() - t:.1f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
