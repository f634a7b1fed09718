"""String registry of environments: ``make_env(name, **kw)``, ``register_env``, ``available_envs``."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from mpo_viz.checks import OptionError
from mpo_viz.envs.base import TextEnv

__all__ = ["make_env", "register_env", "available_envs", "env_options"]

_REGISTRY: dict[str, Callable[..., TextEnv]] = {}


def register_env(name: str, factory: Callable[..., TextEnv]) -> None:
    """Register ``factory(**kw) -> TextEnv`` under ``name``; a name is registered once."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, found {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"name: environment {name!r} is already registered")
    _REGISTRY[name] = factory


def available_envs() -> list[str]:
    """Registered environment names, sorted."""
    return sorted(_REGISTRY)


def env_options(name: str) -> list[str] | None:
    """The keyword options environment ``name``'s factory takes (``difficulty``, ``slack``, ...),
    following ``**kw`` up a class's bases; None when a plain function takes ``**kw`` (anything)."""
    factory = _factory(name)
    funcs = [c.__dict__["__init__"] for c in factory.__mro__ if "__init__" in c.__dict__] if isinstance(factory, type) \
        else [factory]
    out: list[str] = []
    for f in funcs:
        params = inspect.signature(f).parameters.values()
        out += [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.name != "self" and p.name not in out]
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            return out
    return None


def _factory(name: str) -> Callable[..., TextEnv]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise OptionError("name", f"expected one of {available_envs()}, found {name!r}") from None


def make_env(name: str, **kw) -> TextEnv:
    """A new environment ``name`` built with keyword options (``difficulty``, ``slack``, ``seed``, ...);
    an option the environment does not take raises :class:`~mpo_viz.checks.OptionError` naming it."""
    factory = _factory(name)
    takes = env_options(name)
    for k in kw:
        if takes is not None and k not in takes:
            raise OptionError(k, f"expected an option of the {name} environment ({', '.join(takes)}), "
                                 "found one it does not take")
    return factory(**kw)


def _register_builtins() -> None:
    from mpo_viz.envs.automation import AutomationEnv
    from mpo_viz.envs.search import SearchEnv
    from mpo_viz.envs.tooluse import ToolUseEnv

    for cls in (SearchEnv, ToolUseEnv, AutomationEnv):
        register_env(cls.name, cls)


_register_builtins()
