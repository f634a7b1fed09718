"""``mpo-viz truth FILE -o OUT (--model DIR | --policy expert --noise P)``: Monte-Carlo values of a
policy at every turn start of FILE's episodes (:func:`mpo_viz.rollout.truth.mc_truth`); ``--model``
takes a model folder or a trained checkpoint (``RUN/checkpoints/iter=N``, ``RUN [--iteration N]``)."""

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
you name, unlike the oracle_* columns of generated files (the scripted expert's values)."""


def cmd_truth(args) -> int:
    src, out = source_and_output(args.path, args.out)
    if (args.model is None) == (args.policy is None):
        raise CLIError("expected exactly one of --model DIR (a saved policy) and --policy expert --noise P", 2)
    if args.policy is not None and args.policy != "expert":
        raise CLIError(f"--policy: expected 'expert' (the scripted noisy expert), found {args.policy!r}", 2)
    from mpo_viz.envs.expert import NoisyExpert
    from mpo_viz.rollout.truth import mc_truth

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
    print(
        f"Monte-Carlo truth of {who} on {len(batch)} episodes of {src}: {args.m} continuations per turn start"
        f"{' and per turn taken (--q)' if args.q else ''}, seed {args.seed}",
        flush=True,
    )
    t0 = time.perf_counter()
    res = mc_truth(
        batch, policy, m=args.m, seed=args.seed, q=args.q, batch_size=args.batch_size, progress=not args.quiet, env=env
    )
    mio.save(res, out)
    meta = res.meta["mc_truth"]
    se = [x for r in res.field("mc_value_se") for x in r]
    print(
        f"{meta['boundaries']} turn starts, mean standard error {sum(se) / max(len(se), 1):.3f}; "
        f"{time.perf_counter() - t0:.1f} s; wrote {out}",
        flush=True,
    )
    return 0


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
    p.add_argument("--seed", type=int, default=0, help="seeds every continuation (default 0)")
    p.add_argument("--q", action="store_true", help="also continue after the recorded turn: mc_q, mc_q_se")
    p.add_argument(
        "--batch-size", dest="batch_size", type=int, default=64, help="continuation rows decoded together (default 64)"
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_truth)
