"""``mpo-viz doctor PATH``: the semantic checks of :mod:`mpo_viz.doctor` as one table (or ``--json``).

Exit code 1 when a check fires, 0 otherwise; the thresholds are flags declared by
:data:`mpo_viz.doctor.OPTIONS`.
"""

from __future__ import annotations

import json

from mpo_viz.cli.flags import add_option, option_help
from mpo_viz.doctor import OPTIONS, Finding, examine_stream

__all__ = ["add_subcommand", "format_table"]

_DESCRIPTION = """\
Semantic checks beyond the format (docs/doctor.md): rewards off the loss mask, returns cut at
observation spans, a terminal reward lost on a masked tail, masked values read by the advantage
recursion, values shifted by one token, groups with no GRPO signal, rows without a reward, a turn
count collapsing over the steps, explained variance averaged per micro-batch. PATH: a .jsonl or
.parquet file, a folder of them, or a run folder (metrics.jsonl and trajectories/). Rows the loader
refuses are counted (mpo-viz validate lists them). One table: check, status, rows hit, example ids,
what to fix. Exit 1 when a check fires. Streams: PATH is read --max-tokens response tokens at a time
(memory flat in its size; a folder or a whole run is one input), with the findings of a whole-file pass."""


def _cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_table(findings: list[Finding]) -> str:
    """The findings as one text table (check, status, rows hit, example ids, what to fix: the fix of
    a check that fired), then one line per check with what it measured."""
    head = f"{'check':<34} {'status':<8} {'rows hit':>8}  {'example ids':<40}  what to fix"
    lines = [head, "-" * len(head)]
    for f in findings:
        ids = _cell(", ".join(f.examples) or "-", 40)
        lines.append(f"{f.check:<34} {f.status:<8} {f.rows_hit:>8}  {ids:<40}  {f.fix if f.fired else '-'}")
    lines.append("")
    lines += [f"{f.check} ({f.source}): {f.detail}" for f in findings]
    return "\n".join(lines)


def cmd_doctor(args) -> int:
    options = {o.name: getattr(args, o.name) for o in OPTIONS if getattr(args, o.name) is not None}
    findings, n_rows = examine_stream(args.path, metrics=args.metrics, max_tokens=args.max_tokens, **options)
    fired = [f for f in findings if f.fired]
    if args.json:
        print(
            json.dumps(
                {
                    "path": str(args.path),
                    "rows": n_rows,
                    "fired": len(fired),
                    "findings": [f.to_dict() for f in findings],
                },
                indent=1,
            )
        )
        return 1 if fired else 0
    print(f"{args.path}: {n_rows} valid row(s)")
    print(format_table(findings))
    print(
        f"\n{len(fired)} of {len(findings)} checks fired" + (f": {', '.join(f.check for f in fired)}" if fired else "")
    )
    return 1 if fired else 0


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help="semantic checks beyond the format (misaligned rewards, values, masks); exit 1 if any fires",
        description=_DESCRIPTION,
    )
    p.add_argument("path", help=".jsonl, .parquet, a folder of them, or a run folder")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument(
        "--metrics",
        default=None,
        help="a metrics.jsonl to compare logged explained variance with (default: a run folder's own)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=500_000,
        help="response tokens per chunk (memory bound; the findings do not depend on it; default 500,000)",
    )
    for o in OPTIONS:
        add_option(p, o, help=option_help(o))
    p.set_defaults(func=cmd_doctor)
