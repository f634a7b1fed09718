"""Write converted chunks: one Parquet file, or a folder with one ``part-NNNNN.parquet`` per chunk."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from mpo_viz.io import save
from mpo_viz.trajectory import TrajectoryBatch

_PART = re.compile(r"part-\d{5}\.parquet")


def write_chunks(batches: Iterable[TrajectoryBatch], out) -> Path:
    """Write every batch of ``batches`` (consumed one at a time) to ``out``.

    ``out`` ending in ``.parquet``: one file (chunks are written to a temporary folder beside it,
    then joined row group by row group under one schema, then renamed into place). Otherwise a
    folder: earlier ``part-*.parquet`` files there are replaced; other files are left alone.
    """
    out = Path(out)
    if out.suffix == ".jsonl":
        raise ValueError(f"out: expected a .parquet path or a folder, found {str(out)!r} (write JSONL with mpo_viz.save)")
    if out.suffix == ".parquet":
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            parts = _write_parts(batches, tmp)
            if len(parts) == 1:
                os.replace(parts[0], out)
            else:
                _join(parts, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: expected a .parquet path or a folder, found the file {str(out)!r}")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        if _PART.fullmatch(old.name):
            old.unlink()
    _write_parts(batches, out)
    return out


def _write_parts(batches, folder: Path) -> list[Path]:
    parts = []
    meta = None
    for b in batches:
        meta = b.meta
        parts.append(save(b, folder / f"part-{len(parts):05d}.parquet"))
    if not parts:  # nothing converted: still a valid (empty) file
        parts.append(save(TrajectoryBatch.from_rows([], meta), folder / "part-00000.parquet"))
    return parts


def _join(parts: list[Path], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schemas = [pq.read_schema(p) for p in parts]
    schema = pa.unify_schemas([s.remove_metadata() for s in schemas], promote_options="permissive")
    schema = schema.with_metadata(schemas[0].metadata)
    tmp = out.with_name(out.name + ".tmp")
    with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        for p in parts:
            pf = pq.ParquetFile(p)
            for g in range(pf.num_row_groups):
                t = pf.read_row_group(g)
                cols = [t.column(f.name).cast(f.type) if f.name in t.column_names
                        else pa.nulls(t.num_rows, type=f.type) for f in schema]
                writer.write_table(pa.Table.from_arrays(cols, schema=schema))
    os.replace(tmp, out)
