"""``mpo-viz runs explain RUN_DIR``: which collapse signature fired in a run folder, from which
iteration, and the episodes and turns behind it (:mod:`mpo_viz.train.forensics`)."""

from __future__ import annotations

import json

from mpo_viz.cli.errors import CLIError
from mpo_viz.train.collapse import DOCS
from mpo_viz.train.forensics import explain, explanation_text

__all__ = ["add_subcommand"]

_EXPLAIN = f"""\
Read RUN_DIR's metrics.jsonl with the trainer's collapse rules and say, for each signature that
fired (success, eval_success, eval_sampled_success, entropy, ratio_max), the first iteration it
crossed its threshold at, and the top episodes and turns by that metric in the saved episodes of
that iteration (trajectories/iter=N.parquet), with their traj_id and turn. What a ranking could
not use (a field the file lacks) is said in the text. See {DOCS}."""


def cmd_explain(args) -> int:
    if args.top < 1:
        raise CLIError(f"--top: expected >= 1 episodes and turns to list, found {args.top}", 2)
    e = explain(args.run_dir, top=args.top, metric=args.metric)
    if args.json:
        print(json.dumps(_as_json(e), indent=1))
    else:
        print(explanation_text(e))
    return 0


def _as_json(e) -> dict:
    """The explanation as plain JSON (the tables as lists of row objects)."""

    def rows(df):
        return None if df is None else json.loads(df.drop(columns=["row"]).to_json(orient="records"))

    return {
        "run_dir": str(e.run_dir),
        "metrics_lines": e.n_lines,
        "loss": e.loss,
        "saved_iterations": e.saved,
        "findings": [
            {
                "metric": f.metric,
                "first_iteration": f.first,
                "flagged": [list(s) for s in f.spans],
                "rule": f.rule,
                "message": f.signal.message,
                "value": f.signal.value,
                "reference": f.signal.reference,
                "episodes": None if f.episodes is None else str(f.episodes),
                "episodes_iteration": f.episodes_iteration,
                "note": f.note,
                "ranked_by": f.ranking,
                "ranking_note": f.ranking_why,
                "tied": f.tied,
                "top_episodes": rows(f.top_episodes),
                "top_turns": rows(f.top_turns),
            }
            for f in e.findings
        ],
    }


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "runs",
        help="read run folders: collapse forensics (runs explain RUN_DIR)",
        description="Commands that read a run folder mpo-viz train wrote.",
    )
    runs = p.add_subparsers(dest="runs_command", metavar="SUBCOMMAND")
    runs.required = True
    e = runs.add_parser(
        "explain", help="which collapse signature fired, from which iteration, and its episodes", description=_EXPLAIN
    )
    e.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (metrics.jsonl, trajectories/)")
    e.add_argument("--top", type=int, default=5, help="episodes and turns listed per signature (default 5)")
    e.add_argument("--metric", default=None, help="only this signature (one that fired)")
    e.add_argument("--json", action="store_true", help="the same as JSON")
    e.set_defaults(func=cmd_explain)
