"""``mpo-viz generate``: logged trajectories of the noisy expert with exact oracle values."""

from __future__ import annotations

import shlex

from mpo_viz.checks import OptionError


def _difficulty(text: str):
    try:
        if "-" in text:
            lo, hi = text.split("-", 1)
            return (int(lo), int(hi))
        return int(text)
    except ValueError:
        raise OptionError("difficulty", f"expected N or MIN-MAX (expert turns), found {text!r}") from None


def _command_line(args) -> str:
    """The canonical command that reproduces this run (stored in the file metadata)."""
    parts = ["mpo-viz", "generate", "--env", args.env, "--policy", args.policy, "--noise", repr(args.noise),
             "--episodes", str(args.episodes), "--group-size", str(args.group_size), "--seed", str(args.seed)]
    if args.value_noise:
        parts += ["--value-noise", repr(args.value_noise)]
    if args.difficulty != "3-6":
        parts += ["--difficulty", args.difficulty]
    if args.no_reasoning:
        parts.append("--no-reasoning")
    if args.gamma != 1.0:
        parts += ["--gamma", repr(args.gamma)]
    for name in ("slack", "max_turns", "shaping", "slip", "distractors"):
        v = getattr(args, name)
        if v is not None:
            parts += ["--" + name.replace("_", "-"), str(v)]
    return " ".join(shlex.quote(p) for p in [*parts, "--out", args.out])


def cmd_generate(args) -> int:
    from mpo_viz.envs.generate import GenerateConfig, generate
    from mpo_viz.io import save

    opts = {}
    for name in ("slack", "max_turns", "shaping", "slip", "distractors"):
        v = getattr(args, name)
        if v is not None:
            opts[name] = v
    cfg = GenerateConfig(
        env=args.env, policy=args.policy, noise=args.noise, episodes=args.episodes,
        group_size=args.group_size, seed=args.seed, value_noise=args.value_noise,
        reasoning=not args.no_reasoning, difficulty=_difficulty(args.difficulty), gamma=args.gamma,
        env_options=opts,
    )
    batch = generate(cfg)  # a bad field raises OptionError; mpo-viz names its flag (dest = the field)
    batch.meta["command"] = _command_line(args)
    path = save(batch, args.out)
    succ = float(batch.reward.mean()) if not cfg.env_options.get("shaping") else float("nan")
    print(f"wrote {len(batch)} trajectories ({len(batch) // cfg.group_size} tasks x {cfg.group_size}) "
          f"to {path}; mean reward {succ:.3f}; values_source=oracle" +
          (f" + N(0, {cfg.value_noise}^2)" if cfg.value_noise else ""))
    return 0


def add_subcommand(sub) -> None:
    from mpo_viz.envs.registry import available_envs

    p = sub.add_parser("generate", help="play an environment with the noisy expert; write trajectory/v1 "
                                        "with exact oracle values",
                       description="Play --episodes trajectories (--episodes / --group-size tasks, --group-size "
                                   "samples each) of an environment with the scripted noisy expert and write them "
                                   "as trajectory/v1 with exact oracle values in `values` (docs/environments.md). "
                                   "The output is a deterministic function of the options.")
    p.add_argument("--env", required=True, choices=available_envs(), help="environment")
    p.add_argument("--policy", default="expert", choices=["expert"], help="who acts (the scripted noisy expert)")
    p.add_argument("--noise", type=float, default=0.25, help="expert noise p: random valid action with probability p")
    p.add_argument("--episodes", type=int, default=256, help="trajectories in all (a multiple of --group-size)")
    p.add_argument("--group-size", type=int, default=4, help="samples per task (G)")
    p.add_argument("--seed", type=int, default=0, help="master seed")
    p.add_argument("--out", required=True, help="output .parquet or .jsonl")
    p.add_argument("--value-noise", type=float, default=0.0, metavar="SIGMA",
                   help="add N(0, SIGMA^2) to the oracle values (a stand-in for a learned critic)")
    p.add_argument("--difficulty", default="3-6", help="expert turns per task: N or MIN-MAX (default 3-6)")
    p.add_argument("--no-reasoning", action="store_true", help="the expert writes only the command")
    p.add_argument("--gamma", type=float, default=1.0, help="turn-level discount of the oracle values")
    p.add_argument("--slack", type=int, default=None, help="turn limit = expert turns + slack (default 2)")
    p.add_argument("--max-turns", type=int, default=None, help="a fixed turn limit instead")
    p.add_argument("--shaping", type=float, default=None, help="reward per progress turn (default 0)")
    p.add_argument("--slip", type=float, default=None, help="automation: slip probability (default 0.1)")
    p.add_argument("--distractors", type=int, default=None, help="search: distractor entities (default 3)")
    p.set_defaults(func=cmd_generate)
