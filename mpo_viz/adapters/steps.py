"""Step-wise logs (one record per LLM call) → trajectory/v1.

Recognized layouts, one JSON object per line of a JSONL file (or a list of such dicts):

* **verifiers** rollout (``State``, ``verifiers/legacy/types.py``): ``trajectory`` is a list of
  ``TrajectoryStep`` whose ``tokens`` (``TrajectoryStepTokens``) hold ``prompt_ids``,
  ``completion_ids``, ``completion_mask``, ``completion_logprobs``; the step's ``reward`` and
  ``advantage``; ``trajectory_id``. Rollout: ``example_id`` → ``group_id``, ``reward`` → outcome.
* **rLLM** ``Episode`` (``rllm/types.py``, ``Episode.to_dict``): ``id`` (``"task_id:rollout_idx"``;
  the task id → ``group_id``) and ``trajectories``, each a ``Trajectory``: ``uid``, ``name``,
  ``steps``, ``reward``; each ``Step``: ``prompt_ids``, ``response_ids``, ``logprobs``, ``reward``,
  ``advantage``. A bare ``Trajectory`` (a line with ``steps``) works too (``group_id`` from
  ``group_id``/``task`` when present, else its ``uid``).
* **agent-lightning** completed rollout (``agentlightning/verl/agl_rollout_manager.py``):
  ``rollout_id``, ``data_id`` (→ ``group_id``), ``triplets`` — each ``prompt.token_ids``,
  ``response.token_ids``, ``response.log_probs``, ``reward`` — and ``final_reward``.
* **flat steps**: one step per line with ``prompt_ids`` (or ``prompt_token_ids``),
  ``completion_ids`` (or ``response_ids``), optional ``logprobs``/``completion_logprobs``,
  ``completion_mask``, ``reward``, and the trajectory it belongs to in ``trajectory_id`` (or
  ``traj_id``/``rollout_id``/``episode_id``); consecutive lines with the same id are one trajectory,
  ordered by ``step`` when given; ``group_id`` (or ``example_id``/``data_id``).

Merging. Steps ``s_0 … s_n`` of one trajectory become **one** v1 row when each step's prompt
extends the previous step's prompt + completion token for token: then the row's prompt is
``s_0``'s, the response is ``c_0 o_0 c_1 o_1 … c_n`` where ``o_k`` (loss_mask 0) are the tokens the
next prompt adds (tool replies, chat markup), and turn ``k`` is step ``k``. Otherwise (context
truncated, summarized, re-rendered) every step stays a one-turn trajectory ``"{traj_id}/step{k}"``
in the same group, and the reason is counted in the report.

Rewards. Per-step rewards become ``turn_rewards`` (one per step) when any is non-zero; the
trajectory-level reward becomes ``reward`` unless it equals the sum of the step rewards or the last
step's reward (then the steps carry it already — agent-lightning copies its final reward onto the
last triplet; ``reward`` is NaN, and that is counted). Without step rewards, ``reward`` is the
trajectory-level one (NaN if none). Per-token step rewards (SkyRL step-wise) become
``token_rewards``. Per-token log-probs → ``rollout_logprobs`` (0 on observation tokens) when every
step has them; per-step scalar advantages → ``advantages`` on the step's tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mpo_viz.adapters._common import (
    Collector,
    check_options,
    dumps,
    jsonable,
    jsonl_lines,
    move_obs_rewards,
    run,
)

__all__ = ["Step", "from_steps", "iter_steps", "emit_trajectory"]

_FLAT_TRAJ_KEYS = ("trajectory_id", "traj_id", "rollout_id", "episode_id")
_FLAT_GROUP_KEYS = ("group_id", "example_id", "data_id")
_LAYOUTS = (
    "a step-wise log record: a verifiers rollout ('trajectory'), an rLLM Episode ('trajectories') or "
    "Trajectory ('steps'), an agent-lightning rollout ('triplets'), or one step with 'prompt_ids', "
    "'completion_ids' and 'trajectory_id'"
)


@dataclass
class Step:
    """One LLM call: the exact prompt and completion token ids and what was logged with them."""

    prompt_ids: list
    completion_ids: list
    mask: list | None = None  # 1 = trainable completion token (default all 1)
    logprobs: list | None = None
    reward: float | None = None  # scalar step reward
    token_rewards: list | None = None  # per completion token (SkyRL)
    advantage: float | None = None
    extra: dict = field(default_factory=dict)


def _first_diff(a, b) -> int:
    n = min(len(a), len(b))
    a, b = np.asarray(a[:n]), np.asarray(b[:n])
    d = np.flatnonzero(a != b)
    return int(d[0]) if len(d) else n


def emit_trajectory(
    col: Collector,
    steps: list[Step],
    *,
    traj_id: str,
    group_id: str,
    outcome=None,
    scalars: dict | None = None,
    line=None,
    row=None,
    obs_reward: str = "move",
) -> None:
    """Add one trajectory made of ``steps`` to ``col``: merged into one row, or one row per step
    (when a step's prompt does not extend the previous prompt + completion)."""
    for k, s in enumerate(steps):
        if not any(_step_mask(s)):
            col.problem(
                f"steps[{k}].completion_ids",
                "at least one trainable completion token in every step",
                f"{len(s.completion_ids)} tokens, none trainable",
                line=line,
                row=row,
                traj_id=traj_id,
            )
            return
    step_r = [s.reward for s in steps]
    rewards = _Rewards(
        step_r=step_r,
        has_step_r=any(r not in (None, 0) for r in step_r),
        has_tok_r=any(s.token_rewards is not None for s in steps),
        outcome=_outcome(col, step_r, outcome),
        obs_reward=obs_reward,
    )
    base = {**(scalars or {}), "traj_id": traj_id, "group_id": group_id}
    breaks = _merge_breaks(steps)
    if breaks:
        col.report.kept_as_steps[breaks[0][2]] += len(steps)
        for k in range(len(steps)):
            _emit(col, _step_row(steps, k, base, breaks[0]), rewards.of_step(steps, k), line, row)
        return
    if len(steps) > 1:
        col.report.merged_steps += len(steps)
    out, tok_r = _merged_row(col, steps, base)
    _emit(col, out, rewards.merged(tok_r), line, row)


def _step_mask(s: Step) -> list:
    return s.mask if s.mask is not None else [1] * len(s.completion_ids)


def _merge_breaks(steps: list[Step]) -> list[tuple[int, int, str]]:
    """``(step, position, why)`` where a step's prompt does not extend the previous step's prompt +
    completion (the trajectory cannot be merged into one row)."""
    breaks = []
    for k in range(1, len(steps)):
        prev = list(steps[k - 1].prompt_ids) + list(steps[k - 1].completion_ids)
        cur = steps[k].prompt_ids
        if len(cur) < len(prev) or _first_diff(prev, cur) < len(prev):
            p = _first_diff(prev, cur)
            why = (
                "the next prompt is shorter than prompt + completion (context truncated or summarized)"
                if p == min(len(prev), len(cur))
                else "the next prompt differs from prompt + completion (re-rendered or edited history)"
            )
            breaks.append((k, p, why))
    return breaks


def _outcome(col: Collector, step_r: list, outcome) -> float:
    """The trajectory reward to add, NaN when none, or when the steps already carry it (it equals the
    sum of their rewards, or the last one's)."""
    total = sum(r or 0.0 for r in step_r)
    last_r = step_r[-1]
    if (
        outcome is not None
        and not math.isnan(outcome)
        and any(r not in (None, 0) for r in step_r)
        and (abs(outcome - total) <= 1e-9 or (last_r is not None and abs(outcome - last_r) <= 1e-9))
    ):
        col.report.note(
            "trajectory reward equals the sum of its step rewards or the last step's reward (already "
            "carried by the steps): not added again, reward NaN"
        )
        return math.nan
    return math.nan if outcome is None else float(outcome)


@dataclass
class _Rewards:
    """What a trajectory's rows get as rewards: step rewards, token rewards, the outcome."""

    step_r: list
    has_step_r: bool
    has_tok_r: bool
    outcome: float
    obs_reward: str

    def merged(self, tok_r: list) -> tuple:
        return (
            tok_r if self.has_tok_r else None,
            self.step_r if self.has_step_r else None,
            self.outcome,
            self.obs_reward,
        )

    def of_step(self, steps: list[Step], k: int) -> tuple:
        s, last = steps[k], k == len(steps) - 1
        return (
            s.token_rewards if self.has_tok_r else None,
            [s.reward] if self.has_step_r else None,
            self.outcome if last else math.nan,
            self.obs_reward,
        )


def _emit(col: Collector, out: dict, rewards: tuple, line, row) -> None:
    """Fill the row's rewards and add it, unless its rewards cannot be placed (a problem recorded)."""
    tok_r, step_r, outcome, obs_reward = rewards
    if _rewards(out, col, tok_r, step_r, outcome, out["loss_mask"], obs_reward, line, row):
        col.add(out, line=line, row_index=row)


def _merged_row(col: Collector, steps: list[Step], base: dict) -> tuple[dict, list]:
    """The steps merged into one row: each step's completion an assistant turn, the new prompt tokens
    between two steps the observation; and its token rewards."""
    resp, mask, tids, lp, adv, tok_r = [], [], [], [], [], []
    all_lp = all(s.logprobs is not None for s in steps)
    for k, s in enumerate(steps):
        if k:
            prev_len = len(steps[k - 1].prompt_ids) + len(steps[k - 1].completion_ids)
            obs = list(s.prompt_ids[prev_len:])
            resp += obs
            mask += [0] * len(obs)
            tids += [k - 1] * len(obs)
            lp += [0.0] * len(obs)
            adv += [0.0] * len(obs)
            tok_r += [0.0] * len(obs)
        m = _step_mask(s)
        resp += list(s.completion_ids)
        mask += [int(x) for x in m]
        # a step's leading untrainable tokens belong to the turn before (ids never skip)
        first = next(j for j, x in enumerate(m) if x)
        tids += [max(k - 1, 0)] * first + [k] * (len(m) - first)
        if all_lp:
            lp += [float(x) for x in s.logprobs or ()]
        a = 0.0 if s.advantage is None else float(s.advantage)
        adv += [a if x else 0.0 for x in m]
        tok_r += list(s.token_rewards) if s.token_rewards is not None else [0.0] * len(m)
    out = {
        **base,
        "prompt_ids": list(steps[0].prompt_ids),
        "response_ids": resp,
        "loss_mask": mask,
        "turn_ids": tids,
        "num_turns": len(steps),
    }
    if all_lp:
        out["rollout_logprobs"] = lp
    elif any(s.logprobs is not None for s in steps):
        col.report.note("log-probs missing for some steps of a trajectory: rollout_logprobs left out for it")
    if any(s.advantage is not None for s in steps):
        out["advantages"] = adv
    return out, tok_r


def _step_row(steps: list[Step], k: int, base: dict, brk: tuple) -> dict:
    """Step ``k`` as a row of its own (the trajectory could not be merged at ``brk``)."""
    s = steps[k]
    traj_id = base["traj_id"]
    m = [int(x) for x in _step_mask(s)]
    r = {
        **base,
        "traj_id": f"{traj_id}/step{k}",
        "prompt_ids": list(s.prompt_ids),
        "response_ids": list(s.completion_ids),
        "loss_mask": m,
        "num_turns": 1,
        "extra_json": dumps(
            {"source_traj_id": traj_id, "step": k, "merge_break": {"step": brk[0], "position": brk[1]}}
        ),
    }
    if s.logprobs is not None:
        r["rollout_logprobs"] = [float(x) for x in s.logprobs]
    if s.advantage is not None:
        r["advantages"] = [float(s.advantage) if x else 0.0 for x in m]
    return r


def _rewards(out: dict, col: Collector, tok_r, step_r, outcome: float, mask, obs_reward, line, row) -> bool:
    """Fill ``reward``/``turn_rewards``/``token_rewards`` of ``out``; False (a problem recorded) if impossible."""
    if tok_r is not None:
        r, why = move_obs_rewards(
            np.asarray(tok_r, dtype=np.float64), np.asarray(mask), obs_reward=obs_reward, report=col.report
        )
        if why is not None:
            col.problem("rewards", *why, line=line, row=row, traj_id=out["traj_id"], layout=False)
            return False
        extra = 0.0 if math.isnan(outcome) else outcome
        if extra:
            acts = np.flatnonzero(np.asarray(mask) != 0)
            r[acts[-1]] += extra
        out["token_rewards"] = r.tolist()
        out["reward"] = float(r.sum())
        return True
    if step_r is not None:
        out["turn_rewards"] = [0.0 if x is None else float(x) for x in step_r]
    out["reward"] = outcome
    return True


# ---------------------------------------------------------------------------- layouts
def _ids(x, what: str):
    if x is None:
        return None
    if isinstance(x, dict) and "token_ids" in x:
        x = x["token_ids"]
    if not isinstance(x, (list, tuple)):
        raise ValueError(f"{what}: expected a list of token ids, found {type(x).__name__}")
    return [int(v) for v in x]


def _get(d: dict, *keys):
    for k in keys:
        if isinstance(d, dict) and d.get(k) is not None:
            return d[k], k
    return None, None


def _step_from(d: dict, where: str, kind: str) -> Step:
    """One step record of any recognized layout → Step (ValueError names the field)."""
    pk: tuple[str, ...]
    ck: tuple[str, ...]
    lk: tuple[str, ...]
    mk: tuple[str, ...]
    if kind == "verifiers":
        tok = d.get("tokens")
        if not isinstance(tok, dict):
            raise ValueError(
                f"{where}.tokens: expected TrajectoryStepTokens with prompt_ids and completion_ids "
                f"(token-level logging on), found {type(tok).__name__}"
            )
        src = tok
        pk, ck, lk, mk = ("prompt_ids",), ("completion_ids",), ("completion_logprobs",), ("completion_mask",)
    elif kind == "agl":
        src = {
            "prompt_ids": (d.get("prompt") or {}).get("token_ids") if isinstance(d.get("prompt"), dict) else None,
            "completion_ids": (d.get("response") or {}).get("token_ids")
            if isinstance(d.get("response"), dict)
            else None,
            "logprobs": (d.get("response") or {}).get("log_probs") if isinstance(d.get("response"), dict) else None,
        }
        pk, ck, lk, mk = ("prompt_ids",), ("completion_ids",), ("logprobs",), ()
    else:  # rllm and flat
        src = d
        pk = ("prompt_ids", "prompt_token_ids")
        ck = ("completion_ids", "response_ids", "response_token_ids")
        lk = ("logprobs", "completion_logprobs", "rollout_logprobs")
        mk = ("completion_mask", "loss_mask")
    p, pname = _get(src, *pk)
    c, cname = _get(src, *ck)
    if p is None or c is None:
        missing = pk[0] if p is None else ck[0]
        raise ValueError(f"{where}.{missing}: expected token ids (logged with the step), found none")
    prompt = _ids(p, f"{where}.{pname}")
    comp = _ids(c, f"{where}.{cname}")
    if not comp:
        raise ValueError(f"{where}.{cname}: expected at least one completion token, found an empty list")
    lp, lname = _get(src, *lk)
    if lp is not None and len(lp) == 0:  # rLLM's default: nothing logged
        lp = None
    if lp is not None:
        lp = [float(x) for x in lp]
        if len(lp) != len(comp):
            raise ValueError(
                f"{where}.{lname}: expected {len(comp)} log-probs (one per completion token), found {len(lp)}"
            )
    m, mname = _get(src, *mk) if mk else (None, None)
    if m is not None:
        m = [int(x) for x in m]
        if len(m) != len(comp) or any(x not in (0, 1) for x in m):
            raise ValueError(f"{where}.{mname}: expected {len(comp)} entries of 0/1, found {json.dumps(m)[:80]}")
    rew = d.get("reward")
    adv = d.get("advantage")
    if isinstance(adv, list):  # rLLM allows per-token advantages; one per step is what v1 can hold per turn
        adv = float(np.mean(adv)) if adv else None
    return Step(
        prompt,
        comp,
        mask=m,
        logprobs=lp,
        reward=None if rew is None else float(rew),
        advantage=None if adv is None else float(adv),
    )


def _layout(obj) -> str | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("trajectory"), list):
        return "verifiers"
    if isinstance(obj.get("trajectories"), list):
        return "rllm_episode"
    if isinstance(obj.get("steps"), list):
        return "rllm_trajectory"
    if isinstance(obj.get("triplets"), list):
        return "agl"
    if any(k in obj for k in _FLAT_TRAJ_KEYS) and any(k in obj for k in ("prompt_ids", "prompt_token_ids")):
        return "flat"
    return None


