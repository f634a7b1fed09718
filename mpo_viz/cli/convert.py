"""``mpo-viz convert --from verl|areal|skyrl|steps|openai|trl|art IN -o OUT``: other frameworks' logs → v1.

Option problems raised by :mod:`mpo_viz.adapters` are :class:`~mpo_viz.checks.OptionError`s, so the
command names the flag (``--tokenizer: expected ...``) from the parser's own table.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from mpo_viz.adapters import ConversionWarning, convert
from mpo_viz.cli.errors import CLIError

FROM = ("verl", "areal", "skyrl", "steps", "openai", "trl", "art")
# the frameworks whose logs one adapter reads, by their own names
ALIASES = {"verifiers": "steps", "rllm": "steps", "agent-lightning": "steps", "chat": "openai"}


def cmd_convert(args) -> int:
    args.source = ALIASES.get(args.source, args.source)
    src = Path(args.input)
    if not src.exists():
        raise CLIError(f"IN: expected a {args.source} log file or folder, found no such path {str(src)!r}")
    with warnings.catch_warnings():  # the report says them (and --report-json lists them under "warnings")
        warnings.simplefilter("ignore", ConversionWarning)
        report = convert(
            args.source,
            src,
            args.out,
            tokenizer=args.tokenizer,
            trust=args.trust,
            obs_reward=args.obs_reward,
            errors=args.errors,
            chunk_rows=args.chunk_rows,
            chunk_tokens=args.chunk_tokens,
            allow_unknown=args.allow_unknown,
            unknown_role=args.unknown_role,
        )
    if args.report_json:
        Path(args.report_json).write_text(report.to_json() + "\n")
        for w in report.warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(f"wrote {report.trajectories} trajectories to {args.out}; report in {args.report_json}")
    else:
        print(report)
        print(f"wrote {report.trajectories} trajectories to {args.out}")
    return 1 if report.rejected else 0


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="convert verl / AReaL / SkyRL / step-wise / OpenAI-chat / TRL / ART logs to trajectory/v1",
        description="Convert another framework's rollout log to trajectory/v1 and print what changed: rows, rewards "
        "moved off observation tokens, retokenization mismatches, steps kept apart, fields dropped, tool calls "
        "and how they became tokens; WARNING lines for empty assistant turns, unknown tokens and "
        "trajectories without a reward. "
        "Field mappings and how to dump each framework's logs: docs/adapters.md. Exit 1 when rows were "
        "rejected (--errors collect), 0 otherwise.",
    )
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        choices=(*FROM, *ALIASES),
        metavar="{" + ",".join(FROM) + "}",
        help="the layout of IN (verifiers, rllm and agent-lightning logs: steps; chat: openai)",
    )
    p.add_argument(
        "input",
        metavar="IN",
        help="the log: a file (or, for trl/art, a folder of Parquet files; for areal, a folder of batch files)",
    )
    p.add_argument("-o", "--out", required=True, help="output: a .parquet file, or a folder (one part file per chunk)")
    p.add_argument("--tokenizer", metavar="DIR", help="local tokenizer folder with a chat template (openai, trl, art)")
    p.add_argument(
        "--trust",
        action="store_true",
        help="allow unpickling IN (a pickled verl DataProto or SkyRL output); only for files you trust",
    )
    p.add_argument(
        "--obs-reward",
        choices=("move", "error"),
        default="move",
        help="a reward on an observation token: move it to the action token before (default, counted) "
        "or refuse the row",
    )
    p.add_argument(
        "--errors",
        choices=("raise", "collect"),
        default="raise",
        help="stop at the first bad row (default) or convert the good rows and list the others",
    )
    p.add_argument(
        "--allow-unknown-tokens",
        dest="allow_unknown",
        action="store_true",
        help="convert even when most action tokens become the tokenizer's unknown token (refused by "
        "default: the tokenizer does not cover the text)",
    )
    p.add_argument(
        "--unknown-role",
        choices=("error", "observation"),
        default="error",
        help="a chat message whose role is not system/developer/user/assistant/tool/function (a typo such "
        "as 'asistant'): refuse the row (default), or keep it as observation tokens with a warning",
    )
    p.add_argument(
        "--report-json", metavar="PATH", help="write the conversion report as JSON here instead of printing it"
    )
    p.add_argument("--chunk-rows", type=int, default=1024, help="trajectories per chunk (memory bound; default 1024)")
    p.add_argument(
        "--chunk-tokens",
        type=int,
        default=1_000_000,
        help="response tokens per chunk, whichever of the two bounds comes first (default 1,000,000)",
    )
    p.set_defaults(func=cmd_convert)
