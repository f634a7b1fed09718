"""Write trajectories/trained/ from real MPO training runs of the trainer: the rollouts of an early and
a late RL iteration (learned critic values, real log-probs, the advantages trained on, oracle columns)
and a small copy of each run folder for the dashboard.

The runs (``--commands`` prints the commands; trajectories/README.md explains them) start from the
shared SFT + critic warm-up starts of ``benchmarks/learning.py --size small``:

* ``search`` (2–3 expert turns): the learning grid's seed-0 MPO run itself (8 iterations × 16
  episodes);
* ``automation``: a longer critic warm-up (30 rollouts at critic lr 1e-3, so that the critic explains
  part of the returns) and 6 iterations × 32 episodes of mpo + turn_ppo from the grid's start.
* ``tooluse`` (3–6 expert turns; not in the grid): one command makes its own start — 1,500 SFT steps,
  the same 30-rollout critic warm-up — then the same 6 iterations × 32 episodes.

Then the extraction, per run folder:

    python trajectories/trained/make_trained.py RUN_DIR

writes ``ENV_early.parquet`` (the first saved RL iteration), ``ENV_late.parquet`` (the last), and the
run folder without checkpoints — config.json, metrics.jsonl (every iteration) and the trajectories of
the first, middle and last saved iteration — as ``run/`` (automation) or ``run_ENV/``. Each Parquet
file keeps its metadata (estimator, options, iteration) and gains ``config_hash``. The extraction is
deterministic: the same run folder gives the same files.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the environment whose run folder ships as ``run/`` (the others as ``run_<env>/``)
RUN_ENV = "automation"

COMMANDS = [
    # 1. the learning grid's search cells: SFT + critic warm-up start, then every method and seed
    "python benchmarks/learning.py --size small --threads 1 --cells search search-g1",
    # 2. the grid's automation cells (their start is what the automation run below starts from)
    "python benchmarks/learning.py --size small --threads 1 --cells automation automation-g1",
    # 3. automation: a longer critic warm-up and 6 RL iterations from the grid's start
    "mpo-viz train --env automation --estimator mpo --loss turn_ppo --model-dir "
    "runs/learning-small/starts/automation/model --sft-steps 0 --critic-warmup-steps 30 --critic-lr 1e-3 "
    "--iterations 6 --episodes 32 --group-size 4 --eval-interval 3 --eval-episodes 32 --seed 0 "
    "--run-dir runs/trained/automation",
    # 4. tooluse: its own SFT start (1,500 steps), the same critic warm-up and RL as automation
    "mpo-viz train --env tooluse --estimator mpo --loss turn_ppo --sft-steps 1500 --critic-warmup-steps 30 "
    "--critic-lr 1e-3 --iterations 6 --episodes 32 --group-size 4 --eval-interval 3 --eval-episodes 32 --seed 0 "
    "--run-dir runs/trained/tooluse",
    # 5. the files shipped here
    "python trajectories/trained/make_trained.py runs/learning-small/runs/search/mpo/seed=0",
    "python trajectories/trained/make_trained.py runs/trained/automation",
    "python trajectories/trained/make_trained.py runs/trained/tooluse",
]


def _with_hash(path: Path, cfg_hash: str):
    import mpo_viz as mv

    b = mv.load(path)
    b.meta["config_hash"] = cfg_hash
    return b


def extract(run: Path, out: Path = HERE) -> list[Path]:
    import mpo_viz as mv
    from mpo_viz.train import Config

    files = sorted((run / "trajectories").glob("iter=*.parquet"))
    if not files:
        raise SystemExit(f"{run}: expected trajectories/iter=*.parquet, found none (train first: --commands)")
    cfg = Config.load(run / "config.json")
    cfg_hash, env = cfg.hash(), cfg.env
    written = [mv.save(_with_hash(files[0], cfg_hash), out / f"{env}_early.parquet"),
               mv.save(_with_hash(files[-1], cfg_hash), out / f"{env}_late.parquet")]
    dst = out / ("run" if env == RUN_ENV else f"run_{env}")
    if dst.exists():
        shutil.rmtree(dst)
    (dst / "trajectories").mkdir(parents=True)
    for name in ("config.json", "metrics.jsonl"):
        shutil.copy(run / name, dst / name)
        written.append(dst / name)
    for f in sorted({files[0], files[len(files) // 2], files[-1]}):
        written.append(mv.save(_with_hash(f, cfg_hash), dst / "trajectories" / f.name))
    return written


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] == "--commands":
        print("\n".join(COMMANDS))
        return 0
    written = extract(Path(argv[0]))
    for p in written:
        print(f"{p.relative_to(HERE)}  {p.stat().st_size / 1e3:.0f} kB")
    print(f"total {sum(p.stat().st_size for p in written) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