def _task_group(task) -> str | None:
    if task is None:
        return None
    import hashlib

    return "task-" + hashlib.sha1(dumps(jsonable(task)).encode()).hexdigest()[:12]


def _records(src, col: Collector) -> Iterator[tuple[int | None, int | None, Any]]:
    """(line, row, object) of every record: JSONL lines of a file, or items of a list."""
    if isinstance(src, (str, Path)):
        for n, obj in jsonl_lines(src, col):
            yield n, None, obj
    else:
        for i, obj in enumerate(src):
            yield None, i, obj


def iter_steps(src, col: Collector, *, obs_reward: str = "move") -> Iterator[None]:
    """Add the trajectories of a step-wise log to ``col`` (module docstring)."""
    flat: list = []  # pending flat steps of the current trajectory: (line, row, obj)

    def flush_flat():
        if not flat:
            return
        line0, row0, first = flat[0]
        tid = str(_get(first, *_FLAT_TRAJ_KEYS)[0])
        gid = _get(first, *_FLAT_GROUP_KEYS)[0]
        items = sorted(flat, key=lambda x: x[2].get("step", 0) if isinstance(x[2].get("step"), int) else 0)
        try:
            steps = [_step_from(o, f"step {o.get('step', j)}", "flat") for j, (_, _, o) in enumerate(items)]
        except ValueError as exc:
            field, msg = str(exc).split(": ", 1)
            exp, _, found = msg.partition(", found ")
            col.problem(field, exp.removeprefix("expected "), found or "-", line=line0, row=row0, traj_id=tid)
        else:
            outcome = next(
                (o.get("trajectory_reward") for _, _, o in items if o.get("trajectory_reward") is not None), None
            )
            emit_trajectory(
                col,
                steps,
                traj_id=tid,
                group_id=str(gid) if gid is not None else tid,
                outcome=outcome,
                line=line0,
                row=row0,
                obs_reward=obs_reward,
            )
        flat.clear()

    for line, row, obj in _records(src, col):
        kind = _layout(obj)
        if kind != "flat" or (flat and _get(obj, *_FLAT_TRAJ_KEYS)[0] != _get(flat[0][2], *_FLAT_TRAJ_KEYS)[0]):
            flush_flat()
            yield
        col.report.rows_in += 1
        if kind is None:
            found = f"keys {sorted(obj)}" if isinstance(obj, dict) else type(obj).__name__
            col.problem("<record>", _LAYOUTS, found, line=line, row=row)
            continue
        if kind == "flat":
            flat.append((line, row, obj))
            continue
        try:
            for tid, gid, steps, outcome, scalars in _trajectories(obj, kind, line if line is not None else row):
                emit_trajectory(
                    col,
                    steps,
                    traj_id=tid,
                    group_id=gid,
                    outcome=outcome,
                    scalars=scalars,
                    line=line,
                    row=row,
                    obs_reward=obs_reward,
                )
        except ValueError as exc:
            field, _, msg = str(exc).partition(": ")
            exp, _, found = msg.partition(", found ")
            col.problem(
                field, exp.removeprefix("expected "), found or "-", line=line, row=row, traj_id=_record_id(obj, kind)
            )
        yield
    flush_flat()
    yield


