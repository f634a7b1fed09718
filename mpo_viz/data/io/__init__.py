"""Load, save and scan trajectory/v1 data: ``.jsonl``, ``.parquet``, or a folder of them.

* :func:`load` validates every row (:mod:`mpo_viz.data.validate`; rules in trajectories/README.md). ``errors="raise"``
raises
  :class:`~mpo_viz.data.schema.TrajectoryError` naming file, line/row, traj_id, field, expected and
  found; ``errors="collect"`` returns the good rows with ``batch.rejected`` listing every rejected
  row and why. No row is ever dropped silently.
* :func:`scan` yields batches of at most ``max_tokens`` response tokens (a single longer trajectory
  comes alone), so files larger than memory stream in bounded memory; ``keep_groups=True`` re-cuts
  them so that no group is split between two batches (group estimators need whole groups).
* :func:`summarize` gives ``mpo-viz info``'s counts and statistics chunk by chunk (the numbers of
  ``load(path).summary()``, without holding the file); :func:`count_rows` counts a Parquet file's
  rows and :func:`file_facts` reads its sizes from the metadata alone (nothing decoded);
  :func:`merge_parts` assembles one file from parts written chunk by chunk.
* What holds the whole input in memory: :func:`load` (and ``TrajectoryBatch`` methods on what it
  returns). What streams, in memory set by the chunk size: :func:`scan`, :func:`pieces`,
  :func:`summarize`, :func:`count_rows`, :func:`file_facts`.
* Files are never unpickled: only JSONL and Parquet are read.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from mpo_viz.data.io import jsonl, parquet
from mpo_viz.data.io.groups import group_chunks
from mpo_viz.data.io.parts import check_destination, merge_parts
from mpo_viz.data.schema import SCHEMA_VERSION, Problem, TrajectoryError
from mpo_viz.data.summary import Summarizer
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.options import Option

__all__ = [
    "load",
    "save",
    "scan",
    "files_of",
    "count_rows",
    "file_facts",
    "summarize",
    "group_chunks",
    "merge_parts",
    "check_destination",
    "pieces",
    "release_memory",
    "drop_mapped_pages",
    "file_mappings",
]

_READERS = {".jsonl": jsonl, ".parquet": parquet}
#: rows per validated piece when streaming (what :func:`scan`, :func:`summarize` and ``mpo-viz validate`` read at a
# time)
PIECE_ROWS = 64
MAX_TOKENS = Option("max_tokens", kind="int", low=1, doc="response tokens per chunk")


def files_of(path) -> list[Path]:
    """The data files behind ``path``: the file itself, or a folder's ``*.jsonl``/``*.parquet`` sorted by name."""
    if not isinstance(path, (str, Path)) and not hasattr(path, "__fspath__"):
        hint = (
            " (rows in memory: mpo_viz.TrajectoryBatch.from_rows([...]) takes a list of row dicts)"
            if isinstance(path, (dict, list, tuple))
            else ""
        )
        raise TypeError(f"path: expected a file or folder path (str or Path), found {type(path).__name__}{hint}")
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in _READERS and f.is_file())
        if not files:
            raise FileNotFoundError(f"{p}: expected .jsonl or .parquet files in this folder, found none")
        return files
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or folder")
    if p.suffix not in _READERS:
        raise ValueError(f"{p}: expected a .jsonl or .parquet file (or a folder of them), found suffix {p.suffix!r}")
    return [p]


