"""The rollout's options and its plan: which tasks, which sample seeds (see :mod:`mpo_viz.rollout`)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from mpo_viz.checks import OptionError
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.options import check_fields, setting

STOP_REASONS = ("terminated", "turn_limit", "max_total_tokens")
#: the oracle's per-token columns (as in files of ``mpo-viz generate``)
ORACLE_TOKEN_FIELDS = ("oracle_values", "oracle_token_adv", "decisive")

#: the default oracle: exact values under the noisy expert of ``mpo-viz generate`` (noise 0.25)
DEFAULT_ORACLE = NoisyExpert()


@dataclass
class RolloutConfig:
    """Options of :func:`rollout` (recorded in the file metadata as ``generator``); each field is
    declared as an :class:`~mpo_viz.options.Option` and checked by :meth:`validate`."""

    group_size: int = setting(1, kind="int", low=1, doc="samples per task (G); tasks are groups (one group_id)")
    seed: int = setting(0, kind="any", doc="master seed: tasks (unless seeds), environment dynamics and sampling noise")
    temperature: float = setting(
        1.0, low=0, expect="a finite number >= 0 (0 = greedy)", doc="sampling temperature; 0 = greedy (argmax)"
    )
    top_p: float = setting(
        1.0,
        low=0,
        high=1,
        low_open=True,
        expect="a number in (0, 1]",
        doc="nucleus sampling mass in (0, 1]; 1 = the whole distribution",
    )
    max_turn_tokens: int = setting(
        48, kind="int", low=1, doc="at most this many tokens per assistant turn (the stop token included)"
    )
    max_total_tokens: int = setting(
        1024, kind="int", low=1, doc="the episode's token budget (prompt + response, see the module docstring)"
    )
    batch_size: int = setting(16, kind="int", low=1, doc="live episodes decoded together")
    seeds: list[int] | None = None
    """explicit task seeds (one group of G episodes each) instead of tasks drawn from ``seed``"""

    def validate(self) -> None:
        check_fields(self)
        for s in self.seeds or ():
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
                raise OptionError("seeds", f"expected task seeds (ints >= 0), found {s!r}")


def task_seeds(seed: int, n_tasks: int) -> list[int]:
    """The task seeds :func:`rollout` draws from ``seed`` when ``seeds`` is not given (the same
    tasks ``mpo-viz generate --seed`` plays with the expert)."""
    return [t for t, _ in _plan_from_seed(seed, n_tasks, 1)]


def _plan_from_seed(seed: int, n_tasks: int, g: int) -> list[tuple[int, list[int]]]:
    # the draw order of envs/generate.py: a task seed, then the G sample seeds of that task
    master = random.Random(seed)
    out = []
    for _ in range(n_tasks):
        ts = master.randrange(2**31)
        out.append((ts, [master.randrange(2**31) for _ in range(g)]))
    return out


def _plan_from_list(seed: int, seeds, g: int) -> list[tuple[int, list[int]]]:
    out = []
    for ts in seeds:
        r = random.Random(f"rollout-{seed}-{int(ts)}")
        out.append((int(ts), [r.randrange(2**31) for _ in range(g)]))
    return out


def plan_tasks(cfg: RolloutConfig, n_episodes: int | None) -> list[tuple[int, list[int]]]:
    """``[(task seed, [sample seeds])]``: the tasks drawn from ``cfg.seed``, or ``cfg.seeds``."""
    g = cfg.group_size
    if cfg.seeds is None:
        if n_episodes is None or isinstance(n_episodes, bool) or n_episodes < 1 or n_episodes % g:
            raise OptionError("n_episodes", f"expected a positive multiple of group_size={g}, found {n_episodes!r}")
        return _plan_from_seed(cfg.seed, n_episodes // g, g)
    if n_episodes is not None and n_episodes != len(cfg.seeds) * g:
        raise OptionError(
            "n_episodes", f"expected len(seeds) * group_size = {len(cfg.seeds) * g} with seeds, found {n_episodes}"
        )
    return _plan_from_list(cfg.seed, cfg.seeds, g)
