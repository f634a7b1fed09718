"""``mpo-viz truth FILE -o OUT (--model DIR | --policy expert --noise P) [--tokens RULE]``: Monte-Carlo
values of a policy at every turn start of FILE's episodes (:func:`mpo_viz.rollout.truth.mc_truth`) and,
with ``--tokens``, the true advantages of chosen tokens inside the turns
(:func:`mpo_viz.rollout.token_truth.mc_token_truth`); ``--model`` takes a model folder or a trained
checkpoint (``RUN/checkpoints/iter=N``, ``RUN [--iteration N]``)."""

from __future__ import annotations

import time

import mpo_viz.data.io as mio
from mpo_viz.cli.errors import CLIError, source_and_output
from mpo_viz.cli.flags import env_name

__all__ = ["add_subcommand"]

_DESCRIPTION = """\
Replay every episode of FILE (a file the toolkit wrote: mpo-viz generate, a rollout, a run
folder's trajectories) to its turn states, continue the policy M times from each state, and write
FILE to OUT with the per-turn fields mc_value (the mean return: V of this policy at the turn's
start), mc_value_se, mc_value_a / mc_value_b (the two halves, for reliability) and, with --q,
mc_q / mc_q_se (after the recorded turn: Q of the turn taken). These are the values of the policy
you name, unlike the oracle_* columns of generated files (the scripted expert's values).

With --tokens RULE, also the truth inside the turns: at the tokens RULE picks (uncertain: where the
policy's own 1 - pi(a_t|h_t) exceeds --threshold, at most --max-per-turn a turn, plus --controls
random low-uncertainty tokens; decisive: the oracle's decisive tokens; all: every action token),
M continuation pairs from the token's prefix (one writes the recorded token first, one does not)
give the token's true advantage mc_tok_adv with mc_tok_adv_se, its halves mc_tok_adv_a / _b, and
the flags mc_tok_measured / mc_tok_control. --no-turns skips the turn-level truth (one already in
FILE is kept)."""


def cmd_truth(args) -> int:
    src, out = source_and_output(args.path, args.out)
    if (args.model is None) == (args.policy is None):
        raise CLIError("expected exactly one of --model DIR (a saved policy) and --policy expert --noise P", 2)
    if args.policy is not None and args.policy != "expert":
        raise CLIError(f"--policy: expected 'expert' (the scripted noisy expert), found {args.policy!r}", 2)
    from mpo_viz.envs.expert import NoisyExpert
    from mpo_viz.rollout.truth import mc_truth

    if args.tokens is None and not args.turns:
        raise CLIError("--no-turns: expected --tokens RULE beside it (else there is nothing to measure)", 2)
    batch = mio.load(src)
    if args.iteration is not None and args.model is None:
        raise CLIError("--iteration: expected only with --model RUN (a run folder)", 2)
    env = None
    if args.env is not None:
        from mpo_viz.envs.registry import make_env

        env = make_env(args.env, **_env_options_of(batch))
    if args.model is not None:
        from mpo_viz.cli.generate import load_model_flag

        policy, _ = load_model_flag(args.model, args.iteration, args.device)
        who = f"the policy {policy.name}"
    else:
        from mpo_viz.rollout.replay import env_of

        if not getattr(env if env is not None else env_of(batch), "finite_model", True):
            raise CLIError(
                "--policy: expected an environment with a finite model for the noisy expert, found "
                f"{src}'s environment without one (a reset/step environment); use --model DIR",
                2,
            )
        policy = NoisyExpert(noise=args.noise)
        who = f"the noisy expert (noise {args.noise:g})"
    if args.tokens is not None:
        _check_tokens(batch, args)  # before any continuation runs
    t0 = time.perf_counter()
    res = batch
    if args.turns:
        print(
            f"Monte-Carlo truth of {who} on {len(batch)} episodes of {src}: {args.m} continuations per turn start"
            f"{' and per turn taken (--q)' if args.q else ''}, seed {args.seed}",
            flush=True,
        )
        res = mc_truth(
            batch,
            policy,
            m=args.m,
            seed=args.seed,
            q=args.q,
            batch_size=args.batch_size,
            progress=not args.quiet,
            env=env,
        )
        meta = res.meta["mc_truth"]
        se = [x for r in res.field("mc_value_se") for x in r]
        print(f"{meta['boundaries']} turn starts, mean standard error {sum(se) / max(len(se), 1):.3f}", flush=True)
    if args.tokens is not None:
        res = _token_truth(res, policy, who, args, env)
    mio.save(res, out)
    print(f"{time.perf_counter() - t0:.1f} s; wrote {out}", flush=True)
    return 0


def _check_tokens(batch, args) -> None:
    """A positions rule the file cannot serve, said in one line before anything runs (the expert's own
    uncertainty needs no log-probs)."""
    from mpo_viz.checks import OptionError
    from mpo_viz.rollout.positions import choose_positions

    if args.tokens == "uncertain" and args.model is None:
        return
    try:
        choose_positions(
            batch[:1], args.tokens, threshold=args.threshold, max_per_turn=args.max_per_turn, controls=args.controls
        )
    except OptionError as exc:
        if exc.option == "positions":
            raise CLIError(f"--tokens {args.tokens}: {exc.detail}", 1) from None
        raise


