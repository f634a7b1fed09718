"""``mpo-viz fit-critic FILE -o OUT``: give logs without critic values the values of a fitted critic.

A small critic (a tiny Llama trunk over the file's own token ids, or with ``--trunk DIR`` the
pretrained trunk of a Hugging Face model) is fitted to the trajectories' returns on all but a
held-out share (early stopping on the held-out explained variance, the best step's weights kept),
then every trajectory gets its values; the output records in
its metadata that the values come from a fitted critic, with the held-out explained variance and
the across/within split (:func:`mpo_viz.train.fitted_critic.fit_critic`). After it, every critic-based
estimator (mpo, gae, turn_gae, vapo) and the across/within view work on the file.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import mpo_viz.data.io as mio
from mpo_viz.cli.errors import CLIError, source_and_output

__all__ = ["add_subcommand"]

_DESCRIPTION = """\
Fit a small critic to FILE's own returns (Monte-Carlo returns by default) on all but a held-out
share of its trajectories, and write FILE with `values` from that critic (and `bootstrap_value` on
truncated rows) to OUT. The held-out explained variance says how far to trust the values: near 0
the critic explains nothing, and critic-based estimators then run on noise. Deterministic for a
seed. Works on any trajectory/v1 file, converted verl or chat logs included. With --trunk DIR the
critic starts from the pretrained trunk of the Hugging Face model in DIR (the policy that wrote the
logs, or e.g. SmolLM2 for logs converted with its tokenizer): the file's ids must be that model's.
Evaluated every 16 steps on the held-out trajectories; --patience N (default 4) stops after N
evaluations without a better held-out EV (a small file is otherwise seen a hundred times over and
overfitted), and the weights of the best evaluation are the ones written (unless --keep-last).
FILE streams (a whole run's folder is one input): the critic is fitted on all of FILE's rows when
there are at most --fit-rows of them (default 4096; 256 steps of 16 episodes read 4,096 at most)
holding at most --fit-tokens response tokens (default 2,000,000), else on whole groups drawn by the
seed up to either bound; then every row gets its values, --max-tokens response tokens at a time.
Memory is the fitted rows plus one chunk."""


def cmd_fit_critic(args) -> int:
    src, out = source_and_output(args.path, args.out)
    # the critic (transformers) loads only when the command runs: `mpo-viz --help` stays fast
    from mpo_viz.train.fitted_critic import fit_critic_file

    if args.trunk is not None and not Path(args.trunk).is_dir():
        raise CLIError(f"--trunk: expected a Hugging Face model folder, found no such folder {args.trunk!r}", 2)
    if args.threads < 1:
        raise CLIError(f"--threads: expected an integer >= 1, found {args.threads}", 2)
    if args.window < 0:
        raise CLIError(f"--window: expected an integer >= 0 (0: every row whole), found {args.window}", 2)
    n = mio.count_rows(src)
    what = f"a critic on the trunk of {args.trunk}" if args.trunk else f"a {args.size} critic"
    count = "" if n is None else f"{n} trajectories; "
    print(
        f"fitting {what} to the {args.target} returns of {src} ({count}the fit reads about {args.fit_rows} "
        f"of them or {args.fit_tokens:,} response tokens at most, whole groups drawn by the seed beyond that; "
        f"{args.steps} steps, held-out share {args.holdout:g}, seed {args.seed})",
        flush=True,
    )
    t0 = time.perf_counter()
    res = fit_critic_file(
        src,
        out,
        fit_rows=args.fit_rows,
        fit_tokens=args.fit_tokens,
        max_tokens=args.max_tokens,
        target=args.target,
        size=args.size,
        steps=args.steps,
        lr=args.lr,
        batch_episodes=args.batch_episodes,
        holdout=args.holdout,
        seed=args.seed,
        gate=args.gate,
        trunk=args.trunk,
        patience=args.patience or None,
        window=args.window or None,
        keep_best=not args.keep_last,
        progress=not args.quiet,
        source=str(src),
        num_threads=args.threads,
    )
    info = res.info
    print(
        f"fitted on {info['fit_rows']} of {info['rows']} trajectories; {res.fit.summary()}; "
        f"across/within ratio of the values (median) "
        f"{info['values_median_across_within_ratio']:.3g}; {time.perf_counter() - t0:.1f} s; wrote {out}",
        flush=True,
    )
    if not info["heldout_explained_variance"] > 0.05:
        print(
            f"warning: the critic explains almost none of the held-out return variance "
            f"({info['heldout_explained_variance']:.3f}); estimators that read values (mpo, gae, ...) will mostly "
            f"see noise. More steps (--steps), more trajectories, or a larger --size may help.",
            file=sys.stderr,
            flush=True,
        )
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "fit-critic",
        help="give a file without critic values the values of a critic fitted to its returns",
        description=_DESCRIPTION,
    )
    p.add_argument("path", metavar="FILE", help="a trajectory/v1 file or folder (.parquet, .jsonl)")
    p.add_argument("-o", "--out", required=True, help="the output file (.parquet or .jsonl)")
    p.add_argument("--steps", type=int, default=256, help="AdamW steps (default 256)")
    p.add_argument(
        "--target",
        default="mc",
        choices=("mc", "turn"),
        help="mc: Monte-Carlo returns (default); turn: the return from each turn's start, flat inside turns",
    )
    p.add_argument("--size", default="1m", help="the critic's tiny Llama trunk: 1m (default), 3m, 10m")
    p.add_argument(
        "--trunk",
        metavar="DIR",
        default=None,
        help="fit on the pretrained trunk of the Hugging Face causal LM in DIR (instead of a tiny one); "
        "FILE's token ids must be that model's",
    )
    p.add_argument(
        "--patience",
        type=int,
        default=4,
        help="stop after this many held-out evaluations (every 16 steps) without a better explained "
        "variance (default 4: 64 steps; 0 = the whole budget)",
    )
    p.add_argument(
        "--keep-last",
        dest="keep_last",
        action="store_true",
        help="write the values of the last step's weights (default: the step with the best held-out EV)",
    )
    p.add_argument("--seed", type=int, default=0, help="the held-out split, the initial weights and the order")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--holdout", type=float, default=0.2, help="share of trajectories held out to measure the fit")
    p.add_argument("--batch-episodes", dest="batch_episodes", type=int, default=16, help="episodes per step")
    p.add_argument(
        "--gate",
        type=float,
        default=None,
        help="stop early once the held-out explained variance reaches this (default: the whole budget)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: on cores that other work shares, more threads wait on each "
        "other and run many times slower; on a quiet machine 2 are ~1.2x faster)",
    )
    p.add_argument(
        "--fit-rows",
        dest="fit_rows",
        type=int,
        default=4096,
        help="fit on every row of FILE up to this many, else on whole groups drawn by the seed until this "
        "many (default 4096)",
    )
    p.add_argument(
        "--fit-tokens",
        dest="fit_tokens",
        type=int,
        default=2_000_000,
        help="... and up to this many response tokens (default 2,000,000: the sample's memory bound)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=500_000,
        help="response tokens read at a time (memory bound; the values do not depend on it; default 500,000)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=1024,
        help="rows longer than this many tokens train this many at a time (fewer past 1,953 tokens, so a "
        "window reads at most 2M attention pairs), the earlier windows' keys and values held without "
        "gradient (the step's memory is the window's, not the row's; default 1024; 0 = every row whole, "
        "the exact gradient)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_fit_critic)
