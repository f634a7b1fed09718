"""SkyRL ``GeneratorOutput`` → trajectory/v1.

Input: a ``GeneratorOutput`` (``skyrl/train/generators/base.py``, a TypedDict of per-row lists) as
a Python dict, a ``.json`` file holding one, or a ``.jsonl`` file with one per line (e.g. one per
training step). A pickle (``.pkl``) is read only with ``trust=True``.

Field mapping (row ``i`` of every list):

=========================  =========================================================================
SkyRL                      trajectory/v1
=========================  =========================================================================
``prompt_token_ids[i]``    ``prompt_ids``
``response_ids[i]``        ``response_ids`` (assistant tokens and, in multi-turn rows, the
                           observation tokens between them)
``loss_masks[i]``          ``loss_mask``; turns are the runs of 1s (``turn_ids``)
``rewards[i]``             a float → ``reward``; a list (one per response token, SkyRL puts each
                           step's reward on that turn's last token) → ``token_rewards`` (rewards on
                           observation tokens moved, ``obs_reward``) and ``reward`` = their sum
``rollout_logprobs[i]``    ``rollout_logprobs``
``trajectory_ids[i]``      ``TrajectoryID(instance_id, repetition_id)`` (dict, object or string):
                           ``traj_id`` = ``"{instance_id}_{repetition_id}"`` (``to_string()``),
                           ``group_id`` = ``instance_id`` (what SkyRL groups advantages by);
                           absent: ``traj_id`` ``"row{i}"``, ``group_id`` from identical prompts
``stop_reasons[i]``        ``stop_reason``
``is_last_step``           present (step-wise training): each row is one step (one LLM call);
                           consecutive rows of one trajectory are merged as step-wise logs are
                           (:mod:`mpo_viz.adapters.steps`), else kept as one-turn trajectories
``env_metrics[i]``         ``extra_json``
``rollout_metrics``,       file metadata ``skyrl_rollout_metrics`` (batch-level)
others                     dropped and reported (``pixel_values``, ``rollout_expert_indices``, ...)
=========================  =========================================================================
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mpo_viz.adapters._common import (
    Collector,
    check_options,
    describe,
    dumps,
    file_error,
    jsonable,
    jsonl_lines,
    move_obs_rewards,
    run,
)
from mpo_viz.adapters.steps import Step, emit_trajectory
from mpo_viz.data.turns import turn_ids_from_mask

__all__ = ["from_skyrl", "iter_skyrl"]

REQUIRED = ("prompt_token_ids", "response_ids", "rewards", "loss_masks")
PER_ROW = (
    "stop_reasons",
    "rollout_logprobs",
    "trajectory_ids",
    "is_last_step",
    "env_metrics",
    "trajectory_generation_times",
)
_LAYOUT = "a GeneratorOutput dict with per-row lists 'prompt_token_ids', 'response_ids', 'rewards', 'loss_masks'"


def _tid(t, i):
    """(traj_id, group_id) of a TrajectoryID given as a dict, an object or a string."""
    if t is None:
        return None, None
    if isinstance(t, Mapping):
        inst, rep = t.get("instance_id"), t.get("repetition_id")
    elif hasattr(t, "instance_id"):
        inst, rep = t.instance_id, getattr(t, "repetition_id", None)
    else:
        return str(t), str(t).rsplit("_", 1)[0]
    if inst is None:
        raise ValueError(
            f"trajectory_ids[{i}]: expected a TrajectoryID with instance_id and repetition_id, found {t!r}"
        )
    return (f"{inst}_{rep}" if rep is not None else str(inst)), str(inst)


def _outputs(src, col: Collector, trust: bool) -> Iterator[tuple[int | None, Any]]:
    if isinstance(src, Mapping):
        yield None, dict(src)
        return
    path = Path(src)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix in (".pkl", ".pickle"):
        if not trust:
            raise ValueError(
                f"{path}: a pickle can run code when loaded: pass trust=True (--trust) only for a file you "
                "trust, or dump the GeneratorOutput as JSON"
            )
        with open(path, "rb") as fh:
            obj = pickle.load(fh)  # noqa: S301 - explicit trust=True
        yield None, obj
        return
    if path.suffix == ".jsonl":
        for n, obj in jsonl_lines(path, col):
            yield n, obj
        return
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise file_error(
            "skyrl",
            path,
            "<file>",
            "one GeneratorOutput JSON object (.json) or one per line (.jsonl)",
            f"unreadable JSON ({exc.msg} at line {exc.lineno})",
        ) from None
    except UnicodeDecodeError as exc:
        raise file_error(
            "skyrl",
            path,
            "<file>",
            "one GeneratorOutput JSON object (.json) or one per line (.jsonl)",
            f"bytes that are not UTF-8 text ({exc.reason}); a binary file?",
        ) from None
    yield None, obj


def iter_skyrl(src, col: Collector, *, obs_reward: str = "move", trust: bool = False) -> Iterator[None]:
    rep = col.report
    base_row = 0
    for line, out in _outputs(src, col, trust):
        if not isinstance(out, Mapping):
            raise file_error("skyrl", col.source, "<output>", _LAYOUT, describe(out))
        missing = [k for k in REQUIRED if k not in out]
        if missing:
            raise file_error(
                "skyrl",
                col.source,
                missing[0],
                _LAYOUT + (f" (line {line})" if line else ""),
                f"no {missing[0]!r}; keys: {sorted(out)}",
            )
        n = len(out["response_ids"])
        for k in (*REQUIRED, *PER_ROW):
            v = out.get(k)
            if v is not None and len(v) != n:
                raise file_error("skyrl", col.source, k, f"one entry per row like 'response_ids' ({n})", f"{len(v)}")
        for k, v in out.items():
            if k not in REQUIRED and k not in PER_ROW and k != "rollout_metrics" and v is not None:
                rep.drop(k, "not a trajectory/v1 field")
        if out.get("rollout_metrics"):
            try:
                col.meta["skyrl_rollout_metrics"] = jsonable(out["rollout_metrics"])
            except TypeError:
                rep.drop("rollout_metrics", "not JSON")
        rows = _rows(out, n, col, line, base_row, obs_reward)
        if out.get("is_last_step") is not None:
            yield from _stepwise(out, rows, col, line, obs_reward)
        else:
            for r, ri in rows:
                if r is not None and (r := _finish_row(r, col, line, ri, obs_reward)) is not None:
                    col.add(r, line=line, row_index=ri)
                yield
        base_row += n


def _rows(out, n, col, line, base_row, obs_reward):
    """Per input row: (v1 row or None on a problem, input row index)."""
    rep = col.report
    tids = out.get("trajectory_ids")
    prompts_seen: dict = {}
    result = []
    for i in range(n):
        rep.rows_in += 1
        ri = base_row + i
        try:
            tid, gid = _tid(tids[i], i) if tids is not None else (None, None)
        except ValueError as exc:
            col.problem(
                "trajectory_ids",
                str(exc).split("expected ", 1)[1].split(", found")[0],
                repr(tids[i]),
                line=line,
                row=ri,
            )
            result.append((None, ri))
            continue
        prompt = [int(x) for x in out["prompt_token_ids"][i]]
        if tid is None:
            tid = f"row{ri}"
            gid = prompts_seen.setdefault(tuple(prompt), f"prompt{len(prompts_seen)}")
            if i == 0:
                rep.note("no trajectory_ids: traj_id row<i>, group_id from identical prompt_token_ids")
        resp = [int(x) for x in out["response_ids"][i]]
        mask = [int(x) for x in out["loss_masks"][i]]
        if len(mask) != len(resp):
            col.problem(
                "loss_masks",
                f"{len(resp)} entries (the length of response_ids[{i}])",
                str(len(mask)),
                line=line,
                row=ri,
                traj_id=tid,
            )
            result.append((None, ri))
            continue
        row = {"traj_id": tid, "group_id": gid, "prompt_ids": prompt, "response_ids": resp, "loss_mask": mask}
        rw = out["rewards"][i]
        if isinstance(rw, (list, tuple)):
            if len(rw) != len(resp):
                col.problem(
                    "rewards",
                    f"{len(resp)} per-token rewards (the length of response_ids[{i}]) or one float",
                    f"{len(rw)}",
                    line=line,
                    row=ri,
                    traj_id=tid,
                )
                result.append((None, ri))
                continue
            row["_tok_r"] = [float(x) for x in rw]
        else:
            row["reward"] = float("nan") if rw is None else float(rw)
        if out.get("rollout_logprobs") is not None and out["rollout_logprobs"][i] is not None:
            row["rollout_logprobs"] = [float(x) for x in out["rollout_logprobs"][i]]
        if out.get("stop_reasons") is not None and out["stop_reasons"][i] is not None:
            row["stop_reason"] = str(out["stop_reasons"][i])
        extra = {}
        if out.get("env_metrics") is not None and out["env_metrics"][i] is not None:
            extra["env_metrics"] = jsonable(out["env_metrics"][i])
        if out.get("trajectory_generation_times") is not None:
            extra["generation_time_s"] = jsonable(out["trajectory_generation_times"][i])
        if extra:
            row["extra_json"] = dumps(extra)
        result.append((row, ri))
    return result


def _finish_row(row, col, line, ri, obs_reward):
    """Token rewards → moved, summed into ``reward``; explicit turn ids."""
    mask = np.asarray(row["loss_mask"])
    row["turn_ids"] = turn_ids_from_mask(mask).tolist()
    tok = row.pop("_tok_r", None)
    if tok is not None:
        r, why = move_obs_rewards(np.asarray(tok), mask, obs_reward=obs_reward, report=col.report)
        if why is not None:
            col.problem("rewards", *why, line=line, row=ri, traj_id=row["traj_id"], layout=False)
            return None
        row["token_rewards"] = r.tolist()
        row["reward"] = float(r.sum())
    return row


def _stepwise(out, rows, col, line, obs_reward):
    """Step-wise GeneratorOutput: consecutive rows with one trajectory id are the steps of one trajectory."""
    last = out["is_last_step"]
    cur: list = []
    for (r, ri), is_last in zip(rows, last):
        cur.append((r, ri))
        if not is_last:
            continue
        good = [(x, i) for x, i in cur if x is not None]
        if len(good) == len(cur):
            first = good[0][0]
            ids = {x["traj_id"] for x, _ in good}
            if len(ids) > 1:
                col.problem(
                    "is_last_step",
                    "True at the last step of every trajectory (steps of one trajectory adjacent)",
                    f"trajectory ids {sorted(ids)} between two last steps",
                    line=line,
                    row=good[0][1],
                    traj_id=first["traj_id"],
                )
            else:
                steps = [
                    Step(
                        x["prompt_ids"],
                        x["response_ids"],
                        mask=x["loss_mask"],
                        logprobs=x.get("rollout_logprobs"),
                        reward=x.get("reward") if "_tok_r" not in x else None,
                        token_rewards=x.get("_tok_r"),
                    )
                    for x, _ in good
                ]
                scal = {k: good[-1][0][k] for k in ("stop_reason",) if k in good[-1][0]}
                emit_trajectory(
                    col,
                    steps,
                    traj_id=first["traj_id"],
                    group_id=first["group_id"],
                    outcome=None,
                    scalars=scal,
                    line=line,
                    row=good[0][1],
                    obs_reward=obs_reward,
                )
        cur = []
        yield
    if cur:
        col.problem(
            "is_last_step", "True on the last row (the end of the last trajectory)", "False", line=line, row=cur[-1][1]
        )
    yield


def from_skyrl(src, *, obs_reward: str = "move", trust: bool = False, errors: str = "raise", source=None):
    """Convert a SkyRL ``GeneratorOutput`` (dict, ``.json``/``.jsonl`` path, or ``.pkl`` with ``trust=True``) to v1."""
    check_options(obs_reward=obs_reward, errors=errors)
    if source is None and isinstance(src, (str, Path)):
        source = src
    col = Collector("skyrl", source=source, errors=errors)
    return run(iter_skyrl(src, col, obs_reward=obs_reward, trust=trust), col)
