"""What every adapter shares: the row collector, reward moves, layout problems, JSON extras."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Callable, Iterator, Sized

import numpy as np

from mpo_viz.adapters.conversion import ConversionReport, ConversionWarning
from mpo_viz.checks import OptionError
from mpo_viz.data.schema import Problem, TrajectoryError, short
from mpo_viz.data.trajectory import TrajectoryBatch

OBS_REWARD = ("move", "error")


def check_options(*, obs_reward: str = "move", errors: str = "raise") -> None:
    if obs_reward not in OBS_REWARD:
        raise OptionError("obs_reward", f"expected 'move' or 'error', found {obs_reward!r}")
    if errors not in ("raise", "collect"):
        raise OptionError("errors", f"expected 'raise' or 'collect', found {errors!r}")


def file_error(framework: str, source, field: str, expected: str, found: str) -> TrajectoryError:
    """A problem with the whole input (wrong layout): raised even under ``errors='collect'``."""
    return TrajectoryError(
        Problem(
            field=field,
            expected=f"{framework} layout: {expected}",
            found=found,
            file=None if source is None else str(source),
        )
    )


def jsonl_lines(path, col: Collector) -> Iterator[tuple[int, object]]:
    """(line number, parsed object) of each non-blank line of a JSONL file; an unreadable line is a
    problem of that line, a file that is not UTF-8 text (e.g. a binary dump) a problem of the file."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    n = 0
    try:
        with open(path, encoding="utf-8") as fh:
            for n, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    col.report.rows_in += 1
                    col.problem(
                        "<line>",
                        "one JSON object",
                        f"unreadable JSON ({exc.msg} at column {exc.colno})",
                        line=n,
                        layout=False,
                    )
                    continue
                yield n, obj
    except UnicodeDecodeError as exc:
        raise file_error(
            col.framework,
            path,
            "<file>",
            "a UTF-8 JSONL file, one JSON object a line",
            f"bytes that are not UTF-8 text near line {n + 1} ({exc.reason}); a binary file?",
        ) from None


def jsonable(value):
    """``value`` as plain JSON types (numpy scalars and arrays, tuples), or raise TypeError."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if hasattr(value, "tolist") and callable(value.tolist):  # torch tensors
        return jsonable(np.asarray(value.tolist()))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value
    raise TypeError(type(value).__name__)


def dumps(value) -> str:
    """Compact, key-sorted JSON (the same input always gives the same text)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)


def move_obs_rewards(rewards: np.ndarray, mask: np.ndarray, *, obs_reward: str, report: ConversionReport):
    """Move non-zero rewards on observation tokens (``mask == 0``) to the last action token before
    them (v1 never has a reward on an observation token; every move is counted); with no action token before, to the
    first action token after. Returns ``(rewards, None)`` or ``(None, (expected, found))`` — with
    ``obs_reward='error'`` any reward on an observation token is refused; a row without action
    tokens cannot hold a reward at all.
    """
    r = np.asarray(rewards, dtype=np.float64).copy()
    act = np.asarray(mask) != 0
    obs = np.flatnonzero(~act & (r != 0))
    if not len(obs):
        return r, None
    if obs_reward == "error":
        p = int(obs[0])
        return None, ("rewards on action tokens only (obs_reward='error')", f"{r[p]:g} on observation token {p}")
    acts = np.flatnonzero(act)
    if not len(acts):
        return None, ("an action token to carry the reward", f"{r[obs[0]]:g} on a row without action tokens")
    for q in obs:
        k = int(np.searchsorted(acts, q)) - 1
        if k >= 0:
            report.rewards_moved += 1
            r[acts[k]] += r[q]
        else:
            report.rewards_moved_forward += 1
            r[acts[0]] += r[q]
        r[q] = 0.0
    return r, None


