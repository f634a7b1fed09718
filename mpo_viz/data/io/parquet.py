"""Parquet reading and writing through pyarrow record batches: no per-token Python objects.

List columns map to flat numpy arrays plus offsets (zero-copy where Arrow allows). The writer emits
row groups of bounded size so that :func:`mpo_viz.scan` reads a file of any size in flat memory.
File metadata is stored as Parquet key-value metadata, each value JSON-encoded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mpo_viz.data.schema import (
    BINARY_FIELDS,
    EXTRA_TOKEN_DTYPE,
    PROMPT_FIELD,
    REQUIRED,
    SCALAR_FIELDS,
    TOKEN_FIELDS,
    TURN_FIELDS,
    Problem,
    TrajectoryError,
)
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.data.validate import Columns

ROW_GROUP_TOKENS = 131_072  # response tokens per row group (bounds scan memory)
READ_ROWS = 64  # rows per Arrow record batch when reading

_SCALAR_TYPES = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def read_meta(path: Path) -> dict:
    md = pq.read_schema(path).metadata or {}
    meta = {}
    for k, v in md.items():
        key = k.decode("utf-8", "replace")
        if key in ("pandas", "ARROW:schema"):
            continue
        text = v.decode("utf-8", "replace")
        try:
            meta[key] = json.loads(text)
        except json.JSONDecodeError:
            meta[key] = text
    return meta


def _list_parts(arr: pa.Array):
    """(flat numpy values, int64 offsets from 0, present bool) of a (large_)list array chunk."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    off = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.slice(int(off[0]), int(off[-1] - off[0]))
    off = off - off[0]
    present = ~arr.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        flat = np.asarray(values.to_numpy(zero_copy_only=False), dtype=object)
    else:
        flat = values.to_numpy(zero_copy_only=False)
        if values.null_count and flat.dtype.kind in "iu":
            flat = flat.astype(np.float64)
    return flat, off, present


#: column names that give away another framework's dump: (framework, --from name, columns)
_FOREIGN = [
    (
        "verl",
        "verl",
        {
            "prompts",
            "responses",
            "attention_mask",
            "response_mask",
            "token_level_scores",
            "token_level_rewards",
            "input_ids",
            "old_log_probs",
            "ref_log_prob",
        },
    ),
    ("SkyRL", "skyrl", {"prompt_token_ids", "response_ids", "loss_masks", "rewards", "trajectory_ids"}),
    ("TRL", "trl", {"prompt", "completion", "chosen", "rejected", "completion_ids", "prompt_ids", "advantages"}),
    ("OpenAI-style chat log", "openai", {"messages", "conversations", "tools"}),
]


def foreign_hint(names, missing) -> str:
    """'missing …; the columns (…) look like a <framework> dump: convert it …' for a non-v1 table."""
    cols = ", ".join(list(names)[:10]) + (", …" if len(names) > 10 else "")
    best = max(_FOREIGN, key=lambda f: len(f[2] & set(names)))
    found = f"none of {', '.join(missing)}; its columns are {cols or 'none'}"
    if len(best[2] & set(names)) >= 2:
        return (
            f"{found}: this looks like a {best[0]} dump, not mpo_viz.trajectory/v1; convert it with "
            f"`mpo-viz convert --from {best[1]} FILE -o trajectories.parquet`"
        )
    return (
        f"{found}: not an mpo_viz.trajectory/v1 file; convert it with `mpo-viz convert` (its --help lists the formats)"
    )


