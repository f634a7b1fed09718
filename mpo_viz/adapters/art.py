"""ART trajectory Parquet (``trajectories/{split}/{step:04d}.parquet``) → trajectory/v1.

ART (OpenPipe, ``src/art/utils/trajectory_logging.py``, ``write_trajectory_groups_parquet``) logs
every training step as one Parquet file under
``{art_path}/{project}/models/{model}/trajectories/{split}/``, one row per trajectory:

=========================  ==========================================================================
ART column                 trajectory/v1
=========================  ==========================================================================
``messages``               list of ``{role, content, tool_calls (JSON text), tool_call_id, trainable}``
                           → tokens through the chat template (:mod:`mpo_viz.adapters.chat`). An
                           assistant message is a turn (action tokens) when ``trainable`` is true
                           (ART logs the model's ``Choice`` objects as trainable and trains only on
                           them); other assistant messages are part of the prompt/observations. A
                           row with no trainable message: every assistant message is a turn
                           (counted in the report).
``reward``                 ``reward`` (sequence level)
``group_index``            ``group_id`` = ``"{file stem}/g{group_index}"`` (the GRPO group)
``trajectory_index``       ``traj_id`` = ``"{file stem}/g{group_index}/t{trajectory_index}"``
                           (format 1 has no index: the row's position in its group)
file stem                  ``step`` when it is a number (``0003.parquet`` → 3)
``tools``                  passed to the chat template
``metrics``, ``metadata``,  ``extra_json``
``logs``, ``group_*``
``trajectory_json``        dropped (format 2's full model dump; ``messages`` hold what is used)
=========================  ==========================================================================

Rows with neither messages nor reward (format 2's markers of empty groups) are skipped and counted.
ART logs text only: token ids, log-probs and per-token values are not in the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from mpo_viz.adapters._common import Collector, check_options, file_error, jsonable, run
from mpo_viz.adapters.chat import conversation_row, encoder_for
from mpo_viz.adapters.trl import parquet_files, parquet_rows

__all__ = ["from_art", "iter_art"]

_EXTRA = ("metrics", "metadata", "logs", "group_metadata", "group_metrics", "group_logs")


def _message(m: dict) -> dict:
    out = {"role": m.get("role"), "content": m.get("content")}
    if m.get("tool_calls"):
        tc = m["tool_calls"]
        out["tool_calls"] = json.loads(tc) if isinstance(tc, str) else tc
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    return out


def _maybe_json(v):
    if isinstance(v, str):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
    return jsonable(v)


def iter_art(
    src, col: Collector, *, tokenizer=None, obs_reward: str = "move", allow_unknown: bool = False
) -> Iterator[None]:
    enc = encoder_for(tokenizer, col, allow_unknown)
    rep = col.report
    for path in parquet_files(src, "*.parquet"):
        col.source = str(path)
        step = int(path.stem) if path.stem.isdigit() else None
        pos_in_group: dict = {}
        for i, row, names in parquet_rows(path):
            rep.rows_in += 1
            if i == 0:
                missing = [c for c in ("group_index", "reward", "messages") if c not in names]
                if missing:
                    raise file_error(
                        "art",
                        path,
                        missing[0],
                        "an ART trajectory Parquet with columns group_index, "
                        "reward, messages (list of {role, content, tool_calls, tool_call_id, trainable})",
                        f"columns {names}",
                    )
                if "trajectory_json" in names:
                    rep.drop("trajectory_json", "the full model dump; the messages column holds what is converted")
            gi = row.get("group_index")
            if row.get("messages") is None and row.get("reward") is None:
                rep.note("rows without messages or reward (empty-group markers) skipped")
                yield
                continue
            ti = row.get("trajectory_index")
            if ti is None:
                ti = pos_in_group.get(gi, 0)
            pos_in_group[gi] = ti + 1
            tid = f"{path.stem}/g{gi}/t{ti}"
            msgs_raw = row.get("messages") or []
            if not all(isinstance(m, dict) for m in msgs_raw):
                col.problem("messages", "a list of message structs", repr(msgs_raw)[:60], row=i, traj_id=tid)
                yield
                continue
            msgs = [_message(m) for m in msgs_raw]
            actions: list[int] | None = [
                k for k, m in enumerate(msgs_raw) if m.get("role") == "assistant" and m.get("trainable")
            ]
            if not actions:
                actions = None
                rep.note("no trainable assistant message in a row: every assistant message taken as a turn")
            extra = {k: _maybe_json(row[k]) for k in _EXTRA if row.get(k) is not None}
            tools = _maybe_json(row.get("tools")) if row.get("tools") else None
            scal = {"step": step} if step is not None else {}
            out = conversation_row(
                enc,
                col,
                msgs,
                traj_id=tid,
                group_id=f"{path.stem}/g{gi}",
                reward=row.get("reward"),
                actions=actions,
                tools=tools,
                row=i,
                obs_reward=obs_reward,
                extra=extra or None,
                scalars=scal,
            )
            if out is not None:
                col.add(out, row_index=i)
            yield


def from_art(
    src, *, tokenizer, obs_reward: str = "move", errors: str = "raise", source=None, allow_unknown: bool = False
):
    """Convert ART trajectory Parquet (a file, or a ``trajectories/{split}/`` folder) to v1."""
    check_options(obs_reward=obs_reward, errors=errors)
    col = Collector("art", source=source if source is not None else src, errors=errors)
    return run(iter_art(src, col, tokenizer=tokenizer, obs_reward=obs_reward, allow_unknown=allow_unknown), col)
