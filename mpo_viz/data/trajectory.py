"""TrajectoryBatch: ragged trajectory/v1 rows held column-wise, with padded torch views.

Storage is columnar and flat, like Arrow list arrays: every per-token field is one flat numpy array
over all response tokens of the batch plus the shared ``offsets`` (B+1,); rows are
``flat[offsets[i]:offsets[i+1]]``. Loading Parquet therefore never creates per-token Python
objects, and padded ``(B, L)`` tensors are one vectorized scatter.

Derived per-token arrays follow docs/concepts.md §1 and §3 and are computed once, lazily:

* ``turn_ids`` — the given ids, or for rows without them the maximal runs of ``loss_mask == 1``
  (:func:`mpo_viz.data.turns.turn_ids_from_mask`); padding carries the row's last id.
* ``rewards`` — ``token_rewards`` where a row has them; otherwise the outcome ``reward`` (NaN → 0)
  on the row's last action token plus ``turn_rewards[k]`` on turn k's last action token.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from mpo_viz.data.ragged import (
    BatchColumns,
    offsets_from_lengths,
    row_index,
    take,
    turn_ids_from_mask_flat,
)
from mpo_viz.data.schema import (
    BINARY_FIELDS,
    EXTRA_TOKEN_DTYPE,
    REQUIRED,
    SCALAR_FIELDS,
    SCHEMA_VERSION,
    TOKEN_FIELDS,
    TURN_FIELDS,
    Problem,
    TrajectoryError,
    short,
)
from mpo_viz.data.summary import row_numbers, row_sums, summarize_rows
from mpo_viz.data.turns import mc_turn_advantage
from mpo_viz.data.validate import Columns, columns_from_rows, validate_columns

__all__ = ["TrajectoryBatch", "row_to_json", "TURN_TABLE_FIELDS"]

#: per-turn fields the per-turn table (:meth:`TrajectoryBatch.turns`) shows as columns of their own
#: name when the batch carries them: what a trainer's update did to each turn
TURN_TABLE_FIELDS = ("turn_ratio", "turn_clipped")

_EMPTY_OFF = np.zeros(1, dtype=np.int64)


class TrajectoryBatch:
    """A batch of trajectory/v1 rows (the format: trajectories/README.md).

    Build with :meth:`from_rows` (list of dicts) or :func:`mpo_viz.load`. Select with ``b[i]``,
    ``b[slice | index list | bool array]`` or :meth:`select`; join with :meth:`concat`.

    Padded views (right padding, shape ``(B, L)`` with ``L`` the longest response): ``mask``
    (float32 0/1), ``turn_ids`` (int64), ``rewards`` (float32), ``values`` (float32 or None),
    ``lengths`` (int64 ``(B,)``), ``bootstrap_value`` (float64 ``(B,)``, NaN = terminal) and
    :meth:`padded` for any per-token field.
    """

    # ------------------------------------------------------------------ construction
    def __init__(
        self,
        *,
        offsets: np.ndarray,
        tokens: dict[str, np.ndarray],
        present: dict[str, np.ndarray],
        prompt: tuple[np.ndarray, np.ndarray],
        turn: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
        scalars: dict[str, np.ndarray],
        extras: dict[str, np.ndarray],
        meta: dict | None = None,
        rejected: list[Problem] | None = None,
    ):
        self._off = offsets
        self._tok = tokens  # name -> flat array aligned with offsets
        self._present = present  # optional token field -> bool (B,): does the row carry it
        self._prompt = prompt  # (flat int64, offsets)
        self._turn = turn  # name -> (flat, offsets, present)
        self._scalars = scalars  # name -> (B,) array (object for optional / str fields)
        self._extras = extras  # name -> (B,) object array of opaque per-row values
        self.meta: dict = dict(meta or {})
        self.meta.setdefault("schema", SCHEMA_VERSION)
        self.rejected: list[Problem] = list(rejected or [])
        self._cache: dict[str, Any] = {}

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[dict],
        meta: dict | None = None,
        *,
        errors: str = "raise",
        source: str | None = None,
        lines: Sequence[int] | None = None,
    ) -> TrajectoryBatch:
        """Validate rows (dicts of v1 fields) and build a batch.

        ``errors="raise"`` (default) raises :class:`TrajectoryError` on the first problem (its
        ``problems`` lists all); ``"collect"`` returns the good rows with ``batch.rejected`` listing
        every rejected row and why. ``source``/``lines`` name the file and 1-based line of each row
        for messages.
        """
        rows = list(rows)
        cols, problems = columns_from_rows(rows, source=source, lines=lines)
        return cls.from_columns(cols, meta, problems=problems, errors=errors)

    @classmethod
    def from_columns(
        cls, columns: Columns, meta: dict | None = None, *, problems=None, errors: str = "raise", seen_ids=None
    ) -> TrajectoryBatch:
        """Validate reader columns (:class:`mpo_viz.data.validate.Columns`: flat arrays + offsets per
        field, as the JSONL and Parquet readers produce them) and build a batch.

        ``problems``: problems the reader already found (unreadable lines, wrong Arrow types);
        ``errors`` as :meth:`from_rows`; ``seen_ids``: a dict carried across calls so that a
        duplicate ``traj_id`` is found across the chunks and files of one load.
        """
        cols = columns
        if errors not in ("raise", "collect"):
            raise ValueError(f"errors: expected 'raise' or 'collect', found {errors!r}")
        batch, problems = validate_columns(cls, cols, meta, problems or [], seen_ids=seen_ids)
        if problems and errors == "raise":
            raise TrajectoryError(problems)
        batch.rejected = problems
        return batch

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return len(self._off) - 1

    @property
    def offsets(self) -> np.ndarray:
        """int64 ``(B+1,)``: row i's response tokens are ``offsets[i]:offsets[i+1]`` of every flat column."""
        return self._off

    @property
    def columns(self) -> BatchColumns:
        """The batch's storage (:class:`mpo_viz.data.ragged.BatchColumns`), shared, not copied: read only."""
        return BatchColumns(self._off, self._tok, self._present, self._prompt, self._turn, self._scalars, self._extras)

    def __repr__(self) -> str:
        fields = sorted(self.fields)
        return (
            f"TrajectoryBatch({len(self)} trajectories, {self.num_tokens} response tokens, "
            f"{int(self.num_turns.sum())} turns, fields={fields}"
            + (f", rejected={len(self.rejected)}" if self.rejected else "")
            + ")"
        )

    @property
    def num_tokens(self) -> int:
        return int(self._off[-1])

    def clear_cache(self) -> None:
        """Forget the flat arrays derived on first use and kept for the next (each token's row and
        position, turn id, the rewards an estimator sees: about 32 bytes a token); they are rebuilt
        when next asked for. For a long-lived batch whose padded views are no longer needed (a
        critic fit keeps its own rows)."""
        self._cache.clear()

    @property
    def fields(self) -> set[str]:
        """The v1 (and extra) fields present in at least one row."""
        out = set(REQUIRED)
        out |= {k for k, p in self._present.items() if p.any()}
        out |= {k for k, v in self._turn.items() if v[2].any()}
        out |= {k for k, v in self._scalars.items() if k in REQUIRED or any(x is not None for x in v)}
        out |= set(self._extras)
        return out

    @property
    def token_fields(self) -> list[str]:
        """Per-token fields present, v1 fields first in schema order, then extras."""
        v1 = [f for f in TOKEN_FIELDS if f in self._tok and (f not in self._present or self._present[f].any())]
        extra = [f for f in self._tok if f not in TOKEN_FIELDS and self._present[f].any()]
        return v1 + extra

    def has(self, field: str) -> bool:
        """Whether at least one row carries ``field`` (cheap: no scan of scalar columns unless asked).
        An empty batch (e.g. ``batch[0:0]``) has the columns of the batch it came from."""
        if field in REQUIRED:
            return True
        if field in self._present:
            return bool(self._present[field].any()) or len(self) == 0
        if field in self._turn:
            return bool(self._turn[field][2].any()) or len(self) == 0
        if field in self._scalars:
            return any(x is not None for x in self._scalars[field]) or len(self) == 0
        return field in self._extras

    @property
    def traj_ids(self) -> list[str]:
        return list(self._scalars["traj_id"])

    @property
    def group_ids(self) -> list[str]:
        return list(self._scalars["group_id"])

    @property
    def outcome_reward(self) -> np.ndarray:
        """Outcome reward per trajectory, float64 ``(B,)`` (NaN = no outcome reward)."""
        return self._scalars["reward"].astype(np.float64)

    @property
    def lengths(self) -> torch.Tensor:
        """Response length per row, int64 ``(B,)``."""
        return torch.from_numpy(np.diff(self._off))

    @property
    def _seg(self) -> np.ndarray:
        if "seg" not in self._cache:
            self._cache["seg"] = row_index(self._off)
        return self._cache["seg"]

    @property
    def _pos(self) -> np.ndarray:
        if "pos" not in self._cache:
            self._cache["pos"] = np.arange(self.num_tokens, dtype=np.int64) - np.repeat(
                self._off[:-1], np.diff(self._off)
            )
        return self._cache["pos"]

    # ------------------------------------------------------------------ derived flat arrays
    def _flat_turn_ids(self) -> np.ndarray:
        if "turn_ids" not in self._cache:
            derived = turn_ids_from_mask_flat(self._tok["loss_mask"], self._off)
            if "turn_ids" in self._tok:
                given = np.repeat(self._present["turn_ids"], np.diff(self._off))
                derived = np.where(given, self._tok["turn_ids"], derived)
            self._cache["turn_ids"] = derived
        return self._cache["turn_ids"]

    def _action_turn_ends(self):
        """Flat positions of the last action token of every turn, with their row and turn id.

        Returns ``(pos, row, turn)``; turns are ordered by row then turn id.
        """
        if "turn_ends" not in self._cache:
            act = np.flatnonzero(self._tok["loss_mask"] != 0)
            rows = self._seg[act]
            tids = self._flat_turn_ids()[act]
            last = np.ones(len(act), dtype=bool)
            if len(act) > 1:
                last[:-1] = (rows[1:] != rows[:-1]) | (tids[1:] != tids[:-1])
            self._cache["turn_ends"] = (act[last], rows[last], tids[last])
        return self._cache["turn_ends"]

    @property
    def num_turns(self) -> np.ndarray:
        """K per row: the number of assistant turns (distinct turn ids on action tokens), int64 ``(B,)``."""
        if "K" not in self._cache:
            _, rows, tids = self._action_turn_ends()
            k = np.zeros(len(self), dtype=np.int64)
            np.maximum.at(k, rows, tids + 1)
            self._cache["K"] = k
        return self._cache["K"]

    def _flat_rewards(self) -> np.ndarray:
        """Rewards an estimator sees, flat float64 (docs/concepts.md §3)."""
        if "rewards" not in self._cache:
            n = self.num_tokens
            out = np.zeros(n, dtype=np.float64)
            pos, rows, tids = self._action_turn_ends()
            has_tok = self._present.get("token_rewards", np.zeros(len(self), dtype=bool))
            # outcome reward on each row's last action token
            if len(pos):
                row_last = np.ones(len(pos), dtype=bool)
                row_last[:-1] = rows[1:] != rows[:-1]
                r = np.nan_to_num(self.outcome_reward[rows[row_last]], nan=0.0)
                np.add.at(out, pos[row_last], r)
                if "turn_rewards" in self._turn:
                    flat, toff, tpres = self._turn["turn_rewards"]
                    sel = tpres[rows]
                    np.add.at(out, pos[sel], flat[toff[rows[sel]] + tids[sel]])
            if has_tok.any():
                tok_rows = np.repeat(has_tok, np.diff(self._off))
                out[tok_rows] = self._tok["token_rewards"][tok_rows]
            self._cache["rewards"] = out
        return self._cache["rewards"]

    # ------------------------------------------------------------------ padded torch views
    def _pad(self, flat: np.ndarray, dtype, fill) -> np.ndarray:
        lmax = int(np.diff(self._off).max()) if len(self) else 0
        out = np.full((len(self), lmax), fill, dtype=dtype)
        out[self._seg, self._pos] = flat
        return out

    def padded(self, field: str, dtype: torch.dtype | None = None, fill: float = 0.0) -> torch.Tensor:
        """Right-padded ``(B, L)`` tensor of a per-token field (v1 or extra, or ``rewards``/``turn_ids``).

        Rows that do not carry an optional field get ``fill`` (0 by default; pass ``fill=float('nan')``
        to see which). Float fields default to float32, integer fields to int64.
        """
        if field == "rewards":
            flat = self._flat_rewards()
        elif field == "turn_ids":
            ids = self._pad(self._flat_turn_ids(), np.int64, -1)
            ids = np.maximum(np.maximum.accumulate(ids, axis=1), 0) if ids.size else ids
            t = torch.from_numpy(ids)
            return t if dtype is None else t.to(dtype)
        elif field == "mask":
            flat = self._tok["loss_mask"]
            dtype = dtype or torch.float32
        elif field in self._tok:
            flat = self._tok[field]
            if flat.dtype == object:
                raise ValueError(f"field {field!r} holds strings; use batch.field({field!r})")
            if field in self._present and not self._present[field].all():
                flat = np.where(np.repeat(self._present[field], np.diff(self._off)), flat, fill)
        else:
            raise KeyError(f"no per-token field {field!r} in this batch (present: {self.token_fields})")
        if dtype is None:
            dtype = torch.int64 if np.issubdtype(flat.dtype, np.integer) else torch.float32
        np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        return torch.from_numpy(self._pad(flat.astype(np_dtype, copy=False), np_dtype, fill))

    @property
    def mask(self) -> torch.Tensor:
        """``loss_mask`` padded, float32 ``(B, L)``: 1 on action tokens."""
        return self.padded("mask")

    @property
    def turn_ids(self) -> torch.Tensor:
        """Turn ids padded, int64 ``(B, L)`` (given, or derived from mask runs); padding carries the last id."""
        return self.padded("turn_ids")

    @property
    def token_rewards(self) -> torch.Tensor:
        """Token rewards an estimator sees (docs/concepts.md §3), float32 ``(B, L)``;
        ``padded('rewards', torch.float64)`` for float64."""
        return self.padded("rewards")

    @property
    def values(self) -> torch.Tensor | None:
        """Critic values padded, float32 ``(B, L)``, or None when no row has values."""
        return self.padded("values") if self.has("values") else None

    @property
    def bootstrap_value(self) -> torch.Tensor:
        """Bootstrap value per row, float64 ``(B,)``; NaN = terminal (also where absent)."""
        v = self._scalars.get("bootstrap_value")
        if v is None:
            return torch.full((len(self),), float("nan"), dtype=torch.float64)
        return torch.tensor([math.nan if x is None else float(x) for x in v], dtype=torch.float64)

    # ------------------------------------------------------------------ ragged access
    def field(self, name: str) -> list:
        """A field as a list over rows: numpy arrays for per-token / per-turn / prompt fields (None
        where a row lacks it), Python values for scalars."""
        if name == "prompt_ids":
            flat, off = self._prompt
            return [flat[off[i] : off[i + 1]] for i in range(len(self))]
        if name == "turn_ids":
            flat = self._flat_turn_ids()
            return [flat[self._off[i] : self._off[i + 1]] for i in range(len(self))]
        if name == "rewards":
            flat = self._flat_rewards()
            return [flat[self._off[i] : self._off[i + 1]] for i in range(len(self))]
        if name in self._tok:
            flat, pres = self._tok[name], self._present.get(name)
            return [
                flat[self._off[i] : self._off[i + 1]] if pres is None or pres[i] else None for i in range(len(self))
            ]
        if name in self._turn:
            flat, off, pres = self._turn[name]
            return [flat[off[i] : off[i + 1]] if pres[i] else None for i in range(len(self))]
        if name in self._scalars:
            return [None if x is None and name != "reward" else _py(x) for x in self._scalars[name]]
        if name in self._extras:
            return list(self._extras[name])
        raise KeyError(f"no field {name!r} in this batch (present: {sorted(self.fields)})")

    def row(self, i: int) -> dict:
        """Row ``i`` as a dict of v1 fields (lists and Python scalars), absent optional fields omitted.

        Derived turn ids are not added: ``turn_ids`` appears only when the row carries it.
        """
        i = int(i) % len(self) if len(self) else int(i)
        a, b = self._off[i], self._off[i + 1]
        out: dict = {}
        for name, v in self._scalars.items():
            x = v[i]
            if name in REQUIRED or x is not None:
                out[name] = _py(x)
        pf, po = self._prompt
        out["prompt_ids"] = pf[po[i] : po[i + 1]].tolist()
        for name, flat in self._tok.items():
            if name in self._present and not self._present[name][i]:
                continue
            out[name] = flat[a:b].tolist()
        for name, (flat, off, pres) in self._turn.items():
            if pres[i]:
                out[name] = flat[off[i] : off[i + 1]].tolist()
        for name, v in self._extras.items():
            if v[i] is not None:
                out[name] = v[i]
        return out

    def rows(self):
        """Iterate over rows as dicts (see :meth:`row`)."""
        for i in range(len(self)):
            yield self.row(i)

    # ------------------------------------------------------------------ selection and joining
    def __getitem__(self, key) -> TrajectoryBatch:
        if isinstance(key, (int, np.integer)):
            n = len(self)
            if not -n <= key < n:
                raise IndexError(f"row {key} out of range for a batch of {n}")
            return self._subset(np.array([key % n]))
        if isinstance(key, str):
            return self.select(traj_ids=[key])
        if isinstance(key, slice):
            return self._subset(np.arange(len(self))[key])
        if isinstance(key, torch.Tensor):
            key = key.cpu().numpy()
        idx = np.asarray(key)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise IndexError(f"boolean selection: expected shape ({len(self)},), found {idx.shape}")
            idx = np.flatnonzero(idx)
        elif idx.dtype.kind in "US" or idx.dtype == object:
            return self.select(traj_ids=list(idx))
        return self._subset(idx.astype(np.int64))

    def select(self, *, traj_ids: Sequence[str]) -> TrajectoryBatch:
        """Rows with the given trajectory ids, in the order given (KeyError names a missing id)."""
        where = {t: i for i, t in enumerate(self._scalars["traj_id"])}
        missing = [t for t in traj_ids if t not in where]
        if missing:
            raise KeyError(f"traj_id not in batch: {short(missing)}")
        return self._subset(np.array([where[t] for t in traj_ids], dtype=np.int64))

    def _subset(self, idx: np.ndarray) -> TrajectoryBatch:
        idx = np.asarray(idx, dtype=np.int64)
        n = len(self)
        if len(idx) and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"row index out of range for a batch of {n}")
        idx = idx % max(n, 1)
        tokens, off = {}, None
        for name, flat in self._tok.items():
            tokens[name], off = take(flat, self._off, idx)
        if off is None:
            off = offsets_from_lengths(np.diff(self._off)[idx])
        pf, po = take(*self._prompt, idx)
        turn = {}
        for name, (flat, toff, pres) in self._turn.items():
            f2, o2 = take(flat, toff, idx)
            turn[name] = (f2, o2, pres[idx])
        return TrajectoryBatch(
            offsets=off,
            tokens=tokens,
            present={k: v[idx] for k, v in self._present.items()},
            prompt=(pf, po),
            turn=turn,
            scalars={k: v[idx] for k, v in self._scalars.items()},
            extras={k: v[idx] for k, v in self._extras.items()},
            meta=self.meta,
        )

    @classmethod
    def concat(cls, batches: Sequence[TrajectoryBatch]) -> TrajectoryBatch:
        """Join batches row-wise. Fields missing from some batches become absent in those rows.

        Raises ValueError on a duplicate traj_id. Metadata comes from the first batch; rejected
        lists are joined.
        """
        batches = list(batches)
        if not batches:
            raise ValueError("concat: expected at least one batch, found none")
        if len(batches) == 1:
            return batches[0]
        tokens, present = _concat_tokens(batches)
        prompt = (
            np.concatenate([b._prompt[0] for b in batches]),
            offsets_from_lengths(np.concatenate([np.diff(b._prompt[1]) for b in batches])),
        )
        n_each = [len(b) for b in batches]
        scalars = _concat_objects([b._scalars for b in batches], n_each)
        scalars["reward"] = scalars["reward"].astype(np.float64)
        ids = scalars["traj_id"]
        if len(set(ids)) != len(ids):
            seen, dup = set(), None
            for t in ids:
                if t in seen:
                    dup = t
                    break
                seen.add(t)
            raise ValueError(f"concat: duplicate traj_id {dup!r}")
        return cls(
            offsets=offsets_from_lengths(np.concatenate([np.diff(b._off) for b in batches])),
            tokens=tokens,
            present=present,
            prompt=prompt,
            turn=_concat_turns(batches),
            scalars=scalars,
            extras=_concat_objects([b._extras for b in batches], n_each),
            meta=batches[0].meta,
            rejected=[p for b in batches for p in b.rejected],
        )

    def with_token_fields(self, **fields) -> TrajectoryBatch:
        """A new batch with extra per-token float fields (e.g. ``adv_mpo=adv``).

        Each value is a padded ``(B, L')`` tensor/array with ``L' >= `` each row's length (padding
        ignored) or a list of per-row arrays of exactly the row lengths. Stored as float32; saved
        and loaded like any other column.
        """
        tokens = dict(self._tok)
        present = dict(self._present)
        lengths = np.diff(self._off)
        for name, value in fields.items():
            if name in REQUIRED or name in ("mask", "rewards"):
                raise ValueError(f"with_token_fields: {name!r} is a reserved field name")
            if isinstance(value, (list, tuple)):
                if len(value) != len(self):
                    raise ValueError(f"{name}: expected {len(self)} rows, found {len(value)}")
                arrs = [np.asarray(v, dtype=np.float64).reshape(-1) for v in value]
                for i, (a, n) in enumerate(zip(arrs, lengths)):
                    if len(a) != n:
                        raise ValueError(f"{name}: row {i}: expected {n} values (the response length), found {len(a)}")
                flat = np.concatenate(arrs) if arrs else np.zeros(0)
            else:
                arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
                if arr.ndim != 2 or arr.shape[0] != len(self) or (len(self) and arr.shape[1] < lengths.max()):
                    raise ValueError(
                        f"{name}: expected shape ({len(self)}, >= {int(lengths.max()) if len(self) else 0}), found "
                        f"{arr.shape}"
                    )
                flat = arr[self._seg, self._pos]
            dtype = TOKEN_FIELDS.get(name, EXTRA_TOKEN_DTYPE)
            _check_binary(name, flat)
            tokens[name] = flat.astype(dtype)
            present[name] = np.ones(len(self), dtype=bool)
        return self._replace(tokens=tokens, present=present)

    def with_turn_fields(self, **fields) -> TrajectoryBatch:
        """A new batch with per-turn fields set (e.g. ``mc_value=[[...], ...]``): each value a list of
        one sequence per row with one number per assistant turn (``num_turns``), or None for a row
        without. Only the v1 per-turn fields (``turn_rewards``, the Monte-Carlo ``mc_*`` fields, the
        update's ``turn_ratio`` and ``turn_clipped``)."""
        turn = dict(self._turn)
        k = self.num_turns
        for name, value in fields.items():
            if name not in TURN_FIELDS:
                raise ValueError(
                    f"with_turn_fields: expected a v1 per-turn field ({', '.join(TURN_FIELDS)}), found {name!r}"
                )
            v = list(value)
            if len(v) != len(self):
                raise ValueError(f"{name}: expected {len(self)} rows, found {len(v)}")
            arrs = [np.zeros(0) if x is None else np.asarray(x, dtype=np.float64).reshape(-1) for x in v]
            for i, a in enumerate(arrs):
                if v[i] is not None and len(a) != k[i]:
                    raise ValueError(
                        f"{name}: row {i} ({self.traj_ids[i]!r}): expected {k[i]} entries (one per "
                        f"assistant turn), found {len(a)}"
                    )
            flat = np.concatenate(arrs) if arrs else np.zeros(0)
            _check_binary(name, flat)
            turn[name] = (
                flat.astype(TURN_FIELDS[name]),
                offsets_from_lengths(np.asarray([len(a) for a in arrs])),
                np.asarray([x is not None for x in v], dtype=bool),
            )
        return self._replace(turn=turn)

    def with_scalars(self, **fields) -> TrajectoryBatch:
        """A new batch with per-row scalar fields set (e.g. ``bootstrap_value=v``): each value a
        sequence of one entry per row (None or NaN where a row has none). Only the v1 scalar fields
        (``bootstrap_value``, ``step``, ...; not the identity fields ``traj_id``/``group_id``/``reward``)."""
        scalars = dict(self._scalars)
        for name, value in fields.items():
            if name not in SCALAR_FIELDS or name in REQUIRED:
                raise ValueError(
                    f"with_scalars: expected an optional v1 scalar field "
                    f"({', '.join(k for k in SCALAR_FIELDS if k not in REQUIRED)}), found {name!r}"
                )
            v = list(value)
            if len(v) != len(self):
                raise ValueError(f"{name}: expected {len(self)} rows, found {len(v)}")
            scalars[name] = np.array([None if x is None else _py(x) for x in v], dtype=object)
        return self._replace(scalars=scalars)

    def with_meta(self, **entries) -> TrajectoryBatch:
        """A new batch whose file metadata has ``entries`` added (this batch's is left as it is)."""
        return self._replace(meta={**self.meta, **entries})

    def _replace(self, **parts) -> TrajectoryBatch:
        kw: dict[str, Any] = dict(
            offsets=self._off,
            tokens=self._tok,
            present=self._present,
            prompt=self._prompt,
            turn=self._turn,
            scalars=self._scalars,
            extras=self._extras,
            meta=self.meta,
            rejected=self.rejected,
        )
        kw.update(parts)
        return TrajectoryBatch(**kw)

    # ------------------------------------------------------------------ pandas views
    def to_pandas(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """One row per response token: ``traj_id``, ``group_id``, ``position`` and every per-token
        field under its v1 name (``response_ids``, ``loss_mask``, ``turn_ids`` — given or derived —,
        ``values``, ``response_tokens``, …, extras), plus ``rewards`` (the rewards an estimator sees).
        Rows lacking an optional float field show NaN there. ``columns`` selects and orders columns.
        """
        seg = self._seg
        data: dict[str, object] = {
            "traj_id": self._scalars["traj_id"][seg],
            "group_id": self._scalars["group_id"][seg],
            "position": self._pos,
        }
        for name in self.token_fields:
            flat = self._tok[name]
            if name == "turn_ids":
                continue
            if name in self._present and not self._present[name].all():
                row_has = np.repeat(self._present[name], np.diff(self._off))
                if flat.dtype == object:
                    flat = np.where(row_has, flat, np.array(None, dtype=object))
                else:
                    flat = np.where(row_has, flat.astype(np.float64), np.nan)
            data[name] = flat
            if name == "loss_mask":
                data["turn_ids"] = self._flat_turn_ids()
        data["rewards"] = self._flat_rewards()
        df = pd.DataFrame(data)
        if columns is not None:
            missing = [c for c in columns if c not in df.columns]
            if missing:
                raise KeyError(f"to_pandas: unknown columns {missing}; available: {list(df.columns)}")
            df = df[list(columns)]
        return df

    def turns(self, advantages: dict | None = None, returns: dict | None = None) -> pd.DataFrame:
        """The per-turn table: one row per assistant turn, in row then turn order.

        The one per-turn table of the package (``compute(...).turns``, ``analysis.turn_table``, the
        report, the explorer's turn table and the comparison all build it here); its columns are
        documented in docs/concepts.md ("The per-turn table"):

        * ``traj_id``, ``group_id``, ``row`` (index in the batch), ``turn`` (k);
        * ``start`` / ``end``: response positions of the turn's first / last action token;
        * ``n_tokens`` (action tokens), ``n_obs_after`` (observation tokens between the turn's last
          action token and the next turn or the end of the response);
        * ``reward``: ``R_k``, the sum of the rewards an estimator sees on the turn's tokens;
        * with values: ``value_first`` (``V(s_k)``), ``value_mean``, ``value_last`` over the turn's
          action tokens (NaN for a row without values);
        * for each ``name`` of ``advantages`` (``{name: (B, L) tensor or array, or an object with
          .advantages}``): ``adv_<name>``, the mean advantage over the turn's action tokens (for
          MAE and turn GAE without whitening exactly ``A^T_k``);
        * for each ``name`` of ``returns`` (``{name: (B, L)}``, or objects with ``.returns``):
          ``ret_<name>``, the return at the turn's first action token (comparable to ``value_first``);
        * with the Monte-Carlo truth of ``mpo-viz truth`` (``mc_*`` fields): ``v_mc``, ``v_mc_se``
          (the policy's own value at the turn's start and its standard error) and ``a_mc`` (its
          true turn advantage: ``mc_q − mc_value``, else ``R_k + v_mc(k+1) − v_mc(k)``);
        * with the fields a trainer's update writes (:data:`TURN_TABLE_FIELDS`): ``turn_ratio`` (the
          turn's ratio after the update) and ``turn_clipped`` (1: it left the loss's clip band), NaN
          for a row without them.
        """
        act = np.flatnonzero(self._tok["loss_mask"] != 0)
        rows = self._seg[act]
        tids = self._flat_turn_ids()[act]
        first = np.ones(len(act), dtype=bool)
        if len(act) > 1:
            first[1:] = (rows[1:] != rows[:-1]) | (tids[1:] != tids[:-1])
        starts = np.flatnonzero(first)
        end_pos, end_rows, end_tids = self._action_turn_ends()
        n_tok = np.diff(np.append(starts, len(act)))
        trow = rows[starts]
        pos = self._pos[act]
        data = {
            "traj_id": self._scalars["traj_id"][trow],
            "group_id": self._scalars["group_id"][trow],
            "row": trow,
            "turn": tids[starts],
            "start": pos[starts],
            "end": self._pos[end_pos],
            "n_tokens": n_tok,
        }
        # next turn's first action token, or the row end
        nxt = np.empty(len(starts), dtype=np.int64)
        if len(starts):
            nxt[:-1] = np.where(trow[1:] == trow[:-1], act[starts[1:]], self._off[trow[:-1] + 1])
            nxt[-1] = self._off[trow[-1] + 1]
        data["n_obs_after"] = nxt - end_pos - 1

        def per_turn_sum(x):
            return np.add.reduceat(x, starts) if len(starts) else np.zeros(0)

        data["reward"] = per_turn_sum(self._flat_rewards()[act])
        if self.has("values"):
            v = self._tok["values"].astype(np.float64)
            if not self._present["values"].all():
                v = np.where(np.repeat(self._present["values"], np.diff(self._off)), v, np.nan)
            va = v[act]
            data["value_first"] = va[starts] if len(starts) else np.zeros(0)
            data["value_mean"] = per_turn_sum(va) / n_tok if len(starts) else np.zeros(0)
            data["value_last"] = v[end_pos]
        if "mc_value" in self._turn and len(starts):
            self._mc_columns(data, trow)
        for name in TURN_TABLE_FIELDS:
            if name in self._turn and self.has(name):
                data[name] = self._turn_column(name, trow)
        for what, tensors in (("adv", advantages), ("ret", returns)):
            for name, x in (tensors or {}).items():
                x = getattr(x, "advantages" if what == "adv" else "returns", x)
                x = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x, dtype=np.float64)
                if (
                    x.ndim != 2
                    or x.shape[0] != len(self)
                    or x.shape[1] < (int(np.diff(self._off).max()) if len(self) else 0)
                ):
                    raise ValueError(
                        f"{'advantages' if what == 'adv' else 'returns'}[{name!r}]: expected a (B, L) "
                        f"tensor with B = {len(self)} and L >= the longest response, found shape {x.shape}"
                    )
                xa = x[rows, pos]
                data[f"{what}_{name}"] = (
                    per_turn_sum(xa) / np.maximum(n_tok, 1)
                    if what == "adv"
                    else (xa[starts] if len(starts) else np.zeros(0))
                )
        return pd.DataFrame(data)

    def _turn_column(self, name: str, trow: np.ndarray) -> np.ndarray:
        """A per-turn field aligned with the turn table's rows (NaN for a row without it)."""
        flat, off, pres = self._turn[name]
        out = np.full(len(trow), np.nan)
        k = self.num_turns
        first = np.concatenate([[0], np.cumsum(k)[:-1]]) if len(k) else np.zeros(0, dtype=np.int64)
        for i in np.flatnonzero(pres):
            out[first[i] : first[i] + k[i]] = flat[off[i] : off[i + 1]]
        return out

    def _mc_columns(self, data: dict, trow: np.ndarray) -> None:
        """``v_mc`` / ``v_mc_se`` (the policy's Monte-Carlo value at the turn's start) and ``a_mc``
        (its true turn advantage, :func:`~mpo_viz.data.turns.mc_turn_advantage`) from the ``mc_*`` fields."""
        v = self._turn_column("mc_value", trow)
        data["v_mc"] = v
        if "mc_value_se" in self._turn:
            data["v_mc_se"] = self._turn_column("mc_value_se", trow)
        q = self._turn_column("mc_q", trow) if "mc_q" in self._turn else None
        data["a_mc"] = mc_turn_advantage(v, data["reward"], trow, q=q)

    def row_scores(self) -> np.ndarray:
        """Each row's score: the sum of the rewards an estimator sees on its tokens, float64 ``(B,)``
        (0 for an empty row). A row's sum is taken over its own tokens alone
        (:func:`~mpo_viz.data.summary.row_sums`): the same bits in any batch the row sits in."""
        return row_sums(self._flat_rewards(), self._off)

    def summary(self) -> dict:
        """Counts and statistics for ``mpo-viz info`` (plain Python values), of this whole batch;
        :func:`mpo_viz.data.io.summarize` gives the same numbers for a file read chunk by chunk."""
        return summarize_rows(row_numbers(self), self.fields, self.meta)