def columns_from_record_batch(rb: pa.RecordBatch, *, source: str, first_row: int) -> tuple[Columns, list[Problem]]:
    """An Arrow record batch -> :class:`~mpo_viz.data.validate.Columns` and the problems of its columns
    (missing or mistyped columns reject every row; a null in a required list its row)."""
    n = rb.num_rows
    cols = Columns(n=n, file=source, row=np.arange(first_row, first_row + n, dtype=np.int64))
    problems: list[Problem] = []
    bad = np.zeros(n, dtype=bool)
    names = rb.schema.names
    cols.scalar = {
        name: np.array(rb.column(name).to_pylist() + [None], dtype=object)[:-1]
        for name in names
        if name in SCALAR_FIELDS
    }

    def reject_all(fld: str, expected: str, found: str) -> None:  # a column-level problem: every row
        problems.extend(
            Problem(
                field=fld, expected=expected, found=found, file=source, row=first_row + i, traj_id=_tid(cols.scalar, i)
            )
            for i in range(n)
        )
        bad[:] = True

    _check_required(rb, names, source, reject_all)
    if "reward" in cols.scalar and not bad.any():
        cols.scalar["reward"] = np.array(
            [None if x is None else float(x) for x in cols.scalar["reward"]] + [None], dtype=object
        )[:-1]
    rlen = np.diff(_list_parts(rb.column("response_ids"))[1]) if "response_ids" in names else None
    for name in names:
        if name not in SCALAR_FIELDS:
            _read_column(cols, name, rb.column(name), rlen, reject_all)
    for k in ("response_ids", "loss_mask"):
        if k not in cols.token:
            cols.token[k] = (np.zeros(0, dtype=np.int64), np.zeros(n + 1, dtype=np.int64), np.zeros(n, dtype=bool))
    if cols.prompt is None:
        cols.prompt = (np.zeros(0, dtype=np.int64), np.zeros(n + 1, dtype=np.int64))
    for k in ("response_ids", "loss_mask", "prompt_ids"):
        arr = rb.column(k) if k in names else None
        if arr is not None and arr.null_count:
            for i in np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False)):
                problems.append(
                    Problem(
                        field=k,
                        expected="the required field",
                        found="null",
                        file=source,
                        row=first_row + int(i),
                        traj_id=_tid(cols.scalar, int(i)),
                    )
                )
                bad[i] = True
    cols.bad = bad
    return cols, problems


def _check_required(rb: pa.RecordBatch, names: list, source: str, reject_all) -> None:
    """The required columns, and a numeric ``reward``; a file that is not trajectory/v1 at all
    (three or more required columns missing) is one file-level problem that says what it looks like."""
    missing = [req for req in REQUIRED if req not in names]
    if len(missing) >= 3:
        # e.g. a verl or TRL dump: say so once, instead of the same missing columns once per row
        raise TrajectoryError(
            Problem(
                field="columns",
                expected=f"the trajectory/v1 columns ({', '.join(REQUIRED)})",
                found=foreign_hint(names, missing),
                file=source,
            )
        )
    for req in missing:
        reject_all(req, "the required field", "no such column")
    if "reward" in names:
        t = rb.schema.field("reward").type
        if not (pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_null(t)):
            reject_all("reward", "a float column", str(t))


def _read_column(cols: Columns, name: str, col, rlen, reject_all) -> None:
    """A list column of v1 into the token, turn or prompt columns (a mistyped one rejects every
    row); another numeric list column of the response's length is an extra token field; anything
    else stays an opaque extra."""
    is_list = pa.types.is_list(col.type) or pa.types.is_large_list(col.type)
    if name in TOKEN_FIELDS or name in TURN_FIELDS or name == PROMPT_FIELD:
        if not is_list:
            reject_all(name, "a list column", str(col.type))
            return
        elem = _element_problem(name, col.type.value_type)
        if elem is not None:
            reject_all(name, elem, str(col.type))
            return
        flat, off, present = _list_parts(col)
        if name == PROMPT_FIELD:
            cols.prompt = (flat.astype(np.int64), off)
        elif name in TURN_FIELDS:
            cols.turn[name] = (flat.astype(np.float64), off, present)
        else:
            if name not in ("response_ids", "loss_mask", "turn_ids", "response_tokens", *BINARY_FIELDS):
                flat = flat.astype(TOKEN_FIELDS[name])  # the raw ones are checked before they are narrowed
            cols.token[name] = (flat, off, present)
        return
    if (
        is_list
        and rlen is not None
        and (pa.types.is_floating(col.type.value_type) or pa.types.is_integer(col.type.value_type))
    ):
        flat, off, present = _list_parts(col)
        if np.all(~present | (np.diff(off) == rlen)):
            cols.token[name] = (flat.astype(EXTRA_TOKEN_DTYPE), off, present)
            return
    cols.extra[name] = np.array(col.to_pylist() + [None], dtype=object)[:-1]


def _element_problem(name: str, t: pa.DataType) -> str | None:
    """What a v1 list column ``name`` should hold, if its element type ``t`` is wrong; else None.

    Same rule as the JSONL reader: ``response_tokens`` holds strings, every other v1 list field
    numbers (integer, floating or boolean; an all-null/empty list column has type null).
    """
    if pa.types.is_null(t):
        return None
    if name == "response_tokens":
        return None if (pa.types.is_string(t) or pa.types.is_large_string(t)) else "a list<string> column"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return None
    return "a list column of numbers"


