"""Command-line flags generated from :class:`~mpo_viz.options.Option` declarations.

:func:`add_option` turns one declaration into one ``argparse`` flag: ``--turn-lam`` for
``turn_lam``, typed by the option's kind (a flag's text read by :meth:`Option.from_text`, so an
optional option takes ``none``), a ``choice`` of fixed choices checked by argparse itself, a
``bool`` as ``--x/--no-x``. A value that reads but is out of bounds is left to the library, whose
:class:`~mpo_viz.checks.OptionError` the ``mpo-viz`` command reports under the flag (``dest`` names
the config field the flag fills, see :func:`mpo_viz.cli.in_flags`).
"""

from __future__ import annotations

import argparse

from mpo_viz.checks import OptionError
from mpo_viz.options import UNSET, Option

__all__ = ["add_option", "option_help", "flag_of", "read_text"]


def flag_of(name: str) -> str:
    """``turn_lam`` -> ``--turn-lam``."""
    return "--" + name.replace("_", "-")


def _reader(option: Option):
    def read(text: str):
        try:
            return option.from_text(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = option.kind
    return read


def option_help(option: Option, *, doc: str | None = None, defaults: str | None = None) -> str:
    """``"<doc> (<valid values>; default <default>)"``: the ``--help`` line of a declared option
    (``doc`` replaces the option's own, ``defaults`` the default's text)."""
    valid = option.expected() + (" or none" if option.optional and not option.expect else "")
    if defaults is None and option.default is not UNSET:
        defaults = f"default {option.default!r}"
    text = (option.doc if doc is None else doc).replace("``", "")
    return f"{text} ({'; '.join(b for b in (valid, defaults) if b)})"


def add_option(parser, option: Option, *, help: str, dest: str | None = None, default=None) -> None:
    """Add ``option`` as a flag of ``parser`` (or an argument group): ``--<name>``, ``dest`` the
    field it fills (default the option's name), ``default`` what an absent flag leaves
    (``argparse.SUPPRESS``: no attribute at all, so that None can be given as ``none``)."""
    kw = {"dest": dest or option.name, "default": default, "help": help}
    if option.kind == "bool":
        parser.add_argument(flag_of(option.name), action=argparse.BooleanOptionalAction, **kw)
        return
    if option.kind == "choice" and not callable(option.choices) and not option.optional:
        kw["choices"] = option.choices  # argparse's own one-line "invalid choice" names them
    else:
        kw["metavar"] = option.name.upper()
    # a declared parse (the text form of a field, e.g. --difficulty 3-6) is applied by the command
    # (read_text), so that its error is reported as the library's are; the kinds are read here
    parser.add_argument(flag_of(option.name), type=str if option.parse is not None else _reader(option), **kw)


def read_text(option: Option, value):
    """``value`` as :func:`add_option` left it: read with the option's declared ``parse`` when it
    is still text (:class:`~mpo_viz.checks.OptionError` naming the option when it does not read)."""
    if option.parse is None or not isinstance(value, str):
        return value
    try:
        return option.from_text(value)
    except ValueError as exc:
        raise OptionError(option.name, str(exc)) from None