def _meta_of(f: Path) -> dict:
    meta = _READERS[f.suffix].read_meta(f)
    schema = meta.get("schema", SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        raise TrajectoryError(
            Problem(field="schema", expected=f"{SCHEMA_VERSION!r} (file metadata)", found=repr(schema), file=str(f))
        )
    meta["schema"] = SCHEMA_VERSION
    return meta


def pieces(path, errors: str = "raise", rows_per_chunk: int | None = None) -> Iterator:
    """**Streams**: validated batches of successive chunks of every file, as the readers deliver them
    (``rows_per_chunk`` rows at most, each from one file and with that file's metadata; duplicate ids
    checked across all); :func:`load` and :func:`scan` are built on it."""
    if errors not in ("raise", "collect"):
        raise ValueError(f"errors: expected 'raise' or 'collect', found {errors!r}")
    seen: dict = {}  # traj_id -> where it first occurred (named in duplicate messages)
    for f in files_of(path):
        meta = _meta_of(f)
        reader = _READERS[f.suffix]
        kw = {"rows_per_chunk": rows_per_chunk} if rows_per_chunk else {}
        for cols, problems in reader.iter_chunks(f, **kw):
            yield TrajectoryBatch.from_columns(cols, meta, problems=problems, errors=errors, seen_ids=seen)


def load(path, *, errors: str = "raise"):
    """Load a ``.jsonl`` / ``.parquet`` file or a folder of them into one validated TrajectoryBatch.

    No format read here can execute code (nothing is unpickled). **Loads everything**: the whole input
    is held in memory (about 300 bytes a response token with values and three log-prob fields);
    :func:`scan` streams it in bounded chunks, :func:`summarize` gives its summary without holding it.
    """
    parts = list(pieces(path, errors, rows_per_chunk=4096))
    if not parts:
        return TrajectoryBatch.from_rows([], _meta_of(files_of(path)[0]))
    return TrajectoryBatch.concat(parts)


def scan(path, *, max_tokens: int = 1_000_000, errors: str = "raise", keep_groups: bool = False) -> Iterator:
    """**Streams**: TrajectoryBatches of at most ``max_tokens`` response tokens each, in file order.

    Memory stays bounded by the chunk size (plus one set of traj_ids for the duplicate check),
    whatever the file size. With ``errors="collect"`` each yielded batch carries the problems of
    the rows read since the previous one in ``batch.rejected``.

    ``keep_groups=True``: no group is split between two batches — the rows of the group still open
    at a chunk's end go into the next batch (so a batch can exceed ``max_tokens`` by one group), and
    a group id that reappears after its group was closed raises ``ValueError`` (sort the file by
    ``group_id``); see :func:`group_chunks`.
    """
    chunks = _scan(path, MAX_TOKENS.check(max_tokens), errors)
    return group_chunks(chunks) if keep_groups else chunks


def _scan(path, max_tokens: int, errors: str) -> Iterator:
    pending, acc, rejected = [], 0, []
    for piece in pieces(path, errors, rows_per_chunk=PIECE_ROWS):
        rejected.extend(piece.rejected)
        lengths = np.diff(piece.offsets)
        start = 0
        for i, n in enumerate(lengths):
            if acc and acc + int(n) > max_tokens:
                if i > start:
                    pending.append(piece[start:i])
                out = TrajectoryBatch.concat(pending)
                out.rejected, rejected = rejected, []
                yield out
                pending, acc, start = [], 0, i
            acc += int(n)
        if start < len(lengths):
            pending.append(piece[start:])
    if pending or rejected:
        out = TrajectoryBatch.concat(pending) if pending else TrajectoryBatch.from_rows([], None)
        out.rejected = rejected
        yield out


def release_memory() -> None:
    """Give the memory a finished pass over a file freed back to the system. The Arrow pool the
    readers allocate from and the C heap both keep their high-water mark after the chunks are
    freed; call this between passes (``fit-critic`` does, after its survey of the file and after
    gathering its sample: 0.2–0.25 GB of a 5.7M-token file's first pass). Harmless anywhere; the
    heap is trimmed where the C library is glibc."""
    pa.default_memory_pool().release_unused()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # the process's own symbols: no library search
    if trim is not None:
        trim(0)


#: madvise's advice to drop a range's pages from the process (Linux)
_MADV_DONTNEED = 4


def file_mappings(path) -> list[tuple[int, int]]:
    """The address ranges ``[lo, hi)`` at which this process maps the file ``path`` (from
    ``/proc/self/maps``; empty where there is none, or no such file: not Linux)."""
    want = str(Path(path).resolve())
    out = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].strip() == want:
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    out.append((lo, hi))
    except OSError:
        return []
    return out