def _tid(scal, i):
    t = scal.get("traj_id")
    return None if t is None or t[i] is None else str(t[i])


def iter_chunks(path: Path, rows_per_chunk: int = READ_ROWS) -> Iterator[tuple[Columns, list[Problem]]]:
    # pre_buffer=False: with pre-buffering Arrow reads ahead and its pool grows with the file size;
    # without it, memory stays at about one row group (measured in benchmarks/io.py).
    pf = pq.ParquetFile(path, pre_buffer=False)
    first = 0
    for rb in pf.iter_batches(batch_size=rows_per_chunk):
        yield columns_from_record_batch(rb, source=str(path), first_row=first)
        first += rb.num_rows


def _list_array(flat: np.ndarray, off: np.ndarray, present: np.ndarray | None, value_type) -> pa.Array:
    values = pa.array(flat, type=value_type) if flat.dtype != object else pa.array(flat.tolist(), type=value_type)
    mask = None if present is None or present.all() else pa.array(~present)
    return pa.ListArray.from_arrays(pa.array(off.astype(np.int32)), values, mask=mask)


_VALUE_TYPES = {
    np.dtype(np.int64): pa.int64(),
    np.dtype(np.int8): pa.int8(),
    np.dtype(np.float32): pa.float32(),
    np.dtype(np.float64): pa.float64(),
    np.dtype(object): pa.string(),
}


def _columns_to_write(batch: TrajectoryBatch) -> tuple[set, dict]:
    """Names of the columns the whole batch carries, and the Arrow types of its opaque extras."""
    c = batch.columns
    include = set(REQUIRED) | {PROMPT_FIELD}
    include |= {k for k, v in c.scalars.items() if any(x is not None for x in v)}
    include |= {k for k in c.tokens if k not in c.present or c.present[k].any()}
    include |= {k for k, (_, _, p) in c.turn.items() if p.any()}
    extra_types = {k: pa.array(list(v)).type for k, v in c.extras.items()}
    return include, extra_types


def _record_batch(batch: TrajectoryBatch, include: set, extra_types: dict) -> pa.RecordBatch:
    c = batch.columns
    arrays, names = [], []
    for name, v in c.scalars.items():
        typ = SCALAR_FIELDS[name]
        if name not in include:
            continue
        vals = [None if x is None else (x.item() if isinstance(x, np.generic) else x) for x in v]
        if name == "reward":
            vals = [float(x) for x in v]
        arrays.append(pa.array(vals, type=_SCALAR_TYPES[typ]))
        names.append(name)
    pf, po = c.prompt
    arrays.append(_list_array(pf, po, None, pa.int64()))
    names.append(PROMPT_FIELD)
    for name, flat in c.tokens.items():
        pres = c.present.get(name)
        if name not in include:
            continue
        arrays.append(_list_array(flat, c.offsets, pres, _VALUE_TYPES[flat.dtype]))
        names.append(name)
    for name, (flat, off, pres) in c.turn.items():
        if name not in include:
            continue
        arrays.append(_list_array(flat, off, pres, _VALUE_TYPES[flat.dtype]))
        names.append(name)
    for name, v in c.extras.items():
        arrays.append(pa.array(list(v), type=extra_types[name]))
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def write(batch: TrajectoryBatch, path: Path) -> None:
    """Write ``batch`` to ``path`` (temporary name, then rename), in row groups of bounded size."""
    tmp = path.with_name(path.name + ".tmp")
    meta = {k.encode(): json.dumps(v, default=str).encode() for k, v in batch.meta.items()}
    lengths = np.diff(batch.offsets)
    # Cut rows into chunks of about ROW_GROUP_TOKENS response tokens (at least one row each).
    bounds, start, acc = [], 0, 0
    for i, n in enumerate(lengths):
        if acc and acc + n > ROW_GROUP_TOKENS:
            bounds.append((start, i))
            start, acc = i, 0
        acc += int(n)
    bounds.append((start, len(lengths)))
    include, extra_types = _columns_to_write(batch)
    writer = None
    try:
        for a, b in bounds:
            rb = _record_batch(batch[a:b], include, extra_types)
            if writer is None:
                writer = pq.ParquetWriter(tmp, rb.schema.with_metadata(meta), compression="zstd")
            writer.write_batch(rb, row_group_size=max(b - a, 1))
    finally:
        if writer is not None:
            writer.close()
    os.replace(tmp, path)
