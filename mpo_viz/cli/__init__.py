"""The ``mpo-viz`` command.

One module per command group in this package, each exposing ``add_subcommand(subparsers) -> None``
that registers ``argparse`` parsers whose ``func(args) -> int`` does the work; :data:`COMMANDS` lists
them, imported explicitly, in ``--help`` order. Bad input: a one-line message on stderr and exit code 1 or 2,
no traceback unless ``--debug``.
"""

from __future__ import annotations

import argparse
import os
import sys


class CLIError(Exception):
    """An expected failure: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage block is in ``--help``); exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mpo-viz",
        description="Credit assignment for long-horizon LLM agents: inspect, score and visualize trajectories.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    from mpo_viz import __version__

    parser.add_argument("--version", action="version", version=f"mpo-viz {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    from mpo_viz.cli import advantages, convert, data, generate

    # --help order: info, validate, convert, generate, advantages, report
    for module in (data, convert, generate, advantages):
        module.add_subcommand(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # bare `mpo-viz`: show the commands
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return rc
    except BrokenPipeError:  # `mpo-viz validate ... | head`: the reader stopped; not an error to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports it
    except KeyboardInterrupt:
        print("mpo-viz: interrupted", file=sys.stderr)
        return 130
    except (CLIError, ValueError, OSError) as exc:  # TrajectoryError is a ValueError
        if args.debug:
            raise
        print(f"mpo-viz {args.command}: error: {exc}", file=sys.stderr)
        return getattr(exc, "code", 1)


if __name__ == "__main__":
    sys.exit(main())
