"""Write trajectories/trained/ from a real MPO training run of the trainer: the rollouts of an early and
a late RL iteration (learned critic values, real log-probs, the advantages trained on, oracle columns)
and a small copy of the run folder for the dashboard.

The run (commands in trajectories/README.md; ``--commands`` prints them): an SFT warm start on the
noisy expert, its policy saved as a model folder (``--sft-model``), then RL with mpo + turn_ppo from
that folder with the config ``automation_rl.json`` beside this script. Then the extraction:

    python trajectories/trained/make_trained.py runs/trained/automation_rl

writes, from that run folder:

    automation_early.parquet   the rollout of RL iteration 1 (right after the critic warm-up)
    automation_late.parquet    the rollout of the last RL iteration
    run/                       config.json, metrics.jsonl (every iteration) and the trajectories of
                               the first, middle and last iteration; no checkpoints

Each Parquet file keeps its metadata (estimator, options, iteration) and gains ``config_hash``. The
extraction is deterministic: the same run folder gives the same files.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the environment whose run folder ships as ``run/`` (the others as ``run_<env>/``)
RUN_ENV = "automation"

COMMANDS = [
    # 1. SFT warm start (the run was stopped once SFT had written its checkpoint: the RL part of this
    #    config was not used; its critic warm-up had not finished)
    "mpo-viz train --env automation --estimator mpo --loss turn_ppo --model-size 1m --episodes 16 --group-size 4 "
    "--iterations 10 --eval-interval 5 --eval-episodes 16 --seed 0 --sft-steps 100 --run-dir runs/trained/automation",
    # 2. its post-SFT policy as a model folder
    "python trajectories/trained/make_trained.py --sft-model runs/trained/automation runs/trained/automation_sft",
    # 3. critic warm-up and RL from that model folder
    "mpo-viz train --config trajectories/trained/automation_rl.json --run-dir runs/trained/automation_rl",
    # 4. the files shipped here
    "python trajectories/trained/make_trained.py runs/trained/automation_rl",
]


def sft_model(run: Path, out: Path) -> Path:
    """The policy of a run folder right after its SFT warm start (its iteration-0 checkpoint, written
    before the critic warm-up) as a model folder that a config's ``model_dir`` can start from."""
    from mpo_viz import models
    from mpo_viz.envs.registry import make_env
    from mpo_viz.envs.tokenizer import build_tokenizer
    from mpo_viz.train import Config
    from mpo_viz.train.checkpoint import load_checkpoint

    cfg = Config.load(run / "config.json")
    ck = load_checkpoint(run / "checkpoints" / "iter=000000")
    if not (ck.state.get("sft_done") and not ck.state.get("critic_warm")):
        raise SystemExit(f"{run}: expected the iteration-0 checkpoint written after SFT and before the critic warm-up")
    policy = models.tiny_policy(build_tokenizer(make_env(cfg.env)), size=cfg.model_size, seed=cfg.seed)
    ck.load_weights("policy", policy.model)
    return models.save(out, policy)


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
    if argv[0] == "--sft-model":
        print(sft_model(Path(argv[1]), Path(argv[2])))
        return 0
    written = extract(Path(argv[0]))
    for p in written:
        print(f"{p.relative_to(HERE)}  {p.stat().st_size / 1e3:.0f} kB")
    print(f"total {sum(p.stat().st_size for p in written) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
