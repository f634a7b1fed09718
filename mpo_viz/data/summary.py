"""The counts and statistics of ``mpo-viz info``, from a whole batch or from a file read chunk by chunk.

Both go through the same two steps: :func:`row_numbers` takes a few numbers per trajectory from a
batch (response length, action tokens, turns, outcome reward, score, prompt length, group id), and
:func:`summarize_rows` reduces them once, at the end. A row's numbers depend on that row alone (its
sums are taken over its own tokens, :func:`row_sums`), so the numbers of the chunks of a file, joined,
are those of the whole file, and the one reduction gives the same statistics to the last bit however
the file was cut. :class:`Summarizer` collects them chunk by chunk: memory is one chunk plus those
few numbers per trajectory (tens of bytes, against hundreds per token in a loaded batch).
:meth:`TrajectoryBatch.summary <mpo_viz.data.trajectory.TrajectoryBatch.summary>` is the whole-batch
form; :func:`mpo_viz.data.io.summarize` streams a file or folder.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mpo_viz.data.schema import REQUIRED

__all__ = ["row_sums", "row_numbers", "summarize_rows", "Summarizer", "ROW_NUMBERS"]

#: the per-row numbers :func:`row_numbers` takes (plus ``group_id``)
ROW_NUMBERS = ("length", "action", "turns", "reward", "score", "prompt")


def row_sums(flat: np.ndarray, offsets: np.ndarray, dtype=None) -> np.ndarray:
    """Per-row sums of a ragged column (``flat`` over ``offsets``), 0 for an empty row.

    Each row's sum is taken over that row's values alone (``np.add.reduceat`` on its slice), so it is
    the same bit for bit in whatever batch the row sits: what makes per-chunk numbers mergeable.
    """
    lengths = np.diff(offsets)
    flat = flat if dtype is None else flat.astype(dtype, copy=False)
    out = np.zeros(len(lengths), dtype=np.add.reduce(flat[:0]).dtype)
    full = lengths > 0
    if full.any():  # the non-empty rows' starts: each segment ends where the next non-empty row starts
        out[full] = np.add.reduceat(flat[offsets[0] : offsets[-1]], offsets[:-1][full] - offsets[0])
    return out


def row_numbers(batch) -> dict:
    """The per-row numbers of ``batch`` (a :class:`~mpo_viz.data.trajectory.TrajectoryBatch`):
    ``(B,)`` arrays named by :data:`ROW_NUMBERS`, and ``group_id`` (object)."""
    c = batch.columns
    off = c.offsets
    return {
        "length": np.diff(off),
        "action": row_sums(c.tokens["loss_mask"], off, np.int64),
        "turns": np.asarray(batch.num_turns, dtype=np.int64),
        "reward": batch.outcome_reward,
        "score": batch.row_scores(),
        "prompt": np.diff(c.prompt[1]),
        "group_id": np.asarray(c.scalars["group_id"], dtype=object),
    }


def _stats(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not len(x):
        return {"n": 0}
    return {
        "n": int(len(x)),
        "mean": float(x.mean()),
        "std": float(x.std()),
        "min": float(x.min()),
        "max": float(x.max()),
    }


def _value_counts(x) -> dict:
    """``{"values": [v...], "counts": [n...]}``: each distinct integer value and its count, ascending."""
    values, counts = np.unique(np.asarray(x, dtype=np.int64), return_counts=True)
    return {"values": values.tolist(), "counts": counts.tolist()}


def _log2_histogram(x) -> dict:
    """Counts of non-negative integers in the bins ``[0, 1), [1, 2), [2, 4), ..., [2^j, 2^(j+1))``:
    ``{"edges": [0, 1, 2, 4, ...], "counts": [...]}`` (len(edges) = len(counts) + 1), up to the bin of
    the largest value. Token lengths span orders of magnitude; doubling bins show them in a few lines."""
    x = np.asarray(x, dtype=np.int64)
    if not len(x):
        return {"edges": [], "counts": []}
    top = int(x.max())
    edges = [0, 1] + [2**j for j in range(1, max(top, 1).bit_length() + 1)]
    counts, _ = np.histogram(x, bins=np.asarray(edges, dtype=np.float64))
    return {"edges": edges, "counts": counts.astype(np.int64).tolist()}


def _linear_histogram(x, bins: int = 10) -> dict:
    """Counts of the finite values in ``bins`` equal bins from their min to their max (numpy's rule:
    the last bin closed); one value repeated (or values that differ by rounding only): one bin
    holding them all. Missing (NaN) values are
    counted by ``reward_missing``, not here."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not len(x):
        return {"edges": [], "counts": []}
    lo, hi = float(x.min()), float(x.max())
    if lo == hi or not np.all(np.diff(np.linspace(lo, hi, bins + 1)) > 0):
        # one value, or values that differ by float rounding only (no ten distinct edges between them)
        return {"edges": [lo, hi], "counts": [int(len(x))]}
    counts, edges = np.histogram(x, bins=bins, range=(lo, hi))
    return {"edges": edges.tolist(), "counts": counts.astype(np.int64).tolist()}


