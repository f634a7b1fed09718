"""``mpo-viz advantages`` and ``mpo-viz report``: flags -> config -> library call.

``advantages PATH -e mpo,gae,grpo -o OUT.parquet`` is :func:`mpo_viz.render.annotate.annotate_file`;
``report PATH -o report.html`` is :func:`mpo_viz.render.report.write_report`. The estimator flags
(``-e``, ``--gamma``, ``--beta``, ...) are derived from the estimators' declared options
(:mod:`mpo_viz.advantages.registry`): a registered estimator's options show up here unchanged.

Bad input: the loader's message on one line, exit code 1, no traceback.
"""

from __future__ import annotations

import sys
import time
import warnings

from mpo_viz.advantages import registry
from mpo_viz.cli.flags import add_option
from mpo_viz.options import Option
from mpo_viz.render.annotate import AnnotateConfig, annotate_file
from mpo_viz.render.report import ExportWarning, LeftOutNote, ReportConfig, write_report

__all__ = ["add_subcommand", "estimator_option_help"]


# ------------------------------------------------------------------------------------------------
# argparse

_ADVANTAGES_DESCRIPTION = """\
Stream PATH chunk by chunk (--max-tokens response tokens at a time, the rows of a group kept
together), run each estimator on each chunk and write every input row with extra per-token
columns adv_<name> and ret_<name>. -o FILE.parquet or FILE.jsonl writes one file; -o FOLDER
writes one Parquet file per chunk (mpo-viz and mv.load read the folder as one set). Bad input
stops with the loader's one-line message and leaves no output behind."""

_REPORT_DESCRIPTION = """\
Write one self-contained HTML file (opens offline): summary, advantages by estimator, estimator
agreement, critic values across vs within turns, and the token strip, value curve and per-turn
advantages of the best, worst and most disagreed-on trajectories. PATH is streamed chunk by
chunk; statistics are those of the whole file."""


def _estimator_args(p, default: str | None) -> None:
    """``-e`` and one flag per estimator option, derived from the registry's declarations."""
    names = registry.available_estimators()
    p.add_argument(
        "-e",
        "--estimators",
        default=default,
        help=f"comma-separated, from: {', '.join(names)}"
        + (
            f" (default {default})"
            if default
            else f" (default: {','.join(registry.DEFAULT_ESTIMATORS)} where the data allow)"
        ),
    )
    g = p.add_argument_group("estimator options (each estimator takes the ones it accepts; unset = its default)")
    for o in registry.vocabulary(names).values():
        if o.kind != "any":
            add_option(g, o, help=estimator_option_help(o, names))
    p.add_argument("--max-tokens", type=int, default=1_000_000, help="response tokens per chunk (default 1,000,000)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def estimator_option_help(o: Option, names) -> str:
    """``"<doc> [<estimators taking it>; default <d>] in <bounds>"``: the ``--help`` line of an
    estimator option shared by ``names``."""
    takers = registry.takers(o.name, names)
    defaults = {n: registry.get_estimator(n).options[o.name] for n in takers}
    shown = (
        f"default {next(iter(defaults.values()))!r}"
        if len(set(map(repr, defaults.values()))) == 1
        else "defaults " + ", ".join(f"{n} {v!r}" for n, v in defaults.items())
    )
    what = f"{o.doc or o.name} [{', '.join(takers)}; {shown}]"
    if o.bounds_text() and o.kind != "choice":
        what += f" in {o.bounds_text()}"
    return what


def _options(args) -> dict:
    """The estimator options set on the command line (the flags :func:`_estimator_args` added)."""
    return {k: getattr(args, k) for k in registry.vocabulary() if getattr(args, k, None) is not None}


def _names(s: str | None) -> tuple[str, ...] | None:
    return None if s is None else registry.parse_names(s)


def cmd_advantages(args) -> int:
    cfg = AnnotateConfig(
        estimators=_names(args.estimators) or registry.DEFAULT_ESTIMATORS,
        options=_options(args),
        max_tokens=args.max_tokens,
        progress=False if args.no_progress else None,
    )
    stats = annotate_file(args.path, args.out, cfg)
    print(
        f"wrote {stats['out']}: {stats['trajectories']:,} trajectories, {stats['tokens']:,} tokens, "
        f"columns {', '.join(f'adv_{n}, ret_{n}' for n in cfg.estimators)} "
        f"({stats['seconds']:.1f}s, {stats['tokens_per_s']:,.0f} tokens/s)"
    )
    return 0


def cmd_report(args) -> int:
    cfg = ReportConfig(
        estimators=_names(args.estimators),
        options=_options(args),
        n_best=args.n_best,
        n_worst=args.n_worst,
        n_disagreed=args.n_disagreed,
        title=args.title,
        max_tokens=args.max_tokens,
        progress=False if args.no_progress else None,
        tokenizer=args.tokenizer,
        export_dir=args.export,
    )
    t = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExportWarning)
        warnings.simplefilter("always", LeftOutNote)
        p = write_report(args.path, args.output, cfg)
    for w in caught:  # notes and the library's warnings as plain lines, others as Python shows them
        if issubclass(w.category, (ExportWarning, LeftOutNote)):
            print(f"note: {w.message}", file=sys.stderr)
        elif w.category is UserWarning:
            print(f"warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    print(
        f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t:.1f}s); open it in a browser (works "
        "offline)"
    )
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "advantages",
        help="add adv_<name>/ret_<name> columns for chosen estimators (streams)",
        description=_ADVANTAGES_DESCRIPTION,
    )
    p.add_argument("path", help="trajectories: .jsonl, .parquet or a folder")
    p.add_argument(
        "-o",
        "--output",
        dest="out",
        required=True,
        help="output .parquet or .jsonl file, or a folder (one Parquet file per chunk, no merge pass)",
    )
    _estimator_args(p, ",".join(registry.DEFAULT_ESTIMATORS))
    p.set_defaults(func=cmd_advantages)

    r = sub.add_parser(
        "report",
        help="self-contained offline HTML report (summary, across/within, token strips)",
        description=_REPORT_DESCRIPTION,
    )
    r.add_argument("path", help="trajectories: .jsonl, .parquet or a folder")
    r.add_argument("-o", "--output", default="report.html", help="output HTML (default report.html)")
    _estimator_args(r, None)
    r.add_argument("--title", default="mpo_viz report", help="page title")
    r.add_argument("--n-best", type=int, default=2, help="highest-score trajectories to show (default 2)")
    r.add_argument("--n-worst", type=int, default=2, help="lowest-score trajectories to show (default 2)")
    r.add_argument("--n-disagreed", type=int, default=2, help="most disagreed-on trajectories to show (default 2)")
    r.add_argument(
        "--tokenizer",
        metavar="DIR",
        default=None,
        help="local tokenizer folder (or tokenizer.json): show decoded text in the strips when the data "
        "has no response_tokens; loaded offline, nothing is downloaded",
    )
    r.add_argument(
        "--export",
        metavar="DIR",
        default=None,
        help="also write the report's tables as CSV, and its figures as PNG and SVG when plotly's static "
        "renderer (kaleido) is installed, into DIR",
    )
    r.set_defaults(func=cmd_report)