def _token_truth(batch, policy, who: str, args, env):
    from mpo_viz.checks import OptionError
    from mpo_viz.rollout.token_truth import mc_token_truth

    m = args.m_tokens if args.m_tokens is not None else 16
    rule = (
        args.tokens
        if args.tokens != "uncertain"
        else (
            f"uncertain (1 - pi > {args.threshold:g}, at most "
            f"{args.max_per_turn} a turn, {args.controls} control a turn)"
        )
    )
    print(
        f"token truth of {who}: {rule}, {m} continuation pairs per token, estimator {args.estimator}, seed {args.seed}",
        flush=True,
    )
    try:
        res = mc_token_truth(
            batch,
            policy,
            m=m,
            seed=args.seed,
            positions=args.tokens,
            threshold=args.threshold,
            max_per_turn=args.max_per_turn,
            controls=args.controls,
            estimator=args.estimator,
            batch_size=args.batch_size,
            progress=not args.quiet,
            env=env,
        )
    except OptionError as exc:
        if exc.option == "positions":  # a rule the file cannot serve: one line, naming the others
            raise CLIError(f"--tokens {args.tokens}: {exc.detail}", 1) from None
        if exc.option == "m":
            raise CLIError(f"--tokens-M: {exc.detail}", 1) from None
        raise
    meta = res.meta["mc_truth"]["tokens"]
    se = [x for r, f in zip(res.field("mc_tok_adv_se"), res.field("mc_tok_measured")) for x, k in zip(r, f) if k]
    print(
        f"{meta['measured']} tokens measured ({meta['measured_controls']} controls), mean standard error "
        f"{sum(se) / max(len(se), 1):.3f}, {meta['seconds']:.1f} s",
        flush=True,
    )
    return res


def _env_options_of(batch) -> dict:
    """The environment options FILE recorded (its ``generator``), for ``--env``."""
    gen = batch.meta.get("generator")
    return dict(gen.get("env_options") or {}) if isinstance(gen, dict) else {}


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "truth", help="Monte-Carlo values of a policy at every turn start (branch rollouts)", description=_DESCRIPTION
    )
    p.add_argument("path", metavar="FILE", help="a trajectory/v1 file or folder the toolkit wrote")
    p.add_argument("-o", "--out", required=True, help="the output file (.parquet or .jsonl)")
    p.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="the policy: a model folder (--save-model, mpo-viz export, get-model), a plain Hugging Face "
        "folder, a trained checkpoint RUN/checkpoints/iter=N, or a run folder RUN (its checkpoint of "
        "--iteration, default the last)",
    )
    p.add_argument(
        "--iteration",
        type=int,
        default=None,
        metavar="N",
        help="with --model RUN: the checkpoint of iteration N (default the last)",
    )
    p.add_argument(
        "--env",
        default=None,
        metavar="ENV",
        type=env_name,
        help="replay in this environment (a name or package.module:factory) with FILE's recorded options, "
        "instead of the one FILE names",
    )
    p.add_argument("--policy", default=None, help="'expert': the scripted noisy expert instead of a model")
    p.add_argument("--noise", type=float, default=0.25, help="the expert's noise rate with --policy expert (0.25)")
    p.add_argument("-M", dest="m", type=int, default=8, help="continuations per turn state (default 8, at least 2)")
    p.add_argument(
        "--tokens",
        choices=("uncertain", "decisive", "all"),
        default=None,
        help="also the true advantage of tokens inside turns, at: uncertain (the policy's own 1 - pi > "
        "--threshold; needs the file's log-probs, or --policy expert), decisive (the oracle's "
        "decisive tokens), all (every action token; small files)",
    )
    p.add_argument("--threshold", type=float, default=0.01, help="--tokens uncertain: 1 - pi above this (0.01)")
    p.add_argument(
        "--max-per-turn",
        dest="max_per_turn",
        type=int,
        default=4,
        help="--tokens uncertain: at most this many per turn, the most uncertain first (4)",
    )
    p.add_argument(
        "--controls",
        type=int,
        default=1,
        help="--tokens uncertain/decisive: random low-uncertainty tokens per turn, a check that the truth "
        "is ~0 there (1)",
    )
    p.add_argument(
        "--tokens-M",
        dest="m_tokens",
        type=int,
        default=None,
        help="--tokens: continuation pairs per token (default 16)",
    )
    p.add_argument(
        "--estimator",
        choices=("pi", "crn", "plain"),
        default="pi",
        help="--tokens: the estimator of a token's advantage (pi: (1 - pi)(Q(a) - Q(not a)), default; "
        "crn, plain: Q - V with shared or independent random numbers)",
    )
    p.add_argument(
        "--no-turns",
        dest="turns",
        action="store_false",
        help="with --tokens: skip the turn-level truth (one already in FILE is kept)",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds every continuation (default 0)")
    p.add_argument("--q", action="store_true", help="also continue after the recorded turn: mc_q, mc_q_se")
    p.add_argument(
        "--batch-size", dest="batch_size", type=int, default=64, help="continuation rows decoded together (default 64)"
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_truth)