def summarize_rows(numbers: dict, fields, meta: dict) -> dict:
    """The summary (plain Python values) from the per-row ``numbers`` of every row (:func:`row_numbers`,
    joined), the ``fields`` present and the file metadata."""
    lengths, n_act, k, rew = numbers["length"], numbers["action"], numbers["turns"], numbers["reward"]
    groups = pd.Series(numbers["group_id"]).value_counts()
    return {
        "trajectories": int(len(lengths)),
        "groups": int(len(groups)),
        "group_size": _stats(groups.values),
        "response_tokens": int(lengths.sum()),
        "action_tokens": int(n_act.sum()),
        "prompt_tokens": int(numbers["prompt"].sum()),
        "turns": _stats(k),
        "response_length": _stats(lengths),
        "action_tokens_per_turn": _stats(n_act[k > 0] / k[k > 0]) if (k > 0).any() else {"n": 0},
        "reward": _stats(rew),
        "reward_missing": int(np.isnan(rew).sum()),
        "score": _stats(numbers["score"]),
        "histograms": {
            "turns": _value_counts(k),
            "response_length": _log2_histogram(lengths),
            "reward": _linear_histogram(rew),
            "score": _linear_histogram(numbers["score"]),
        },
        "fields": sorted(fields),
        "meta": dict(meta),
    }


_EMPTY = {
    "length": np.int64,
    "action": np.int64,
    "turns": np.int64,
    "reward": np.float64,
    "score": np.float64,
    "prompt": np.int64,
    "group_id": object,
}


class Summarizer:
    """The summary of a file read in chunks: :meth:`add` each validated chunk (its rows and its
    ``rejected`` problems), then :meth:`result`. ``meta``: the file metadata to report (the first
    file's, as :func:`mpo_viz.load` keeps it)."""

    def __init__(self, meta: dict | None = None):
        self.meta = dict(meta or {})
        self.fields: set = set(REQUIRED)
        self.rejected = 0
        self.rows = 0
        self._parts: list[dict] = []

    def add(self, batch) -> None:
        self.rejected += len(batch.rejected)
        self.fields |= batch.fields
        self.rows += len(batch)
        if len(batch):
            self._parts.append(row_numbers(batch))

    def result(self) -> dict:
        """The summary, as :meth:`TrajectoryBatch.summary` gives it for the whole input, plus
        ``rejected_rows`` (the loader's problems)."""
        numbers = {
            k: (np.concatenate([p[k] for p in self._parts]) if self._parts else np.zeros(0, dtype=dt))
            for k, dt in _EMPTY.items()
        }
        out = summarize_rows(numbers, self.fields, self.meta)
        out["rejected_rows"] = self.rejected
        return out
