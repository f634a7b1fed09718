"""The ``mpo-viz`` command.

One module per command group in this package (``data``, ``generate``, ``advantages``, ``runs``), each exposing
``add_subcommand(subparsers) -> None`` that registers ``argparse`` parsers whose ``func(args) -> int``
does the work; :func:`build_parser` imports them explicitly, in ``--help`` order. To add a command
group: write ``cli/<group>.py`` with ``add_subcommand`` and add it to the tuple in :func:`build_parser`.

A command builds the library's config from its flags and calls the library. Errors: the library
raises :class:`~mpo_viz.checks.OptionError` for a bad option or config field (its ``option``
attribute names the field); :func:`main` says it under the flag whose ``dest`` is that field
(``lam: expected ...`` reads ``--lam: expected ...``), so name each flag's ``dest`` after the config
field it fills. Bad input: a one-line message on stderr and exit code 1 or 2, no traceback unless
``--debug``.
"""

from __future__ import annotations

import argparse
import os
import sys

from mpo_viz.checks import OptionError
from mpo_viz.cli import (
    advantages,
    convert,
    data,
    doctor,
    export,
    fit_critic,
    generate,
    get_model,
    runs,
    train,
    truth,
)
from mpo_viz.cli.errors import CLIError
from mpo_viz.cli.flags import requested_env
from mpo_viz.version import __version__

__all__ = ["main", "build_parser", "CLIError", "flags_of", "in_flags"]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage block is in ``--help``); exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``mpo-viz`` parser; ``argv`` (the command line to parse) lets the commands that take
    ``--env`` add flags for the options of the environment it names (an entry point's, or
    ``package.module:factory``'s: they are not known before)."""
    parser = _Parser(
        prog="mpo-viz",
        description="Credit assignment for long-horizon LLM agents: inspect, score and visualize trajectories.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"mpo-viz {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    # --help order: info, validate, doctor, convert, generate, truth, fit-critic, advantages, report, train, export,
    # runs, get-model
    hint = requested_env(argv)
    for module in (data, doctor, convert, generate, truth, fit_critic, advantages, train, export, runs, get_model):
        if module in (generate, train):
            module.add_subcommand(sub, env_hint=hint)
        else:
            module.add_subcommand(sub)
    for command in sub.choices.values():
        command.set_defaults(flags=flags_of(command))
    return parser


def flags_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``dest -> flag`` of a parser's arguments: the longest option string (``--turn-lam``), or the
    metavar of a positional (``PATH``)."""
    out = {}
    for a in parser._actions:
        if a.dest in (argparse.SUPPRESS, "help"):
            continue
        out[a.dest] = max(a.option_strings, key=len) if a.option_strings else str(a.metavar or a.dest.upper())
    return out


def in_flags(exc: OptionError, flags: dict[str, str]) -> str:
    """The message of ``exc`` with its option named by its flag (``--lam: ...``) when it has one; a
    key inside a dict field (``loss_options.token_clip``) reads ``--loss-option token_clip: ...``."""
    flag = flags.get(exc.option)
    if flag:
        return f"{flag}: {exc.detail}"
    head, dot, key = str(exc.option).partition(".")
    if dot and flags.get(head):
        return f"{flags[head]} {key}: {exc.detail}"
    return str(exc)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(sys.argv[1:] if argv is None else argv)
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
    except (CLIError, ValueError, OSError) as exc:  # TrajectoryError and OptionError are ValueErrors
        if args.debug:
            raise
        msg = in_flags(exc, getattr(args, "flags", {})) if isinstance(exc, OptionError) else str(exc)
        print(f"mpo-viz {args.command}: error: {msg}", file=sys.stderr)
        return getattr(exc, "code", 1)


if __name__ == "__main__":
    sys.exit(main())
