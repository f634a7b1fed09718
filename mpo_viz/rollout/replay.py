"""Turn states by replay: every turn boundary of a recorded episode rebuilt exactly.

An episode the toolkit wrote (``mpo-viz generate``, :func:`~mpo_viz.rollout.rollout`, the trainer's
run folders) records its environment (the file metadata's ``generator``: name and options), its
task seed and its dynamics seed (``extra_json``). :func:`replay` resets a fresh environment with
those seeds and steps it with each recorded turn's text (decoded from its recorded tokens), so that
before every turn ``k`` it holds the state ``s_k`` the policy met. Each replayed observation is
checked against the recorded one, token for token: a mismatch is a :class:`ReplayError` naming the
trajectory, the turn and the two texts (the file was edited, or was made by other code or options).

What a boundary carries (:class:`TurnState`): a snapshot of the environment at ``s_k`` (to be
:meth:`~mpo_viz.envs.TextEnv.fork`\\ ed by branch rollouts), the exact token prefix the policy read
before turn ``k``'s first action token (``prompt_ids + response_ids[:start]``), and turn ``k``'s own
recorded tokens.

**Your own environment** takes part when its ``reset`` and ``step(text)`` are deterministic
functions of the seeds and the texts (replay), and it has ``fork(seed)`` (a copy at its current
state, its whole dynamic state and RNG included, whose future dynamics draw from a new stream;
:class:`~mpo_viz.envs.TextEnv` has it). A plain reset/step object (:mod:`mpo_viz.envs.protocol`) is
wrapped. A file records the name it was made under, so an environment made by ``make_env`` from a
registered name, an entry point or ``package.module:factory`` is rebuilt from the file alone;
otherwise pass it as ``env=``. docs/environments.md walks through it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.envs.base import TextEnv
from mpo_viz.envs.protocol import as_env
from mpo_viz.envs.registry import env_declarations, make_env
from mpo_viz.envs.tokenizer import build_tokenizer
from mpo_viz.models.layout import layout_for

__all__ = ["ReplayError", "TurnState", "replay", "env_of", "word_layout_of"]


class ReplayError(ValueError):
    """A recorded episode that cannot be replayed: what is missing, or which turn differs."""


@dataclass
class TurnState:
    """One turn boundary of a recorded episode (the state before turn ``turn``).

    ``row``/``traj_id``: the episode; ``env``: a snapshot at ``s_k`` (fork it, never step it);
    ``prefix``: ``prompt_ids + response_ids[:start]`` (the tokens read before the turn's first action
    token); ``start``/``end``: response positions of the turn's first action token and one past its
    last; ``action_ids``: the turn's recorded tokens; ``cut``: the recorded turn was cut by the
    rollout's total token budget (the environment never saw it); ``prompt_len``: the prompt's length.
    """

    row: int
    traj_id: str
    turn: int
    env: TextEnv
    prefix: list[int]
    start: int
    end: int
    action_ids: list[int]
    cut: bool
    prompt_len: int


def env_of(batch: TrajectoryBatch) -> TextEnv:
    """The environment a file of the toolkit was made in, rebuilt from its metadata ``generator``
    (``env`` and ``env_options``, or ``mpo-viz generate``'s ``difficulty`` and ``env_options``)."""
    gen = batch.meta.get("generator")
    if not isinstance(gen, dict) or not gen.get("env"):
        raise ReplayError(
            "the file's metadata has no 'generator' naming its environment: only files the toolkit "
            "wrote (mpo-viz generate, rollout, the trainer's run folders) replay; for other data pass "
            "env= (an environment with reset/step/fork, docs/environments.md)"
        )
    opts = dict(gen.get("env_options") or {})
    declared = env_declarations(gen["env"])
    if (
        gen.get("difficulty") is not None
        and "difficulty" not in opts
        and (declared is None or "difficulty" in declared)
    ):
        opts["difficulty"] = gen["difficulty"]
    if isinstance(opts.get("difficulty"), list):
        opts["difficulty"] = tuple(opts["difficulty"])
    return make_env(gen["env"], **opts)


def word_layout_of(env: TextEnv):
    """The environments' word-level chat layout for ``env`` (the layout of expert files)."""
    return layout_for(build_tokenizer(env))


def _seeds(batch: TrajectoryBatch, i: int) -> tuple[int, int]:
    tid = batch.traj_ids[i]
    raw = batch.field("extra_json")[i] if batch.has("extra_json") else None
    try:
        info = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        info = {}
    missing = [k for k in ("task_seed", "seed") if not isinstance(info.get(k), int)]
    if missing:
        raise ReplayError(
            f"trajectory {tid!r}: extra_json has no {' and '.join(missing)} (the task and dynamics "
            "seeds the toolkit records when it plays an episode); this row cannot be replayed"
        )
    return int(info["task_seed"]), int(info["seed"])


def _spans(mask: np.ndarray, tids: np.ndarray) -> list[tuple[int, int, int]]:
    """Per turn ``(start, end, obs_end)``: first action position, one past the last, and one past
    the observation that follows (the next turn's start, or the response's end)."""
    act = np.flatnonzero(mask != 0)
    k = int(tids[act].max()) + 1 if len(act) else 0
    starts = [int(act[tids[act] == j].min()) for j in range(k)]
    ends = [int(act[tids[act] == j].max()) + 1 for j in range(k)]
    return [(s, e, starts[j + 1] if j + 1 < k else len(mask)) for j, (s, e) in enumerate(zip(starts, ends))]


def _messages(batch: TrajectoryBatch, i: int) -> list[dict] | None:
    if not batch.has("messages_json"):
        return None
    raw = batch.field("messages_json")[i]
    try:
        return json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return None


def replay(batch: TrajectoryBatch, layout, *, env: TextEnv | None = None) -> list[list[TurnState]]:
    """Every turn boundary of every row of ``batch``, rebuilt by replay (module docstring).

    Args:
        batch: trajectories the toolkit wrote (their ``extra_json`` has ``task_seed`` and ``seed``).
        layout: the chat layout the episodes were tokenized with (``policy.layout``, or
            :func:`word_layout_of` for the word-level files).
        env: the environment to replay in (default: rebuilt from the metadata, :func:`env_of`).

    Returns:
        per row, its :class:`TurnState` for turns ``0..K−1``.

    Raises:
        ReplayError: a row without seeds, a prompt or an observation that differs from the replay
            (naming the trajectory, the turn and both texts), an episode that ends early.
    """
    env = env if env is not None else env_of(batch)
    if not callable(getattr(env, "fork", None)) or not getattr(env, "can_fork", True):
        raise ReplayError(
            f"environment {getattr(env, 'name', type(env).__name__)} cannot branch: it needs fork(seed), "
            "a copy at its current state that copies the whole dynamic state (any RNG included) and "
            "draws its future from a stream seeded by seed (see docs/environments.md)"
        )
    try:
        env = as_env(env)
    except TypeError as exc:
        raise ReplayError(str(exc)) from None
    masks, tids = batch.field("loss_mask"), batch.field("turn_ids")
    prompts, resps = batch.field("prompt_ids"), batch.field("response_ids")
    stops = batch.field("stop_reason") if batch.has("stop_reason") else [None] * len(batch)
    out = []
    for i in range(len(batch)):
        out.append(
            _replay_row(
                batch,
                i,
                env,
                layout,
                np.asarray(masks[i]),
                np.asarray(tids[i]),
                [int(x) for x in prompts[i]],
                [int(x) for x in resps[i]],
                stops[i],
            )
        )
    return out


def _replay_row(batch, i, env, layout, mask, tids, prompt, resp, stop) -> list[TurnState]:
    tid = batch.traj_ids[i]
    task_seed, seed = _seeds(batch, i)
    e = env.spawn() if callable(getattr(env, "spawn", None)) else env.fork(0)
    e.reset(seed=seed, task_seed=task_seed)
    if layout.prompt(e.messages) != prompt:
        raise ReplayError(
            f"trajectory {tid!r}: turn 0: the replayed prompt differs from the recorded one: recorded "
            f"{layout.text(prompt)!r}, replayed {e.messages[-1]['content']!r} (another environment, "
            "options or tokenizer)"
        )
    msgs = _messages(batch, i)
    states = []
    spans = _spans(mask, tids)
    for k, (s, t, obs_end) in enumerate(spans):
        if e.done:
            raise ReplayError(
                f"trajectory {tid!r}: turn {k}: the replayed episode ended after turn {k - 1}, the "
                f"record has {len(spans)} turns"
            )
        action = resp[s:t]
        cut = k == len(spans) - 1 and stop == "max_total_tokens" and obs_end == t
        states.append(
            TurnState(
                row=i,
                traj_id=tid,
                turn=k,
                env=e.fork(0),
                prefix=prompt + resp[:s],
                start=s,
                end=t,
                action_ids=action,
                cut=cut,
                prompt_len=len(prompt),
            )
        )
        if cut:
            break
        obs = e.step(layout.text(action))[0]
        replayed = layout.observation(e.obs_role, obs, final=e.done)
        if replayed != resp[t:obs_end]:
            rec = _recorded_obs(msgs, k) or layout.text(resp[t:obs_end])
            raise ReplayError(
                f"trajectory {tid!r}: turn {k}: the replayed observation differs from the recorded one: "
                f"recorded {rec!r}, replayed {obs!r}"
            )
    return states


def _recorded_obs(msgs: list[dict] | None, k: int) -> str | None:
    """The observation after assistant turn ``k`` in the recorded messages."""
    if not msgs:
        return None
    seen = -1
    for j, m in enumerate(msgs):
        if m.get("role") == "assistant":
            seen += 1
            if seen == k:
                nxt = msgs[j + 1] if j + 1 < len(msgs) else None
                return None if nxt is None else str(nxt.get("content"))
    return None
