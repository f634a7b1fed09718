"""The trajectory/v1 validation rules (docs/concepts.md, "Data"), beside :mod:`mpo_viz.data.schema`.

Every reader produces the same intermediate :class:`Columns` (flat arrays + offsets per field, each
field with its own offsets until lengths are checked): :func:`columns_from_rows` from Python rows,
the Parquet reader from Arrow record batches. :func:`validate_columns` runs every rule once,
vectorized over the whole batch, and splits good rows from rejected ones; it is what
``TrajectoryBatch.from_columns`` and ``TrajectoryBatch.from_rows`` call. Each rule is a function
that returns its problems (:func:`check_columns` on the raw columns, :func:`check_rows` on the
aligned batch, duplicate ids last); every problem names the file, line (JSONL) or row (Parquet /
list of rows), traj_id, field, expected and found.

This module imports nothing above the schema: the surviving rows are aligned
(:func:`aligned_columns`) and the batch class it is given builds itself from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from mpo_viz.data.ragged import offsets_from_lengths, row_index, take
from mpo_viz.data.schema import (
    BINARY_FIELDS,
    EXTRA_TOKEN_DTYPE,
    FINITE_ON_ACTIONS,
    MC_TOKEN_NUMBERS,
    POSITIVE_FIELDS,
    PROMPT_FIELD,
    REQUIRED,
    REWARD_SUM_TOL,
    SCALAR_FIELDS,
    TOKEN_FIELDS,
    TURN_FIELDS,
    Problem,
    short,
)

__all__ = ["Columns", "columns_from_rows", "validate_columns", "check_columns", "check_rows", "aligned_columns"]

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
        return {
            "file": f,
            "line": line,
            "row": row,
            "traj_id": t if isinstance(t, str) else (None if t is None else str(t)),
        }


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
        return (
            None
            if k in "UO" and all(isinstance(x, str) for x in arr.tolist())
            else f"non-string items (dtype {arr.dtype})"
        )
    if name in _INT_TOKEN or name == PROMPT_FIELD:
        if k in "iub":
            return None
        if k == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            return None  # 1.0 for 1 is fine (some writers emit floats)
        return (
            f"non-integers (e.g. {short(arr[~(arr == np.round(arr))][:1].tolist() if k == 'f' else arr[:1].tolist())})"
        )
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
    cols.bad = np.zeros(n, dtype=bool)
    problems: list[Problem] = []
    scal: dict[str, list] = {k: [None] * n for k in SCALAR_FIELDS}
    lists: dict[str, list] = {}
    extra: dict[str, list] = {}
    cols.scalar = scal
    for i, r in enumerate(rows):
        found = _read_row(r, i, scal, lists, extra)
        problems += [_problem(cols, i, *f) for f in found]
        cols.bad[i] = bool(found)
    _promote_token_extras(lists, extra, n)
    _flatten_lists(cols, lists)
    cols.scalar = {k: np.array(v, dtype=object) for k, v in scal.items()}
    cols.extra = {k: np.array(v + [None], dtype=object)[:-1] for k, v in extra.items()}
    return cols, problems


_TYPE_NAMES = {str: "string", int: "integer", float: "float", bool: "boolean"}


def _scalar_ok(v, typ) -> tuple[bool, object]:
    """Whether ``v`` is a value of scalar type ``typ`` (a float may arrive as an int), and the value."""
    if typ is float:
        ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
        return ok, float(v) if ok else v
    if typ is int:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool), v
    if typ is bool:
        return isinstance(v, (bool, np.bool_)), v
    return isinstance(v, str), v


def _list_value(k: str, v) -> tuple[np.ndarray | None, tuple | None]:
    """A per-token/turn/prompt list as a flat array, or ``(None, (expected, found))``."""
    if not isinstance(v, (list, tuple, np.ndarray)):
        return None, ("a list", f"{type(v).__name__} {short(v)}")
    try:
        arr = np.asarray(v, dtype=object if k == "response_tokens" else None)
        if arr.dtype == object and k != "response_tokens":
            arr = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        return None, ("a flat list of numbers", short(v))
    why = _kind_ok(arr, k)
    if why:
        what = (
            "strings" if k == "response_tokens" else "integers" if k in _INT_TOKEN or k == PROMPT_FIELD else "numbers"
        )
        return None, ("a flat list of " + what, why)
    return arr, None


def _read_row(r, i: int, scal: dict, lists: dict, extra: dict) -> list[tuple]:
    """Read row ``i`` into the scalar, list and extra columns; its problems as ``(field, expected,
    found)`` (the row is bad when there is any)."""
    if not isinstance(r, dict):
        return [("<row>", "a JSON object", f"{type(r).__name__}")]
    scal["traj_id"][i] = r.get("traj_id")
    found = [
        (req, "the required field", "nothing") for req in REQUIRED if req not in r or r[req] is None and req != "reward"
    ]
    n = len(scal["traj_id"])
    for k, v in r.items():
        if k in SCALAR_FIELDS:
            if v is None:
                continue
            ok, v = _scalar_ok(v, SCALAR_FIELDS[k])
            if ok:
                scal[k][i] = v
            else:
                found.append((k, f"a {_TYPE_NAMES[SCALAR_FIELDS[k]]}", f"{type(v).__name__} {short(v)}"))
        elif k in TOKEN_FIELDS or k in TURN_FIELDS or k == PROMPT_FIELD:
            if v is None:
                continue
            arr, why = _list_value(k, v)
            if why:
                found.append((k, *why))
            else:
                lists.setdefault(k, [None] * n)[i] = arr
        else:
            extra.setdefault(k, [None] * n)[i] = v
    return found


def _is_token_list(vals: list, resp: list) -> bool:
    """Whether an extra field is per-token numbers: a flat list of the length of response_ids in
    every row that has it (and some row has it)."""
    if all(v is None for v in vals):
        return False
    for v, ids in zip(vals, resp):
        if v is None:
            continue
        if not isinstance(v, (list, tuple)) or ids is None or len(v) != len(ids):
            return False
        try:
            if np.asarray(v, dtype=np.float64).ndim != 1:
                return False
        except (TypeError, ValueError):
            return False
    return True


def _promote_token_extras(lists: dict, extra: dict, n: int) -> None:
    """Extras that are per-token number lists (e.g. adv_mpo written by ``mpo-viz advantages``)
    become token fields; others stay opaque."""
    resp = lists.get("response_ids", [None] * n)
    for k in list(extra):
        if _is_token_list(extra[k], resp):
            lists[k] = [None if v is None else np.asarray(v, dtype=np.float64) for v in extra[k]]
            del extra[k]


def _flatten_lists(cols: Columns, lists: dict) -> None:
    """The list columns as flat arrays + offsets (a bad row's entries left out)."""
    n = cols.n
    bad = cols.bad if cols.bad is not None else np.zeros(n, dtype=np.bool_)
    for k, arrs in lists.items():
        if k == PROMPT_FIELD:
            continue
        dt = TOKEN_FIELDS.get(k) or TURN_FIELDS.get(k) or EXTRA_TOKEN_DTYPE
        if k in ("loss_mask", "turn_ids") or k in BINARY_FIELDS:
            dt = np.dtype(np.float64)  # raw: checked for 0/1 and integrality before narrowing
        present = np.array([a is not None and not bad[i] for i, a in enumerate(arrs)], dtype=np.bool_)
        off = offsets_from_lengths(np.array([len(a) if p else 0 for a, p in zip(arrs, present)], dtype=np.int64))
        parts = [a for a, p in zip(arrs, present) if p and len(a)]
        if dt.kind == "O":
            flat = np.empty(off[-1], dtype=object)
            if parts:
                flat[:] = np.concatenate(parts)
        else:
            flat = np.concatenate([a.astype(dt) for a in parts]) if parts else np.zeros(0, dtype=dt)
        (cols.turn if k in TURN_FIELDS else cols.token)[k] = (flat, off, present)
    parr = [a if a is not None and not bad[i] else None for i, a in enumerate(lists.get(PROMPT_FIELD, [None] * n))]
    poff = offsets_from_lengths(np.array([0 if a is None else len(a) for a in parr], dtype=np.int64))
    pparts = [a.astype(np.int64) for a in parr if a is not None and len(a)]
    cols.prompt = (np.concatenate(pparts) if pparts else np.zeros(0, dtype=np.int64), poff)
    for k in ("response_ids", "loss_mask"):
        if k not in cols.token:
            cols.token[k] = (np.zeros(0, dtype=np.float64), np.zeros(n + 1, dtype=np.int64), np.zeros(n, dtype=bool))


# ---------------------------------------------------------------------------- validation
# Each rule is a function that returns its problems as ``(row, field, expected, found)``; the rules
# of the columns see the rows already rejected (``bad``) and skip them, those of the aligned batch
# take its row ``j`` (column row ``good[j]``). validate_columns runs them in order.


def _first_per_row(rows: np.ndarray, pos: np.ndarray):
    """Unique rows with the first position flagged in each (inputs ordered by position)."""
    u, first = np.unique(rows, return_index=True)
    return u, pos[first]


def _identity_problems(cols: Columns, bad: np.ndarray, name: str) -> list[tuple]:
    """``traj_id``: a non-empty string; ``group_id``: a string."""
    out = []
    for i, v in enumerate(cols.scalar.get(name, np.full(cols.n, None, dtype=object))):
        if bad[i]:
            continue
        if name == "traj_id" and (not isinstance(v, str) or not v):
            out.append((i, name, "a non-empty string", short(v)))
        elif name == "group_id" and not isinstance(v, str):
            out.append((i, name, "a string", short(v)))
    return out


def _length_problems(cols: Columns, bad: np.ndarray, name: str) -> list[tuple]:
    """A per-token field has one item per response token."""
    rlen = np.diff(cols.token["response_ids"][1])
    _, off, pres = cols.token[name]
    flen = np.diff(off)
    return [
        (i, name, f"{rlen[i]} items (the length of response_ids)", f"{flen[i]}")
        for i in np.flatnonzero(pres & ~bad & (flen != rlen))
    ]


def _mask_problems(cols: Columns, bad: np.ndarray) -> list[tuple]:
    """``loss_mask``: 0 or 1 (the first other value of each row)."""
    mflat, moff, _ = cols.token["loss_mask"]
    badm = (mflat != 0) & (mflat != 1)
    if not badm.any():
        return []
    seg_m = np.repeat(np.arange(cols.n), np.diff(moff))
    pos = np.flatnonzero(badm)
    return [
        (i, "loss_mask", "0 or 1", f"{_num(mflat[p])} at position {p - moff[i]}")
        for i, p in zip(*_first_per_row(seg_m[pos], pos))
        if not bad[i]
    ]


def _binary_problems(cols: Columns, bad: np.ndarray, name: str) -> list[tuple]:
    """A flag (``clipped`` per token, ``turn_clipped`` per turn): 0 or 1, booleans accepted (the
    first other value of each row), on the raw values before they are narrowed to int8."""
    per_turn = name in cols.turn
    flat, off, pres = cols.turn[name] if per_turn else cols.token[name]
    badv = (flat != 0) & (flat != 1)
    if not badv.any():
        return []
    seg = np.repeat(np.arange(cols.n), np.diff(off))
    pos = np.flatnonzero(badv)
    where = "turn" if per_turn else "position"
    return [
        (i, name, "0 or 1 (or a boolean)", f"{_num(flat[p])} at {where} {p - off[i]}")
        for i, p in zip(*_first_per_row(seg[pos], pos))
        if pres[i] and not bad[i]
    ]


def _integer_problems(cols: Columns, bad: np.ndarray, name: str) -> list[tuple]:
    """``response_ids``, ``turn_ids``: integers >= 0 (raw values may be floats: 1.0 is 1)."""
    flat, off, _ = cols.token[name]
    nonint = ~np.isfinite(flat) | (flat != np.round(flat)) | (flat < 0) if flat.dtype.kind == "f" else flat < 0
    if not nonint.any():
        return []
    seg = np.repeat(np.arange(cols.n), np.diff(off))
    pos = np.flatnonzero(nonint)
    return [
        (i, name, "integers >= 0", f"{_num(flat[p])} at position {p - off[i]}")
        for i, p in zip(*_first_per_row(seg[pos], pos))
        if not bad[i]
    ]


def check_columns(cols: Columns, bad: np.ndarray) -> list[tuple]:
    """The rules of the raw columns, in order (identity, lengths, 0/1 mask, integers); ``bad`` is
    updated in place as rows fail, so that a row is not checked past what it failed."""
    rules: list[Callable[[], list[tuple]]] = [
        lambda: _identity_problems(cols, bad, "traj_id"),
        lambda: _identity_problems(cols, bad, "group_id"),
    ]
    rules += [partial(_length_problems, cols, bad, name) for name in cols.token if name != "response_ids"]
    rules += [partial(_mask_problems, cols, bad)]
    rules += [
        partial(_binary_problems, cols, bad, name) for name in BINARY_FIELDS if name in cols.token or name in cols.turn
    ]
    rules += [
        partial(_integer_problems, cols, bad, name) for name in ("response_ids", "turn_ids") if name in cols.token
    ]
    out = []
    for rule in rules:
        found = rule()
        for i, *_ in found:
            bad[i] = True
        out += found
    return out


def _turn_id_problems(bc, seg: np.ndarray, m: np.ndarray) -> list[tuple]:
    """``turn_ids``: non-decreasing; on action tokens 0..K-1 without gaps."""
    if "turn_ids" not in bc.tokens:
        return []
    off = bc.offsets
    t = bc.tokens["turn_ids"]
    row_has = np.repeat(bc.present["turn_ids"], np.diff(off))
    same_row = np.zeros(len(t), dtype=bool)
    same_row[1:] = seg[1:] == seg[:-1]
    dec = np.zeros(len(t), dtype=bool)
    dec[1:] = same_row[1:] & (t[1:] < t[:-1]) & row_has[1:]
    out = []
    if dec.any():
        pos = np.flatnonzero(dec)
        out += [
            (j, "turn_ids", "non-decreasing ids", f"{t[p - 1]} then {t[p]} at position {p - off[j]}")
            for j, p in zip(*_first_per_row(seg[pos], pos))
        ]
    act = np.flatnonzero(m & row_has)
    if not len(act):
        return out
    ar, at = seg[act], t[act]
    first = np.ones(len(act), dtype=bool)
    first[1:] = ar[1:] != ar[:-1]
    step = np.zeros(len(act), dtype=bool)
    step[1:] = ~first[1:] & ((at[1:] - at[:-1]) > 1)
    out += [
        (
            ar[k],
            "turn_ids",
            "turn 0 on the first action token (every turn id 0..K-1 needs an action token)",
            f"turn {at[k]} at position {act[k] - off[ar[k]]}",
        )
        for k in np.flatnonzero(first & (at != 0))
    ]
    if step.any():
        ks = np.flatnonzero(step)
        out += [
            (
                j,
                "turn_ids",
                "consecutive turn ids on action tokens (every id needs an action token)",
                f"{at[k - 1]} then {at[k]} at position {act[k] - off[j]}",
            )
            for j, k in zip(*_first_per_row(ar[ks], ks))
        ]
    return out


def _finite_problems(bc, seg: np.ndarray, m: np.ndarray) -> list[tuple]:
    """Values, log-probs and ratios: finite on action tokens; ratios also > 0 there."""
    out = []
    off = bc.offsets
    for name in FINITE_ON_ACTIONS:
        if name not in bc.tokens:
            continue
        row_has = np.repeat(bc.present[name], np.diff(off))
        x = bc.tokens[name]
        nf = m & row_has & ~np.isfinite(x)
        checks = [(nf, "finite numbers on action tokens")]
        if name in POSITIVE_FIELDS:
            checks.append((m & row_has & ~nf & (x <= 0), "ratios > 0 on action tokens"))
        for cond, expected in checks:
            if cond.any():
                pos = np.flatnonzero(cond)
                out += [
                    (j, name, expected, f"{_num(x[p])} at position {p - off[j]}")
                    for j, p in zip(*_first_per_row(seg[pos], pos))
                ]
    return out


def _token_truth_problems(bc, seg: np.ndarray, m: np.ndarray) -> list[tuple]:
    """The token truth (``mc_tok_*``, ``mpo-viz truth --tokens``): ``mc_tok_measured`` beside its numbers,
    1 only on action tokens; ``mc_tok_control`` only on measured tokens; where measured, the numbers
    finite, the standard error >= 0 and ``mc_tok_pi`` a probability (the first problem of each row)."""
    nums = [f for f in MC_TOKEN_NUMBERS if f in bc.tokens]
    if not nums and "mc_tok_measured" not in bc.tokens:
        return []
    off = bc.offsets
    out: list[tuple] = []

    def first(cond, name, expected, found):
        if cond.any():
            pos = np.flatnonzero(cond)
            out.extend((j, name, expected, found(p, j)) for j, p in zip(*_first_per_row(seg[pos], pos)))

    n = len(off) - 1

    def rows_with(name):
        return bc.present.get(name, np.ones(n, dtype=bool)) if name in bc.tokens else np.zeros(n, dtype=bool)

    has_meas = rows_with("mc_tok_measured")
    for f in nums:
        lacking = rows_with(f) & ~has_meas
        out += [
            (j, "mc_tok_measured", f"the measured tokens' 0/1 flags beside {f}", "nothing")
            for j in np.flatnonzero(lacking)
        ]
    if "mc_tok_measured" not in bc.tokens:
        return out
    meas = (bc.tokens["mc_tok_measured"] == 1) & np.repeat(has_meas, np.diff(off))
    first(
        meas & ~m,
        "mc_tok_measured",
        "1 only on action tokens (loss_mask == 1)",
        lambda p, j: f"1 at position {p - off[j]}, an observation token",
    )
    if "mc_tok_control" in bc.tokens:
        ctl = (bc.tokens["mc_tok_control"] == 1) & np.repeat(rows_with("mc_tok_control"), np.diff(off))
        first(
            ctl & ~meas,
            "mc_tok_control",
            "1 only on measured tokens (mc_tok_measured == 1)",
            lambda p, j: f"1 at position {p - off[j]}, a token not measured",
        )
    for f in nums:
        x = bc.tokens[f]
        at = meas & np.repeat(rows_with(f), np.diff(off))
        bad = at & ~np.isfinite(x)
        first(
            bad,
            f,
            "finite numbers where mc_tok_measured is 1",
            lambda p, j, x=x: f"{_num(x[p])} at position {p - off[j]}",
        )
        if f == "mc_tok_adv_se":
            first(
                at & ~bad & (x < 0),
                f,
                "standard errors >= 0",
                lambda p, j, x=x: f"{_num(x[p])} at position {p - off[j]}",
            )
        if f == "mc_tok_pi":
            first(
                at & ~bad & ((x < 0) | (x > 1)),
                f,
                "probabilities in [0, 1]",
                lambda p, j, x=x: f"{_num(x[p])} at position {p - off[j]}",
            )
    return out


def _token_reward_problems(bc, seg: np.ndarray, m: np.ndarray, reward: np.ndarray) -> list[tuple]:
    """``token_rewards``: finite, 0 on observation tokens, summing to a finite outcome ``reward``."""
    if "token_rewards" not in bc.tokens:
        return []
    off = bc.offsets
    tr = bc.tokens["token_rewards"]
    has = bc.present["token_rewards"]
    row_has = np.repeat(has, np.diff(off))
    out = []
    for cond, expected in (
        (row_has & ~np.isfinite(tr), "finite numbers"),
        (row_has & ~m & (tr != 0) & np.isfinite(tr), "0 on observation tokens (loss_mask == 0)"),
    ):
        if cond.any():
            pos = np.flatnonzero(cond)
            out += [
                (j, "token_rewards", expected, f"{_num(tr[p])} at position {p - off[j]}")
                for j, p in zip(*_first_per_row(seg[pos], pos))
            ]
    sums = np.zeros(len(has))
    np.add.at(sums, seg, np.where(row_has, np.nan_to_num(tr), 0.0))
    mism = has & np.isfinite(reward) & (np.abs(sums - reward) > REWARD_SUM_TOL)
    return out + [
        (j, "reward", f"the sum of token_rewards ({sums[j]:.9g}) within {REWARD_SUM_TOL:g}", f"{reward[j]:.9g}")
        for j in np.flatnonzero(mism)
    ]


def _turn_reward_problems(bc, k: np.ndarray) -> list[tuple]:
    """Every per-turn field (``turn_rewards``, the Monte-Carlo ``mc_*`` fields, ``turn_ratio``,
    ``turn_clipped``): one finite number per assistant turn; standard errors are also >= 0, ratios > 0."""
    out: list[tuple] = []
    for name in TURN_FIELDS:
        if name not in bc.turn:
            continue
        flat, toff, has = bc.turn[name]
        tl = np.diff(toff)
        out += [
            (j, name, f"{k[j]} entries (one per assistant turn)", f"{tl[j]}") for j in np.flatnonzero(has & (tl != k))
        ]
        for j in np.flatnonzero(has):
            vals = flat[toff[j] : toff[j + 1]]
            if not np.all(np.isfinite(vals)):
                out.append((j, name, "finite numbers", short(vals.tolist())))
            elif name.endswith("_se") and np.any(vals < 0):
                out.append((j, name, "standard errors >= 0", short(vals.tolist())))
            elif name in POSITIVE_FIELDS and np.any(vals <= 0):
                out.append((j, name, "ratios > 0", short(vals.tolist())))
    return out


def _reward_problems(bc, k: np.ndarray, reward: np.ndarray) -> list[tuple]:
    """A reward needs an action token to sit on; a bootstrap value is finite or NaN (terminal)."""
    has_tr = bc.present.get("token_rewards", np.zeros(len(k), dtype=bool))
    out: list[tuple] = [
        (j, "reward", "no reward on a trajectory with no action token (nowhere to put it)", f"{reward[j]}")
        for j in np.flatnonzero((k == 0) & np.isfinite(reward) & (reward != 0) & ~has_tr)
    ]
    bv = bc.scalars.get("bootstrap_value")
    if bv is not None:
        out += [
            (j, "bootstrap_value", "a finite number or NaN (terminal)", f"{x}")
            for j, x in enumerate(bv)
            if x is not None and math.isinf(float(x))
        ]
    return out


def check_rows(bc, num_turns: np.ndarray) -> list[tuple]:
    """The rules of the aligned rows (``bc``: a batch's :class:`~mpo_viz.data.ragged.BatchColumns`):
    turn ids, finite values, token and turn rewards, rewards without actions, bootstrap values.
    Rows are the batch's."""
    seg = row_index(bc.offsets)
    m = bc.tokens["loss_mask"] != 0
    reward = bc.scalars["reward"].astype(np.float64)
    return (
        _turn_id_problems(bc, seg, m)
        + _finite_problems(bc, seg, m)
        + _token_truth_problems(bc, seg, m)
        + _token_reward_problems(bc, seg, m, reward)
        + _turn_reward_problems(bc, num_turns)
        + _reward_problems(bc, num_turns, reward)
    )


def _duplicate_problems(cols: Columns, traj_ids, rows: np.ndarray, bad: np.ndarray, seen_ids) -> list[tuple]:
    """Duplicate trajectory ids, within these rows and, with ``seen_ids``, across chunks/files
    (``seen_ids`` updated in place). ``rows``: the column row of each id."""
    seen = seen_ids if seen_ids is not None else set()
    first_line: dict = {}
    out = []
    for t, i in zip(traj_ids, rows):
        if bad[i]:
            continue
        if t in seen or t in first_line:
            # where the first one is: "line 3" in the same file, "FILE, line 3" in another one; the
            # same words whether it lies in this chunk or an earlier one (a chunked pass says what a whole one does)
            first = first_line.get(t) or (seen[t] if isinstance(seen, dict) else None)
            if first is None:
                where = " (seen earlier)"
            elif first[0] == cols.where(i)["file"] or first[0] is None:
                where = f" (first at {first[1]})"
            else:
                where = f" (first in {first[0]}, {first[1]})"
            out.append((i, "traj_id", "a unique traj_id", f"a duplicate of {t!r}{where}"))
        else:
            w = cols.where(i)
            first_line[t] = (w["file"], f"line {w['line']}" if w["line"] is not None else f"row {w['row']}")
    seen.update(first_line)
    return out


def validate_columns(cls, cols: Columns, meta, problems: list[Problem], *, seen_ids=None):
    """Run every v1 rule over ``cols``; return ``(batch of good rows, all problems)``.

    The phases: :func:`check_columns` on the raw columns; the surviving rows aligned
    (:func:`aligned_columns`) and built by ``cls`` (``TrajectoryBatch``, called with them as keyword
    arguments); :func:`check_rows` on the batch's columns; duplicate ``traj_id`` s last. Each phase
    returns its problems, which name the file, line/row, traj_id, field, expected and found.

    ``seen_ids`` (a set, or a dict traj_id -> (file, "line/row N") to name the first occurrence;
    updated in place) carries traj_ids across chunks/files so duplicates are found across a whole
    folder or scan.
    """
    bad = cols.bad.copy() if cols.bad is not None else np.zeros(cols.n, dtype=bool)
    found = check_columns(cols, bad)
    good = np.flatnonzero(~bad)  # batch row j is cols row good[j]
    batch = cls(**aligned_columns(cols, good), meta=meta)
    rows = [(good[j], *rest) for j, *rest in check_rows(batch.columns, batch.num_turns)]
    for i, *_ in rows:
        bad[i] = True
    found += rows
    found += _duplicate_problems(cols, batch.columns.scalars["traj_id"], good, bad, seen_ids)
    for i, *_ in found:
        bad[i] = True
    problems = list(problems) + [_problem(cols, int(i), *rest) for i, *rest in found]
    keep = np.flatnonzero(~bad[good])
    out = batch if len(keep) == len(batch) else batch[keep]
    problems.sort(key=lambda p: (str(p.file), p.line if p.line is not None else -1, p.row if p.row is not None else -1))
    return out, problems


def aligned_columns(cols: Columns, good: np.ndarray) -> dict:
    """Rows ``good`` of ``cols`` with every token field aligned to response_ids: the keyword
    arguments a :class:`~mpo_viz.data.trajectory.TrajectoryBatch` builds itself from (but ``meta``)."""
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
    if cols.prompt is None:
        raise ValueError("columns: expected prompt_ids columns (the readers always set them), found none")
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
    return {
        "offsets": off,
        "tokens": tokens,
        "present": present,
        "prompt": (pf.astype(np.int64), po),
        "turn": turn,
        "scalars": scalars,
        "extras": extras,
    }
