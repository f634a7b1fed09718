"""Options from verl's ``algorithm`` config: estimator options and the run-folder settings.

Which estimators the plugin offers verl (:data:`ESTIMATORS`) is derived from
:mod:`mpo_viz.advantages.registry`, not listed by hand: every registered estimator that runs on what
verl's batch carries — its ``needs`` include critic ``values`` and nothing beyond ``values`` and
``turns`` (the runs of ``response_mask``), and its function takes ``(rewards, values, mask)`` first
and nothing else it requires (the call :mod:`.estimators` and :mod:`.runlog` make). A name verl registers itself
(``gae``) stays
verl's: :func:`refresh_estimators` leaves out the names it is told to skip, and the plugin's
``register()`` tells it verl's own. An estimator added to the registry later is offered by the same
rule, without code here. Today: ``mpo`` (MAE), ``turn_gae``, ``vapo``.

Estimator ``NAME`` (``mpo``, ``turn_gae``, ...) reads its options from ``algorithm.NAME.*`` — e.g.
``+algorithm.mpo.beta=0.5`` on verl's Hydra command line. The option names and defaults are the
ones :mod:`mpo_viz.advantages.registry` declares for that estimator (``registry.estimator_options(name)``);
their declarations (kind, bounds, choices) are the registry's too, so an unknown key or a bad value
is an error naming ``algorithm.NAME.KEY`` with what was expected and found. verl's own
``algorithm.gamma``/``algorithm.lam`` belong to verl's estimators and are not read by ours (our
defaults differ: MAE's within-turn λ is 0.95).

Run-folder logging reads ``algorithm.mpo_viz.*`` (see :data:`LOG_KEYS`), each overridable by an
``MPO_VIZ_*`` environment variable when the config leaves it unset.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping

from mpo_viz.advantages import registry as adv_registry
from mpo_viz.checks import OptionError

__all__ = [
    "ESTIMATORS",
    "VERL_INPUTS",
    "VERL_NEEDS",
    "LOG_KEYS",
    "offered",
    "refresh_estimators",
    "plain",
    "section",
    "estimator_options",
    "log_settings",
]

#: what an estimator may need to run on verl's batch: critic values and turns (response_mask runs)
VERL_NEEDS = frozenset({"values", "turns"})
#: the leading positional parameters the plugin calls an estimator's function with
VERL_INPUTS = ("rewards", "values", "mask")

#: verl estimator name -> mpo_viz registry name (the same name); filled by :func:`refresh_estimators`
ESTIMATORS: dict[str, str] = {}


def offered(name: str) -> bool:
    """Whether registry estimator ``name`` runs on what verl provides (the rule of the module docstring)."""
    est = adv_registry.get_estimator(name)
    if "values" not in est.needs or not set(est.needs) <= VERL_NEEDS:
        return False
    try:
        params = list(inspect.signature(est.fn).parameters.values())
    except (TypeError, ValueError):  # a callable without a signature
        return False
    first, rest = params[: len(VERL_INPUTS)], params[len(VERL_INPUTS) :]
    required = [
        p
        for p in rest
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    return tuple(p.name for p in first) == VERL_INPUTS and not required


def refresh_estimators(skip: Iterable[str] = ()) -> dict[str, str]:
    """Fill :data:`ESTIMATORS` (in place, so every module holding it sees the change) with the
    registry's estimators that :func:`offered` accepts, minus ``skip`` (verl's own names). Returns it."""
    skip = set(skip)
    names = {n: n for n in adv_registry.available_estimators() if n not in skip and offered(n)}
    ESTIMATORS.clear()
    ESTIMATORS.update(names)
    return ESTIMATORS


refresh_estimators()

#: run-folder settings: key under ``algorithm.mpo_viz`` -> (environment variable, type, default, meaning)
LOG_KEYS = {
    "run_dir": ("MPO_VIZ_RUN_DIR", str, None, "run folder to append each step to (unset: no logging)"),
    "every": ("MPO_VIZ_EVERY", int, 1, "log every N-th step (metrics and trajectories)"),
    "max_rows": ("MPO_VIZ_MAX_ROWS", int, 0, "trajectories saved per step, whole uid groups (0: all)"),
    "max_mb": (
        "MPO_VIZ_MAX_MB",
        float,
        0.0,
        "stop saving trajectories once trajectories/ holds this many MB (0: no cap)",
    ),
    "compare": ("MPO_VIZ_COMPARE", str, "mpo,gae,grpo", "estimators computed side by side for metrics.jsonl"),
    "seed": ("MPO_VIZ_SEED", int, 0, "seed of the row subsampling (with the step)"),
}


def plain(obj):
    """An OmegaConf node / verl BaseConfig / Mapping as plain Python containers."""
    try:  # OmegaConf DictConfig / ListConfig
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            return OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover - verl always has omegaconf
        pass
    if isinstance(obj, Mapping):
        return {k: plain(obj[k]) for k in obj}
    return obj


def section(config, name: str) -> dict:
    """``config[name]`` as a plain dict ({} when ``config`` is None or lacks it)."""
    if config is None:
        return {}
    try:
        node = config.get(name) if hasattr(config, "get") else getattr(config, name, None)
    except Exception:  # a struct config without the key
        node = None
    if node is None:
        return {}
    out = plain(node)
    if not isinstance(out, dict):
        raise ValueError(f"algorithm.{name}: expected a mapping of options, found {out!r}")
    return out


def estimator_options(config, name: str) -> dict:
    """The options of our estimator ``name`` from ``algorithm.<name>.*`` (only those set), each
    checked against its declaration in :mod:`mpo_viz.advantages.registry` (kind, bounds, choices).

    Raises ValueError naming ``algorithm.<name>.<key>`` for a key the estimator does not take
    (listing the valid keys) or a value it refuses (expected and found).
    """
    given = section(config, name)
    spec = {o.name: o for o in adv_registry.estimator_options(ESTIMATORS[name])}
    out = {}
    for key, value in given.items():
        if key not in spec:
            raise ValueError(
                f"algorithm.{name}.{key}: unknown option of estimator {name!r}; expected one of "
                f"{', '.join(spec)}, found {key!r}"
            )
        try:
            out[key] = spec[key].check(value)
        except OptionError as exc:
            raise ValueError(f"algorithm.{name}.{key}: {exc.detail}") from None
    return out


def log_settings(config) -> dict:
    """The run-folder settings (:data:`LOG_KEYS`): ``algorithm.mpo_viz.*``, else ``MPO_VIZ_*``, else
    the default. ``run_dir`` None means logging is off. ValueError names the key on a bad value."""
    given = section(config, "mpo_viz")
    unknown = sorted(set(given) - set(LOG_KEYS))
    if unknown:
        raise ValueError(f"algorithm.mpo_viz.{unknown[0]}: unknown key; expected one of {', '.join(LOG_KEYS)}")
    out = {}
    for key, (env, typ, default, _) in LOG_KEYS.items():
        where = f"algorithm.mpo_viz.{key}"
        raw = given.get(key)
        if raw is None and os.environ.get(env, "") != "":
            raw, where = os.environ[env], env
        if raw is None:
            out[key] = default
            continue
        if typ is str:
            out[key] = str(raw)
            continue
        least = 1 if key == "every" else 0
        what = f"{'an integer' if typ is int else 'a number'} >= {least}"
        if isinstance(raw, bool):
            raise ValueError(f"{where}: expected {what}, found {raw!r}")
        try:
            val = typ(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected {what}, found {raw!r}") from None
        if val < least or (typ is int and isinstance(raw, float) and raw != val):
            raise ValueError(f"{where}: expected {what}, found {raw!r}")
        out[key] = val
    names = [n.strip() for n in str(out["compare"]).split(",") if n.strip()]
    bad = [n for n in names if n not in adv_registry.available_estimators()]
    if bad:
        known = ", ".join(adv_registry.available_estimators())
        raise ValueError(f"algorithm.mpo_viz.compare: expected estimator names from {known}, found {', '.join(bad)}")
    return {**out, "compare": names}
