"""A real pretrained model through the whole loop, phase by phase: SmolLM2-135M-Instruct on ``tooluse``.

The steps of notebook 06, without the widgets: load the model folder (``mpo-viz get-model
smollm2-135m --out DIR``), measure it zero-shot on held-out tasks, a short SFT on noisy-expert
episodes in its chat template (stopping once greedy success reaches 0.5, to leave RL headroom), then a few RL
iterations from that start with MPO (mae +
turn_ppo, a value head on the policy's own trunk, ``critic_init="shared"``, warmed up first) and
with GRPO (grpo + token_ppo, G = 4, no critic), each evaluated before and after. It prints one row
per phase: seconds (wall), action tokens where the phase samples, and the load average after it.

    python benchmarks/pretrained_loop.py --model models/smollm2-135m                 # CPU, notebook 06's sizes
    python benchmarks/pretrained_loop.py --model models/smollm2-135m --device cuda --gpu   # a GPU's sizes

``--gpu`` raises the sizes to what a GPU makes short (more SFT steps, episodes and iterations, a
larger decode batch and micro-batch); every size can also be set on its own. The trainer keeps
float32 weights, optimizer states and losses on every device. Nothing is downloaded: ``--model``
is a local folder. Run folders go to ``--out`` (default /tmp/mpo_viz_bench_pretrained).
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
from mpo_viz.train.summary import phase_seconds  # noqa: E402

#: notebook 06's committed sizes (2 CPU cores) and a GPU's (``--gpu``)
SIZES = {
    "cpu": dict(
        sft_steps=40,
        sft_batch_episodes=4,
        episodes=8,
        group_size=4,
        iterations=3,
        eval_episodes=8,
        warmup_episodes=16,
        warmup_steps=8,
        rollout_batch_size=8,
        micro_batch_tokens=2048,
    ),
    "gpu": dict(
        sft_steps=200,
        sft_batch_episodes=16,
        episodes=64,
        group_size=4,
        iterations=20,
        eval_episodes=128,
        warmup_episodes=128,
        warmup_steps=64,
        rollout_batch_size=64,
        micro_batch_tokens=16384,
    ),
}
#: what both runs share: the environment, its difficulty, the token budgets, the learning rates
#: of a pretrained model (the tiny models' SFT rate, 3e-3, would wreck its weights), and SFT's stop:
#: a greedy check every 10 steps, stopping at 0.5 so that RL has headroom (40 steps reach 1.00)
COMMON = dict(
    env="tooluse",
    difficulty=[2, 3],
    max_turn_tokens=24,
    max_total_tokens=384,
    sft_lr=5e-5,
    sft_noise=0.0,
    sft_target_success=0.5,
    sft_eval_interval=10,
    policy_lr=1e-5,
    epochs=1,
    minibatches=2,
)


def config(args, s: dict, **changes) -> Config:
    return Config(
        **COMMON,
        seed=args.seed,
        device=args.device,
        num_threads=args.threads,
        episodes=s["episodes"],
        group_size=s["group_size"],
        iterations=s["iterations"],
        eval_episodes=s["eval_episodes"],
        eval_interval=s["iterations"],
        rollout_batch_size=s["rollout_batch_size"],
        micro_batch_tokens=s["micro_batch_tokens"],
        sft_batch_episodes=s["sft_batch_episodes"],
        **changes,
    )


def row(phase: str, seconds: float, tokens: int | None = None, note: str = "") -> None:
    tps = f"{tokens / seconds:.1f}" if tokens and seconds > 0 else ""
    print(
        f"| {phase} | {seconds:.1f} | {tokens if tokens is not None else ''} | {tps} | "
        f"{os.getloadavg()[0]:.1f} | {note} |",
        flush=True,
    )


def sft_phase(args, s: dict, out: Path) -> Path:
    """Load, zero-shot evaluation, SFT; returns the saved start folder."""
    t0 = time.perf_counter()
    tr = Trainer(
        config(args, s, model_dir=str(args.model), sft_steps=s["sft_steps"], estimator="grpo", loss="token_ppo"),
        out / "sft",
        quiet=True,
    )
    row(
        "load the model folder",
        time.perf_counter() - t0,
        note=f"{sum(p.numel() for p in tr.policy.model.parameters()):,} parameters",
    )
    t0 = time.perf_counter()
    ev = tr.evaluate()
    row(
        "zero-shot evaluation (greedy + sampled)",
        time.perf_counter() - t0,
        note=f"{ev['n_eval_tasks']} tasks: greedy {ev['eval_success']:.2f}, sampled {ev['eval_sampled_success']:.2f}",
    )
    rec = tr.sft()
    row(
        "SFT on expert episodes",
        rec["seconds"]["sft"],
        note=f"{rec['sft_steps']} steps x {s['sft_batch_episodes']} episodes; greedy success after: "
        f"{rec.get('sft_success', float('nan')):.2f} (its evaluation: {rec['seconds']['eval']:.1f} s)",
    )
    t0 = time.perf_counter()
    start = models.save(out / "start", tr.policy)
    row("save the start", time.perf_counter() - t0)
    return start


def rl_phase(args, s: dict, out: Path, start: Path, name: str, **method) -> None:
    """RL iterations from ``start``: its phase seconds, action tokens and held-out success."""
    tr = Trainer(config(args, s, model_dir=str(start), sft_steps=0, **method), out / name, quiet=True)
    t0 = time.perf_counter()
    recs = tr.run_all(log=lambda line: None)
    wall = time.perf_counter() - t0
    sec = phase_seconds(tr.history)
    tokens = round(sum(r["throughput"]["rollout_tokens_per_sec"] * r["timings"]["rollout"] for r in recs))
    for phase, seconds in sec.items():
        row(f"{name}: {phase}", seconds, tokens if phase == "rollout" else None)
    ev = [r for r in tr.history if r.get("eval_success") is not None]
    row(
        f"{name}: all ({len(recs)} iterations)",
        wall,
        note=f"held-out greedy {ev[0]['eval_success']:.2f} -> "
        f"{ev[-1]['eval_success']:.2f}, sampled {ev[0]['eval_sampled_success']:.2f} -> "
        f"{ev[-1]['eval_sampled_success']:.2f}",
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        type=Path,
        default=Path("models/smollm2-135m"),
        help="a local Hugging Face folder (default models/smollm2-135m: mpo-viz get-model smollm2-135m "
        "--out models/smollm2-135m)",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--gpu", action="store_true", help="a GPU's sizes instead of notebook 06's CPU sizes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default, every core)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/mpo_viz_bench_pretrained"))
    for k, v in SIZES["cpu"].items():
        ap.add_argument(
            f"--{k.replace('_', '-')}", type=int, default=None, help=f"default {v} (--gpu: {SIZES['gpu'][k]})"
        )
    args = ap.parse_args(argv)
    if not (args.model / "config.json").is_file():
        print(
            f"skipped: --model {args.model} holds no Hugging Face folder (config.json); make one with: "
            f"mpo-viz get-model smollm2-135m --out {args.model}"
        )
        return 0
    s = dict(SIZES["gpu" if args.gpu else "cpu"])
    s.update({k: getattr(args, k) for k in s if getattr(args, k) is not None})
    shutil.rmtree(args.out, ignore_errors=True)
    print(
        f"\n## {args.model.name} on tooluse, device {args.device}; sizes {s}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start\n"
    )
    print("| phase | seconds | action tokens | tokens/s | load after | note |\n|---|---|---|---|---|---|", flush=True)
    t0 = time.perf_counter()
    start = sft_phase(args, s, args.out)
    rl_phase(
        args,
        s,
        args.out,
        start,
        "MPO",
        estimator="mpo",
        loss="turn_ppo",
        critic_init="shared",
        critic_lr=1e-4,
        critic_warmup_episodes=s["warmup_episodes"],
        critic_warmup_steps=s["warmup_steps"],
    )
    rl_phase(args, s, args.out, start, "GRPO", estimator="grpo", loss="token_ppo")
    row("everything", time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
