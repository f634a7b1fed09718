"""String registry of environments: ``make_env(name, **kw)``, ``register_env``, ``available_envs``.

An environment is named in one of three ways, each usable wherever a name is (``make_env``,
``--env``, ``Config.env``, the ``generator`` a file records):

* a name registered in this process (``register_env``; the built-in ``search``, ``tooluse``,
  ``automation``);
* a name of the entry-point group ``mpo_viz.envs`` of an installed package (``[project.entry-points
  ."mpo_viz.envs"] guess = "my_pkg.envs:GuessEnv"``), loaded on first use and listed by
  :func:`available_envs` (so ``mpo-viz ... --help`` shows it);
* ``package.module:factory`` — imported on first use and registered under that very string, so a
  fresh process (``mpo-viz truth`` on a file, a resumed run) rebuilds it from the name alone;
* ``gem:<id>`` / ``textarena:<id>`` — a game of GEM or TextArena through its adapter
  (:mod:`mpo_viz.envs.gem`, :mod:`mpo_viz.envs.textarena`; the ``[gem]`` / ``[textarena]`` extras),
  registered on first use like a spec.

A factory is a :class:`~mpo_viz.envs.base.TextEnv` subclass, a class or function that returns a
``TextEnv``, or one that returns a plain reset/step object (:mod:`mpo_viz.envs.protocol`; wrapped in
:class:`~mpo_viz.envs.protocol.ProtocolEnv`). Its keyword options are declared once, as
:class:`~mpo_viz.options.Option` s: a ``TextEnv`` subclass in its ``options`` (gathered along its bases),
any other factory in an ``options`` attribute (a class attribute, or ``factory.options = (...)``), or
with ``register_env(name, factory, options=[...])``. ``make_env`` checks each given option against its
declaration and refuses an undeclared one by name.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from typing import Any

from mpo_viz.checks import OptionError
from mpo_viz.envs import gem, textarena
from mpo_viz.envs.automation import AutomationEnv
from mpo_viz.envs.base import TextEnv
from mpo_viz.envs.frozenlake import FrozenLakeEnv
from mpo_viz.envs.library import OPTIONS as LIBRARY_OPTIONS
from mpo_viz.envs.library import library_of
from mpo_viz.envs.protocol import PROTOCOL, ProtocolEnv, is_protocol
from mpo_viz.envs.search import SearchEnv
from mpo_viz.envs.sokoban import SokobanEnv
from mpo_viz.envs.tooluse import ToolUseEnv
from mpo_viz.options import Option

__all__ = [
    "make_env",
    "register_env",
    "available_envs",
    "registered_envs",
    "env_options",
    "env_declarations",
    "resolve_env",
    "ENTRY_POINT_GROUP",
    "is_spec",
]

#: the entry-point group an installed package lists its environments in
ENTRY_POINT_GROUP = "mpo_viz.envs"

_REGISTRY: dict[str, Callable[..., Any]] = {}
_OPTIONS: dict[str, dict[str, Option] | None] = {}
_ENTRY: dict[str, str] | None = None


def is_spec(name) -> bool:
    """Whether ``name`` reads as ``package.module:factory``."""
    if not isinstance(name, str) or name.count(":") != 1:
        return False
    mod, attr = name.split(":")
    return bool(mod) and bool(attr) and all(p.isidentifier() for p in mod.split(".") + attr.split("."))


def _declared(factory, options: Iterable[Option] | None) -> dict[str, Option] | None:
    if options is not None:
        return {o.name: o for o in options}
    if isinstance(factory, type) and issubclass(factory, TextEnv):
        return factory.declared_options()
    own = getattr(factory, "options", None)
    if isinstance(own, (tuple, list)) and all(isinstance(o, Option) for o in own):
        return {o.name: o for o in own}
    return None


def register_env(name: str, factory: Callable[..., Any], *, options: Iterable[Option] | None = None) -> None:
    """Register ``factory(**kw)`` (a ``TextEnv``, or a reset/step object) under ``name``; a name is
    registered once.

    ``options``: the factory's keyword options; default: a ``TextEnv`` subclass's declared ones
    (:meth:`~mpo_viz.envs.base.TextEnv.declared_options`), else the factory's ``options`` attribute
    when it holds :class:`~mpo_viz.options.Option` s, else none declared (every keyword is passed on
    unchecked)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, found {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"name: environment {name!r} is already registered")
    if not callable(factory):
        raise ValueError(f"factory: expected a class or function that makes an environment, found {factory!r}")
    _REGISTRY[name] = factory
    _OPTIONS[name] = _declared(factory, options)


