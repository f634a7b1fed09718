"""``mpo-viz generate``: trajectories of the noisy expert (exact oracle values) or of a model
(``--policy model``: a fresh tiny Llama and critic, or ``--model DIR``: a model folder or a trained
checkpoint; critic values beside the oracle's)."""

from __future__ import annotations

import shlex
import sys
import time
import warnings

from mpo_viz.checks import OptionError
from mpo_viz.cli.flags import ENV_OPTIONS, add_env_options, env_help, env_name
from mpo_viz.data.io import save
from mpo_viz.envs.base import parse_difficulty
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.registry import make_env


def _difficulty(text: str):
    """The ``--difficulty`` flag's value: N, or (MIN, MAX)."""
    try:
        d = parse_difficulty(text)
    except ValueError as exc:
        raise OptionError("difficulty", str(exc)) from None
    return tuple(d) if isinstance(d, list) else d


def _env_kwargs(args) -> dict:
    """The environment's options from the flags: its declared options' flags, ``--env-option``, and
    ``--difficulty`` when it was given (else the environment's own default)."""
    kw = {k.partition(".")[2]: v for k, v in vars(args).items() if k.startswith(ENV_OPTIONS + ".")}
    for item in vars(args).get(ENV_OPTIONS) or ():
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise OptionError(ENV_OPTIONS, f"expected KEY=VALUE (e.g. --env-option top=9), found {item!r}")
        kw[key.strip()] = _json_or_text(text)
    if args.difficulty is not None:
        kw["difficulty"] = _difficulty(args.difficulty)
    return kw


def _json_or_text(text: str):
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _make_env(args):
    """``make_env`` of the flags; an option the environment refuses is named by its flag."""
    kw = _env_kwargs(args)
    try:
        return make_env(args.env, **kw)
    except OptionError as exc:
        if exc.option in kw and exc.option != "difficulty":
            raise OptionError(f"{ENV_OPTIONS}.{exc.option}", exc.detail) from None
        raise


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
    if args.difficulty is not None:
        parts += ["--difficulty", args.difficulty]
    if args.no_reasoning:
        parts.append("--no-reasoning")
    if args.gamma != 1.0:
        parts += ["--gamma", repr(args.gamma)]
    for key, v in vars(args).items():
        if key.startswith(ENV_OPTIONS + "."):
            parts += ["--" + key.partition(".")[2].replace("_", "-"), str(v)]
    for item in vars(args).get(ENV_OPTIONS) or ():
        parts += ["--env-option", item]
    return " ".join(shlex.quote(p) for p in [*parts, "--out", args.out])


#: flags of --policy model only (None when not given)
_MODEL_FLAGS = (
    "model",
    "iteration",
    "save_model",
    "model_size",
    "critic",
    "temperature",
    "top_p",
    "max_turn_tokens",
    "max_total_tokens",
    "batch_size",
    "device",
)


def _resolve_policy(args, env) -> str:
    """--model / --save-model alone imply --policy model, and so does an environment with no expert to
    play (no finite model, no ``expert(rng)``); model flags with the expert are refused."""
    given = [n for n in _MODEL_FLAGS if getattr(args, n) is not None]
    if args.policy is None:
        has_expert = getattr(env, "finite_model", True) or getattr(env, "has_expert", False)
        args.policy = "model" if args.model is not None or args.save_model is not None or not has_expert else "expert"
    if args.policy == "expert" and given:
        raise OptionError(given[0], "expected only with --policy model, found it with --policy expert")
    if args.policy == "model":
        if args.value_noise:
            raise OptionError(
                "value_noise",
                "expected only with --policy expert (a model run records its "
                "critic's values), found it with --policy model",
            )
        if args.model is not None and args.model_size is not None:
            raise OptionError("model_size", "expected only for a fresh model (without --model), found it with --model")
        if args.iteration is not None and args.model is None:
            raise OptionError("iteration", "expected only with --model RUN (a run folder), found it without --model")
    return args.policy


