"""The ``compute_advantage`` wrapper and where it is installed.

verl computes advantages in ``verl.trainer.ppo.ray_trainer.compute_advantage(data, adv_estimator,
gamma, lam, num_repeat, norm_adv_by_std_in_grpo, config)`` (the driver, ``RayPPOTrainer.fit``). GAE
and GRPO are hard-coded branches there; every other name goes to the registered estimator without
``values``. The v1 trainer (``verl.trainer.ppo.v1.trainer_base``) reaches the same function through
``verl.trainer.ppo.v1.utils.compute_advantage_for_multi_trajectories``, which imported it by name
(``from verl.trainer.ppo.ray_trainer import compute_advantage``), as do the experimental trainers.

The wrapper:

* for our estimators (``mpo``, ``turn_gae``) calls the registered function with the critic's
  ``values`` (a :class:`~.estimators.MissingCriticError` without them), the turn structure being
  the runs of ``response_mask`` and the uid groups in ``index``;
* passes every other estimator to verl's function unchanged;
* then, when a run folder is configured (:mod:`.runlog`), appends the step to it.

Installation is lazy: importing the plugin does not import the trainer modules (they pull in Ray
and the whole trainer). A ``sys.meta_path`` finder patches each module of :data:`MODULES` right
after it executes; modules already imported are patched at once.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
import threading

__all__ = ["MODULES", "install", "patched_modules", "wrap"]

#: modules whose global ``compute_advantage`` is replaced by the wrapper (the first one defines it)
MODULES = (
    "verl.trainer.ppo.ray_trainer",
    "verl.trainer.ppo.v1.utils",
    "verl.experimental.separation.ray_trainer",
)

_WRAPPED = "__mpo_viz_wrapped__"
_lock = threading.RLock()


def _name(adv_estimator) -> str:
    return getattr(adv_estimator, "value", adv_estimator)


def wrap(original):
    """The wrapper around verl's ``compute_advantage`` ``original`` (idempotent)."""
    if getattr(original, _WRAPPED, None) is not None:
        return original
    sig = inspect.signature(original)

    @functools.wraps(original)
    def compute_advantage(*args, **kwargs):
        from mpo_viz.integrations.verl import runlog
        from mpo_viz.integrations.verl.estimators import ESTIMATORS

        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        data, name, config = a["data"], _name(a["adv_estimator"]), a.get("config")
        if name in ESTIMATORS:
            data = _ours(data, name, config, sys.modules[original.__module__])
        else:
            data = original(*args, **kwargs)
        runlog.maybe_log(data, name, config)
        return data

    setattr(compute_advantage, _WRAPPED, original)
    return compute_advantage


def _ours(data, name, config, home):
    from verl.trainer.ppo import core_algos

    keys = data.batch.keys()
    if "response_mask" not in keys:
        data.batch["response_mask"] = home.compute_response_mask(data)
    fn = core_algos.get_adv_estimator_fn(name)
    adv, ret = fn(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        config=config,
        index=data.non_tensor_batch.get("uid"),
        values=data.batch["values"] if "values" in keys else None,
    )
    data.batch["advantages"] = adv
    data.batch["returns"] = ret
    return data


def _patch(module) -> None:
    fn = getattr(module, "compute_advantage", None)
    if fn is None or getattr(fn, _WRAPPED, None) is not None:
        return
    if module.__name__ != MODULES[0]:
        home = sys.modules.get(MODULES[0])
        if home is not None:  # reuse the one wrapper, whatever order the modules were imported in
            _patch(home)
            if getattr(home.compute_advantage, _WRAPPED) is fn:
                module.compute_advantage = home.compute_advantage
                return
    module.compute_advantage = wrap(fn)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):  # get_source, get_code, is_package, ... for tracebacks and inspect
        return getattr(self.inner, name)

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        with _lock:
            _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of the :data:`MODULES` so they are patched right after they execute."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader)
        return spec


_finder = _Finder()


def install() -> None:
    """Patch the loaded :data:`MODULES` now and the others when they are imported (idempotent)."""
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        for name in MODULES:
            mod = sys.modules.get(name)
            if mod is not None:
                _patch(mod)


def patched_modules() -> list[str]:
    """Names of the modules whose ``compute_advantage`` is the wrapper (for tests and diagnostics)."""
    return [
        n
        for n in MODULES
        if n in sys.modules and getattr(getattr(sys.modules[n], "compute_advantage", None), _WRAPPED, None) is not None
    ]
