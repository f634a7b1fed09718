"""The ``mpo-viz`` command's expected failure (shared by the command modules and :func:`mpo_viz.cli.main`)."""

from __future__ import annotations

__all__ = ["CLIError"]


class CLIError(Exception):
    """An expected failure: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code