def load_model_flag(path, iteration, device):
    """``--model DIR [--iteration N]``: a model folder (DIR/policy, DIR/critic), a plain Hugging Face
    causal-LM folder, a trained checkpoint (RUN/checkpoints/iter=N) or a run folder (its checkpoint
    of ``--iteration``, default the last); ``(policy, critic or None)``. A folder that is none of them
    is an :class:`OptionError` of ``--model`` saying what each needs."""
    from mpo_viz import models  # transformers (~1 s): only a model run imports it
    from mpo_viz.train.export import load_model

    dev = models.resolve_device(device or "cpu")  # before loading: a missing backend is one line
    try:
        return load_model(path, iteration=iteration, device=dev)
    except OptionError:
        raise
    except (OSError, ValueError) as exc:
        raise OptionError("model", str(exc)) from None


def _load_model(args):
    """``--model``: :func:`load_model_flag` (no critic unless the folder has one or ``--critic`` builds one)."""
    from mpo_viz import models

    policy, critic = load_model_flag(args.model, args.iteration, args.device)
    if args.critic is not None:
        if critic is not None:
            raise OptionError("critic", f"expected only when --model has no critic, found one in {args.model}")
        critic = models.make_critic(policy, args.critic, seed=args.seed)
    return policy, critic


def cmd_generate_model(args, env) -> int:
    # the models, their tokenizer and the rollout pull in transformers (~1 s): only a model run imports them
    from mpo_viz import models
    from mpo_viz.envs.tokenizer import UnknownTextWarning, build_tokenizer
    from mpo_viz.rollout import rollout

    if args.episodes < 1 or args.episodes % max(args.group_size, 1):
        raise OptionError(
            "episodes", f"expected a positive multiple of --group-size={args.group_size}, found {args.episodes}"
        )
    if args.model is not None:
        policy, critic = _load_model(args)
    else:
        device = models.resolve_device(args.device or "cpu")
        policy = models.tiny_policy(build_tokenizer(env), args.model_size or "1m", seed=args.seed)
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
        with warnings.catch_warnings():  # text lost to [UNK]: one line of its own at the end
            warnings.simplefilter("ignore", UnknownTextWarning)
            batch = rollout(
                policy,
                env,
                args.episodes,
                group_size=args.group_size,
                critic=critic,
                seed=args.seed,
                oracle=oracle,
                progress=None,
                notice=_note,
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
    mean = float(batch.outcome_reward.mean())
    reward_txt = "shaped rewards" if batch.has("turn_rewards") else f"mean reward {mean:.3f}"
    beside = " (oracle beside)" if batch.has("oracle_values") else ""
    print(
        f"wrote {len(batch)} trajectories ({len(batch) // args.group_size} tasks x {args.group_size}) to {path}; "
        f"{reward_txt}; {n_act} action tokens in {secs:.1f} s; values_source="
        f"{batch.meta.get('values_source', 'none')}{beside}; policy {policy.name}"
    )
    _say_unknown(batch, f"the tokenizer of policy {policy.name}")
    if batch.meta.get("values_source") == models.UNTRAINED_CRITIC:
        print(
            "note: the critic's value head is untrained (as initialized): its values are no estimate, and reports "
            "do not rank the estimators that use them; fit one with mpo-viz fit-critic"
        )
    if args.save_model is not None:
        print(f"saved the policy and critic to {args.save_model}")
    return 0


def _note(line: str) -> None:
    print(f"mpo-viz generate: note: {line}", file=sys.stderr, flush=True)


def _say_unknown(batch, who: str) -> None:
    """The line of text lost to [UNK] (the batch's ``unknown_text``), as a warning on stderr."""
    from mpo_viz.envs.tokenizer import UnknownText

    lost = batch.meta.get("unknown_text")
    if not lost:
        return
    u = UnknownText()
    for src, d in lost.items():
        u.texts[src], u.hit[src], u.tokens[src] = d["of"], d["texts"], d["tokens"]
        u.words[src].update(d["examples"])
    print(f"mpo-viz generate: warning: {u.line(who)}", file=sys.stderr, flush=True)


def cmd_generate(args) -> int:
    from mpo_viz.envs.generate import (  # the tokenizer: transformers, as above
        GenerateConfig,
        generate,
    )
    from mpo_viz.envs.tokenizer import UnknownTextWarning

    env = _make_env(args)  # an option the environment refuses: named by its flag, before anything is played
    if _resolve_policy(args, env) == "model":
        return cmd_generate_model(args, env)
    kw = _env_kwargs(args)
    difficulty = kw.pop("difficulty", None)
    cfg = GenerateConfig(
        env=args.env,
        policy=args.policy,
        noise=args.noise,
        episodes=args.episodes,
        group_size=args.group_size,
        seed=args.seed,
        value_noise=args.value_noise,
        reasoning=not args.no_reasoning,
        difficulty=difficulty,
        gamma=args.gamma,
        env_options=kw,
    )
    with warnings.catch_warnings():  # text lost to [UNK]: one line of its own at the end
        warnings.simplefilter("ignore", UnknownTextWarning)
        batch = generate(cfg)  # a bad field raises OptionError; mpo-viz names its flag (dest = the field)
    batch.meta["command"] = _command_line(args)
    path = save(batch, args.out)
    if batch.meta.get("values_source") == "none":  # an environment's own expert: no oracle
        mean = float(batch.outcome_reward.mean())
        reward = "per-turn rewards" if batch.has("turn_rewards") else f"mean reward {mean:.3f}"
        print(
            f"wrote {len(batch)} trajectories ({len(batch) // cfg.group_size} tasks x {cfg.group_size}) of the "
            f"environment's own expert to {path}; {reward}; no values (the environment has no finite model)"
        )
    else:
        succ = float(batch.outcome_reward.mean()) if not batch.has("turn_rewards") else float("nan")
        print(
            f"wrote {len(batch)} trajectories ({len(batch) // cfg.group_size} tasks x {cfg.group_size}) "
            f"to {path}; mean reward {succ:.3f}; values_source=oracle"
            + (f" + N(0, {cfg.value_noise}^2)" if cfg.value_noise else "")
        )
    _say_unknown(batch, "the environment's word-level tokenizer")
    return 0


def add_subcommand(sub, env_hint: str | None = None) -> None:
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
    p.add_argument("--env", required=True, type=env_name, metavar="ENV", help=env_help())
    p.add_argument(
        "--policy",
        default=None,
        choices=["expert", "model"],
        help="who acts: the scripted noisy expert (default) or a language model (--model/--save-model "
        "imply model, and so does an environment without an expert to play)",
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
    p.add_argument(
        "--difficulty",
        default=None,
        help="expert turns per task: N or MIN-MAX (default: the environment's own; 3-6 for search, tooluse "
        "and automation)",
    )
    p.add_argument("--no-reasoning", action="store_true", help="the expert writes only the command")
    p.add_argument("--gamma", type=float, default=1.0, help="turn-level discount of the oracle values")
    g = p.add_argument_group(
        "environment options (an environment takes those it declares; unset: its default; "
        "an entry point's or package.module:factory's own options show with --env NAME --help)"
    )
    g.add_argument(
        "--env-option",
        dest=ENV_OPTIONS,
        action="append",
        metavar="KEY=VALUE",
        help="any option of the environment, repeatable (e.g. slack=3; the value read as JSON when it is)",
    )
    add_env_options(g, p, env_hint)
    m = p.add_argument_group("--policy model")
    m.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="load DIR/policy and DIR/critic (a folder written by --save-model or mpo-viz export), DIR "
        "itself when it is a plain local Hugging Face causal-LM folder (no critic unless --critic), "
        "a trained checkpoint RUN/checkpoints/iter=N, or a run folder RUN (its checkpoint of "
        "--iteration); default: a fresh tiny Llama and critic for the environment",
    )
    m.add_argument(
        "--iteration",
        type=int,
        default=None,
        metavar="N",
        help="with --model RUN: the checkpoint of iteration N (default the last)",
    )
    m.add_argument("--save-model", default=None, metavar="DIR", help="write DIR/policy and DIR/critic")
    m.add_argument(
        "--model-size", default=None, choices=["1m", "3m", "10m"], help="fresh tiny policy size (default 1m)"
    )
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
