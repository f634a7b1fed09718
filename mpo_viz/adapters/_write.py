"""Write converted chunks: one Parquet file, or a folder with one ``part-NNNNN.parquet`` per chunk."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from mpo_viz.checks import OptionError
from mpo_viz.data.io import save
from mpo_viz.data.io.parts import merge_parts
from mpo_viz.data.trajectory import TrajectoryBatch

_PART = re.compile(r"part-\d{5}\.parquet")


def write_chunks(batches: Iterable[TrajectoryBatch], out) -> Path:
    """Write every batch of ``batches`` (consumed one at a time) to ``out``.

    ``out`` ending in ``.parquet``: one file (chunks are written to a temporary folder beside it,
    then joined by :func:`mpo_viz.data.io.parts.merge_parts`). Otherwise a
    folder: earlier ``part-*.parquet`` files there are replaced; other files are left alone.
    """
    out = Path(out)
    if out.suffix == ".jsonl":
        raise OptionError(
            "out", f"expected a .parquet path or a folder, found {str(out)!r} (write JSONL with mpo_viz.save)"
        )
    if out.suffix == ".parquet":
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            parts = _write_parts(batches, tmp)
            if len(parts) == 1:
                os.replace(parts[0], out)
            else:
                merge_parts(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out
    if out.exists() and not out.is_dir():
        raise OptionError("out", f"expected a .parquet path or a folder, found the file {str(out)!r}")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        if _PART.fullmatch(old.name):
            old.unlink()
    _write_parts(batches, out)
    return out


def _write_parts(batches, folder: Path) -> list[Path]:
    parts: list[Path] = []
    meta = None
    for b in batches:
        meta = b.meta
        parts.append(save(b, folder / f"part-{len(parts):05d}.parquet"))
    if not parts:  # nothing converted: still a valid (empty) file
        parts.append(save(TrajectoryBatch.from_rows([], meta), folder / "part-00000.parquet"))
    return parts
