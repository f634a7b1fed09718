"""mpo_viz: credit assignment for long-horizon LLM agents (MPO, GAE, GRPO, ...) with Jupyter views.

The public API; this module only re-exports. The heavier subpackages
(``mv.advantages``, ``mv.losses``, ``mv.analysis``, ``mv.plots``, ``mv.report``, ``mv.envs``,
``mv.widgets``) load on first access, so ``import mpo_viz`` stays quick.
"""

import importlib

from mpo_viz.data import synthetic
from mpo_viz.data.io import load, save, scan
from mpo_viz.data.schema import SCHEMA_VERSION, TrajectoryError
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.version import __version__

#: subpackages loaded on first access, by the name ``mv.<name>`` (their module path)
_LAZY = {
    "advantages": "mpo_viz.advantages",
    "losses": "mpo_viz.losses",
    "analysis": "mpo_viz.analysis",
    "plots": "mpo_viz.render.plots",
    "report": "mpo_viz.render.report",
    "envs": "mpo_viz.envs",
    "widgets": "mpo_viz.widgets",
    "turns": "mpo_viz.data.turns",
}

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
        return importlib.import_module(_LAZY[name])
    raise AttributeError(f"module 'mpo_viz' has no attribute {name!r}")
