"""Trainer benchmark: phase timings of one iteration, and success against wall time for MPO, GRPO, PPO.

Part 1 — one 64-episode iteration (mpo + turn_ppo, the "1m" model, the default config: two policy
epochs, four critic epochs, four minibatches) on ``search``, ``tooluse`` and ``automation`` at
default difficulty, after a short SFT warm start (a random policy writes every turn to the token
limit, which is not what training looks like): seconds per phase (rollout, values, advantages,
update) and their sum (``iteration s``: target <= 15 s), then the evaluation that every
``eval_interval``-th (5th) iteration adds (greedy and sampled, 128 tasks each), timed apart, and
the iteration with a fifth of it; tokens/s of rollout and update; the load average after each row.
The estimator's kernels are compiled on their first call (numba, cached on disk): a first run in a
fresh checkout adds their compile time (~15 s) to ``advantages s`` once.

Part 2 — from one SFT warm start on ``search`` (saved once, loaded by each run), MPO (mae +
turn_ppo), GRPO (grpo + token_ppo, G = 4) and PPO (gae + token_ppo) each train for ``--minutes`` of
wall time; greedy eval success on the same 64 held-out tasks every ``--eval-interval`` iterations,
against wall time (critic warm-up included) and iterations. Goal: MPO >= 90% within 20 minutes.

Part 3 — a short run from scratch, what a new user tries first: the two-iteration run of
``mpo-viz train --env search --estimator mpo --loss turn_ppo --episodes 16 --group-size 4
--sft-steps 20 --seed 0 --iterations 2`` (``Trainer.run_all``, as the command does): seconds per
phase (``mpo_viz.train.summary.phase_seconds``), the wall and CPU seconds of the whole run and the
load average at its start and end. Target: <= 120 s wall on 2 cores at load <= 1. With
``--full-warmup`` a second row runs the same command with the warm-up pool and budget of a full run
(512 episodes, 256 steps: what every run used before they scaled with its length), and the ratio
column compares each row's wall time with the first.

    python benchmarks/train.py                         # all three parts, 20 minutes per algorithm
    python benchmarks/train.py --part 2 --minutes 8    # what fits a busy machine
    python benchmarks/train.py --part 1 --sft-steps 40
    python benchmarks/train.py --part 3 --full-warmup  # the short run, and the same with a full warm-up

Run folders go to ``--out`` (default /tmp/mpo_viz_bench_train). Rows are printed as they come.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpo_viz import models  # noqa: E402
from mpo_viz.train import Config, Trainer  # noqa: E402
from mpo_viz.train.summary import PHASES, phase_seconds  # noqa: E402

ALGOS = [("MPO", "mpo", "turn_ppo", 1), ("GRPO", "grpo", "token_ppo", 4), ("PPO", "gae", "token_ppo", 1)]


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path


def part1(args) -> None:
    print(
        f"\n## one iteration of 64 episodes (mpo + turn_ppo, model 1m, the default config, "
        f"{Config().num_threads} CPU thread; load average {os.getloadavg()[0]:.1f} at the start)\n",
        flush=True,
    )
    head = (
        "| env | SFT steps | SFT greedy success | rollout s | values s | advantages s | update s | iteration s | "
        "eval s | iteration + eval/5 s | action tokens | rollout tok/s | update tok/s | load |"
    )
    print(head)
    print("|" + "|".join(["---"] * (head.count("|") - 1)) + "|")
    for env in args.envs:
        start = _start_of(args, env)
        # the default config (critic_epochs 4, eval every 5 iterations on 128 tasks, twice) but for the
        # warm start (SFT, or a model folder) and no critic warm-up: the timed iteration is a plain one
        cfg = Config(
            env=env,
            estimator="mpo",
            loss="turn_ppo",
            episodes=64,
            sft_steps=0 if start else args.sft_steps,
            sft_target_success=0.4,
            critic_warmup_steps=0,
            iterations=1,
            seed=args.seed,
            model_dir=start,
        )
        tr = Trainer(cfg, _fresh(args.out / f"phases-{env}"), quiet=True)
        if start:
            sft = {"sft_steps": f"from {Path(start).parent.name}", "sft_success": tr.evaluate_one()["eval_success"]}
        else:
            sft = tr.sft() if args.sft_steps else {"sft_steps": 0, "sft_success": float("nan")}
        rec = next(tr.iterate(1))
        t = rec["timings"]
        th = rec["throughput"]
        it = t["rollout"] + t["values"] + t["advantages"] + t["update"]
        t0 = time.perf_counter()
        tr.evaluate()  # what every cfg.eval_interval-th iteration adds (greedy and sampled, eval_episodes each)
        ev = time.perf_counter() - t0
        print(
            f"| {env} | {sft['sft_steps']} | {sft['sft_success']:.2f} | {t['rollout']:.2f} | {t['values']:.2f} | "
            f"{t['advantages']:.2f} | {t['update']:.2f} | {it:.2f} | {ev:.2f} | {it + ev / cfg.eval_interval:.2f} | "
            f"{int(rec['action_tokens_mean'] * cfg.episodes)} | {th['rollout_tokens_per_sec']:.0f} | "
            f"{th['update_tokens_per_sec']:.0f} | {os.getloadavg()[0]:.1f} |",
            flush=True,
        )


def _difficulty(args):
    """``--difficulty`` as a Config value: None, N, or [MIN, MAX]."""
    d = args.difficulty
    return None if d is None else d[0] if len(d) == 1 else list(d)


def _start_of(args, env: str) -> str | None:
    """The model folder part 1 starts ``env`` from (``--model-dir ENV=DIR``), or None (SFT first)."""
    for item in args.model_dir or ():
        name, _, folder = item.partition("=")
        if name == env:
            return folder
    return None


def warm_start(args) -> Path:
    """SFT on search once (to the target success or the step budget); the policy is saved for all runs."""
    if args.warm_start:
        print(f"warm start: the model folder {args.warm_start}", flush=True)
        return Path(args.warm_start)
    folder = args.out / "warm_start"
    if (folder / "policy").is_dir() and not args.redo_sft:
        print(f"warm start: reusing {folder}", flush=True)
        return folder
    cfg = Config(
        env="search",
        difficulty=_difficulty(args),
        estimator="grpo",
        loss="token_ppo",
        group_size=4,
        sft_steps=args.sft_steps_warm,
        sft_target_success=args.sft_target,
        iterations=0,
        eval_episodes=64,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    tr = Trainer(cfg, _fresh(args.out / "sft"), quiet=True)
    r = tr.sft()
    models.save(_fresh(folder), tr.policy)
    print(
        f"warm start: {r['sft_steps']} SFT steps, greedy success {r['sft_success']:.3f} "
        f"(noisy expert {r['sft_expert_success']:.3f}), {time.perf_counter() - t0:.0f} s -> {folder}",
        flush=True,
    )
    return folder


def part2(args) -> None:
    warm = warm_start(args)
    turns = "default" if args.difficulty is None else "-".join(map(str, args.difficulty))
    print(
        f"\n## search ({turns} expert turns), from the SFT warm start: greedy eval success (64 held-out tasks) "
        f"vs wall time, {args.minutes:g} min per algorithm\n",
        flush=True,
    )
    print("| algorithm | iteration | wall min | greedy eval success | rollout success |")
    print("|---|---|---|---|---|", flush=True)
    summary = []
    for name, est, loss, g in ALGOS:
        if args.algos and name not in args.algos:
            continue
        cfg = Config(
            env="search",
            difficulty=_difficulty(args),
            model_dir=str(warm),
            sft_steps=0,
            estimator=est,
            loss=loss,
            group_size=g,
            episodes=64,
            eval_interval=args.eval_interval,
            eval_episodes=64,
            iterations=10**6,
            seed=args.seed,
        )
        t0 = time.perf_counter()
        tr = Trainer(cfg, _fresh(args.out / name), quiet=True)
        ev = tr.evaluate_one()["eval_success"]
        print(f"| {name} | 0 | 0.0 | {ev:.3f} | |", flush=True)
        best = (ev, 0, 0.0)
        if tr.critic is not None:
            tr.warmup_critic()
        while time.perf_counter() - t0 < args.minutes * 60:
            rec = next(tr.iterate(1))
            if "eval_success" in rec:
                wall = (time.perf_counter() - t0) / 60
                print(
                    f"| {name} | {rec['iteration']} | {wall:.1f} | {rec['eval_success']:.3f} | {rec['success']:.3f} |",
                    flush=True,
                )
                if rec["eval_success"] > best[0]:
                    best = (rec["eval_success"], rec["iteration"], wall)
        summary.append((name, tr.iteration, (time.perf_counter() - t0) / 60, *best))
    print("\n| algorithm | iterations run | wall min | best greedy eval success | at iteration | at wall min |")
    print("|---|---|---|---|---|---|")
    for name, its, wall, b, bi, bw in summary:
        print(f"| {name} | {its} | {wall:.1f} | {b:.3f} | {bi} | {bw:.1f} |", flush=True)


#: part 3: the short run's command as Config fields (every other field at its default)
SHORT_RUN = dict(
    env="search", estimator="mpo", loss="turn_ppo", episodes=16, group_size=4, sft_steps=20, seed=0, iterations=2
)
#: part 3's target wall time, seconds
SHORT_RUN_TARGET_S = 120.0


def _short_run(out: Path, **changes) -> dict:
    """The short run (``SHORT_RUN`` with ``changes``) from scratch: its phase seconds, wall, CPU, loads."""
    load0, wall0, cpu0 = os.getloadavg()[0], time.perf_counter(), time.process_time()
    tr = Trainer(Config(**{**SHORT_RUN, **changes}), _fresh(out), quiet=True)
    tr.run_all(log=lambda line: None)
    warm = next((r for r in tr.history if r.get("phase") == "critic_warmup"), {})
    return {
        "phases": phase_seconds(tr.history),
        "wall": time.perf_counter() - wall0,
        "cpu": time.process_time() - cpu0,
        "load": (load0, os.getloadavg()[0]),
        "warmup": f"{warm.get('warmup_episodes')} episodes, {warm.get('warmup_steps')} steps "
        f"({warm.get('warmup_stop')})",
    }


def part3(args) -> None:
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in SHORT_RUN.items())
    print(
        f"\n## the short run: mpo-viz train {flags} (wall target {SHORT_RUN_TARGET_S:.0f} s on 2 cores at "
        f"load <= 1; load average {os.getloadavg()[0]:.1f} at the start)\n",
        flush=True,
    )
    rows = [("defaults", {})]
    if args.full_warmup:
        rows.append(
            ("full-run warm-up pool and budget (512, 256)", dict(critic_warmup_episodes=512, critic_warmup_steps=256))
        )
    names = [name for name, _ in PHASES]
    head = (
        "| run | warm-up | "
        + " | ".join(f"{n} s" for n in names)
        + " | wall s | CPU s | wall / first | load start | load end |"
    )
    print(head)
    print("|" + "|".join(["---"] * (head.count("|") - 1)) + "|", flush=True)
    first = None
    for i, (name, changes) in enumerate(rows):
        r = _short_run(args.out / f"short-{i}", **changes)
        first = first or r["wall"]
        cells = " | ".join(f"{r['phases'].get(n, 0.0):.1f}" for n in names)
        print(
            f"| {name} | {r['warmup']} | {cells} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['wall'] / first:.2f} | "
            f"{r['load'][0]:.1f} | {r['load'][1]:.1f} |",
            flush=True,
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", type=int, choices=(1, 2, 3), help="run only part 1, 2 or 3")
    p.add_argument(
        "--full-warmup",
        action="store_true",
        help="part 3: also run the short run with a full run's warm-up pool and budget",
    )
    p.add_argument("--minutes", type=float, default=20.0, help="wall minutes per algorithm in part 2")
    p.add_argument("--eval-interval", type=int, default=3, help="iterations between greedy evaluations (part 2)")
    p.add_argument("--sft-steps", type=int, default=60, help="SFT steps before the timed iteration (part 1)")
    p.add_argument("--envs", nargs="*", default=["search", "tooluse", "automation"], help="environments of part 1")
    p.add_argument(
        "--model-dir",
        nargs="*",
        metavar="ENV=DIR",
        help="part 1: start ENV from this model folder (e.g. a learning-grid start) instead of SFT",
    )
    p.add_argument("--sft-steps-warm", type=int, default=1500, help="SFT step budget of the warm start (part 2)")
    p.add_argument("--sft-target", type=float, default=0.4, help="SFT stops at this greedy success (part 2)")
    p.add_argument("--algos", nargs="*", help="subset of MPO GRPO PPO")
    p.add_argument("--warm-start", metavar="DIR", help="part 2: start from this model folder instead of SFT")
    p.add_argument(
        "--difficulty",
        type=int,
        nargs="+",
        default=None,
        metavar="TURNS",
        help="part 2: search's expert turns, N or MIN MAX (default: the environment's)",
    )
    p.add_argument("--redo-sft", action="store_true", help="redo the warm start even if saved")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("/tmp/mpo_viz_bench_train"))
    p.add_argument(
        "--quick",
        action="store_true",
        help="a few seconds' smoke run (make bench): part 1 on search after 10 SFT steps",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.part, args.envs, args.sft_steps = 1, ["search"], 10
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part in (None, 1):
        part1(args)
    if args.part in (None, 2):
        part2(args)
    if args.part in (None, 3):
        part3(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
