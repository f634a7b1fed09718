"""``mpo-viz generate``: trajectories of the noisy expert (exact oracle values) or of a model
(``--policy model``: a fresh tiny Llama and critic, or ``--model DIR``; critic values beside the
oracle's)."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from mpo_viz.checks import OptionError
from mpo_viz.data.io import save
from mpo_viz.envs.base import parse_difficulty
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.registry import available_envs, make_env


def _difficulty(text: str):
    """The ``--difficulty`` flag's value: N, or (MIN, MAX)."""
    try:
        d = parse_difficulty(text)
    except ValueError as exc:
        raise OptionError("difficulty", str(exc)) from None
    return tuple(d) if isinstance(d, list) else d


def _command_line(args) -> str:
    """The canonical command that reproduces this run (stored in the file metadata)."""
    parts = [
        "mpo-viz",
        "generate",
        "--env",
        args.env,
        "--policy",
        args.policy,
        "--noise",
        repr(args.noise),
        "--episodes",
        str(args.episodes),
        "--group-size",
        str(args.group_size),
        "--seed",
        str(args.seed),
    ]
    for name in _MODEL_FLAGS:
        v = getattr(args, name)
        if v is not None:
            parts += ["--" + name.replace("_", "-"), str(v)]
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


#: flags of --policy model only (None when not given)
_MODEL_FLAGS = (
    "model",
    "save_model",
    "size",
    "critic",
    "temperature",
    "top_p",
    "max_turn_tokens",
    "max_total_tokens",
    "batch_size",
    "device",
)


def _resolve_policy(args) -> str:
    """--model / --save-model alone imply --policy model; model flags with the expert are refused."""
    given = [n for n in _MODEL_FLAGS if getattr(args, n) is not None]
    if args.policy is None:
        args.policy = "model" if args.model is not None or args.save_model is not None else "expert"
    if args.policy == "expert" and given:
        raise OptionError(given[0], "expected only with --policy model, found it with --policy expert")
    if args.policy == "model":
        if args.value_noise:
            raise OptionError(
                "value_noise",
                "expected only with --policy expert (a model run records its "
                "critic's values), found it with --policy model",
            )
        if args.model is not None and args.size is not None:
            raise OptionError("size", "expected only for a fresh model (without --model), found it with --model")
    return args.policy


def _env_options(args) -> dict:
    return {
        name: getattr(args, name)
        for name in ("slack", "max_turns", "shaping", "slip", "distractors")
        if getattr(args, name) is not None
    }


def _load_model(args):
    """``--model DIR``: a model folder (DIR/policy, DIR/critic) or a plain Hugging Face causal-LM folder
    (no critic unless ``--critic`` builds one)."""
    from mpo_viz import models  # transformers (~1 s): only a model run imports it

    path = Path(args.model)
    device = models.resolve_device(args.device or "cpu")  # before loading: a missing backend is one line
    try:
        policy, critic = models.load(path, device=device)
    except (OSError, ValueError) as exc:
        raise OptionError("model", str(exc)) from None
    if args.critic is not None:
        if critic is not None:
            raise OptionError("critic", f"expected only when --model has no critic/, found {path / 'critic'}")
        critic = models.make_critic(policy, args.critic, seed=args.seed)
    return policy, critic


def cmd_generate_model(args) -> int:
    # the models, their tokenizer and the rollout pull in transformers (~1 s): only a model run imports them
    from mpo_viz import models
    from mpo_viz.envs.tokenizer import build_tokenizer
    from mpo_viz.rollout import rollout

    env = make_env(args.env, difficulty=_difficulty(args.difficulty), **_env_options(args))
    if args.episodes < 1 or args.episodes % max(args.group_size, 1):
        raise OptionError(
            "episodes", f"expected a positive multiple of --group-size={args.group_size}, found {args.episodes}"
        )
    if args.model is not None:
        policy, critic = _load_model(args)
    else:
        device = models.resolve_device(args.device or "cpu")
        policy = models.tiny_policy(build_tokenizer(env), args.size or "1m", seed=args.seed)
        policy.model.to(device)
        critic = models.make_critic(policy, args.critic or "policy", seed=args.seed)
    oracle = NoisyExpert(noise=args.noise)
    opts = {
        k: getattr(args, k)
        for k in ("temperature", "top_p", "max_turn_tokens", "max_total_tokens", "batch_size")
        if getattr(args, k) is not None
    }
    t0 = time.perf_counter()
    try:
        batch = rollout(
            policy,
            env,
            args.episodes,
            group_size=args.group_size,
            critic=critic,
            seed=args.seed,
            oracle=oracle,
            progress=None,
            **opts,
        )
    except OptionError as exc:
        if exc.option == "n_episodes":
            raise OptionError("episodes", exc.detail) from None
        raise
    except ValueError as exc:  # the model's tokenizer does not cover the environment
        if args.model is not None:
            raise OptionError("model", str(exc)) from None
        raise
    secs = time.perf_counter() - t0
    batch.meta["command"] = _command_line(args)
    path = save(batch, args.out)
    if args.save_model is not None:
        models.save(args.save_model, policy, critic)
    n_act = int(batch.mask.sum())
    reward_txt = f"mean reward {float(batch.outcome_reward.mean()):.3f}" if not env.shaping else "shaped rewards"
    print(
        f"wrote {len(batch)} trajectories ({len(batch) // args.group_size} tasks x {args.group_size}) to {path}; "
        f"{reward_txt}; {n_act} action tokens in {secs:.1f} s; values_source="
        f"{batch.meta.get('values_source', 'none')} (oracle beside); policy {policy.name}"
    )
    if batch.meta.get("values_source") == models.UNTRAINED_CRITIC:
        print(
            "note: the critic's value head is untrained (as initialized): its values are no estimate, and reports "
            "do not rank the estimators that use them; fit one with mpo-viz fit-critic"
        )
    if args.save_model is not None:
        print(f"saved the policy and critic to {args.save_model}")
    return 0


