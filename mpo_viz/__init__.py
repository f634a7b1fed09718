"""mpo_viz: credit assignment for long-horizon LLM agents (MPO, GAE, GRPO, ...) with Jupyter views.

The public API; this module only re-exports. The heavier subpackages
(``mv.advantages``, ``mv.losses``, ``mv.analysis``, ``mv.plots``, ``mv.report``, ``mv.envs``,
``mv.widgets``) load on first access, so ``import mpo_viz`` stays quick.
"""

import importlib

from mpo_viz import synthetic
from mpo_viz.io import load, save, scan
from mpo_viz.schema import SCHEMA_VERSION, TrajectoryError
from mpo_viz.trajectory import TrajectoryBatch
from mpo_viz.version import __version__

_LAZY = ("advantages", "losses", "analysis", "plots", "report", "envs", "widgets", "turns")

__all__ = [
    "SCHEMA_VERSION",
    "TrajectoryBatch",
    "TrajectoryError",
    "load",
    "save",
    "scan",
    "synthetic",
    "__version__",
    *_LAZY,
]


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"mpo_viz.{name}")
    raise AttributeError(f"module 'mpo_viz' has no attribute {name!r}")
