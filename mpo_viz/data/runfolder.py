"""The run folder a trainer writes and the TrainingDashboard reads.

::

    RUN/
      config.json                      the Config (JSON)
      metrics.jsonl                    one JSON object per line: one per iteration (phase "rl"),
                                       plus one for SFT and one for the critic warm-up (iteration 0)
      trajectories/iter=NNNNNN.parquet trajectory/v1 with critic values, log-probs, advantages, returns
      checkpoints/iter=NNNNNN/         see mpo_viz.train.checkpoint; checkpoints/latest names the newest
      start/                           the SFT start as a model folder (policy/, and critic/ after the
                                       critic warm-up): ``--model-dir RUN/start`` starts another run
                                       from it; kept whatever ``keep_checkpoints`` says
      train.log                        the log of a launched run (mpo_viz.train.launch)

Every file is written under a temporary name and renamed, except ``metrics.jsonl``, which is
appended one complete line at a time (readers tolerate a partial last line; on resume the lines
after the checkpoint's iteration, and a partial last line, are cut). :func:`read_metrics` is the one
reader of ``metrics.jsonl`` (whole or on from a byte offset).

Invariant: a reader never sees half a file or half a metrics line as data: a complete line is a
record, a partial last line is at most ``pending``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import NamedTuple

from mpo_viz.data.io import save
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = ["RunFolder", "MetricsRead", "read_metrics", "clean_json", "iteration_of"]


def clean_json(x):
    """JSON-safe: NaN/inf become null, numpy scalars plain numbers, nested dicts kept."""
    if isinstance(x, dict):
        return {str(k): clean_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean_json(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        try:
            x = x.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


class MetricsRead(NamedTuple):
    """What :func:`read_metrics` read: ``records`` (the complete lines, as dicts), ``offset`` (the
    byte after the last complete line: where the next read starts) and ``pending`` (the partial last
    line when it already parses as a JSON object, else None)."""

    records: list[dict]
    offset: int
    pending: dict | None


def read_metrics(path, offset: int = 0) -> MetricsRead:
    """Read a ``metrics.jsonl`` from byte ``offset`` (0: the whole file) — the one reader of the
    run folder's metrics (trainer, dashboards, doctor, experiments).

    Only complete lines (ending in a newline) are records: a writer appends one whole line at a
    time, so a partial last line is a line being written — it is not a record, and it is
    ``pending`` when it already parses (a reader that polls sees it before its newline). A missing
    file reads as nothing yet (``MetricsRead([], offset, None)``). A complete line that is not a
    JSON object raises ``ValueError`` naming the file and the line."""
    p = Path(path)
    if not p.is_file():
        return MetricsRead([], offset, None)
    with open(p, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    records = []
    for i, line in enumerate(data[:end].split(b"\n")[:-1] if end else []):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{p}: line {_line_number(p, offset) + i}: expected one JSON object per line, found "
                f"{line[:80]!r} ({exc})"
            ) from None
        if not isinstance(obj, dict):
            raise ValueError(
                f"{p}: line {_line_number(p, offset) + i}: expected a JSON object, found {type(obj).__name__}"
            )
        records.append(obj)
    pending = None
    tail = data[end:]
    if tail.strip():
        try:
            obj = json.loads(tail)
            pending = obj if isinstance(obj, dict) else None
        except json.JSONDecodeError:
            pending = None
    return MetricsRead(records, offset + end, pending)


def _line_number(p: Path, offset: int) -> int:
    """The line number (from 1) of the line that starts at byte ``offset``."""
    with open(p, "rb") as fh:
        return fh.read(offset).count(b"\n") + 1


class RunFolder:
    """Paths and writers of one run folder."""

    def __init__(self, path):
        self.path = Path(path)
        #: called with each metrics line after it is written (an experiment tracker's ``log``)
        self.mirror = None
        self.config_path = self.path / "config.json"
        self.metrics_path = self.path / "metrics.jsonl"
        self.trajectories = self.path / "trajectories"
        self.checkpoints = self.path / "checkpoints"
        self.start = self.path / "start"
        self.log_path = self.path / "train.log"

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ metrics
    def append_metrics(self, record: dict) -> None:
        """Append one metrics object as one line (written with a single ``write`` call), then hand
        it to :attr:`mirror` when one is set."""
        clean = clean_json(record)
        line = json.dumps(clean, allow_nan=False) + "\n"
        with open(self.metrics_path, "a") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        if self.mirror is not None:
            self.mirror(clean)

    def metrics(self) -> list[dict]:
        """The records of ``metrics.jsonl`` (:func:`read_metrics`)."""
        return read_metrics(self.metrics_path).records

    def truncate_metrics(self, iteration: int) -> int:
        """Keep the lines whose ``iteration`` <= ``iteration`` (and drop a partial last line);
        returns the number of lines removed."""
        if not self.metrics_path.is_file():
            return 0
        data = self.metrics_path.read_bytes()
        keep, removed = [], 0
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                removed += 1
                continue
            if int(obj.get("iteration", 0)) <= iteration:
                keep.append(line)
            else:
                removed += 1
        if removed:
            tmp = self.metrics_path.with_name(".metrics.jsonl.tmp")
            tmp.write_bytes(b"".join(x + b"\n" for x in keep))
            os.replace(tmp, self.metrics_path)
        return removed

    # ------------------------------------------------------------------ trajectories
    def trajectory_path(self, iteration: int) -> Path:
        return self.trajectories / f"iter={iteration:06d}.parquet"

    def write_trajectories(self, batch: TrajectoryBatch, iteration: int, *, max_mb: float) -> Path:
        """Save ``batch`` as ``trajectories/iter=NNNNNN.parquet`` (atomic), then remove the oldest
        files while the folder holds more than ``max_mb`` megabytes (the newest always stays)."""
        p = save(batch, self.trajectory_path(iteration))
        files = sorted(self.trajectories.glob("iter=*.parquet"))
        total = sum(f.stat().st_size for f in files)
        while len(files) > 1 and total > max_mb * 2**20:
            f = files.pop(0)
            total -= f.stat().st_size
            f.unlink()
        return p

    def trajectory_files(self) -> dict[int, Path]:
        """``{iteration: path}`` of ``trajectories/iter=NNNNNN.parquet`` (or ``.jsonl``, as the verl
        run log writes them), oldest first; names that are not ``iter=<integer>`` are left out."""
        if not self.trajectories.is_dir():
            return {}
        out = {}
        for f in self.trajectories.iterdir():
            it = iteration_of(f)
            if it is not None and f.suffix in (".parquet", ".jsonl"):
                out[it] = f
        return dict(sorted(out.items()))

    def remove_trajectories_after(self, iteration: int) -> None:
        """Remove trajectory files of iterations past ``iteration`` (written by an unfinished run)."""
        if not self.trajectories.is_dir():
            return
        for f in self.trajectories.glob("iter=*.parquet"):
            it = iteration_of(f)
            if it is not None and it > iteration:
                f.unlink()


def iteration_of(path) -> int | None:
    """The iteration of an ``iter=NNNNNN.*`` file or folder name (None for another name)."""
    head, eq, num = Path(path).name.partition(".")[0].partition("=")
    if head != "iter" or not eq or not num.isdigit():
        return None
    return int(num)
