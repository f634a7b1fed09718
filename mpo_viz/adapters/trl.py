"""TRL completion logs (``completions/completions_{step:05d}.parquet``) → trajectory/v1.

TRL's ``GRPOTrainer`` (``trl/trainer/grpo_trainer.py``, ``log()``, with ``log_completions=True``)
writes one Parquet file per logging step into ``{output_dir}/completions/``, one row per completion:

==========================  ========================================================================
TRL column                  trajectory/v1
==========================  ========================================================================
``prompt``                  text (``batch_decode(prompt_ids, skip_special_tokens=True)``) →
                            ``prompt_ids`` by the tokenizer (special tokens are not in the log, so
                            the chat markup of the real prompt is lost); a list of chat messages →
                            the chat template (:mod:`mpo_viz.adapters.chat`)
``completion``              text → ``response_ids`` by the tokenizer, one assistant turn, every
                            token an action; a list of messages (assistant/tool) → turns from the
                            chat structure, tool replies as observation tokens
one column per reward       ``reward`` = their sum (TRL's default ``reward_weights`` are all 1; NaN
function                    entries are skipped as TRL's ``nansum`` does; give ``reward_weights``
                            when yours differ). Which columns are rewards: every numeric column but
                            ``step`` and ``advantage``, or ``reward_columns``
``advantage``               ``advantages`` on every action token (TRL's advantage is per sequence)
``step``                    ``step``
other columns               ``extra_json``
==========================  ========================================================================

``group_id`` is ``"step{step}/prompt{k}"``: completions of the same prompt text in one step (TRL
samples ``num_generations`` per prompt); ``traj_id`` is ``"{file stem}/{row}"``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from mpo_viz.adapters._common import Collector, check_options, dumps, file_error, jsonable, run
from mpo_viz.adapters.chat import conversation_row, encoder_for
from mpo_viz.adapters.chat_template import ChatEncoder
from mpo_viz.checks import OptionError

__all__ = ["from_trl", "iter_trl", "parquet_rows"]

_FIXED = ("step", "prompt", "completion", "advantage")


def parquet_files(src, pattern: str) -> list[Path]:
    p = Path(src)
    if p.is_dir():
        files = sorted(p.glob(pattern))
        if not files:
            raise FileNotFoundError(f"{p}: expected {pattern} files in this folder, found none")
        return files
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file or folder")
    return [p]


def parquet_rows(path: Path, batch_size: int = 256) -> Iterator[tuple[int, dict, list[str]]]:
    """(row number, row as a dict, column names) of a Parquet file, a record batch at a time."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    n = 0
    for rb in pf.iter_batches(batch_size=batch_size):
        for r in rb.to_pylist():
            yield n, r, names
            n += 1


def _is_num(v) -> bool:
    return v is None or (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool))


def iter_trl(
    src,
    col: Collector,
    *,
    tokenizer=None,
    obs_reward: str = "move",
    reward_columns=None,
    reward_weights=None,
    allow_unknown: bool = False,
) -> Iterator[None]:
    enc = encoder_for(tokenizer, col, allow_unknown)
    rep = col.report
    for path in parquet_files(src, "completions_*.parquet"):
        col.source = str(path)
        groups: dict = {}
        rew_cols: list = []
        for i, row, names in parquet_rows(path):
            rep.rows_in += 1
            if i == 0:
                rew_cols = _reward_columns(path, row, names, reward_columns, reward_weights, rep)
            out = _trl_row(enc, col, row, i, f"{path.stem}/{i}", groups, rew_cols, reward_weights, obs_reward)
            if out is not None:
                col.add(out, row_index=i)
            yield


def _reward_columns(path, row: dict, names: list, reward_columns, reward_weights, rep) -> list:
    """The columns whose sum is the reward: ``reward_columns``, else every numeric column of the
    first row but the fixed ones (the file is refused when prompt or completion is missing)."""
    missing = [c for c in ("prompt", "completion") if c not in names]
    if missing:
        raise file_error(
            "trl",
            path,
            missing[0],
            "a completions_*.parquet with columns step, prompt, completion, one per reward function, advantage",
            f"columns {names}",
        )
    if reward_columns is not None:
        absent = [c for c in reward_columns if c not in names]
        if absent:
            raise OptionError("reward_columns", f"expected columns of {path}, found {absent} not among {names}")
        rew_cols = list(reward_columns)
    else:
        rew_cols = [c for c in names if c not in _FIXED and _is_num(row.get(c))]
    rep.note(f"reward = sum of columns {rew_cols}" + (f" weighted {reward_weights}" if reward_weights else ""))
    return rew_cols


