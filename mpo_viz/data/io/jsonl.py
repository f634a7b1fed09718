"""JSONL reading and writing: one trajectory/v1 object a line, metadata in ``_meta.json`` beside."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from mpo_viz.data.schema import JSONL_META_NAME, Problem
from mpo_viz.data.trajectory import TrajectoryBatch, row_to_json
from mpo_viz.data.validate import Columns, columns_from_rows

ROWS_PER_CHUNK = 256


def read_meta(path: Path) -> dict:
    """The ``_meta.json`` in the folder of ``path`` (a JSONL file), or {} when there is none."""
    meta_path = path.parent / JSONL_META_NAME
    if not meta_path.exists():
        return {}
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"{meta_path}: expected a JSON object of file metadata, found unreadable JSON ({exc})"
        ) from None
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path}: expected a JSON object of file metadata, found {type(meta).__name__}")
    return meta


def iter_chunks(path: Path, rows_per_chunk: int = ROWS_PER_CHUNK) -> Iterator[tuple[Columns, list[Problem]]]:
    """Yield (columns, problems) for successive chunks of lines; unreadable lines become problems."""
    rows, lines, problems = [], [], []
    with open(path, encoding="utf-8") as fh:
        for lineno, text in enumerate(fh, start=1):
            if not text.strip():
                continue  # blank lines (e.g. a trailing newline) carry no row
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                problems.append(
                    Problem(
                        field="<line>",
                        expected="one JSON object",
                        found=f"unreadable JSON ({exc.msg} at column {exc.colno})",
                        file=str(path),
                        line=lineno,
                    )
                )
                continue
            rows.append(obj)
            lines.append(lineno)
            if len(rows) >= rows_per_chunk:
                cols, probs = columns_from_rows(rows, source=str(path), lines=lines)
                yield cols, problems + probs
                rows, lines, problems = [], [], []
    if rows or problems:
        cols, probs = columns_from_rows(rows, source=str(path), lines=lines)
        yield cols, problems + probs


def write(batch: TrajectoryBatch, path: Path) -> None:
    """Write rows as JSONL (temporary name, then rename) and the metadata as ``_meta.json`` beside.

    The JSONL files of a folder share its ``_meta.json``. If other JSONL files are already there
    with different metadata, writing would silently change what they load with, so this refuses
    (ValueError) and asks for a folder of its own (or Parquet, which keeps metadata in the file).
    """
    meta_path = path.parent / JSONL_META_NAME
    new_meta = json.loads(json.dumps(batch.meta, default=str))
    others = sorted(f.name for f in path.parent.glob("*.jsonl") if f.name != path.name)
    if others and meta_path.exists() and read_meta(path) != new_meta:
        raise ValueError(
            f"{path}: the JSONL files of a folder share {meta_path.name}, and {others[0]}"
            f"{f' (and {len(others) - 1} more)' if len(others) > 1 else ''} already use it with different "
            f"metadata; writing here would change how they load. Save into a folder of its own, or as .parquet "
            f"(metadata inside the file)."
        )
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in batch.rows():
            fh.write(row_to_json(row))
            fh.write("\n")
    os.replace(tmp, path)
    meta_tmp = path.parent / (JSONL_META_NAME + ".tmp")
    meta_tmp.write_text(json.dumps(new_meta, indent=1, sort_keys=True))
    os.replace(meta_tmp, meta_path)
