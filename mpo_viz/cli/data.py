"""``mpo-viz info PATH`` and ``mpo-viz validate PATH``."""

from __future__ import annotations

import json

from mpo_viz.data.io import load, pieces
from mpo_viz.data.schema import SCHEMA_VERSION, TrajectoryError


def _fmt_stats(s: dict) -> str:
    if not s.get("n"):
        return "-"
    return f"mean {s['mean']:.4g}  std {s['std']:.4g}  min {s['min']:.4g}  max {s['max']:.4g}"


def cmd_info(args) -> int:
    batch = load(args.path, errors="collect")
    s = batch.summary()
    s["rejected_rows"] = len(batch.rejected)
    if args.json:
        print(json.dumps(s, indent=1, default=str))
        return 1 if batch.rejected else 0
    print(f"{args.path}")
    print(f"  trajectories     {s['trajectories']}  in {s['groups']} groups (size {_fmt_stats(s['group_size'])})")
    print(f"  response tokens  {s['response_tokens']}  (action {s['action_tokens']})")
    print(f"  prompt tokens    {s['prompt_tokens']}")
    print(f"  turns/traj       {_fmt_stats(s['turns'])}")
    print(f"  response length  {_fmt_stats(s['response_length'])}")
    print(f"  action tok/turn  {_fmt_stats(s['action_tokens_per_turn'])}")
    print(f"  reward           {_fmt_stats(s['reward'])}  (missing: {s['reward_missing']})")
    print(f"  score (sum)      {_fmt_stats(s['score'])}")
    # with no valid row there are no fields to speak of (the required ones would be listed as if present)
    print(f"  fields           {', '.join(s['fields']) if len(batch) else 'none: no valid row'}")
    for k, v in s["meta"].items():
        print(f"  {'meta.' + k:<16} {v}")
    if batch.rejected:
        print(f"  REJECTED ROWS    {len(batch.rejected)} problem(s); run `mpo-viz validate {args.path}` to list them")
        return 1
    return 0


def cmd_validate(args) -> int:
    n_ok, problems = 0, []
    try:
        for piece in pieces(args.path, "collect", rows_per_chunk=1024):
            n_ok += len(piece)
            problems.extend(piece.rejected)
    except TrajectoryError as exc:  # file-level problems (unknown schema version)
        problems.extend(exc.problems)
    bad_rows = len({(p.file, p.line, p.row) for p in problems})
    limit = args.max_problems
    for p in problems[: limit if limit > 0 else None]:
        print(str(p))
    if limit > 0 and len(problems) > limit:
        print(f"... and {len(problems) - limit} more")
    if problems:
        print(f"INVALID: {len(problems)} problem(s) in {bad_rows} row(s); {n_ok} valid row(s)")
        return 1
    if not n_ok:
        print(f"EMPTY: {args.path} holds no trajectories (0 rows); nothing to check or analyse")
        return 1
    print(f"OK: {n_ok} valid trajectories, no problems ({SCHEMA_VERSION})")
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "info",
        help="counts, fields present, reward and turn statistics of a trajectory file or folder",
        description="Summarize a trajectory/v1 file or folder: counts, groups, turns, lengths, "
        "rewards, the fields present and the file metadata. Rows that fail validation "
        "are counted (exit 1); `mpo-viz validate` lists them.",
    )
    p.add_argument("path", help=".jsonl, .parquet, or a folder of them")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser(
        "validate",
        help="check every row against trajectory/v1; list every problem; exit 1 if any",
        description="Check every row against trajectory/v1 (trajectories/README.md) and print one "
        "line per problem: file, line or row, traj_id, field, expected, found. "
        "Exit 0 if there is none, 1 otherwise (and 1 for a file without any trajectory).",
    )
    p.add_argument("path", help=".jsonl, .parquet, or a folder of them")
    p.add_argument(
        "--max-problems", type=int, default=200, help="print at most this many problems (default 200; 0 = all)"
    )
    p.set_defaults(func=cmd_validate)
