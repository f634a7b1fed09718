"""Command-line flags generated from :class:`~mpo_viz.options.Option` declarations.

:func:`add_option` turns one declaration into one ``argparse`` flag: ``--turn-lam`` for
``turn_lam``, typed by the option's kind (a flag's text read by :meth:`Option.from_text`, so an
optional option takes ``none``), a ``choice`` of fixed choices checked by argparse itself, a
``bool`` as ``--x/--no-x``. A value that reads but is out of bounds is left to the library, whose
:class:`~mpo_viz.checks.OptionError` the ``mpo-viz`` command reports under the flag (``dest`` names
the config field the flag fills, see :func:`mpo_viz.cli.in_flags`).

The environments' options get flags the same way (:func:`add_env_options`): one per option declared
by the registered environments and by the one ``--env`` names on the command line
(:func:`requested_env`: an entry point's or ``package.module:factory`` options show up once it is
named), each filling its key of the environment's options.
"""

from __future__ import annotations

import argparse

from mpo_viz.checks import OptionError
from mpo_viz.options import UNSET, Option

__all__ = [
    "add_option",
    "option_help",
    "flag_of",
    "read_text",
    "env_name",
    "env_help",
    "requested_env",
    "add_env_options",
    "ENV_OPTIONS",
]

#: the dest prefix of the environment option flags (``--slip`` fills ``env_options.slip``)
ENV_OPTIONS = "env_options"


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


def env_name(text: str) -> str:
    """The ``--env`` flag's value: a registered name, an installed entry point's, ``gem:<id>`` /
    ``textarena:<id>`` or ``package.module:factory`` (imported and registered here); argparse's
    one-line error otherwise."""
    from mpo_viz.envs.registry import resolve_env

    try:
        return resolve_env(text)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(exc.detail) from None


def env_help() -> str:
    """The ``--env`` help: the names known now and the other forms."""
    from mpo_viz.envs.registry import ENTRY_POINT_GROUP, available_envs

    return (
        f"environment: one of {', '.join(available_envs())} (installed packages add theirs through the entry-point "
        f"group {ENTRY_POINT_GROUP}), gem:<id> or textarena:<id> (a game of GEM or TextArena, e.g. "
        "gem:game:Sokoban-v0-easy; extras [gem], [textarena]), or package.module:factory (a TextEnv or reset/step "
        "class or function; docs/environments.md)"
    )


def requested_env(argv) -> str | None:
    """The value of ``--env`` in ``argv`` (``--env X`` or ``--env=X``), or None."""
    args = list(argv or ())
    for i, a in enumerate(args):
        if a == "--env" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--env="):
            return a.partition("=")[2]
    return None


def add_env_options(group, parser, env_hint: str | None, *, skip=()) -> list[str]:
    """One flag per option declared by the registered environments and by ``env_hint`` (the ``--env``
    of the command line, when it builds), in first-declared order: ``--<name>``, dest
    ``env_options.<name>``, absent unless given. Options of kind ``any``, names in ``skip`` and flags
    the parser already has are left to ``--env-option KEY=VALUE``. Returns the option names."""
    from mpo_viz.envs.registry import env_declarations, registered_envs

    names = registered_envs()
    if env_hint and env_hint not in names:
        try:
            env_declarations(env_hint)
            names.append(env_hint)
        except OptionError:  # the --env flag's own check says what is wrong with it
            pass
    taken = {s for a in parser._actions for s in a.option_strings}
    seen: dict[str, tuple[Option, list[str]]] = {}
    for name in names:
        for o in (env_declarations(name) or {}).values():
            if o.kind == "any" or o.name in skip or flag_of(o.name) in taken:
                continue
            seen.setdefault(o.name, (o, []))[1].append(name)
    for o, envs in seen.values():
        add_option(
            group,
            o,
            help=option_help(o, doc=f"{o.doc} ({', '.join(envs)})"),
            dest=f"{ENV_OPTIONS}.{o.name}",
            default=argparse.SUPPRESS,
        )
    return list(seen)
