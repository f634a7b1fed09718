"""Assembling one file from parts written chunk by chunk (``mpo-viz advantages`` writes each chunk
as a part, then merges them)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from mpo_viz.data.schema import JSONL_META_NAME

__all__ = ["merge_parts", "check_destination"]


def check_destination(out: Path) -> None:
    """Refuse, before any work, a ``.jsonl`` output in a folder that already holds other JSONL files:
    they share its ``_meta.json``, and the merged file's metadata would change how they load
    (ValueError saying to use a folder of its own or ``.parquet``, as :func:`mpo_viz.save` does)."""
    out = Path(out)
    if out.suffix != ".jsonl":
        return
    others = sorted(f.name for f in out.parent.glob("*.jsonl") if f.name != out.name)
    if others:
        raise ValueError(
            f"{out}: the JSONL files of a folder share {JSONL_META_NAME}, and {others[0]}"
            f"{f' (and {len(others) - 1} more)' if len(others) > 1 else ''} already use it; writing here "
            f"would change how they load. Write into a folder of its own, or as .parquet (metadata inside the file)."
        )


def merge_parts(parts: Path, out: Path, meta: dict | None = None) -> None:
    """Concatenate the part files of folder ``parts`` into one file ``out`` (temporary name, then rename).

    ``.parquet``: the ``part-*.parquet`` files, row group by row group, under the union of their
    schemas (a column a part lacks is null there); the first part's file metadata. ``.jsonl``: the
    ``part-*/rows.jsonl`` files, byte for byte, and the first part's ``_meta.json`` beside ``out``.
    ``meta``: the file metadata to write instead of the first part's (a command that merges what
    its chunks measured, e.g. ``mpo-viz truth``'s counts and seconds).
    """
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = sorted(parts.glob("part-*.parquet"))
        schemas = [pq.read_schema(f) for f in files]
        unified = pa.unify_schemas([s.remove_metadata() for s in schemas], promote_options="permissive")
        unified = unified.with_metadata(
            schemas[0].metadata
            if meta is None
            else {k.encode(): json.dumps(v, default=str).encode() for k, v in meta.items()}
        )
        with pq.ParquetWriter(tmp, unified, compression="zstd") as w:
            for f in files:
                pf = pq.ParquetFile(f)
                for g in range(pf.num_row_groups):
                    t = pf.read_row_group(g)
                    cols = [
                        t.column(fld.name).cast(fld.type)
                        if fld.name in t.column_names
                        else pa.nulls(t.num_rows, fld.type)
                        for fld in unified
                    ]
                    w.write_table(pa.Table.from_arrays(cols, schema=unified))
        os.replace(tmp, out)
    else:
        dirs = sorted(parts.glob("part-*"))
        with open(tmp, "wb") as fh:
            for d in dirs:
                with open(d / f"rows{out.suffix}", "rb") as src:
                    shutil.copyfileobj(src, fh)
        os.replace(tmp, out)
        if meta is None:
            shutil.copyfile(dirs[0] / JSONL_META_NAME, out.parent / JSONL_META_NAME)
        else:
            text = json.dumps(json.loads(json.dumps(meta, default=str)), indent=1, sort_keys=True)
            meta_tmp = out.parent / (JSONL_META_NAME + ".tmp")
            meta_tmp.write_text(text)
            os.replace(meta_tmp, out.parent / JSONL_META_NAME)