class Collector:
    """Collects converted v1 rows and the problems met on the way, and turns them into batches.

    Adapters call :meth:`add` with one v1 row dict and where it came from, or :meth:`problem` when
    an input row cannot be converted. :meth:`flush` validates the pending rows (trajectory/v1 rules)
    and returns a batch; problems name the input file and its line (JSONL) or row. ``errors='raise'``
    raises :class:`TrajectoryError` at the first problem; ``'collect'`` keeps them in
    ``batch.rejected`` and ``report.rejected``. Trajectory ids are checked for duplicates across all
    flushes. A row without any reward (no finite ``reward``, no ``turn_rewards``, no
    ``token_rewards``) or with a non-finite one is counted and named in the report. ``checks`` are
    called with the report before each flush (over everything converted so far); one may raise to
    refuse the whole input (e.g. mostly unknown tokens).
    """

    def __init__(self, framework: str, *, source=None, errors: str = "raise", meta: dict | None = None):
        self.framework = framework
        self.source = None if source is None else str(source)
        self.errors = errors
        self.report = ConversionReport(framework, source=self.source)
        self.meta = {"source_framework": framework, **(meta or {})}
        self._rows: list[dict] = []
        self._tokens = 0  # response tokens of the pending rows
        self._where: list[tuple] = []  # (line, row, file) of each pending row in the input
        self._problems: list[Problem] = []
        self._seen: dict[str, str] = {}
        self.checks: list[Callable[[ConversionReport], None]] = []

    @property
    def pending(self) -> int:
        return len(self._rows)

    @property
    def pending_tokens(self) -> int:
        """Response tokens of the pending rows (a chunk's memory grows with them)."""
        return self._tokens

    @property
    def has_problems(self) -> bool:
        """Whether rows that could not be converted wait to be reported by :meth:`flush`."""
        return bool(self._problems)

    def _loc(self, line, row) -> str:
        return f"line {line}" if line is not None else f"row {row}"

    def problem(
        self, field: str, expected: str, found: str, *, line=None, row=None, traj_id=None, layout: bool = True
    ) -> None:
        """One input row cannot be converted. ``layout`` prefixes the framework's name to ``expected``."""
        p = Problem(
            field=field,
            expected=(f"{self.framework} layout: " if layout else "") + expected,
            found=found,
            traj_id=traj_id,
            file=self.source,
            line=line,
            row=row,
        )
        if self.errors == "raise":
            raise TrajectoryError(p)
        self._problems.append(p)

    def add(self, row: dict, *, line=None, row_index=None) -> None:
        tid = row.get("traj_id")
        if isinstance(tid, str):
            if tid in self._seen:
                self.problem(
                    "traj_id",
                    "a unique traj_id",
                    f"a duplicate of {tid!r} (first at {self._seen[tid]})",
                    line=line,
                    row=row_index,
                    traj_id=tid,
                    layout=False,
                )
                return
            self._seen[tid] = self._loc(line, row_index)
        self._rows.append(row)
        ids = row.get("response_ids")
        self._tokens += len(ids) if isinstance(ids, Sized) else 0
        self._where.append((line, row_index, self.source))

    def flush(self) -> TrajectoryBatch:
        """Validate and return the pending rows as a batch (with this chunk's problems in ``rejected``)."""
        for check in self.checks:
            check(self.report)
        rows, where, problems = self._rows, self._where, self._problems
        self._rows, self._where, self._problems, self._tokens = [], [], [], 0
        batch = TrajectoryBatch.from_rows(rows, dict(self.meta), errors="collect", source=self.source)
        refused = {p.row for p in batch.rejected}
        for i, row in enumerate(rows):
            found = None if i in refused else _reward_missing(row)
            if found is not None:
                self.report.missing_reward(str(row.get("traj_id")), found)
        for p in batch.rejected:  # from_rows numbers rows 0..n-1 of this chunk: name the input's line/row
            line, row, file = where[p.row] if p.row is not None and p.row < len(where) else (None, None, p.file)
            problems.append(dataclasses.replace(p, file=file, line=line, row=None if line is not None else row))
        problems.sort(
            key=lambda p: (str(p.file), p.line if p.line is not None else -1, p.row if p.row is not None else -1)
        )
        if problems and self.errors == "raise":
            raise TrajectoryError(problems)
        batch.rejected = problems
        self.report.rejected.extend(problems)
        self.report.trajectories += len(batch)
        return batch


def _reward_missing(row: dict) -> str | None:
    """What a v1 row has instead of a reward (``"no reward"``, ``"reward inf"``), or None when it has one:
    a finite ``reward``, or ``turn_rewards``/``token_rewards`` (a NaN ``reward`` beside them is v1's
    "the outcome is in the turn rewards")."""
    r = row.get("reward")
    try:
        v = math.nan if r is None else float(r)
    except (TypeError, ValueError):
        return None  # not a number: validation rejects the row and names it
    if math.isinf(v):
        return f"reward {v}"
    if math.isnan(v) and row.get("turn_rewards") is None and row.get("token_rewards") is None:
        return "no reward"
    return None


#: what one input record of each adapter is, for the error on an input without any
RECORDS = {
    "openai": "conversation (one JSON object a line with a 'messages' list)",
    "steps": "step record",
    "verl": "batch row",
    "areal": "trajectory (a row of the rollout batch)",
    "skyrl": "generator output row",
    "trl": "completion row",
    "art": "trajectory row",
}


def drive(
    gen: Iterator, col: Collector, chunk_rows: int | None, chunk_tokens: int | None = None
) -> Iterator[TrajectoryBatch]:
    """Run an adapter's row generator, yielding a validated batch every ``chunk_rows`` rows or
    ``chunk_tokens`` response tokens, whichever comes first (and at the end); then each of the
    report's warnings as a :class:`ConversionWarning`. An input without any record is a file-level
    error (a conversion that writes nothing is never a success)."""
    for _ in gen:
        if chunk_rows and (col.pending >= chunk_rows or (chunk_tokens and col.pending_tokens >= chunk_tokens)):
            yield col.flush()
    if not col.report.rows_in:
        raise file_error(
            col.framework,
            col.source,
            "<file>",
            f"at least one {RECORDS.get(col.framework, 'record')}",
            "none: the input is empty",
        )
    if col.pending or col.has_problems or not chunk_rows:
        yield col.flush()
    for text in col.report.warnings:
        warnings.warn(text, ConversionWarning, stacklevel=2)


def run(gen: Iterator, col: Collector):
    """Convert everything at once: ``(TrajectoryBatch, ConversionReport)``."""
    batches = list(drive(gen, col, None))  # one batch; exhausting the generator emits the warnings
    return batches[0], col.report


def describe(value) -> str:
    """A short description of a value for messages: its type and a preview."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"{type(value).__name__} {short(value)}"
