"""Annotating a trajectory file with advantages: every row of the input with extra per-token
columns ``adv_<name>`` / ``ret_<name>`` for each estimator (``mpo-viz advantages`` is this plus flags).

The input streams through :func:`mpo_viz.data.io.scan` (bounded memory: one chunk of ``max_tokens``
response tokens at a time, the rows of a group kept together for group estimators); chunks are
written as parts and merged row group by row group (:func:`mpo_viz.data.io.merge_parts`), so the output
holds the union of the columns whatever chunk they first appear in; an output folder receives the
parts themselves (one Parquet file per chunk, which ``mv.load``/``mv.scan`` read as one set).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from mpo_viz.advantages import registry as adv
from mpo_viz.checks import OptionError
from mpo_viz.data.io import count_rows, merge_parts, save, scan
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = ["AnnotateConfig", "annotate_file"]


@dataclass
class AnnotateConfig:
    """What :func:`annotate_file` takes besides the paths (one flat config)."""

    estimators: tuple[str, ...] = adv.DEFAULT_ESTIMATORS
    """estimator names (see ``mpo_viz.advantages.available_estimators()``)."""
    options: dict = field(default_factory=dict)
    """options shared by the estimators (gamma, lam, turn_gamma, turn_lam, beta, within, ...;
    declared in :mod:`mpo_viz.advantages.registry`); each estimator receives those it accepts, one
    that none of them takes is an error."""
    max_tokens: int = 1_000_000
    """response tokens per chunk (memory bound)."""
    progress: bool | None = None
    """tqdm progress bar on stderr (None: only on a terminal)."""


def _parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".parts.tmp")


def annotate_file(path, out, config: AnnotateConfig | None = None) -> dict:
    """Add ``adv_<name>`` / ``ret_<name>`` columns for each estimator to every row of ``path``.
    **Streams**: ``config.max_tokens`` response tokens at a time (whole groups), memory flat in the input's size.

    ``out``: a ``.parquet`` or ``.jsonl`` file, or a folder (one Parquet file per chunk). The input
    is read with ``errors="raise"``: the first invalid row stops the run with the loader's message
    and no output is left behind. Returns statistics: ``out``, ``trajectories``, ``tokens``
    (response tokens), ``chunks``, ``seconds``, ``tokens_per_s`` and per-phase ``timings``.
    """
    cfg = config or AnnotateConfig()
    out = Path(out)
    folder = out.suffix == "" or out.is_dir()
    _check_output(path, out, folder)
    names = adv.parse_names(cfg.estimators)  # unknown names fail before any work, listing the available ones
    need_groups = any(adv.is_group_estimator(n) for n in names)
    opts = adv.split_options(names, cfg.options)  # an option none of them takes fails here too
    t0 = time.perf_counter()
    timings = {"read": 0.0, "estimate": 0.0, "write": 0.0}
    # a folder output receives one Parquet file per chunk directly (no merge pass); a file output
    # is assembled from parts in a temporary folder beside it
    parts = out if folder else _parts_dir(out)
    if not folder and parts.exists():
        shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    n_traj = n_tok = n_chunks = 0
    ok = False
    bar = tqdm(
        total=count_rows(path),
        unit="traj",
        desc="advantages",
        leave=False,
        dynamic_ncols=True,
        disable=None if cfg.progress is None else not cfg.progress,
    )
    try:
        it = scan(path, max_tokens=cfg.max_tokens, keep_groups=need_groups)
        while True:
            ta = time.perf_counter()
            chunk = next(it, None)
            timings["read"] += time.perf_counter() - ta
            if chunk is None:
                break
            _annotate_chunk(
                chunk,
                opts,
                timings,
                parts / f"part-{n_chunks:06d}.parquet"
                if folder or out.suffix == ".parquet"
                else parts / f"part-{n_chunks:06d}" / f"rows{out.suffix}",
            )
            n_chunks += 1
            n_traj += len(chunk)
            n_tok += int(chunk.lengths.sum())
            bar.update(len(chunk))
            del chunk
        tm = time.perf_counter()
        if n_chunks == 0:
            raise ValueError(f"{path}: no trajectories to annotate")
        if not folder:
            merge_parts(parts, out)
        timings["write"] += time.perf_counter() - tm
        ok = True
    finally:
        bar.close()
        if not folder:
            shutil.rmtree(parts, ignore_errors=True)
        elif not ok:
            for f in parts.glob("part-*.parquet"):  # no half-written folder left behind
                f.unlink()
    secs = time.perf_counter() - t0
    return {
        "out": str(out),
        "trajectories": n_traj,
        "tokens": n_tok,
        "chunks": n_chunks,
        "seconds": secs,
        "tokens_per_s": n_tok / secs if secs > 0 else float("nan"),
        "timings": timings,
    }


def _check_output(path, out: Path, folder: bool) -> None:
    """``out`` must be a .parquet/.jsonl file or a new (or empty) folder, outside the input."""
    if not folder and out.suffix not in (".parquet", ".jsonl"):
        raise OptionError("out", f"expected a .parquet or .jsonl path or a folder, found {str(out)!r}")
    if folder and out.exists() and any(out.glob("part-*.parquet")):
        raise OptionError(
            "out", f"folder {str(out)!r} already holds part-*.parquet files; expected a new or empty folder"
        )
    src, dst = Path(path).resolve(), out.resolve()
    if dst == src or src in dst.parents or (folder and dst in src.parents):
        raise OptionError(
            "out",
            f"expected an output outside the input, found {str(out)!r} for input {str(path)!r} "
            f"(the input would be overwritten, or read back with the output as one set)",
        )


def _annotate_chunk(chunk: TrajectoryBatch, opts: dict, timings: dict, part: Path) -> None:
    """Every estimator on one chunk, written with its ``adv_<name>`` / ``ret_<name>`` columns to ``part``."""
    tb = time.perf_counter()
    cols = {}
    for n, o in opts.items():
        r = adv.compute(chunk, n, **o)
        cols[f"adv_{n}"] = r.advantages
        cols[f"ret_{n}"] = r.returns
    annotated = chunk.with_token_fields(**cols)
    annotated.meta = {**chunk.meta, "advantage_estimators": {n: _jsonable(r_opts) for n, r_opts in opts.items()}}
    tc = time.perf_counter()
    timings["estimate"] += tc - tb
    save(annotated, part)
    timings["write"] += time.perf_counter() - tc


def _jsonable(d: dict) -> dict:
    return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in d.items()}
