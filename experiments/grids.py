"""The replication grids as frozen data: arms, cells, sizes (one per experiment version), their
pre-registered comparisons, and the plan of runs they make.

A size is the whole of a grid's identity: budgets, start, seeds, arms and comparisons. Tests check
each version's data against the text docs/results.md fixed before its first run, so nothing here
changes after a grid has run; a new question is a new size.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from pathlib import Path

from mpo_viz.advantages import get_estimator

REPO = Path(__file__).resolve().parents[1]


START = REPO / "trajectories" / "starts" / "automation"


#: replication v3 E3's start for 5–6 turns: SFT continued from START at that horizon (docs/results.md)
START_D56 = REPO / "trajectories" / "starts" / "automation-d5-6"


#: replication v4 E6's own Sokoban start, made by the rule docs/results.md fixed (trajectories/starts/make_start.py
#: says how); until it is made, the grid's plan exists and a run refuses the missing folder
START_E6 = REPO / "trajectories" / "starts" / "sokoban-e6"


@dataclasses.dataclass(frozen=True)
class Arm:
    """One method of the grid: estimator and loss (with options) and where its values come from."""

    estimator: str
    loss: str
    loss_options: tuple = ()  # ((key, value), ...)
    critic: str = "learned"
    estimator_options: tuple = ()  # ((key, value), ...)
    matched_band: bool = False  # turn_ppo at the token band the matched-step rule chose for the seed


ARMS = {
    "grpo": Arm("grpo", "token_ppo"),
    "ppo": Arm("gae", "token_ppo"),
    "turn_gae": Arm("turn_gae", "token_ppo"),
    "mpo_token": Arm("mpo", "token_ppo"),
    "mpo": Arm("mpo", "turn_ppo"),
    "mpo_bare": Arm("mpo", "turn_ppo", (("token_clip", None),)),
    "mpo_oracle": Arm("mpo", "turn_ppo", critic="expert"),
    # replication v3 (docs/results.md): the policy's own Monte-Carlo values as the critic (critic="mc"),
    # the unbiased within-turn baseline, and turn_ppo at the step size of token_ppo
    "turn_gae_mc": Arm("turn_gae", "token_ppo", critic="mc"),
    "mpo_mc": Arm("mpo", "token_ppo", critic="mc"),
    # replication v4 E2' (docs/results.md): turn GAE at λ_T = 0 on the policy's Monte-Carlo values, so
    # a turn's credit is its one-step residual R_k + V(s_{k+1}) − V(s_k) and later turns' luck stays out
    "turn_gae_mc0": Arm("turn_gae", "token_ppo", critic="mc", estimator_options=(("turn_lam", 0.0),)),
    "mpo_baseline": Arm("mpo", "token_ppo", estimator_options=(("within", "baseline"),)),
    "mpo_matched": Arm("mpo", "turn_ppo", matched_band=True),
    # SAO as its paper runs it: token GAE with VAPO's length-adaptive λ = 1 − 1/(1.5·ℓ), the sao loss
    "sao": Arm("gae", "sao", estimator_options=(("lam_rule", "vapo"), ("alpha", 1.5))),
    # v4 E6: RAGEN's bi-level GAE (GAE across turns, then token GAE inside each turn)
    "bilevel_gae": Arm("bilevel_gae", "token_ppo"),
}


#: the comparisons stated in advance: (label, arm a, arm b); Holm over all of them, per cell
COMPARISONS = [
    ("MPO vs GRPO", "mpo", "grpo"),
    ("MPO vs PPO", "mpo", "ppo"),
    ("MPO vs turn GAE", "mpo", "turn_gae"),
    ("MPO vs MPO-token (turn_ppo vs token_ppo)", "mpo", "mpo_token"),
    ("MPO vs MPO bare (token band vs none)", "mpo", "mpo_bare"),
    ("MPO-oracle vs MPO (exact vs learned critic)", "mpo_oracle", "mpo"),
]


#: v3 E2, headroom: can near-true turn credit beat GRPO and PPO here at all? (primaries, Holm over both)
E2_COMPARISONS = [
    ("turn GAE + MC values vs PPO", "turn_gae_mc", "ppo"),
    ("turn GAE + MC values vs GRPO", "turn_gae_mc", "grpo"),
]


#: v4 E2', real headroom: turn credit nearer the truth (λ_T = 0 on MC values) against E2's ppo and grpo runs
E2P_COMPARISONS = [
    ("turn GAE λ_T=0 + MC values vs PPO", "turn_gae_mc0", "ppo"),
    ("turn GAE λ_T=0 + MC values vs GRPO", "turn_gae_mc0", "grpo"),
]


#: v3 E3, the long horizon one factor at a time (primaries, Holm over the four)
E3_COMPARISONS = [
    ("MPO-token vs PPO (the estimator)", "mpo_token", "ppo"),
    ("MPO-token vs turn GAE (the within-turn signal)", "mpo_token", "turn_gae"),
    ("MPO matched vs MPO-token (turn_ppo vs token_ppo at matched steps)", "mpo_matched", "mpo_token"),
    ("MPO baseline vs MPO-token (within='baseline' vs intra)", "mpo_baseline", "mpo_token"),
]


#: v4 E6, the literature's Sokoban ranking (primaries, Holm over both)
E6_COMPARISONS = [
    ("bi-level GAE vs PPO", "bilevel_gae", "ppo"),
    ("MPO-token vs PPO", "mpo_token", "ppo"),
]


#: cell name -> the difficulty range of its tasks (automation: expert turns; sokoban: optimal moves)
CELLS = {"automation-d3-4": [3, 4], "automation-d5-6": [5, 6], "sokoban-d2-6": [2, 6]}

#: cell name -> its environment, at the environment's default options (a cell not named: automation)
CELL_ENVS = {"sokoban-d2-6": "sokoban"}


def env_of(cell: str) -> str:
    """The environment a cell's tasks come from."""
    return CELL_ENVS.get(cell, "automation")


