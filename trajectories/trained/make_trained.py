"""Write trajectories/trained/ from real MPO training runs of the trainer: the rollouts of an early and
a late RL iteration (learned critic values, real log-probs, the advantages trained on, oracle columns)
and a small copy of each run folder for the dashboard.

The runs (``--commands`` prints the commands; trajectories/README.md explains them) are self-contained,
mpo + turn_ppo (its default token band ``token_clip`` 2.0) with a learned critic, seed 0, 6 iterations
× 32 episodes (8 tasks × G = 4), each 3.5–5 minutes of CPU (12–29 minutes of wall time on a
shared 2-core machine at load average 5–9):

* ``automation``: from the shipped SFT start ``trajectories/starts/automation`` (``--model-dir``,
  ``--sft-steps 0``);
* ``search`` (2–3 expert turns) and ``tooluse`` (3–6): a short SFT of their own (150 steps at the
  default lr 3e-3: a start that has barely begun to imitate the expert) and a progress reward
  (``shaping`` 0.1 for each turn that makes progress, 1 for success), so that a return can differ
  from 0 before the first success (in these runs hardly an episode makes progress:
  trajectories/README.md says what each run shows).

Every run warms its critic up with today's procedure (a pool of rollouts of the start, AdamW steps
of 32 episodes at lr 1e-3 until the explained variance on the held-out fifth reaches 0.2), on a
smaller pool and budget than the defaults (``--critic-warmup-episodes 160 --critic-warmup-steps 64``
instead of 512 and 256: the default pool alone costs minutes here), and evaluates on 32 held-out
tasks (``--eval-episodes 32`` instead of 128) at iterations 0, 3 and 6. These are example data for
the dashboard, the explorer and notebooks 01/02, not results: the runs are too short to learn much.

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

#: what every run shares: mpo + turn_ppo (default token band), 6 iterations x 32 episodes, a smaller
#: critic warm-up than the default (see the docstring), 32 evaluation tasks at iterations 0, 3 and 6
_COMMON = (
    "--estimator mpo --loss turn_ppo --critic-warmup-episodes 160 --critic-warmup-steps 64 "
    "--iterations 6 --episodes 32 --group-size 4 --eval-episodes 32 --eval-interval 3 --seed 0"
)

COMMANDS = [
    "mkdir -p runs/trained",
    # 1. automation: from the shipped SFT start
    f"mpo-viz train --env automation --model-dir trajectories/starts/automation --sft-steps 0 {_COMMON} "
    "--run-dir runs/trained/automation",
    # 2. search (2-3 expert turns): a short SFT of its own and a progress reward (env_options has no
    #    flag of its own: a --config file holds it)
    """echo '{"env_options": {"shaping": 0.1}}' > runs/trained/shaping.json""",
    f"mpo-viz train --config runs/trained/shaping.json --env search --difficulty 2-3 --sft-steps 150 {_COMMON} "
    "--run-dir runs/trained/search",
    # 3. tooluse (3-6 expert turns): the same
    f"mpo-viz train --config runs/trained/shaping.json --env tooluse --sft-steps 150 {_COMMON} "
    "--run-dir runs/trained/tooluse",
    # 4. the files shipped here
    "python trajectories/trained/make_trained.py runs/trained/automation",
    "python trajectories/trained/make_trained.py runs/trained/search",
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
    written = [
        mv.save(_with_hash(files[0], cfg_hash), out / f"{env}_early.parquet"),
        mv.save(_with_hash(files[-1], cfg_hash), out / f"{env}_late.parquet"),
    ]
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