def cmd_generate(args) -> int:
    from mpo_viz.envs.generate import (  # the tokenizer: transformers, as above
        GenerateConfig,
        generate,
    )

    if _resolve_policy(args) == "model":
        return cmd_generate_model(args)
    opts = {}
    for name in ("slack", "max_turns", "shaping", "slip", "distractors"):
        v = getattr(args, name)
        if v is not None:
            opts[name] = v
    cfg = GenerateConfig(
        env=args.env,
        policy=args.policy,
        noise=args.noise,
        episodes=args.episodes,
        group_size=args.group_size,
        seed=args.seed,
        value_noise=args.value_noise,
        reasoning=not args.no_reasoning,
        difficulty=_difficulty(args.difficulty),
        gamma=args.gamma,
        env_options=opts,
    )
    batch = generate(cfg)  # a bad field raises OptionError; mpo-viz names its flag (dest = the field)
    batch.meta["command"] = _command_line(args)
    path = save(batch, args.out)
    succ = float(batch.outcome_reward.mean()) if not cfg.env_options.get("shaping") else float("nan")
    print(
        f"wrote {len(batch)} trajectories ({len(batch) // cfg.group_size} tasks x {cfg.group_size}) "
        f"to {path}; mean reward {succ:.3f}; values_source=oracle"
        + (f" + N(0, {cfg.value_noise}^2)" if cfg.value_noise else "")
    )
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="play an environment with the noisy expert or a model; write trajectory/v1 with exact oracle values",
        description="Play --episodes trajectories (--episodes / --group-size tasks, --group-size "
        "samples each) of an environment and write them as trajectory/v1. With the "
        "scripted noisy expert (--policy expert, the default) `values` are the exact "
        "oracle values (docs/environments.md). With --policy model, a language model "
        "samples the turns (a fresh tiny Llama and critic for the environment, or "
        "--model DIR) and `values` are its critic's, with the oracle's beside "
        "(docs/models.md). The output is a deterministic function of the options.",
    )
    p.add_argument("--env", required=True, choices=available_envs(), help="environment")
    p.add_argument(
        "--policy",
        default=None,
        choices=["expert", "model"],
        help="who acts: the scripted noisy expert (default) or a language model (--model/--save-model imply model)",
    )
    p.add_argument(
        "--noise",
        type=float,
        default=0.25,
        help="expert noise p: random valid action with probability p (with --policy model: the noise of "
        "the expert whose exact values are recorded as oracle_values)",
    )
    p.add_argument("--episodes", type=int, default=256, help="trajectories in all (a multiple of --group-size)")
    p.add_argument("--group-size", type=int, default=4, help="samples per task (G)")
    p.add_argument("--seed", type=int, default=0, help="master seed")
    p.add_argument("--out", required=True, help="output .parquet or .jsonl")
    p.add_argument(
        "--value-noise",
        type=float,
        default=0.0,
        metavar="SIGMA",
        help="add N(0, SIGMA^2) to the oracle values (a stand-in for a learned critic)",
    )
    p.add_argument("--difficulty", default="3-6", help="expert turns per task: N or MIN-MAX (default 3-6)")
    p.add_argument("--no-reasoning", action="store_true", help="the expert writes only the command")
    p.add_argument("--gamma", type=float, default=1.0, help="turn-level discount of the oracle values")
    p.add_argument("--slack", type=int, default=None, help="turn limit = expert turns + slack (default 2)")
    p.add_argument("--max-turns", type=int, default=None, help="a fixed turn limit instead")
    p.add_argument("--shaping", type=float, default=None, help="reward per progress turn (default 0)")
    p.add_argument("--slip", type=float, default=None, help="automation: slip probability (default 0.1)")
    p.add_argument("--distractors", type=int, default=None, help="search: distractor entities (default 3)")
    m = p.add_argument_group("--policy model")
    m.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="load DIR/policy and DIR/critic (a folder written by --save-model), or DIR itself when it is "
        "a plain local Hugging Face causal-LM folder (no critic unless --critic); default: a fresh "
        "tiny Llama and critic for the environment",
    )
    m.add_argument("--save-model", default=None, metavar="DIR", help="write DIR/policy and DIR/critic")
    m.add_argument("--size", default=None, choices=["1m", "3m", "10m"], help="fresh tiny policy size (default 1m)")
    m.add_argument(
        "--critic",
        default=None,
        choices=["fresh", "policy", "shared"],
        help="a new critic's trunk: new weights, a copy of the policy's, or the policy's own "
        "(default policy for a fresh model; with --model only when DIR has no critic)",
    )
    m.add_argument(
        "--temperature", type=float, default=None, metavar="T", help="sampling temperature, 0 = greedy (default 1)"
    )
    m.add_argument("--top-p", type=float, default=None, help="nucleus mass in (0, 1] (default 1)")
    m.add_argument("--max-turn-tokens", type=int, default=None, help="tokens per assistant turn (default 48)")
    m.add_argument("--max-total-tokens", type=int, default=None, help="tokens per episode (default 1024)")
    m.add_argument("--batch-size", type=int, default=None, help="episodes decoded together (default 16)")
    m.add_argument("--device", default=None, help="torch device of the model: cpu (default), cuda, cuda:N, mps")
    p.set_defaults(func=cmd_generate)