def drop_mapped_pages(a: np.ndarray, mappings: list[tuple[int, int]]) -> int:
    """Give back the resident pages of ``a``, a read-only C-contiguous view into a mapping of a file
    at one of ``mappings`` (:func:`file_mappings`; e.g. a tensor of ``torch.load(..., mmap=True)``,
    a private copy-on-write mapping): the pages whole inside ``a`` leave the process's resident
    memory and are read again from the file if ``a`` is used again. A file read through such a
    mapping otherwise stays resident as it is read, so memory grows with the file.

    Only for a mapping nothing has written to: a page written since (copy on write) would read back
    as the file's bytes, and a page of other memory as zeros. So ``a`` must be marked read-only
    (``a.setflags(write=False)``, the promise that no one writes through it) and lie inside one of
    ``mappings``; anything else is left alone. Returns the bytes given back (0 where ``madvise`` is
    missing, for a writable, non-contiguous or empty view)."""
    if a.size == 0 or not a.flags.c_contiguous or a.flags.writeable:
        return 0
    start, end = a.ctypes.data, a.ctypes.data + a.nbytes
    if not any(lo <= start and end <= hi for lo, hi in mappings):
        return 0
    madvise = getattr(ctypes.CDLL(None), "madvise", None)
    if madvise is None:
        return 0
    page = mmap.PAGESIZE
    lo, hi = -(-start // page) * page, end // page * page  # the pages whole inside [start, end)
    if hi <= lo:
        return 0
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return hi - lo if madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) == 0 else 0


def count_rows(path) -> int | None:
    """Number of trajectories in a Parquet file or folder from metadata only, without reading the
    rows; None for JSONL (counting would mean reading it) or an unreadable file."""
    import pyarrow.parquet as pq

    try:
        files = files_of(path)
        if all(f.suffix == ".parquet" for f in files):
            return sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    except (OSError, ValueError):  # a count is only for a progress bar; load() reports the problem
        return None
    return None


def file_facts(path) -> dict:
    """What the files behind ``path`` say about themselves without being decoded: ``files`` (count),
    ``bytes`` (on disk), ``format`` ("parquet", "jsonl" or "mixed"), and for Parquet files ``rows``,
    ``row_groups`` and ``columns`` (name -> compressed bytes, largest first), from the metadata alone."""
    import pyarrow.parquet as pq

    files = files_of(path)
    kinds = {f.suffix for f in files}
    out: dict = {
        "files": len(files),
        "bytes": sum(f.stat().st_size for f in files),
        "format": "mixed" if len(kinds) > 1 else kinds.pop().lstrip("."),
    }
    pq_files = [f for f in files if f.suffix == ".parquet"]
    if pq_files:
        rows = groups = 0
        cols: dict = {}
        for f in pq_files:
            md = pq.ParquetFile(f).metadata
            rows += md.num_rows
            groups += md.num_row_groups
            for g in range(md.num_row_groups):
                rg = md.row_group(g)
                for c in range(rg.num_columns):
                    cc = rg.column(c)
                    name = cc.path_in_schema.split(".", 1)[0]
                    cols[name] = cols.get(name, 0) + cc.total_compressed_size
        out.update(rows=rows, row_groups=groups, columns=dict(sorted(cols.items(), key=lambda kv: -kv[1])))
    return out


def summarize(path) -> dict:
    """``mpo-viz info``'s summary of a file or folder (:meth:`TrajectoryBatch.summary`, plus
    ``rejected_rows``: the number of problems the loader found), read :data:`PIECE_ROWS` rows at a time.

    **Streams**: memory is one piece plus a few numbers per trajectory, whatever the input's size.
    The numbers are those of ``load(path, errors="collect").summary()`` to the last bit
    (:mod:`mpo_viz.data.summary` says why); rows that fail validation are counted, never dropped silently.
    """
    s = Summarizer(_meta_of(files_of(path)[0]))
    for piece in pieces(path, "collect", rows_per_chunk=PIECE_ROWS):
        s.add(piece)
    return s.result()


def save(batch: TrajectoryBatch, path) -> Path:
    """Write ``batch`` to ``path`` (``.jsonl`` with ``_meta.json`` beside it, or ``.parquet``).

    Writes go to a temporary name and are renamed into place, so readers never see half a file.
    Returns the path written.
    """
    p = Path(path)
    if p.suffix not in _READERS:
        raise ValueError(f"{p}: expected a .jsonl or .parquet path, found suffix {p.suffix!r}")
    p.parent.mkdir(parents=True, exist_ok=True)
    _READERS[p.suffix].write(batch, p)
    return p
