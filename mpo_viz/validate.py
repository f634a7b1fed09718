"""The trajectory/v1 validation rules (docs/concepts.md, "Data"), beside :mod:`mpo_viz.schema`.

Every reader produces the same intermediate :class:`Columns` (flat arrays + offsets per field, each
field with its own offsets until lengths are checked): :func:`columns_from_rows` from Python rows,
the Parquet reader from Arrow record batches. :func:`validate_columns` runs every rule once,
vectorized over the whole batch, and splits good rows from rejected ones; it is what
``TrajectoryBatch.from_columns`` and ``TrajectoryBatch.from_rows`` call. Every problem names the
file, line (JSONL) or row (Parquet / list of rows), traj_id, field, expected and found.

This module imports nothing above the schema: it builds the batch with the class it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mpo_viz.ragged import offsets_from_lengths, row_index, take
from mpo_viz.schema import (
    EXTRA_TOKEN_DTYPE,
    FINITE_ON_ACTIONS,
    PROMPT_FIELD,
    REQUIRED,
    REWARD_SUM_TOL,
    SCALAR_FIELDS,
    TOKEN_FIELDS,
    TURN_FIELDS,
    Problem,
    short,
)

__all__ = ["Columns", "columns_from_rows", "validate_columns"]

_INT_TOKEN = {"response_ids", "loss_mask", "turn_ids"}


@dataclass
class Columns:
    """Unvalidated column data of ``n`` rows. Token/turn fields: name -> (flat, offsets, present)."""

    n: int
    token: dict = field(default_factory=dict)
    turn: dict = field(default_factory=dict)
    prompt: tuple | None = None
    scalar: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    file: object = None  # str, or (n,) object array for rows from several files
    line: np.ndarray | None = None  # 1-based JSONL line per row, or None
    row: np.ndarray | None = None  # 0-based row number per row
    bad: np.ndarray | None = None  # rows already rejected while building columns

    def where(self, i: int) -> dict:
        f = self.file[i] if isinstance(self.file, np.ndarray) else self.file
        line = int(self.line[i]) if self.line is not None and self.line[i] >= 0 else None
        row = int(self.row[i]) if self.row is not None and line is None else None
        tid = self.scalar.get("traj_id")
        t = tid[i] if tid is not None and i < len(tid) else None
        return {"file": f, "line": line, "row": row, "traj_id": t if isinstance(t, str) else (None if t is None else str(t))}


def _num(x) -> str:
    """A number for messages: 2 not np.float64(2.0)."""
    x = x.item() if isinstance(x, np.generic) else x
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return repr(x)


def _problem(cols: Columns, i: int, fld: str, expected: str, found: str) -> Problem:
    return Problem(field=fld, expected=expected, found=found, **cols.where(i))


# ---------------------------------------------------------------------------- rows -> columns
def _kind_ok(arr: np.ndarray, name: str) -> str | None:
    """None if a per-token/turn/prompt array has an acceptable dtype, else what was found."""
    if arr.ndim != 1:
        return f"a nested list (ndim {arr.ndim})"
    if arr.size == 0:
        return None
    k = arr.dtype.kind
    if name == "response_tokens":
        return None if k in "UO" and all(isinstance(x, str) for x in arr.tolist()) else f"non-string items (dtype {arr.dtype})"
    if name in _INT_TOKEN or name == PROMPT_FIELD:
        if k in "iub":
            return None
        if k == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            return None  # 1.0 for 1 is fine (some writers emit floats)
        return f"non-integers (e.g. {short(arr[~(arr == np.round(arr))][:1].tolist() if k == 'f' else arr[:1].tolist())})"
    if k in "iufb":
        return None
    return f"non-numbers (dtype {arr.dtype})"


def columns_from_rows(rows: list, *, source=None, lines=None) -> tuple[Columns, list[Problem]]:
    """Python dict rows -> :class:`Columns`, with the problems found on the way (missing required
    fields, wrong types, lists that are not lists). Rows with such problems are marked bad."""
    n = len(rows)
    cols = Columns(n=n, file=source)
    cols.line = np.asarray(lines, dtype=np.int64) if lines is not None else None
    cols.row = np.arange(n, dtype=np.int64)
    bad = np.zeros(n, dtype=bool)
    problems: list[Problem] = []

    scal: dict[str, list] = {k: [None] * n for k in SCALAR_FIELDS}
    lists: dict[str, list] = {}
    extra: dict[str, list] = {}
    cols.scalar = scal

    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            problems.append(_problem(cols, i, "<row>", "a JSON object", f"{type(r).__name__}"))
            bad[i] = True
            continue
        tid = r.get("traj_id")
        scal["traj_id"][i] = tid
        for req in REQUIRED:
            if req not in r or r[req] is None and req != "reward":
                problems.append(_problem(cols, i, req, "the required field", "nothing"))
                bad[i] = True
        for k, v in r.items():
            if k in SCALAR_FIELDS:
                typ = SCALAR_FIELDS[k]
                if v is None:
                    continue
                if typ is float:
                    ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                    v = float(v) if ok else v
                elif typ is int:
                    ok = isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                elif typ is bool:
                    ok = isinstance(v, (bool, np.bool_))
                else:
                    ok = isinstance(v, str)
                if not ok:
                    tname = {str: "string", int: "integer", float: "float", bool: "boolean"}[typ]
                    problems.append(_problem(cols, i, k, f"a {tname}", f"{type(v).__name__} {short(v)}"))
                    bad[i] = True
                    continue
                scal[k][i] = v
            elif k in TOKEN_FIELDS or k in TURN_FIELDS or k == PROMPT_FIELD:
                if v is None:
                    continue
                if not isinstance(v, (list, tuple, np.ndarray)):
                    problems.append(_problem(cols, i, k, "a list", f"{type(v).__name__} {short(v)}"))
                    bad[i] = True
                    continue
                try:
                    arr = np.asarray(v, dtype=object if k == "response_tokens" else None)
                    if arr.dtype == object and k != "response_tokens":
                        arr = np.asarray(v, dtype=np.float64)
                except (TypeError, ValueError):
                    problems.append(_problem(cols, i, k, "a flat list of numbers", short(v)))
                    bad[i] = True
                    continue
                why = _kind_ok(arr, k)
                if why:
                    problems.append(_problem(cols, i, k, "a flat list of " + ("strings" if k == "response_tokens" else "integers" if k in _INT_TOKEN or k == PROMPT_FIELD else "numbers"), why))
                    bad[i] = True
                    continue
                lists.setdefault(k, [None] * n)[i] = arr
            else:
                extra.setdefault(k, [None] * n)[i] = v

    # Extras that are per-token number lists (same length as response_ids in every row that has
    # them, e.g. adv_mpo written by `mpo-viz advantages`) become token fields; others stay opaque.
    resp = lists.get("response_ids", [None] * n)
    for k in list(extra):
        vals = extra[k]
        is_tok = any(v is not None for v in vals)
        for i, v in enumerate(vals):
            if v is None:
                continue
            if not isinstance(v, (list, tuple)) or resp[i] is None or len(v) != len(resp[i]):
                is_tok = False
                break
            try:
                a = np.asarray(v, dtype=np.float64)
            except (TypeError, ValueError):
                is_tok = False
                break
            if a.ndim != 1:
                is_tok = False
                break
        if is_tok:
            lists[k] = [None if v is None else np.asarray(v, dtype=np.float64) for v in vals]
            del extra[k]

    for k, arrs in lists.items():
        if k == PROMPT_FIELD:
            continue
        dt = TOKEN_FIELDS.get(k) or TURN_FIELDS.get(k) or EXTRA_TOKEN_DTYPE
        if k in ("loss_mask", "turn_ids"):
            dt = np.dtype(np.float64)  # raw: checked for 0/1 and integrality before narrowing
        present = np.array([a is not None and not bad[i] for i, a in enumerate(arrs)], dtype=bool)
        lens = np.array([len(a) if p else 0 for a, p in zip(arrs, present)], dtype=np.int64)
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        parts = [a for a, p in zip(arrs, present) if p and len(a)]
        if dt.kind == "O":
            flat = np.empty(off[-1], dtype=object)
            if parts:
                flat[:] = np.concatenate(parts)
        else:
            flat = np.concatenate([a.astype(dt) for a in parts]) if parts else np.zeros(0, dtype=dt)
        target = cols.turn if k in TURN_FIELDS else cols.token
        target[k] = (flat, off, present)
    parr = lists.get(PROMPT_FIELD, [None] * n)
    plens = np.array([len(a) if a is not None and not bad[i] else 0 for i, a in enumerate(parr)], dtype=np.int64)
    poff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(plens, out=poff[1:])
    pparts = [a.astype(np.int64) for i, a in enumerate(parr) if a is not None and not bad[i] and len(a)]
    cols.prompt = (np.concatenate(pparts) if pparts else np.zeros(0, dtype=np.int64), poff)
    for k in ("response_ids", "loss_mask"):
        if k not in cols.token:
            cols.token[k] = (np.zeros(0, dtype=np.float64), np.zeros(n + 1, dtype=np.int64), np.zeros(n, dtype=bool))
    cols.scalar = {k: np.array(v, dtype=object) for k, v in scal.items()}
    cols.extra = {k: np.array(v + [None], dtype=object)[:-1] for k, v in extra.items()}
    cols.bad = bad
    return cols, problems


# ---------------------------------------------------------------------------- validation
def _first_per_row(rows: np.ndarray, pos: np.ndarray):
    """Unique rows with the first position flagged in each (inputs ordered by position)."""
    u, first = np.unique(rows, return_index=True)
    return u, pos[first]


def validate_columns(cls, cols: Columns, meta, problems: list[Problem], *, seen_ids=None):
    """Run every v1 rule over ``cols``; return ``(batch of good rows, all problems)``.

    ``cls``: the batch class to build (``TrajectoryBatch``; called with the aligned columns as
    keyword arguments, then read through its public ``columns``/``num_turns``).

    ``seen_ids`` (a set, or a dict traj_id -> "file, line/row" to name the first occurrence; updated
    in place) carries traj_ids across chunks/files so duplicates are
    found across a whole folder or scan.
    """
    n = cols.n
    bad = cols.bad.copy() if cols.bad is not None else np.zeros(n, dtype=bool)
    problems = list(problems)

    def flag(i, fld, expected, found):
        problems.append(_problem(cols, int(i), fld, expected, found))
        bad[int(i)] = True

    # -- identity scalars
    for i, t in enumerate(cols.scalar.get("traj_id", np.full(n, None, dtype=object))):
        if bad[i]:
            continue
        if not isinstance(t, str) or not t:
            flag(i, "traj_id", "a non-empty string", short(t))
    for i, g in enumerate(cols.scalar.get("group_id", np.full(n, None, dtype=object))):
        if not bad[i] and not isinstance(g, str):
            flag(i, "group_id", "a string", short(g))

    # -- lengths of per-token fields, then integrality and 0/1 on the raw values
    rflat, roff, rpres = cols.token["response_ids"]
    rlen = np.diff(roff)
    for name, (_, off, pres) in cols.token.items():
        if name == "response_ids":
            continue
        flen = np.diff(off)
        for i in np.flatnonzero(pres & ~bad & (flen != rlen)):
            flag(i, name, f"{rlen[i]} items (the length of response_ids)", f"{flen[i]}")
    mflat, moff, _ = cols.token["loss_mask"]
    seg_m = np.repeat(np.arange(n), np.diff(moff))
    badm = (mflat != 0) & (mflat != 1)
    if badm.any():
        pos = np.flatnonzero(badm)
        for i, p in zip(*_first_per_row(seg_m[pos], pos)):
            if not bad[i]:
                flag(i, "loss_mask", "0 or 1", f"{_num(mflat[p])} at position {p - moff[i]}")
    for name in ("response_ids", "turn_ids"):
        if name not in cols.token:
            continue
        flat, off, _ = cols.token[name]
        if flat.dtype.kind == "f":
            nonint = ~np.isfinite(flat) | (flat != np.round(flat)) | (flat < 0)
            if nonint.any():
                seg = np.repeat(np.arange(n), np.diff(off))
                pos = np.flatnonzero(nonint)
                for i, p in zip(*_first_per_row(seg[pos], pos)):
                    if not bad[i]:
                        flag(i, name, "integers >= 0", f"{_num(flat[p])} at position {p - off[i]}")
        elif flat.size and flat.min() < 0:
            seg = np.repeat(np.arange(n), np.diff(off))
            pos = np.flatnonzero(flat < 0)
            for i, p in zip(*_first_per_row(seg[pos], pos)):
                if not bad[i]:
                    flag(i, name, "integers >= 0", f"{_num(flat[p])} at position {p - off[i]}")

    # -- align the rows that survived so far into a batch
    good = np.flatnonzero(~bad)
    batch = _aligned_batch(cls, cols, good, meta)
    gi = good  # batch row j is cols row gi[j]
    bc = batch.columns
    off = bc.offsets
    seg = row_index(off)
    m = bc.tokens["loss_mask"] != 0

    def bflag(j, fld, expected, found):
        flag(gi[j], fld, expected, found)

    # -- turn ids: non-decreasing; on action tokens 0..K-1 without gaps
    if "turn_ids" in bc.tokens:
        t = bc.tokens["turn_ids"]
        has = bc.present["turn_ids"]
        row_has = np.repeat(has, np.diff(off))
        same_row = np.zeros(len(t), dtype=bool)
        same_row[1:] = seg[1:] == seg[:-1]
        dec = np.zeros(len(t), dtype=bool)
        dec[1:] = same_row[1:] & (t[1:] < t[:-1]) & row_has[1:]
        if dec.any():
            pos = np.flatnonzero(dec)
            for j, p in zip(*_first_per_row(seg[pos], pos)):
                bflag(j, "turn_ids", "non-decreasing ids", f"{t[p - 1]} then {t[p]} at position {p - off[j]}")
        act = np.flatnonzero(m & row_has)
        if len(act):
            ar, at = seg[act], t[act]
            first = np.ones(len(act), dtype=bool)
            first[1:] = ar[1:] != ar[:-1]
            bad_first = first & (at != 0)
            step = np.zeros(len(act), dtype=bool)
            step[1:] = ~first[1:] & ((at[1:] - at[:-1]) > 1)
            for k in np.flatnonzero(bad_first):
                bflag(ar[k], "turn_ids", "turn 0 on the first action token (every turn id 0..K-1 needs an action token)", f"turn {at[k]} at position {act[k] - off[ar[k]]}")
            if step.any():
                ks = np.flatnonzero(step)
                for j, k in zip(*_first_per_row(ar[ks], ks)):
                    bflag(j, "turn_ids", "consecutive turn ids on action tokens (every id needs an action token)", f"{at[k - 1]} then {at[k]} at position {act[k] - off[j]}")

    # -- finite values/logprobs on action tokens
    for name in FINITE_ON_ACTIONS:
        if name not in bc.tokens:
            continue
        row_has = np.repeat(bc.present[name], np.diff(off))
        nf = m & row_has & ~np.isfinite(bc.tokens[name])
        if nf.any():
            pos = np.flatnonzero(nf)
            for j, p in zip(*_first_per_row(seg[pos], pos)):
                bflag(j, name, "finite numbers on action tokens", f"{_num(bc.tokens[name][p])} at position {p - off[j]}")

    reward = bc.scalars["reward"].astype(np.float64)
    # -- token rewards: finite, zero on masked tokens, sum to a finite outcome reward
    if "token_rewards" in bc.tokens:
        tr = bc.tokens["token_rewards"]
        has = bc.present["token_rewards"]
        row_has = np.repeat(has, np.diff(off))
        nf = row_has & ~np.isfinite(tr)
        if nf.any():
            pos = np.flatnonzero(nf)
            for j, p in zip(*_first_per_row(seg[pos], pos)):
                bflag(j, "token_rewards", "finite numbers", f"{_num(tr[p])} at position {p - off[j]}")
        onmask = row_has & ~m & (tr != 0) & np.isfinite(tr)
        if onmask.any():
            pos = np.flatnonzero(onmask)
            for j, p in zip(*_first_per_row(seg[pos], pos)):
                bflag(j, "token_rewards", "0 on observation tokens (loss_mask == 0)", f"{_num(tr[p])} at position {p - off[j]}")
        sums = np.zeros(len(batch))
        np.add.at(sums, seg, np.where(row_has, np.nan_to_num(tr), 0.0))
        mism = has & np.isfinite(reward) & (np.abs(sums - reward) > REWARD_SUM_TOL)
        for j in np.flatnonzero(mism):
            bflag(j, "reward", f"the sum of token_rewards ({sums[j]:.9g}) within {REWARD_SUM_TOL:g}", f"{reward[j]:.9g}")

    # -- turn rewards: one per assistant turn, finite
    k = batch.num_turns
    if "turn_rewards" in bc.turn:
        flat, toff, has = bc.turn["turn_rewards"]
        tl = np.diff(toff)
        for j in np.flatnonzero(has & (tl != k)):
            bflag(j, "turn_rewards", f"{k[j]} entries (one per assistant turn)", f"{tl[j]}")
        for j in np.flatnonzero(has):
            seg_vals = flat[toff[j] : toff[j + 1]]
            if not np.all(np.isfinite(seg_vals)):
                bflag(j, "turn_rewards", "finite numbers", short(seg_vals.tolist()))

    # -- a reward needs an action token to sit on
    no_act = k == 0
    has_outcome = np.isfinite(reward) & (reward != 0)
    has_tr = bc.present.get("token_rewards", np.zeros(len(batch), dtype=bool))
    for j in np.flatnonzero(no_act & has_outcome & ~has_tr):
        bflag(j, "reward", "no reward on a trajectory with no action token (nowhere to put it)", f"{reward[j]}")

    # -- bootstrap value: finite or NaN/None
    bv = bc.scalars.get("bootstrap_value")
    if bv is not None:
        for j, x in enumerate(bv):
            if x is not None and math.isinf(float(x)):
                bflag(j, "bootstrap_value", "a finite number or NaN (terminal)", f"{x}")

    # -- duplicate trajectory ids (within this batch and, with seen_ids, across chunks/files)
    seen = seen_ids if seen_ids is not None else set()
    first_line: dict = {}
    for j, t in enumerate(bc.scalars["traj_id"]):
        if bad[gi[j]]:
            continue
        if t in seen or t in first_line:
            if t in first_line:
                where = f" (first at {first_line[t][1]})"
            else:  # an earlier chunk or file; a dict seen_ids knows where
                where = f" (first in {seen[t]})" if isinstance(seen, dict) else " (seen earlier)"
            bflag(j, "traj_id", "a unique traj_id", f"a duplicate of {t!r}{where}")
        else:
            w = cols.where(gi[j])
            first_line[t] = (w["file"], f"line {w['line']}" if w["line"] is not None else f"row {w['row']}")
    if isinstance(seen, dict):
        seen.update({t: (f"{f}, {loc}" if f is not None else loc) for t, (f, loc) in first_line.items()})
    else:
        seen.update(first_line)

    keep = np.flatnonzero(~bad[gi])
    out = batch if len(keep) == len(batch) else batch[keep]
    problems.sort(key=lambda p: (str(p.file), p.line if p.line is not None else -1, p.row if p.row is not None else -1))
    return out, problems


def _aligned_batch(cls, cols: Columns, good: np.ndarray, meta):
    """Rows ``good`` of ``cols`` as a TrajectoryBatch with every token field aligned to response_ids."""
    rflat, roff, _ = cols.token["response_ids"]
    rlen = np.diff(roff)[good]
    off = offsets_from_lengths(rlen)
    tokens, present = {}, {}
    for name, (flat, foff, pres) in cols.token.items():
        dt = TOKEN_FIELDS.get(name, EXTRA_TOKEN_DTYPE)
        p = pres[good] if name not in ("response_ids", "loss_mask") else np.ones(len(good), dtype=bool)
        if name in ("response_ids", "loss_mask"):
            vals, _ = take(flat, foff, good)
            tokens[name] = vals.astype(dt)
            continue
        sel = np.flatnonzero(p)
        if len(sel) == len(good):
            vals, voff = take(flat, foff, good)
            if np.array_equal(voff, off):  # every row carries the field: no scatter needed
                tokens[name] = vals.astype(dt) if dt.kind != "O" else vals
                present[name] = p
                continue
        out = np.zeros(off[-1], dtype=dt) if dt.kind != "O" else np.full(off[-1], "", dtype=object)
        if len(sel):
            vals, _ = take(flat, foff, good[sel])
            target, _ = take(np.arange(off[-1], dtype=np.int64), off, sel)
            out[target] = vals.astype(dt) if dt.kind != "O" else vals
        tokens[name] = out
        present[name] = p
    turn = {}
    for name, (flat, toff, pres) in cols.turn.items():
        f2, o2 = take(flat, toff, good)
        turn[name] = (f2.astype(TURN_FIELDS.get(name, np.float64)), o2, pres[good])
    pf, po = take(cols.prompt[0], cols.prompt[1], good)
    scalars = {}
    for name, v in cols.scalar.items():
        v = v[good]
        if name == "reward":
            v = np.array([math.nan if x is None else float(x) for x in v], dtype=np.float64)
        scalars[name] = v
    for name in ("traj_id", "group_id", "reward"):
        if name not in scalars:
            scalars[name] = np.full(len(good), None, dtype=object) if name != "reward" else np.full(len(good), np.nan)
    extras = {k: v[good] for k, v in cols.extra.items()}
    return cls(
        offsets=off,
        tokens=tokens,
        present=present,
        prompt=(pf.astype(np.int64), po),
        turn=turn,
        scalars=scalars,
        extras=extras,
        meta=meta,
    )