def _entry_points() -> dict[str, str]:
    """``name -> "module:attr"`` of the installed entry points of :data:`ENTRY_POINT_GROUP` (read once)."""
    global _ENTRY
    if _ENTRY is None:
        from importlib.metadata import entry_points

        try:
            _ENTRY = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
        except Exception:  # a broken distribution's metadata must not break every command
            _ENTRY = {}
    return _ENTRY


def available_envs() -> list[str]:
    """Environment names, sorted: the registered ones and the installed entry points' (specs
    ``package.module:factory`` are accepted too, and listed once used)."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def registered_envs() -> list[str]:
    """The names registered in this process so far (built-in, ``register_env``, and the entry points
    and specs already used), sorted: those whose options are known without importing anything."""
    return sorted(_REGISTRY)


def _load(target: str, what: str):
    """The object ``module:attr`` names; an :class:`OptionError` (option ``env``) saying which part
    does not load."""
    mod_name, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as exc:
        raise OptionError(
            "env",
            f"expected {what} to import, found {target!r}: module {mod_name!r} does not ({type(exc).__name__}: {exc})",
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise OptionError(
                "env", f"expected {what} to name a factory, found {target!r}: module {mod_name!r} has no {attr!r}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise OptionError(
            "env", f"expected {what} to name a class or function, found {target!r}: a {type(obj).__name__}"
        )
    return obj


def resolve_env(name: str) -> str:
    """Make sure ``name`` can be built: a registered name as it is; an entry point's or a
    ``package.module:factory`` loaded and registered. Returns ``name``; an unknown or broken one is an
    :class:`~mpo_viz.checks.OptionError` (option ``env``) saying what was expected."""
    if not isinstance(name, str) or not name:
        raise OptionError("env", f"expected an environment name, found {name!r}")
    if name in _REGISTRY:
        return name
    entry = _entry_points().get(name)
    if entry is not None:
        register_env(name, _load(entry, f"the entry point {name!r} of group {ENTRY_POINT_GROUP!r}"))
        return name
    library = library_of(name)
    if library is not None:
        game_id = name.partition(":")[2]
        factory: Callable[..., Any]
        if library == "gem":
            gem.check_id(game_id)
            factory = functools.partial(gem.GemGame, game_id)
        else:
            textarena.check_id(game_id)
            factory = functools.partial(textarena.TextArenaGame, game_id)
        register_env(name, factory, options=LIBRARY_OPTIONS)
        return name
    if is_spec(name):
        register_env(name, _load(name, "package.module:factory"))
        return name
    raise OptionError(
        "env",
        f"expected one of {', '.join(available_envs())}, gem:<id>, textarena:<id> or package.module:factory, "
        f"found {name!r}",
    )


def env_declarations(name: str) -> dict[str, Option] | None:
    """``{option: Option}`` environment ``name`` declares; None for a factory registered without
    declarations (it takes anything)."""
    try:
        resolve_env(name)
    except OptionError as exc:
        raise OptionError("name", exc.detail) from None
    declared = _OPTIONS[name]
    return None if declared is None else dict(declared)


def env_options(name: str) -> list[str] | None:
    """The keyword options environment ``name`` declares (``difficulty``, ``slack``, ...); None for
    a factory registered without declarations (it takes anything)."""
    declared = env_declarations(name)
    return None if declared is None else list(declared)


def make_env(name: str, **kw) -> TextEnv:
    """A new environment ``name`` (a registered name, an entry point's, or ``package.module:factory``)
    built with keyword options (``difficulty``, ``slack``, ``seed``, ...); an option the environment
    does not declare, or a value its declaration refuses, raises :class:`~mpo_viz.checks.OptionError`
    naming it. A factory that returns a reset/step object gets it wrapped
    (:class:`~mpo_viz.envs.protocol.ProtocolEnv`); the environment's ``env_id`` is ``name``."""
    try:
        resolve_env(name)
    except OptionError as exc:
        raise OptionError("name", exc.detail) from None
    factory = _REGISTRY[name]
    declared = _OPTIONS[name]
    for k, v in kw.items():
        if declared is None:
            continue
        if k not in declared:
            raise OptionError(
                k,
                f"expected an option of the {name} environment ({', '.join(declared) or 'none'}), "
                "found one it does not take",
            )
        declared[k].check(v)
    env = factory(**kw)
    if isinstance(env, TextEnv):
        env.env_id = name
        return env
    if is_protocol(env):
        return ProtocolEnv(env, env_id=name, factory=factory, options=kw, declared=declared)
    raise OptionError("env", f"expected the factory of {name!r} to return {PROTOCOL}, found {type(env).__name__}")


for _cls in (SearchEnv, ToolUseEnv, AutomationEnv, SokobanEnv, FrozenLakeEnv):
    register_env(_cls.name, _cls)
