"""A small trajectory/v1 data set that exercises every doctor check, info statistic and validation
rule at once, split across files (the streamed-versus-whole tests of info, validate and the doctor).

:func:`messy_rows` gives the rows (dicts, JSON-ready), a few thousand tokens in all: groups of
four with flat ones among them; optional fields present in some rows only (values, returns,
token and turn rewards, steps); returns reset before an observation, a terminal reward lost on a
masked tail, NaN values on observation tokens, values shifted by one token, rows without a reward,
a turn count that falls over four steps; and, with ``bad=True``, rows the loader refuses (a
reward on an observation token, a mask entry 5, a duplicate traj_id, an unreadable line in JSONL).
:func:`write_jsonl_folder` / :func:`write_parquet_folder` / :func:`write_run_folder` put them on disk.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

import mpo_viz as mv

META = {"gamma": 0.9, "source_framework": "tests.data.messy"}


def _turn_layout(rng, n_turns: int, tail: bool):
    """(mask, turn_ids) of alternating action / observation spans (1-4 tokens each)."""
    mask, tids = [], []
    for k in range(n_turns):
        a = int(rng.integers(1, 5))
        mask += [1] * a
        tids += [k] * a
        if k < n_turns - 1 or tail:
            o = int(rng.integers(1, 5))
            mask += [0] * o
            tids += [k] * o
    return np.array(mask), np.array(tids)


def _returns(mask: np.ndarray, reward: float, gamma: float) -> np.ndarray:
    """Monte-Carlo returns over action tokens (the outcome reward on the last one), 0 elsewhere."""
    out = np.zeros(len(mask))
    g, last = 0.0, True
    for t in range(len(mask) - 1, -1, -1):
        if mask[t]:
            g = (reward if last else 0.0) + gamma * g
            last = False
            out[t] = g
    return out


def messy_rows(
    n: int = 240, seed: int = 0, *, bad: bool = False, shift_every: int = 6, returns_until: int | None = None
) -> list[dict]:
    """``n`` rows (dicts), in groups of four; see the module docstring. ``shift_every``: every so
    many rows have their values shifted by one token (1: all, and values_shifted fires);
    ``returns_until``: only rows before this one log returns (later chunks have none while the input does)."""
    rng = np.random.default_rng(seed)
    rows = []
    steps = 4
    for i in range(n):
        g = i // 4
        step = i * steps // n
        n_turns = int(rng.integers(2, 5)) if step < steps - 1 else int(rng.integers(1, 3))  # collapse at the end
        tail = i % 5 == 0
        mask, tids = _turn_layout(rng, n_turns, tail)
        L = len(mask)
        flat = g % 3 == 0
        reward = 1.0 if flat else float(rng.integers(0, 2))
        row = {
            "traj_id": f"r{i:04d}",
            "group_id": f"g{g:03d}",
            "prompt_ids": rng.integers(0, 99, int(rng.integers(0, 4))).tolist(),
            "response_ids": rng.integers(0, 99, L).tolist(),
            "loss_mask": mask.tolist(),
            "reward": reward,
        }
        if i % 7:
            row["turn_ids"] = tids.tolist()
        if i % 13 == 0:
            row["reward"] = math.nan  # no reward at all
        if i % 4 != 3:
            ret = _returns(mask, reward if math.isfinite(row["reward"]) else 0.0, META["gamma"])
            values = ret + rng.normal(0, 0.1, L)
            if i % shift_every == 0:
                values = np.concatenate([values[1:], [0.0]])  # shifted by one token
            if i % 11 == 0:
                values[np.flatnonzero(mask == 0)[:1]] = math.nan  # NaN on an observation token
            row["values"] = values.tolist()
            if i % 2 == 0 and (returns_until is None or i < returns_until):
                r = ret.copy()
                if i % 8 == 0:
                    r[tids == 0] = 0.0  # returns reset before the first observation
                if tail and i % 10 == 0:
                    r[np.flatnonzero(mask)[-1]] *= 0.5  # the terminal reward decayed on the masked tail
                row["returns"] = r.tolist()
        if i % 9 == 4:
            row["turn_rewards"] = [0.0] * (n_turns - 1) + [row["reward"] if math.isfinite(row["reward"]) else 0.0]
        if i % 3 != 2:
            row["step"] = step
        row["sample_idx"] = i % 4
        rows.append(row)
    if bad:
        for i in range(3, n, 17):  # a reward on an observation token: refused (reward_on_observation)
            r = rows[i]
            m = np.array(r["loss_mask"])
            if (m == 0).any():
                tr = np.zeros(len(m))
                tr[np.flatnonzero(m == 0)[0]] = 1.0
                r["token_rewards"] = tr.tolist()
                r["reward"] = 1.0
        for i in range(5, n, 23):
            rows[i]["loss_mask"] = [5] + rows[i]["loss_mask"][1:]  # not 0/1
        rows[n - 2]["traj_id"] = rows[1]["traj_id"]  # a duplicate, files apart
    return rows


def _line(row: dict) -> str:
    return json.dumps(row)


def write_jsonl_folder(rows: list[dict], folder: Path, n_files: int = 3, *, garbage: bool = False) -> Path:
    """The rows as ``n_files`` JSONL files (``part-0.jsonl`` ...) with one ``_meta.json``; ``garbage``:
    an unreadable line in the middle file."""
    folder.mkdir(parents=True, exist_ok=True)
    cuts = np.array_split(np.arange(len(rows)), n_files)
    for k, idx in enumerate(cuts):
        lines = [_line(rows[i]) for i in idx]
        if garbage and k == n_files // 2:
            lines.insert(len(lines) // 2, "{not json")
        (folder / f"part-{k}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "_meta.json").write_text(json.dumps(META), encoding="utf-8")
    return folder


def write_parquet_folder(rows: list[dict], folder: Path, n_files: int = 3, *, iterations: bool = False) -> Path:
    """The (valid) rows as ``n_files`` Parquet files; ``iterations``: each file's metadata names its
    ``iteration`` (0, 1, ...), as a trainer's run folder does."""
    folder.mkdir(parents=True, exist_ok=True)
    for k, idx in enumerate(np.array_split(np.arange(len(rows)), n_files)):
        b = mv.TrajectoryBatch.from_rows([rows[i] for i in idx], dict(META))
        if iterations:
            b = b.with_meta(iteration=k)
        mv.save(b, folder / f"part-{k}.parquet")
    return folder


def write_run_folder(rows: list[dict], folder: Path, n_files: int = 4) -> Path:
    """A run folder: ``trajectories/`` (one Parquet file per iteration, rows without a ``step`` field
    taking the file's) and ``metrics.jsonl`` with an explained variance per step, some of them off."""
    write_parquet_folder(
        [{k: v for k, v in r.items() if k != "step"} for r in rows], folder / "trajectories", n_files, iterations=True
    )
    metrics = [{"step": k, "critic_explained_var": ev} for k, ev in enumerate((0.2, 0.95, -0.3, 0.5)[:n_files])]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n", encoding="utf-8")
    return folder
