"""mpo_viz: credit assignment for long-horizon LLM agents (MPO, GAE, GRPO, ...) with Jupyter views.

The public API (DESIGN §5); this module only re-exports.
"""

from mpo_viz import synthetic
from mpo_viz.io import load, save, scan
from mpo_viz.schema import SCHEMA_VERSION, TrajectoryError
from mpo_viz.trajectory import TrajectoryBatch

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "TrajectoryBatch",
    "TrajectoryError",
    "load",
    "save",
    "scan",
    "synthetic",
    "__version__",
]
