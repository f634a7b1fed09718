"""String registry of environments: ``make_env(name, **kw)``, ``register_env``, ``available_envs``.

An environment's keyword options are declared once, as :class:`~mpo_viz.options.Option` s: a
:class:`~mpo_viz.envs.base.TextEnv` subclass in its ``options`` (gathered along its bases), a plain
factory function with ``register_env(name, factory, options=[...])``. ``make_env`` checks each
given option against its declaration and refuses an undeclared one by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mpo_viz.checks import OptionError
from mpo_viz.envs.automation import AutomationEnv
from mpo_viz.envs.base import TextEnv
from mpo_viz.envs.frozenlake import FrozenLakeEnv
from mpo_viz.envs.search import SearchEnv
from mpo_viz.envs.sokoban import SokobanEnv
from mpo_viz.envs.tooluse import ToolUseEnv
from mpo_viz.options import Option

__all__ = ["make_env", "register_env", "available_envs", "env_options"]

_REGISTRY: dict[str, Callable[..., TextEnv]] = {}
_OPTIONS: dict[str, dict[str, Option] | None] = {}


def register_env(name: str, factory: Callable[..., TextEnv], *, options: Iterable[Option] | None = None) -> None:
    """Register ``factory(**kw) -> TextEnv`` under ``name``; a name is registered once.

    ``options``: the factory's keyword options; default: a ``TextEnv`` subclass's declared ones
    (:meth:`~mpo_viz.envs.base.TextEnv.declared_options`), and for another factory none declared
    (every keyword is passed on unchecked)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, found {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"name: environment {name!r} is already registered")
    if options is not None:
        declared: dict[str, Option] | None = {o.name: o for o in options}
    elif isinstance(factory, type) and issubclass(factory, TextEnv):
        declared = factory.declared_options()
    else:
        declared = None
    _REGISTRY[name] = factory
    _OPTIONS[name] = declared


def available_envs() -> list[str]:
    """Registered environment names, sorted."""
    return sorted(_REGISTRY)


def env_options(name: str) -> list[str] | None:
    """The keyword options environment ``name`` declares (``difficulty``, ``slack``, ...); None for
    a factory registered without declarations (it takes anything)."""
    _factory(name)
    declared = _OPTIONS[name]
    return None if declared is None else list(declared)


def _factory(name: str) -> Callable[..., TextEnv]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise OptionError("name", f"expected one of {available_envs()}, found {name!r}") from None


def make_env(name: str, **kw) -> TextEnv:
    """A new environment ``name`` built with keyword options (``difficulty``, ``slack``, ``seed``, ...);
    an option the environment does not declare, or a value its declaration refuses, raises
    :class:`~mpo_viz.checks.OptionError` naming it."""
    factory = _factory(name)
    declared = _OPTIONS[name]
    for k, v in kw.items():
        if declared is None:
            continue
        if k not in declared:
            raise OptionError(
                k, f"expected an option of the {name} environment ({', '.join(declared)}), found one it does not take"
            )
        declared[k].check(v)
    return factory(**kw)


for _cls in (SearchEnv, ToolUseEnv, AutomationEnv):
    register_env(_cls.name, _cls)
# the exact models of the literature's testbeds (docs/environments.md, "The environments others train on")
for _lit in (SokobanEnv, FrozenLakeEnv):
    register_env(_lit.name, _lit)
