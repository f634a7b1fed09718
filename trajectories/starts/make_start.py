"""Write a shipped SFT start under trajectories/starts/, stored in float16.

Three starts ship (a fourth, E6's, has its recipe here), each made by SFT on the noisy scripted
expert (noise 0.3 unless said, lr 3e-3, 16 episodes per step, a greedy evaluation every 50 steps
that decides the stop):

``automation/`` — the start notebook 03 and the 3–4-turn learning cell train from. It is the v1
learning grid's shared ``automation`` start (``benchmarks/learning.py --size small`` at commit
14b590f; the grid has no ``small`` size now, so remaking it means checking out that commit's
benchmark): 1,450 SFT steps at difficulty 3–6 until greedy success reached 0.44 on 64 held-out
tasks, about 40 minutes on 2 cores::

    git worktree add /tmp/v1 14b590f && (cd /tmp/v1 && python benchmarks/learning.py --size small \\
        --threads 1 --cells automation)                                          # makes the start
    python trajectories/starts/make_start.py /tmp/v1/runs/learning-small/starts/automation

``automation-d5-6/`` — the start of the 5–6-turn cell (replication v3, E3; docs/results.md): SFT
continued from ``automation/`` at difficulty 5–6 with the stop at greedy success 0.60 on 64 held-out
tasks of evaluation seed 1000, in three stages — the rule's 3,000 steps at lr 3e-3, then (the
recorded deviation) 400 steps and up to 1,200 more at lr 1e-3, each on new expert episodes::

    T="mpo-viz train --env automation --difficulty 5-6 --sft-target-success 0.6 --sft-eval-interval 50 \\
       --eval-episodes 64 --iterations 0 --critic-warmup-steps 0 --num-threads 1 --max-turn-tokens 48"
    $T --run-dir /tmp/rule --model-dir trajectories/starts/automation --sft-steps 3000 --seed 1000
    $T --run-dir /tmp/diag --model-dir /tmp/rule/start --sft-steps 400 --sft-lr 1e-3 --eval-seed 1000 --seed 1001
    $T --run-dir /tmp/stage2 --model-dir /tmp/diag/start --sft-steps 1200 --sft-lr 1e-3 --eval-seed 1000 --seed 1002
    python trajectories/starts/make_start.py /tmp/stage2/start automation-d5-6 --after /tmp/rule/start /tmp/diag/start

``sokoban/`` — the start notebook 07 trains from: SFT of a new 1m model on the noisy breadth-first
solver (noise 0.1) on one-box 6×6 rooms of 1–3 optimal moves, turn limit their moves + 3 (the
notebook's ``ENV_OPTIONS``: ``boxes=1, slack=3``), lr 3e-3, 16 episodes per step, a greedy
evaluation of 48 held-out rooms every 100 steps, the stop at greedy success 0.7 or 2,500 steps (its
``start.json`` records where it stopped). The plan was 3,000 steps; a 100-step probe took 0.69 s a
step beside two other training processes on the 2 cores (load 3.6), so the budget was cut to 2,500
to fit in about half an hour. It ran to the budget: 2,500 steps, greedy success 0.10 on the 48
held-out rooms (0.06–0.23 at the evaluations every 100 steps, no trend after step 900; the expert's
episodes 0.99 successful), 31 min 39 s wall on the 2 cores beside two other training processes (load
average 4.7–6.0; ``OMP_NUM_THREADS=1``, ``num_threads=1``). Uniformly random moves solve about a
fifth of such rooms, so the greedy start plays worse than chance; notebook 07 measures it greedy and
sampled. Made with (``quiet=False`` shows the evaluations)::

    OMP_NUM_THREADS=1 python -c "from mpo_viz.train import Config, Trainer; Trainer(Config(env='sokoban', \\
        env_options={'boxes': 1, 'slack': 3}, difficulty=[1, 3], sft_steps=2500, sft_noise=0.1, \\
        sft_target_success=0.7, sft_eval_interval=100, eval_episodes=48, estimator='grpo', group_size=4, \\
        loss='token_ppo', iterations=0, max_turn_tokens=32, num_threads=1), '/tmp/sokoban-sft').sft()"
    python trajectories/starts/make_start.py /tmp/sokoban-sft/start sokoban

``sokoban-e6/`` — replication v4 E6's own start (docs/results.md, its rule fixed before it is made):
SFT of a new 1m model on the noisy breadth-first solver (noise 0.1) on the exact
Sokoban model at its defaults (6×6, one box, RAGEN's reward, turn limit = optimal moves + 2) with rooms
of 2–6 optimal moves, lr 3e-3, 16 episodes per step, a greedy evaluation of 128 held-out rooms every
100 steps, the stop at the first evaluation with greedy success 0.20 or after 3,000 steps; shipped
with its record whatever its success. It ran to the budget: 3,000 steps, greedy success 0.11 on the
128 held-out rooms at the last evaluation (0.02–0.12 at the evaluations every 100 steps; the expert's
episodes 0.95 successful), 64 min wall (2026-12-05, ``OMP_NUM_THREADS=1``, ``num_threads=1``, a
benchmark on the other core, load 2.0–2.4). Made with::

    OMP_NUM_THREADS=1 python -c "from mpo_viz.train import Config, Trainer; Trainer(Config(env='sokoban', \
        difficulty=[2, 6], sft_steps=3000, sft_noise=0.1, sft_target_success=0.2, sft_eval_interval=100, \
        eval_episodes=128, sft_lr=3e-3, sft_batch_episodes=16, estimator='grpo', group_size=4, \
        loss='token_ppo', iterations=0, max_turn_tokens=48, num_threads=1), '/tmp/sokoban-e6-sft').sft()"
    python trajectories/starts/make_start.py /tmp/sokoban-e6-sft/start sokoban-e6

``SRC`` is either a learning grid's start folder (``SRC/model/policy`` and ``SRC/start.json``) or a
trainer run's ``RUN/start`` (``SRC/policy`` and ``SRC/start.json``). Only the policy ships (runs warm
up their own critic). Weights are rounded to float16 to halve the folder (2.2 MB); they load as
float32. Writes ``NAME/policy/`` (a Hugging Face folder) and ``NAME/start.json`` (the SFT record of
the source: steps, success, config hash). ``--after EARLIER...`` names the earlier SFT stages that
``SRC`` continued, in order: the record then lists every stage (``stages``) and ``sft_steps`` counts
them all. Deterministic: the same sources give the same files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: where each shipped start came from (its ``start.json`` ``source``)
SOURCES = {
    "automation": "benchmarks/learning.py --size small: the shared automation start (seed 0)",
    "sokoban": "Trainer(Config(env='sokoban', env_options={'boxes': 1, 'slack': 3}, difficulty=[1, 3], "
    "sft_noise=0.1, ...)).sft(): SFT of a new 1m model on the noisy solver, stop at greedy success 0.7 or "
    "2,500 steps (notebook 07's start)",
    "automation-d5-6": "mpo-viz train --difficulty 5-6 --model-dir trajectories/starts/automation: SFT continued "
    "at 5-6 turns, stop at greedy success 0.60, in three stages (3,000 steps at lr 3e-3, "
    "then 400 and up to 1,200 at lr 1e-3; replication v3, E3)",
    "sokoban-e6": "Trainer(Config(env='sokoban', difficulty=[2, 6], sft_noise=0.1, ...)).sft(): SFT of a new 1m "
    "model on the noisy solver at the exact model's defaults, stop at greedy success 0.20 on 128 held-out rooms "
    "or 3,000 steps (replication v4, E6)",
}


def model_folder(src: Path) -> Path:
    """The model folder inside ``src``: ``src/model`` (a learning grid's start) or ``src`` itself
    (a trainer run's ``RUN/start``)."""
    for d in (src / "model", src):
        if (d / "policy").is_dir():
            return d
    raise FileNotFoundError(
        f"{src}: expected a start folder (model/policy/ or policy/, and start.json), found no policy/"
    )


def stage_record(src: Path) -> dict:
    """One SFT stage's record from ``src/start.json``: source, config hash, steps, greedy success."""
    path = src / "start.json"
    if not path.is_file():
        raise FileNotFoundError(f"{src}: expected a start folder with start.json (the SFT record), found none")
    record = json.loads(path.read_text())
    if "sft" not in record or "sft_config_hash" not in record:
        raise ValueError(
            f"{path}: expected the fields 'sft' and 'sft_config_hash' (a start's SFT record), found {sorted(record)}"
        )
    sft = record["sft"]
    return {
        "from": str(src),
        "sft_config_hash": record["sft_config_hash"],
        "sft_steps": sft["sft_steps"],
        "sft_success": sft["sft_success"],
        "sft_expert_success": sft["sft_expert_success"],
    }


def write_start(
    src: Path, out: Path = HERE / "automation", source: str | None = None, after: list[Path] | None = None
) -> list[Path]:
    """Round ``src``'s policy to float16 into ``out/policy``; copy ``src/start.json``'s SFT record
    (with the earlier stages ``after``, in order, when ``src`` continued them)."""
    from mpo_viz import models

    last = stage_record(src)
    earlier = [stage_record(p) for p in after or []]
    policy, _ = models.load(model_folder(src))
    policy.model.half()
    if out.exists():
        shutil.rmtree(out)
    models.save(out, policy)
    info = {
        "source": source or SOURCES.get(out.name, str(src)),
        "sft_config_hash": last["sft_config_hash"],
        "sft_steps": sum(s["sft_steps"] for s in [*earlier, last]),
        "sft_success": last["sft_success"],
        "sft_expert_success": last["sft_expert_success"],
        "stored_as": "float16",
    }
    if earlier:
        info["stages"] = [{k: v for k, v in s.items() if k != "from"} for s in [*earlier, last]]
    (out / "start.json").write_text(json.dumps(info, indent=1) + "\n")
    return sorted(p for p in out.rglob("*") if p.is_file())


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="make_start.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("src", type=Path, help="the start folder (SRC/model/policy or SRC/policy, and SRC/start.json)")
    ap.add_argument("name", nargs="?", default="automation", choices=sorted(SOURCES), help="the start to write")
    ap.add_argument(
        "--after",
        type=Path,
        nargs="+",
        default=[],
        metavar="EARLIER",
        help="the earlier SFT stages SRC continued, in order (their start.json)",
    )
    args = ap.parse_args(argv)
    try:
        written = write_start(args.src, HERE / args.name, after=args.after)
    except (FileNotFoundError, ValueError) as e:
        ap.error(str(e))
    for p in written:
        print(f"{p.relative_to(HERE)}  {p.stat().st_size / 1e3:.0f} kB")
    print(f"total {sum(p.stat().st_size for p in written) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
