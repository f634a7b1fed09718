"""``mpo-viz truth FILE -o OUT (--model DIR | --policy expert --noise P) [--tokens RULE]``: Monte-Carlo
values of a policy at every turn start of FILE's episodes (:func:`mpo_viz.rollout.truth.mc_truth`) and,
with ``--tokens``, the true advantages of chosen tokens inside the turns
(:func:`mpo_viz.rollout.token_truth.mc_token_truth`); ``--model`` takes a model folder or a trained
checkpoint (``RUN/checkpoints/iter=N``, ``RUN [--iteration N]``)."""

from __future__ import annotations

import shutil
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
    _check_flags(args)
    try:
        mio.check_destination(out)
    except ValueError as exc:
        raise CLIError(str(exc), 2) from None
    t0 = time.perf_counter()
    parts = out.with_name(out.name + ".parts.tmp")
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    tally = _Tally()
    policy = env = meta = None
    who = ""
    try:
        for i, chunk in enumerate(mio.scan(src, max_tokens=args.max_tokens)):
            if i == 0:  # the environment, the policy and the token rule are checked on the first chunk
                env, policy, who = _setup(args, src, chunk)
                _announce(args, src, who)
                n = mio.count_rows(src)
                if n is not None and n > len(chunk):
                    print(f"{src} is read in chunks of --max-tokens {args.max_tokens:,} response tokens", flush=True)
            res = _measure(chunk, policy, who, args, env, tally)
            mio.save(
                res,
                parts / f"part-{i:06d}{out.suffix}"
                if out.suffix == ".parquet"
                else parts / f"part-{i:06d}" / f"rows{out.suffix}",
            )
            meta = _merged_meta(meta, res.meta, args)
        if meta is None:
            raise CLIError(f"{src}: no trajectories to measure (0 rows)")
        mio.merge_parts(parts, out, meta)
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    tally.report(args)
    print(f"{time.perf_counter() - t0:.1f} s; wrote {out} ({tally.rows} episodes)", flush=True)
    return 0


def _check_flags(args) -> None:
    """The flags that contradict each other, before anything is read."""
    if (args.model is None) == (args.policy is None):
        raise CLIError("expected exactly one of --model DIR (a saved policy) and --policy expert --noise P", 2)
    if args.policy is not None and args.policy != "expert":
        raise CLIError(f"--policy: expected 'expert' (the scripted noisy expert), found {args.policy!r}", 2)
    if args.tokens is None and not args.turns:
        raise CLIError("--no-turns: expected --tokens RULE beside it (else there is nothing to measure)", 2)
    if args.iteration is not None and args.model is None:
        raise CLIError("--iteration: expected only with --model RUN (a run folder)", 2)
    if args.max_tokens < 1:
        raise CLIError(f"--max-tokens: expected at least 1 response token per chunk, found {args.max_tokens}", 2)


def _setup(args, src, batch):
    """``(env, policy, who)``: the environment to replay in (None: the one FILE names), the policy
    and its name in the messages; the token rule checked on ``batch`` before any continuation runs."""
    env = None
    if args.env is not None:
        from mpo_viz.envs.registry import make_env

        env = make_env(args.env, **_env_options_of(batch))
    if args.model is not None:
        from mpo_viz.cli.generate import load_model_flag

        policy, _ = load_model_flag(args.model, args.iteration, args.device)
        who = f"the policy {policy.name}"
    else:
        from mpo_viz.envs.expert import NoisyExpert
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
        _check_tokens(batch, args)
    return env, policy, who


def _announce(args, src, who: str) -> None:
    if args.turns:
        n = mio.count_rows(src)
        print(
            f"Monte-Carlo truth of {who} on {'the' if n is None else f'{n}'} episodes of {src}: {args.m} "
            f"continuations per turn start{' and per turn taken (--q)' if args.q else ''}, seed {args.seed}",
            flush=True,
        )


def _measure(batch, policy, who: str, args, env, tally: _Tally):
    """One chunk's turn truth (``--turns``) and token truth (``--tokens``); every continuation is
    seeded by its trajectory, turn and index, so a chunk's numbers are those of the whole file's."""
    from mpo_viz.rollout.truth import mc_truth

    res = batch
    if args.turns:
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
        tally.turns(res)
    if args.tokens is not None:
        res = _token_truth(res, policy, who, args, env, announce=tally.rows == 0)
        tally.tokens(res)
    tally.rows += len(batch)
    return res


class _Tally:
    """What the command prints at the end, summed over the chunks: turn starts and their standard
    errors, tokens measured and theirs."""

    def __init__(self):
        self.rows = self.starts = self.tok = self.controls = 0
        self.se = self.tok_se = self.tok_seconds = 0.0

    def turns(self, res) -> None:
        se = [x for r in res.field("mc_value_se") for x in r]
        self.starts += len(se)
        self.se += sum(se)

    def tokens(self, res) -> None:
        flags = zip(res.field("mc_tok_adv_se"), res.field("mc_tok_measured"))
        se = [x for r, f in flags for x, k in zip(r, f) if k]
        meta = res.meta["mc_truth"]["tokens"]
        self.tok += len(se)
        self.tok_se += sum(se)
        self.controls += meta["measured_controls"]
        self.tok_seconds += meta["seconds"]

    def report(self, args) -> None:
        if args.turns:
            print(f"{self.starts} turn starts, mean standard error {self.se / max(self.starts, 1):.3f}", flush=True)
        if args.tokens is not None:
            print(
                f"{self.tok} tokens measured ({self.controls} controls), mean standard error "
                f"{self.tok_se / max(self.tok, 1):.3f}, {self.tok_seconds:.1f} s",
                flush=True,
            )


#: the numbers of the ``mc_truth`` metadata (and of its ``tokens``) that add up over chunks
_SUMMED = ("boundaries", "seconds", "measured", "measured_controls", "skipped")


def _merged_meta(merged: dict | None, meta: dict, args) -> dict:
    """The file metadata of the chunks so far: the first chunk's, with the counts and seconds that
    the turn truth (``--turns``) and token truth (``--tokens``) measured summed over the chunks."""
    if merged is None:
        return meta
    old, new = dict(merged["mc_truth"]), meta["mc_truth"]
    if args.turns:
        old.update({k: _add(old[k], new[k]) for k in _SUMMED if k in old})
    if args.tokens is not None:
        old["tokens"] = {
            **old["tokens"],
            **{k: _add(old["tokens"][k], new["tokens"][k]) for k in _SUMMED if k in old["tokens"]},
        }
    return {**merged, "mc_truth": old}


def _add(a, b):
    return round(a + b, 3) if isinstance(a, float) or isinstance(b, float) else a + b


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


def _token_truth(batch, policy, who: str, args, env, announce: bool = True):
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
    if announce:
        print(
            f"token truth of {who}: {rule}, {m} continuation pairs per token, estimator {args.estimator}, "
            f"seed {args.seed}",
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
    p.add_argument(
        "--max-tokens",
        type=int,
        default=200_000,
        help="response tokens of FILE measured at a time (memory bound; the numbers do not depend on it; "
        "default 200,000)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_truth)