#: the noise rate of the expert the start imitated: the oracle values are this expert's
ORACLE_NOISE = 0.3


SIZES = {
    # a smoke run of the whole pipeline (a minute): nothing here learns
    "tiny": dict(
        cells=("automation-d3-4",),
        arms=("grpo", "mpo", "mpo_oracle"),
        seeds=(0,),
        iterations=2,
        episodes=8,
        epochs=1,
        minibatches=2,
        critic_epochs=1,
        eval_episodes=8,
        eval_interval=1,
        warmup_episodes=20,
        warmup_steps=2,
        pass_tasks=4,
        pass_samples=2,
        max_turn_tokens=48,
    ),
    # the pre-registered grid (docs/results.md): 2 cells × 7 arms × 6 seeds
    "v2": dict(
        cells=("automation-d3-4", "automation-d5-6"),
        arms=("grpo", "ppo", "turn_gae", "mpo_token", "mpo", "mpo_bare", "mpo_oracle"),
        seeds=tuple(range(6)),
        iterations=20,
        episodes=32,
        epochs=2,
        minibatches=4,
        critic_epochs=4,
        eval_episodes=128,
        eval_interval=5,
        warmup_episodes=512,
        warmup_steps=256,
        pass_tasks=64,
        pass_samples=8,
        max_turn_tokens=48,
    ),
}


# v3 (docs/results.md, "Replication v3"): the v2 budget, one experiment a size
SIZES["v3-e2"] = dict(
    SIZES["v2"],
    cells=("automation-d3-4",),
    arms=("grpo", "ppo", "turn_gae", "turn_gae_mc", "mpo_mc"),
    comparisons=E2_COMPARISONS,
    # the recorded deviation (docs/results.md, E2): mpo_mc is turn_gae_mc by construction
    # (MC values are constant inside a turn), shown on seeds 0 and 1; the other seeds skip it
    arm_seeds={"mpo_mc": (0, 1)},
)


SIZES["v3-e3"] = dict(
    SIZES["v2"],
    cells=("automation-d5-6",),
    seeds=tuple(range(8)),
    arms=("grpo", "ppo", "turn_gae", "mpo_token", "mpo_matched", "mpo_baseline"),
    comparisons=E3_COMPARISONS,
    start=START_D56,
)


# v4 E2' (docs/results.md, "Replication v4"): E2's cell, budget, start and seeds; its ppo and grpo runs
# are E2's archived ones (experiments/records/v4/e2p/runs holds copies of them), only turn_gae_mc0 runs anew
SIZES["v4-e2p"] = dict(
    SIZES["v2"], cells=("automation-d3-4",), arms=("grpo", "ppo", "turn_gae_mc0"), comparisons=E2P_COMPARISONS
)