def _record_id(obj: dict, kind: str) -> str | None:
    """The trajectory (or episode) id of a record, for messages."""
    if kind == "verifiers":
        t = next(
            (x.get("trajectory_id") for x in obj["trajectory"] if isinstance(x, dict) and x.get("trajectory_id")), None
        )
    else:
        t = _get(obj, "uid", "rollout_id", "id")[0]
    return None if t is None else str(t)


def _trajectories(obj: dict, kind: str, n):
    """(traj_id, group_id, steps, outcome, scalars) of each trajectory in one record."""
    if kind == "verifiers":
        items = obj["trajectory"]
        tid = next((s.get("trajectory_id") for s in items if isinstance(s, dict) and s.get("trajectory_id")), None)
        tid = str(tid) if tid is not None else f"line{n}"
        ex = obj.get("example_id")
        steps = [_step_from(s, f"trajectory[{k}]", "verifiers") for k, s in enumerate(items)]
        scal: dict = {"truncated": bool(obj["is_truncated"])} if isinstance(obj.get("is_truncated"), bool) else {}
        if isinstance(obj.get("stop_condition"), str):
            scal["stop_reason"] = obj["stop_condition"]
        yield tid, str(ex) if ex is not None else tid, steps, obj.get("reward"), scal
    elif kind == "rllm_episode":
        eid = str(obj.get("id", f"line{n}"))
        gid = eid.split(":")[0]
        for j, t in enumerate(obj["trajectories"]):
            tid = f"{eid}/{t.get('name') or j}" if t.get("uid") is None else str(t["uid"])
            steps = [_step_from(s, f"trajectories[{j}].steps[{k}]", "rllm") for k, s in enumerate(t.get("steps") or [])]
            if not steps:
                raise ValueError(f"trajectories[{j}].steps: expected at least one step, found none")
            yield tid, gid, steps, t.get("reward"), {}
    elif kind == "rllm_trajectory":
        tid = str(obj.get("uid", f"line{n}"))
        gid = obj.get("group_id") or _task_group(obj.get("task")) or tid
        steps = [_step_from(s, f"steps[{k}]", "rllm") for k, s in enumerate(obj["steps"])]
        if not steps:
            raise ValueError("steps: expected at least one step, found none")
        yield tid, str(gid), steps, obj.get("reward"), {}
    elif kind == "agl":
        tid = str(obj.get("rollout_id", f"line{n}"))
        gid = str(obj.get("data_id", tid))
        steps = [_step_from(s, f"triplets[{k}]", "agl") for k, s in enumerate(obj["triplets"])]
        if not steps:
            raise ValueError("triplets: expected at least one triplet, found none")
        scal = {"step": int(obj["step"])} if isinstance(obj.get("step"), int) else {}
        yield tid, gid, steps, obj.get("final_reward"), scal


def from_steps(src, *, obs_reward: str = "move", errors: str = "raise", source=None):
    """Convert a step-wise log (a JSONL path, or a list of record dicts) to v1.

    Returns ``(TrajectoryBatch, ConversionReport)``; the report counts merged steps and the steps
    kept as one-turn trajectories by reason.
    """
    check_options(obs_reward=obs_reward, errors=errors)
    if source is None and isinstance(src, (str, Path)):
        source = src
    col = Collector("steps", source=source, errors=errors)
    return run(iter_steps(src, col, obs_reward=obs_reward), col)