def _check_binary(name: str, flat: np.ndarray) -> None:
    """A flag field (:data:`~mpo_viz.data.schema.BINARY_FIELDS`) holds only 0 and 1 before it is narrowed to int8."""
    if name in BINARY_FIELDS:
        bad = (flat != 0) & (flat != 1)
        if bad.any():
            raise ValueError(f"{name}: expected 0 or 1 (or booleans), found {flat[bad][0].item()!r}")


def _py(x):
    """numpy scalar -> Python scalar (for rows and JSON)."""
    if isinstance(x, np.generic):
        return x.item()
    return x


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def row_to_json(row: dict) -> str:
    """One JSONL line for a row (NaN written as ``NaN``, as Python's json reads it back)."""
    return json.dumps(row, default=_json_default, allow_nan=True)


def _concat_tokens(batches: list[TrajectoryBatch]) -> tuple[dict, dict]:
    """The token fields of several batches joined (a field a batch lacks: absent in its rows)."""
    tokens, present = {}, {}
    for name in dict.fromkeys(k for b in batches for k in b._tok):
        dt = next(b._tok[name].dtype for b in batches if name in b._tok)
        parts, pres = [], []
        for b in batches:
            if name in b._tok:
                parts.append(b._tok[name])
                p = b._present.get(name)
                pres.append(p if p is not None else np.ones(len(b), dtype=bool))
            else:
                parts.append(
                    np.zeros(b.num_tokens, dtype=dt) if dt.kind != "O" else np.full(b.num_tokens, "", dtype=object)
                )
                pres.append(np.zeros(len(b), dtype=bool))
        tokens[name] = np.concatenate(parts)
        if name not in ("response_ids", "loss_mask"):
            present[name] = np.concatenate(pres)
    return tokens, present


def _concat_turns(batches: list[TrajectoryBatch]) -> dict:
    """The per-turn fields of several batches joined."""
    turn = {}
    for name in dict.fromkeys(k for b in batches for k in b._turn):
        flats, lens, pres = [], [], []
        for b in batches:
            if name in b._turn:
                f, o, p = b._turn[name]
                flats.append(f)
                lens.append(np.diff(o))
                pres.append(p)
            else:
                flats.append(np.zeros(0, dtype=TURN_FIELDS.get(name, np.float64)))
                lens.append(np.zeros(len(b), dtype=np.int64))
                pres.append(np.zeros(len(b), dtype=bool))
        turn[name] = (np.concatenate(flats), offsets_from_lengths(np.concatenate(lens)), np.concatenate(pres))
    return turn


def _concat_objects(dicts: list[dict], n_each: list[int]) -> dict:
    """Per-row object columns (scalars, extras) of several batches joined (None where one lacks a column)."""
    out = {}
    for name in dict.fromkeys(k for d in dicts for k in d):
        parts = [d[name] if name in d else np.full(n, None, dtype=object) for d, n in zip(dicts, n_each)]
        out[name] = np.concatenate([p.astype(object) if p.dtype != object else p for p in parts])
    return out
