"""The package version (one place; ``mpo_viz.__version__`` re-exports it)."""

__version__ = "0.1.0"