# v4 E6 (docs/results.md, "Replication v4"): the exact Sokoban model at its defaults (6x6, one box,
# RAGEN's reward, turn limit = optimal moves + 2), rooms of 2-6 optimal moves, E6's own start, the v2
# budget (its iterations are set from the first unit's cost by the rule the text fixes, at most 20)
SIZES["v4-e6"] = dict(
    SIZES["v2"],
    cells=("sokoban-d2-6",),
    arms=("grpo", "ppo", "bilevel_gae", "mpo_token"),
    comparisons=E6_COMPARISONS,
    start=START_E6,
)


#: continuations per turn start of the critic="mc" arms
MC_SAMPLES = 8


def comparisons_of(size: str) -> list[tuple[str, str, str]]:
    """The comparisons a size states in advance (v1/v2: :data:`COMPARISONS`)."""
    return SIZES[size].get("comparisons", COMPARISONS)


GROUP_SIZE = 4


COLLAPSE_LEVEL, COLLAPSE_AFTER = 0.05, 4


def plan(size: str, cells=None, seeds=None, arms=None) -> list[tuple[str, int, str]]:
    """``(cell, seed, arm)`` in the order they run: cell by cell, seed by seed, arm by arm (a
    partial grid has whole seeds of its first cell); ``cells``, ``seeds`` and ``arms`` filter, and a
    size's ``arm_seeds`` keeps an arm to the seeds it names."""
    s = SIZES[size]
    only = s.get("arm_seeds", {})  # arm -> the only seeds it runs on (a recorded deviation)
    return [
        (c, seed, a)
        for c in s["cells"]
        if not cells or c in cells
        for seed in s["seeds"]
        if seeds is None or seed in seeds
        for a in s["arms"]
        if (not arms or a in arms) and seed in only.get(a, (seed,))
    ]


def grid_meta(size: str, value_target: str | None = None) -> dict:
    """``OUT/grid.json``: the size's spec with its start (:func:`start_of`, as its path in the
    repository), the arms, the comparisons, the value target and the machine."""
    spec = {**SIZES[size], "start": start_of(size)}  # a size's own start, else the shipped one
    grid = {k: str(v.relative_to(REPO)) if isinstance(v, Path) else v for k, v in spec.items()}
    return {
        "size": size,
        "grid": grid,
        "arms": {k: dataclasses.asdict(v) for k, v in ARMS.items()},
        "comparisons": comparisons_of(size),
        "value_target": value_target or VALUE_TARGET,
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "runs": len(plan(size)),
    }


def start_of(size: str) -> Path:
    """The SFT start every arm and warm-up of ``size`` begins from (a size's ``start``, else :data:`START`)."""
    return SIZES[size].get("start", START)


def uses_warmup(arm: str) -> bool:
    """Whether the arm starts from the seed's critic warm-up (a learned critic that its estimator reads)."""
    a = ARMS[arm]
    return "values" in get_estimator(a.estimator).needs and a.critic == "learned"


#: what every learned critic trains on during RL (``Config.value_target``; ``--value-target``)
VALUE_TARGET = "mc"


#: turn_ppo's token bands tried, loosest first (2.0 = the default); fixed before any calibration run
TOKEN_CLIP_LADDER = (2.0, 1.5, 1.3, 1.2, 1.1)


#: turn_ppo's per-update approx_kl must lie within this share of token_ppo's to count as matched
KL_BAND = (0.8, 1.2)


#: RL iterations per calibration run (the grid's episodes, epochs and minibatches each)
CALIBRATION_ITERATIONS = 2


COLOURS = {
    "grpo": "#2ca02c",
    "ppo": "#1f77b4",
    "turn_gae": "#9467bd",
    "mpo_token": "#ff7f0e",
    "mpo": "#d62728",
    "mpo_bare": "#7f7f7f",
    "mpo_oracle": "#8c564b",
    "turn_gae_mc": "#17becf",
    "turn_gae_mc0": "#aec7e8",
    "mpo_mc": "#e377c2",
    "mpo_baseline": "#bcbd22",
    "mpo_matched": "#8c2d04",
    "sao": "#393b79",
    "bilevel_gae": "#c49c94",
}
