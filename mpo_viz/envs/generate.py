"""Logged trajectories from the noisy expert, with exact oracle values (trajectory/v1 rows).

``generate(GenerateConfig(env="search", noise=0.25, episodes=256, group_size=4, seed=0))`` plays
``episodes / group_size`` tasks ``group_size`` times each (one ``group_id`` per task, different
dynamics and expert seeds per sample) and returns a :class:`~mpo_viz.data.trajectory.TrajectoryBatch`:

* the chat layout of :mod:`mpo_viz.envs.tokenizer` (``prompt_ids``, ``response_ids``,
  ``loss_mask``; ``turn_ids`` from :func:`mpo_viz.data.turns.turn_ids_from_mask`), ``response_tokens``,
  ``messages_json``, ``reward`` (the outcome; with shaping, ``turn_rewards`` and ``reward`` NaN),
  ``num_turns``, ``stop_reason`` (``"terminated"``/``"truncated"``), ``truncated``, ``sample_idx``;
* ``values``: oracle values aligned as docs/concepts.md §2 — before each action token the partial-turn value
  (:mod:`mpo_viz.envs.oracle`); observation tokens carry ``V`` of the state they lead to (0 after the
  end) — plus Gaussian noise of ``value_noise`` σ on every token if asked (a stand-in for a critic);
* extra per-token columns ``oracle_values`` (the noise-free values), ``oracle_token_adv`` (exact
  token-level advantages, 0 on observations) and ``decisive`` (1 on tokens that rule out a valid
  action, i.e. decide it; 0 on filler and observations);
* ``extra_json``: ``{"env", "task_seed", "seed", "success", "needed_turns", "turn_limit",
  "oracle": {"turn_v", "turn_q", "turn_adv", "turn_actions"}}`` — exact turn-level ``V(s_k)``,
  ``Q(s_k, a_k)`` and advantage ``Q − V`` of each taken action.

File metadata: ``values_source="oracle"``, ``tokenizer``, ``source_framework="mpo_viz.envs"``,
``gamma``, and ``generator`` (the config) so a file says how it was made.

An environment without a finite model (:mod:`mpo_viz.envs.protocol`) has no noisy expert and no
oracle: with an ``expert(rng)`` of its own, its expert's episodes are written without ``values`` and
oracle columns (``values_source="none"``, the noise options unused); without one it is refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import warnings
from dataclasses import dataclass, field

import numpy as np

from mpo_viz.checks import OptionError
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.data.turns import turn_ids_from_mask
from mpo_viz.envs.base import TextEnv
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.oracle import Oracle
from mpo_viz.envs.protocol import ProtocolEnv, play_expert
from mpo_viz.envs.registry import make_env
from mpo_viz.envs.tokenizer import ChatLayout, UnknownTextWarning, build_tokenizer

#: the extra per-token columns a generated batch carries (float32; saved and loaded like any column)
ORACLE_TOKEN_FIELDS = ("oracle_values", "oracle_token_adv", "decisive")

__all__ = ["ORACLE_TOKEN_FIELDS", "GenerateConfig", "generate", "generate_rows", "run_episode", "oracle_columns"]


@dataclass
class GenerateConfig:
    """How to generate a set of expert trajectories.

    Fields:
        env: environment name (``search``, ``tooluse``, ``automation``, an entry point's, or
            ``package.module:factory``).
        policy: only ``"expert"`` (the scripted noisy expert) for now.
        noise: the expert's noise rate p (random valid action with probability p).
        episodes: trajectories in all; must be a multiple of ``group_size``.
        group_size: samples per task (G); each task is one group.
        seed: master seed; the whole set is a deterministic function of the config.
        value_noise: σ of Gaussian noise added to ``values`` (0 = the exact oracle).
        reasoning: the expert writes its short thought before the command.
        difficulty: expert turns per task, an int or an inclusive (min, max) range; None (default):
            the environment's own default (3–6 for the built-in ones).
        gamma: turn-level discount of the oracle values.
        env_options: further keyword options of the environment (``slack``, ``shaping``, ``slip``...).
    """

    env: str = "search"
    policy: str = "expert"
    noise: float = 0.25
    episodes: int = 256
    group_size: int = 4
    seed: int = 0
    value_noise: float = 0.0
    reasoning: bool = True
    difficulty: int | tuple[int, int] | None = None
    gamma: float = 1.0
    env_options: dict = field(default_factory=dict)

    def validate(self) -> None:
        if self.policy != "expert":
            raise OptionError("policy", f"expected 'expert', found {self.policy!r}")
        if self.group_size < 1:
            raise OptionError("group_size", f"expected >= 1, found {self.group_size}")
        if self.episodes < 1 or self.episodes % self.group_size:
            raise OptionError(
                "episodes", f"expected a positive multiple of group_size={self.group_size}, found {self.episodes}"
            )
        if not (self.value_noise >= 0 and math.isfinite(self.value_noise)):
            raise OptionError("value_noise", f"expected a finite sigma >= 0, found {self.value_noise}")


def run_episode(
    env: TextEnv,
    expert: NoisyExpert,
    layout: ChatLayout,
    *,
    seed: int,
    task=None,
    task_seed: int | None = None,
    gamma: float = 1.0,
    oracle: Oracle | None = None,
) -> dict:
    """Play one episode with the expert and return a v1 row (without ids) plus oracle columns.

    Keys: ``prompt_ids``, ``response_ids``, ``loss_mask``, ``turn_ids``, ``values`` (exact oracle,
    float64 list), ``oracle_token_adv``, ``decisive``, ``response_tokens``, ``messages_json``,
    ``reward``, ``turn_rewards`` (list, always), ``num_turns``, ``stop_reason``, ``truncated``,
    ``success`` and ``oracle`` (turn-level dict). ``oracle`` may be passed to share memoization
    between the samples of one task.
    """
    env.reset(seed=seed, task=task, task_seed=task_seed)
    if oracle is None or oracle.task != env.task:
        oracle = Oracle(env, expert, gamma=gamma, encode=layout.action)
    rng = random.Random(f"expert-{seed}")
    prompt = layout.prompt(env.messages)
    ids: list[int] = []
    mask: list[int] = []
    vals: list[float] = []
    adv: list[float] = []
    dec: list[int] = []
    turn_v, turn_q, turn_actions, rewards = [], [], [], []
    success = False
    trunc = False
    while not env.done:
        state = env.state
        _, text = expert.act(env, rng)
        toks = layout.action(text)
        obs, r, term, trunc, info = env.step(text)
        to = oracle.turn(state, toks, info["action"])
        ids += toks
        mask += [1] * len(toks)
        vals += to.values.tolist()
        adv += to.token_adv.tolist()
        dec += to.decisive.astype(int).tolist()
        turn_v.append(to.v)
        turn_q.append(to.q)
        turn_actions.append(info["action"])
        rewards.append(float(r))
        success = info["success"]
        otoks = layout.observation(env.obs_role, obs, final=env.done)
        v_next = 0.0 if env.done else oracle.value(env.state)
        ids += otoks
        mask += [0] * len(otoks)
        vals += [v_next] * len(otoks)
        adv += [0.0] * len(otoks)
        dec += [0] * len(otoks)
    mask_arr = np.asarray(mask, dtype=np.int64)
    return {
        "prompt_ids": prompt,
        "response_ids": ids,
        "loss_mask": mask,
        "turn_ids": turn_ids_from_mask(mask_arr).tolist(),
        "values": vals,
        "oracle_token_adv": adv,
        "decisive": dec,
        "response_tokens": layout.tokens(ids),
        "messages_json": json.dumps(env.messages),
        "reward": float(sum(rewards)),
        "turn_rewards": rewards,
        "num_turns": len(rewards),
        "stop_reason": "truncated" if trunc else "terminated",
        "truncated": bool(trunc),
        "success": bool(success),
        "needed_turns": env.needed_turns(env.task),
        "turn_limit": env.turn_limit,
        "oracle": {
            "turn_v": turn_v,
            "turn_q": turn_q,
            "turn_adv": [q - v for q, v in zip(turn_q, turn_v)],
            "turn_actions": turn_actions,
        },
    }


def _env_of(cfg: GenerateConfig) -> TextEnv:
    kw = dict(cfg.env_options)
    if cfg.difficulty is not None:
        kw["difficulty"] = cfg.difficulty
    return make_env(cfg.env, **kw)


def _unknown_warning(layout: ChatLayout, meta: dict) -> None:
    """``meta["unknown_text"]`` and one warning when the layout counted text lost to ``[UNK]``."""
    if layout.unknown:
        meta["unknown_text"] = layout.unknown.summary()
        warnings.warn(layout.unknown.line("the environment's word-level tokenizer"), UnknownTextWarning, stacklevel=3)


def _protocol_rows(cfg: GenerateConfig, env: ProtocolEnv, layout: ChatLayout) -> list[dict]:
    """The episodes of an environment's own expert (no finite model: no values, no oracle)."""
    if not env.has_expert:
        raise OptionError(
            "policy",
            f"expected an environment with a scripted expert for --policy expert, found "
            f"{env.name}, which has no finite model (no noisy expert) and no expert(rng) of "
            "its own; play it with a model (--policy model)",
        )
    master = random.Random(cfg.seed)
    rows, lists = [], []
    for g in range(cfg.episodes // cfg.group_size):
        task_seed = master.randrange(2**31)
        gid = f"{env.name}-s{cfg.seed}-t{g:04d}"
        for j in range(cfg.group_size):
            seed = master.randrange(2**31)
            ep = play_expert(env, layout, seed=seed, task_seed=task_seed)
            extra = {
                "env": env.env_id or env.name,
                "task_seed": task_seed,
                "seed": seed,
                "success": ep["success"],
                "needed_turns": None,
                "turn_limit": env.turn_limit,
            }
            lists.append(ep["rewards"])
            rows.append(
                {
                    "traj_id": f"{gid}-{j}",
                    "group_id": gid,
                    "sample_idx": j,
                    "prompt_ids": ep["prompt_ids"],
                    "response_ids": ep["response_ids"],
                    "loss_mask": ep["loss_mask"],
                    "turn_ids": ep["turn_ids"],
                    "response_tokens": ep["response_tokens"],
                    "messages_json": json.dumps(ep["messages"]),
                    "reward": float(sum(ep["rewards"])),
                    "turn_rewards": ep["rewards"],
                    "num_turns": ep["num_turns"],
                    "stop_reason": ep["stop_reason"],
                    "truncated": ep["truncated"],
                    "extra_json": json.dumps(extra),
                }
            )
    shaped = any(any(r != 0 for r in rs[:-1]) for rs in lists)
    for row in rows:
        if shaped:
            row["reward"] = float("nan")
        else:
            del row["turn_rewards"]
    return rows


def generate_rows(cfg: GenerateConfig) -> tuple[list[dict], dict]:
    """The v1 rows and file metadata of :func:`generate` (no validation, no batch)."""
    cfg.validate()
    env = _env_of(cfg)
    layout = ChatLayout(build_tokenizer(env))
    if isinstance(env, ProtocolEnv):
        rows = _protocol_rows(cfg, env, layout)
        env_id = env.env_id or env.name
        meta: dict = {
            "tokenizer": f"mpo_viz.envs.build_tokenizer({env_id!r})",
            "source_framework": "mpo_viz.envs",
            "values_source": "none",
            "generator": {**dataclasses.asdict(cfg), "env": env_id, "env_options": env.option_values()},
        }
        _unknown_warning(layout, meta)
        return rows, meta
    expert = NoisyExpert(noise=cfg.noise, reasoning=cfg.reasoning)
    master = random.Random(cfg.seed)
    noise_rng = np.random.default_rng(cfg.seed)
    rows = []
    shaped = env.shaping != 0.0
    for g in range(cfg.episodes // cfg.group_size):
        task_seed = master.randrange(2**31)
        task = env.make_task(task_seed)
        oracle = Oracle(env, expert, task=task, gamma=cfg.gamma, encode=layout.action)
        gid = f"{cfg.env}-s{cfg.seed}-t{g:04d}"
        for j in range(cfg.group_size):
            seed = master.randrange(2**31)
            ep = run_episode(env, expert, layout, seed=seed, task=task, gamma=cfg.gamma, oracle=oracle)
            clean = np.asarray(ep["values"], dtype=np.float64)
            noisy = clean + (noise_rng.normal(0.0, cfg.value_noise, clean.shape) if cfg.value_noise else 0.0)
            extra = {
                "env": cfg.env,
                "task_seed": task_seed,
                "seed": seed,
                "success": ep["success"],
                "needed_turns": ep["needed_turns"],
                "turn_limit": ep["turn_limit"],
                "oracle": {
                    k: ([round(x, 9) for x in v] if k != "turn_actions" else v) for k, v in ep["oracle"].items()
                },
            }
            row = {
                "traj_id": f"{gid}-{j}",
                "group_id": gid,
                "sample_idx": j,
                "prompt_ids": ep["prompt_ids"],
                "response_ids": ep["response_ids"],
                "loss_mask": ep["loss_mask"],
                "turn_ids": ep["turn_ids"],
                "values": noisy.astype(np.float32),
                "oracle_values": clean.astype(np.float32),
                "oracle_token_adv": np.asarray(ep["oracle_token_adv"], dtype=np.float32),
                "decisive": np.asarray(ep["decisive"], dtype=np.float32),
                "response_tokens": ep["response_tokens"],
                "messages_json": ep["messages_json"],
                "reward": float("nan") if shaped else ep["reward"],
                "num_turns": ep["num_turns"],
                "stop_reason": ep["stop_reason"],
                "truncated": ep["truncated"],
                "extra_json": json.dumps(extra),
            }
            if shaped:
                row["turn_rewards"] = ep["turn_rewards"]
            rows.append(row)
    meta = {
        "tokenizer": f"mpo_viz.envs.build_tokenizer({cfg.env!r})",
        "source_framework": "mpo_viz.envs",
        "values_source": "oracle",
        "gamma": cfg.gamma,
        "value_noise": cfg.value_noise,
        "generator": dataclasses.asdict(cfg),
    }
    _unknown_warning(layout, meta)
    return rows, meta


def generate(cfg: GenerateConfig):
    """Generate the trajectories of ``cfg`` as a validated :class:`~mpo_viz.data.trajectory.TrajectoryBatch`."""
    rows, meta = generate_rows(cfg)
    if meta["values_source"] == "none":  # an environment's own expert: no oracle columns
        return TrajectoryBatch.from_rows(rows, meta=meta)
    extra = {name: [r.pop(name) for r in rows] for name in ORACLE_TOKEN_FIELDS}
    return TrajectoryBatch.from_rows(rows, meta=meta).with_token_fields(**extra)


def oracle_columns(batch: TrajectoryBatch) -> dict:
    """The oracle columns of a generated batch: ``values`` ``(B, L)`` float32 (noise-free),
    ``token_adv`` ``(B, L)``, ``decisive`` ``(B, L)`` (0/1) as padded torch tensors, and the per-turn
    lists ``turn_v``, ``turn_q``, ``turn_adv`` (one list per trajectory) from ``extra_json``."""
    for name in ("oracle_values", "oracle_token_adv", "decisive", "extra_json"):
        if not batch.has(name):
            raise ValueError(f"batch: expected the field {name!r} of mpo-viz generate, found it missing")
    turn = [json.loads(x)["oracle"] for x in batch.field("extra_json")]
    return {
        "values": batch.padded("oracle_values"),
        "token_adv": batch.padded("oracle_token_adv"),
        "decisive": batch.padded("decisive"),
        "turn_v": [t["turn_v"] for t in turn],
        "turn_q": [t["turn_q"] for t in turn],
        "turn_adv": [t["turn_adv"] for t in turn],
    }
