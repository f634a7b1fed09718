"""The ``mpo-viz`` command's expected failure (shared by the command modules and :func:`mpo_viz.cli.main`)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["CLIError", "source_and_output"]


class CLIError(Exception):
    """An expected failure: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def source_and_output(path, out) -> tuple[Path, Path]:
    """A command's input (an existing file or folder) and its ``-o`` trajectory file (``.parquet``
    or ``.jsonl``), or a :class:`CLIError` saying which is wrong."""
    src, dst = Path(path), Path(out)
    if not src.exists():
        raise CLIError(f"{src}: no such file or folder")
    if dst.suffix not in (".parquet", ".jsonl"):
        raise CLIError(f"-o: expected a .parquet or .jsonl file, found {str(dst)!r}", 2)
    return src, dst
