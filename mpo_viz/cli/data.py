"""``mpo-viz info PATH`` and ``mpo-viz validate PATH``: both stream the input (a few rows at a time), so
a whole run's folder is read in flat memory; their numbers are those of a whole-file load."""

from __future__ import annotations

import json

from mpo_viz.data.io import PIECE_ROWS, file_facts, pieces, summarize
from mpo_viz.data.schema import SCHEMA_VERSION, TrajectoryError


def _fmt_stats(s: dict) -> str:
    if not s.get("n"):
        return "-"
    return f"mean {s['mean']:.4g}  std {s['std']:.4g}  min {s['min']:.4g}  max {s['max']:.4g}"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n:,} bytes"


_BARS = "▁▂▃▄▅▆▇█"


def _spark(counts: list[int]) -> str:
    """One character per bin, its height proportional to the count (an empty bin: a space)."""
    top = max(counts) if counts else 0
    return "".join(" " if not c else _BARS[min(len(_BARS) - 1, (c * len(_BARS) - 1) // top)] for c in counts)


def _histogram_lines(h: dict) -> list[str]:
    """The summary's histograms as text: turns by value, response length in doubling bins, reward and
    score in ten equal bins (a bar per bin, then the counts)."""
    lines = []
    turns = h["turns"]
    if turns["values"]:
        pairs = [f"{v}:{c}" for v, c in zip(turns["values"], turns["counts"])]
        shown = "  ".join(pairs) if len(pairs) <= 12 else "  ".join(pairs[:6] + ["..."] + pairs[-5:])
        lines.append(f"  turns hist       {shown}")
    length = h["response_length"]
    if length["counts"]:
        e, c = length["edges"], length["counts"]
        bins = [f"[{e[i]},{e[i + 1]}):{n}" for i, n in enumerate(c) if n]
        lines.append(f"  length hist      {'  '.join(bins)}")
    for name in ("reward", "score"):  # the outcome reward (missing in logs of per-turn rewards), the sum
        e, c = h[name]["edges"], h[name]["counts"]
        if c:
            lines.append(
                f"  {name + ' hist':<16} |{_spark(c)}| {e[0]:.4g} to {e[-1]:.4g} in {len(c)} "
                f"bin{'s' if len(c) != 1 else ''}: " + " ".join(map(str, c))
            )
    return lines


def _facts_lines(facts: dict) -> list[str]:
    """The lines of what the files say about themselves (Parquet metadata; nothing decoded)."""
    what = f"{facts['files']} {facts['format']} file{'s' if facts['files'] != 1 else ''}, {_mb(facts['bytes'])}"
    lines = [f"  files            {what}"]
    if "rows" in facts:
        cols = ", ".join(f"{k} {_mb(v)}" for k, v in list(facts["columns"].items())[:4])
        lines.append(
            f"  parquet metadata {facts['rows']} rows in {facts['row_groups']} row groups; largest columns: {cols}"
        )
    return lines


def cmd_info(args) -> int:
    facts = file_facts(args.path)  # metadata only: a missing or foreign file fails here, before any decoding
    if args.metadata:
        if args.json:
            print(json.dumps(facts, indent=1, default=str))
            return 0
        print(f"{args.path}")
        print("\n".join(_facts_lines(facts)))
        return 0
    s = summarize(args.path)  # streams: one piece of rows at a time, the same numbers as a whole load
    if args.json:
        print(json.dumps({**s, "files": facts}, indent=1, default=str))
        return 1 if s["rejected_rows"] else 0
    print(f"{args.path}")
    print("\n".join(_facts_lines(facts)))
    print(f"  trajectories     {s['trajectories']}  in {s['groups']} groups (size {_fmt_stats(s['group_size'])})")
    print(f"  response tokens  {s['response_tokens']}  (action {s['action_tokens']})")
    print(f"  prompt tokens    {s['prompt_tokens']}")
    print(f"  turns/traj       {_fmt_stats(s['turns'])}")
    print(f"  response length  {_fmt_stats(s['response_length'])}")
    print(f"  action tok/turn  {_fmt_stats(s['action_tokens_per_turn'])}")
    print(f"  reward           {_fmt_stats(s['reward'])}  (missing: {s['reward_missing']})")
    print(f"  score (sum)      {_fmt_stats(s['score'])}")
    for line in _histogram_lines(s["histograms"]):
        print(line)
    # with no valid row there are no fields to speak of (the required ones would be listed as if present)
    print(f"  fields           {', '.join(s['fields']) if s['trajectories'] else 'none: no valid row'}")
    for k, v in s["meta"].items():
        print(f"  {'meta.' + k:<16} {v}")
    if s["rejected_rows"]:
        print(f"  REJECTED ROWS    {s['rejected_rows']} problem(s); run `mpo-viz validate {args.path}` to list them")
        return 1
    return 0


def cmd_validate(args) -> int:
    # streams: PIECE_ROWS rows at a time; only the problems printed are kept (and counted past the limit)
    limit = args.max_problems
    n_ok = n_problems = bad_rows = 0
    try:
        for piece in pieces(args.path, "collect", rows_per_chunk=PIECE_ROWS):
            n_ok += len(piece)
            n_problems, bad_rows = _print_problems(piece.rejected, n_problems, bad_rows, limit)
    except TrajectoryError as exc:  # file-level problems (unknown schema version, not a v1 table)
        n_problems, bad_rows = _print_problems(exc.problems, n_problems, bad_rows, limit)
    if limit > 0 and n_problems > limit:
        print(f"... and {n_problems - limit} more")
    if n_problems:
        print(f"INVALID: {n_problems} problem(s) in {bad_rows} row(s); {n_ok} valid row(s)")
        return 1
    if not n_ok:
        print(f"EMPTY: {args.path} holds no trajectories (0 rows); nothing to check or analyse")
        return 1
    print(f"OK: {n_ok} valid trajectories, no problems ({SCHEMA_VERSION})")
    return 0


def _print_problems(problems, n_problems: int, bad_rows: int, limit: int) -> tuple[int, int]:
    """Print the problems of one piece up to ``limit`` in all (0: every one); the running counts of
    problems and of the rows they name (a row's problems all come in its own piece)."""
    for p in problems:
        if limit <= 0 or n_problems < limit:
            print(str(p))
        n_problems += 1
    return n_problems, bad_rows + len({(p.file, p.line, p.row) for p in problems})


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "info",
        help="counts, fields present, reward and turn statistics of a trajectory file or folder",
        description="Summarize a trajectory/v1 file or folder: counts, groups, turns, lengths, "
        "rewards, the fields present and the file metadata. Rows that fail validation "
        "are counted (exit 1); `mpo-viz validate` lists them. Streams: memory stays flat "
        "whatever the size of the input (a folder is one input).",
    )
    p.add_argument("path", help=".jsonl, .parquet, or a folder of them")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--metadata",
        action="store_true",
        help="only what the files say about themselves without being decoded: their number and size, "
        "and for Parquet the row count, row groups and column sizes (instant on any size)",
    )
    p.set_defaults(func=cmd_info)
    p = sub.add_parser(
        "validate",
        help="check every row against trajectory/v1; list every problem; exit 1 if any",
        description="Check every row against trajectory/v1 (trajectories/README.md) and print one "
        "line per problem: file, line or row, traj_id, field, expected, found. "
        "Exit 0 if there is none, 1 otherwise (and 1 for a file without any trajectory). Streams: "
        "memory stays flat whatever the size of the input.",
    )
    p.add_argument("path", help=".jsonl, .parquet, or a folder of them")
    p.add_argument(
        "--max-problems", type=int, default=200, help="print at most this many problems (default 200; 0 = all)"
    )
    p.set_defaults(func=cmd_validate)