def _trl_row(
    enc: ChatEncoder,
    col: Collector,
    row: dict,
    i: int,
    tid: str,
    groups: dict,
    rew_cols: list,
    reward_weights,
    obs_reward: str,
) -> dict | None:
    """Row ``i`` as a v1 row (text retokenized, or a conversation laid out by the chat template);
    None when it cannot be converted (a problem recorded)."""
    rep = col.report
    step = row.get("step")
    vals = [row.get(c) for c in rew_cols]
    if any(not _is_num(v) for v in vals):
        bad = next(c for c, v in zip(rew_cols, vals) if not _is_num(v))
        col.problem(bad, "a number (a reward function's score) or null", repr(row.get(bad))[:60], row=i, traj_id=tid)
        return None
    w = [1.0 if not reward_weights else float(reward_weights.get(c, 1.0)) for c in rew_cols]
    finite = [(x, wi) for x, wi in zip(vals, w) if x is not None and not math.isnan(float(x))]
    reward = sum(float(x) * wi for x, wi in finite) if finite else math.nan
    prompt, comp = row.get("prompt"), row.get("completion")
    gkey = dumps(jsonable(prompt)) if not isinstance(prompt, str) else prompt
    gid = f"step{step}/" + groups.setdefault(gkey, f"prompt{len(groups)}")
    extra: dict = {}
    for k, v in row.items():
        if k not in _FIXED and k not in rew_cols:
            try:
                extra[k] = jsonable(v)
            except TypeError as exc:
                rep.drop(k, f"values of type {exc} are not JSON")
    scal = {"step": int(step)} if isinstance(step, int) else {}
    if isinstance(prompt, str) and isinstance(comp, str):
        p_ids, r_ids = enc.ids(prompt), enc.ids(comp)
        if not r_ids:
            col.problem("completion", "a non-empty completion", "empty text", row=i, traj_id=tid)
            return None
        rep.unknown_token = rep.unknown_token or enc.tok.unk_token
        for field, ids, text in (("prompt", p_ids, prompt), ("action", r_ids, comp)):
            n_unk = sum(1 for x in ids if x == enc.unk) if enc.unk is not None else 0
            rep.unknown(field, n_unk, len(ids), enc.unknown_words(text, ids) if n_unk else (), where=tid)
        if enc.is_empty(r_ids):
            rep.empty_turn(f"{tid} completion")
        out = {
            **scal,
            "traj_id": tid,
            "group_id": gid,
            "prompt_ids": p_ids,
            "response_ids": r_ids,
            "loss_mask": [1] * len(r_ids),
            "reward": reward,
            "num_turns": 1,
            "response_tokens": enc.tokens(r_ids),
        }
        if extra:
            out["extra_json"] = dumps(extra)
        if i == 0:
            rep.note("text prompt/completion retokenized (TRL logs decoded text without special tokens)")
    elif isinstance(prompt, list) and isinstance(comp, list):
        conv = conversation_row(
            enc,
            col,
            list(prompt) + list(comp),
            traj_id=tid,
            group_id=gid,
            reward=reward,
            row=i,
            obs_reward=obs_reward,
            extra=extra or None,
            scalars=scal,
        )
        if conv is None:
            return None
        out = conv
    else:
        col.problem(
            "completion",
            "prompt and completion both text, or both lists of chat messages",
            f"prompt {type(prompt).__name__}, completion {type(comp).__name__}",
            row=i,
            traj_id=tid,
        )
        return None
    adv = row.get("advantage")
    if adv is not None:
        out["advantages"] = [float(adv) if m else 0.0 for m in out["loss_mask"]]
    return out


def from_trl(
    src,
    *,
    tokenizer,
    obs_reward: str = "move",
    errors: str = "raise",
    reward_columns=None,
    reward_weights=None,
    source=None,
    allow_unknown: bool = False,
):
    """Convert TRL ``completions_*.parquet`` (a file or the ``completions/`` folder) to v1."""
    check_options(obs_reward=obs_reward, errors=errors)
    col = Collector("trl", source=source if source is not None else src, errors=errors)
    return run(
        iter_trl(
            src,
            col,
            tokenizer=tokenizer,
            obs_reward=obs_reward,
            reward_columns=reward_columns,
            reward_weights=reward_weights,
            allow_unknown=allow_unknown,
        ),
        col,
    )
