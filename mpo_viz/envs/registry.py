"""String registry of environments: ``make_env(name, **kw)``, ``register_env``, ``available_envs``."""

from __future__ import annotations

from collections.abc import Callable

from mpo_viz.envs.base import TextEnv

__all__ = ["make_env", "register_env", "available_envs"]

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


def make_env(name: str, **kw) -> TextEnv:
    """A new environment ``name`` built with keyword options (``difficulty``, ``slack``, ``seed``, ...)."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"name: expected one of {available_envs()}, found {name!r}") from None
    return factory(**kw)


def _register_builtins() -> None:
    from mpo_viz.envs.automation import AutomationEnv
    from mpo_viz.envs.search import SearchEnv
    from mpo_viz.envs.tooluse import ToolUseEnv

    for cls in (SearchEnv, ToolUseEnv, AutomationEnv):
        register_env(cls.name, cls)


_register_builtins()
