"""The trainer's configuration: one flat dataclass, validated on construction, JSON round trip.

``Config(env="search", estimator="mpo", loss="turn_ppo")`` — every field has a default that works
for the tiny CPU models. Each field is declared once, as an :class:`~mpo_viz.options.Option`
(:func:`~mpo_viz.options.setting`: its kind, bounds or choices and its doc); from that declaration
come the check, the ``mpo-viz train`` flags (:mod:`mpo_viz.cli.train`) and the field table of
docs/training.md (:func:`config_table`). A bad value raises :class:`~mpo_viz.checks.OptionError` (a
``ValueError``) naming the field, what was expected and what was found; unknown keys in a JSON file
are refused by name. Estimator options are checked against the estimator's declarations
(:func:`mpo_viz.advantages.estimator_options`), loss options against the loss kind's
(:func:`mpo_viz.losses.loss_options`), so every option either estimator or loss accepts is accepted here
and nothing else.

Critic fields (``critic_lr``, ``value_clip``, ``critic_epochs``, ``critic_warmup_*``, ``value_target``,
``critic_init``) default to ``None`` = "the default, when the estimator uses a learned critic";
setting one with a critic-free estimator (grpo, rloo, ...) or with ``critic="expert"``/``"mc"`` is refused,
since it would silently do nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from mpo_viz.advantages import available_estimators as estimators
from mpo_viz.advantages import estimator_options as estimator_declarations
from mpo_viz.advantages import get_estimator
from mpo_viz.checks import OptionError
from mpo_viz.envs.base import parse_difficulty
from mpo_viz.envs.library import library_of
from mpo_viz.envs.registry import available_envs, env_declarations, is_spec, resolve_env
from mpo_viz.losses import KL_KINDS
from mpo_viz.losses import available_losses as losses
from mpo_viz.losses import loss_options as loss_declarations
from mpo_viz.options import Option, check_fields, declared, setting

__all__ = [
    "Config",
    "CRITIC_DEFAULTS",
    "CRITIC_KINDS",
    "ExpertCriticWarning",
    "RESUMABLE_FIELDS",
    "TrustRegionWarning",
    "config_table",
    "parse_difficulty",
    "warmup_pool",
    "warmup_steps",
]

#: what each critic field means when left at None (and the estimator needs a critic); the warm-up's
#: pool and budget are these at most, smaller for a short run (:func:`warmup_pool`, :func:`warmup_steps`)
CRITIC_DEFAULTS = {
    "critic_lr": 3e-4,
    "value_clip": 0.5,
    "critic_epochs": 4,
    "critic_warmup_episodes": 512,
    "critic_warmup_steps": 256,
    "critic_warmup_ev": 0.2,
    "critic_warmup_lr": 1e-3,
    "critic_init": "policy",
    "critic_warmup_positions": "all",
    "value_target": "estimator",
}
#: the smallest default warm-up pool (a short run's pool: its own episodes, iterations × episodes, at least this)
WARMUP_POOL_MIN = 64
#: where an estimator's values can come from (``Config.critic``)
CRITIC_KINDS = ("learned", "expert", "mc")
#: the continuations per turn start of ``critic="mc"`` when ``mc_samples`` is None
MC_SAMPLES = 8
#: fields added after runs were recorded that leave a run's identity (its hash) as it was while None,
#: so a run folder written before them keeps its hash and resumes
LATER_FIELDS = ("mc_samples", "value_target", "critic_warmup_positions")
#: the text of ``critic="expert"``'s one-time warning: what it reads (how far off, measured: docs/training.md,
#: section 2, "The expert's values")
EXPERT_BIAS = (
    "the scripted expert's exact values, not this policy's: too high at the turn starts of a policy weaker "
    'than the expert, with another turn credit (measured in docs/training.md, "The expert\'s values"); '
    "use critic='mc' for the policy's values"
)
#: how the critic starts (``Config.critic_init``)
CRITIC_INITS = ("policy", "fresh", "shared")
#: what the learned critic is trained on during RL (``Config.value_target``)
VALUE_TARGETS = ("estimator", "mc")
#: sizes of the tiny policy (``Config.model_size``)
MODEL_SIZES = ("1m", "3m", "10m")
#: fields a resume may change (``mpo-viz train --resume DIR --iterations N --log-to tensorboard``)
RESUMABLE_FIELDS = ("iterations", "log_to", "side_thread")
#: experiment trackers (``Config.log_to``; :mod:`mpo_viz.train.trackers`)
TRACKER_KINDS = ("wandb", "tensorboard")


class ExpertCriticWarning(UserWarning):
    """``critic="expert"``: the values are the scripted expert's, not the trained policy's."""


class TrustRegionWarning(UserWarning):
    """A PPO-style loss configured so that every importance ratio is 1 (the clip never acts)."""


@dataclass
class Config:
    """Everything one training run needs (see docs/training.md for a guide to each group); each
    field's doc is the ``doc`` of its declaration (``Config.options()``)."""

    # ------------------------------------------------------------------ environment
    env: str = setting(
        "search",
        kind="choice",
        choices=available_envs,
        doc="Environment name (``search``, ``tooluse``, ``automation``, your own registered one, an installed "
        "package's entry point of group ``mpo_viz.envs``, ``gem:<id>`` / ``textarena:<id>`` (a game of GEM or "
        "TextArena), or ``package.module:factory``).",
    )
    difficulty: int | list | None = setting(
        None,
        kind="any",
        parse=parse_difficulty,
        expect="an int or [min, max] of expert turns, or None",
        doc="Expert turns per task: an int or ``[min, max]`` (on the command line ``N`` or ``MIN-MAX``, e.g. "
        "``--difficulty 5-6``); None = the environment's default (3–6).",
    )
    env_options: dict = setting(
        default_factory=dict,
        kind="dict",
        expect="a dict of environment options",
        doc="Further keyword options of the environment (``slack``, ``max_turns``, ``distractors``, ...), "
        "checked against the options it declares; each declared one also has a flag of ``mpo-viz train``.",
    )

    # ------------------------------------------------------------------ models
    model_size: str = setting(
        "1m",
        kind="choice",
        choices=MODEL_SIZES,
        doc="Size of the tiny Llama policy built for the environment's tokenizer: ``1m``, ``3m``, ``10m``.",
    )
    model_dir: str | None = setting(
        None,
        kind="str",
        optional=True,
        doc="A local model folder to start from instead (``DIR/policy``, and ``DIR/critic`` when present), a "
        "plain Hugging Face one, or a trained checkpoint (``RUN/checkpoints/iter=N``, or ``RUN``: its last).",
    )
    critic: str = setting(
        "learned",
        kind="choice",
        choices=CRITIC_KINDS,
        doc='Where the values the estimator reads come from: ``"learned"`` (a critic trained on the '
        'returns; default); ``"mc"`` (the current policy\'s Monte-Carlo values at turn starts, from '
        "``mc_samples`` branch rollouts of every turn state, broadcast over each turn's tokens; no critic "
        'is trained: VinePPO-style); or ``"expert"`` (the environment\'s exact values under the scripted '
        "noisy expert of ``oracle_noise``; no critic is trained) — the *expert's* values, biased for any "
        "other policy (a one-time warning says so).",
    )
    mc_samples: int | None = setting(
        None,
        kind="int",
        low=2,
        optional=True,
        doc='Continuations per turn start of ``critic="mc"`` (None: 8). More halve the standard error '
        "by their square root and cost in proportion.",
    )
    critic_init: str | None = setting(
        None,
        kind="choice",
        choices=CRITIC_INITS,
        optional=True,
        doc='How the critic starts: ``"policy"`` (a copy of the policy\'s trunk; default), ``"fresh"`` '
        '(a new trunk), or ``"shared"`` (the policy\'s trunk itself plus a value head; the value loss '
        "then also trains the shared trunk through the policy's optimizer).",
    )
    value_target: str | None = setting(
        None,
        kind="choice",
        choices=VALUE_TARGETS,
        optional=True,
        doc='What the value loss trains the learned critic on during RL: ``"estimator"`` (the estimator\'s '
        "own returns; default: gae and vapo ``A + V`` at their λ, turn_gae the turn returns ``G^T_k``, "
        "which bootstrap on the critic and are flat inside a turn, mpo its ``critic_target``) or "
        '``"mc"`` (the Monte-Carlo returns at the estimator\'s γ/γ_T, whatever the estimator: runs that '
        "compare estimators then train their critics on one target). The warm-up always fits the "
        "Monte-Carlo returns.",
    )

    # ------------------------------------------------------------------ algorithm
    estimator: str = setting(
        "mpo",
        kind="choice",
        choices=estimators,
        doc="Advantage estimator, any name of :func:`mpo_viz.advantages.available_estimators` (mpo, gae, grpo, ...).",
    )
    estimator_options: dict = setting(
        default_factory=dict,
        kind="dict",
        doc="Options of the estimator (``gamma``, ``lam``, ``beta``, ...), checked against its registry entry.",
    )
    loss: str = setting(
        "turn_ppo",
        kind="choice",
        choices=losses,
        doc="Policy loss kind, any name of :func:`mpo_viz.losses.available_losses` (turn_ppo, token_ppo, gspo, sao).",
    )
    loss_options: dict = setting(
        default_factory=dict,
        kind="dict",
        doc="Options of the loss: ``clip_low``, ``clip_high``, ``ratio``, ``agg`` and the kind's own "
        "(``dual_clip``; ``token_clip`` for turn_ppo — default 2.0, ``None`` for the bare turn-level "
        "trust region — and gspo).",
    )

    # ------------------------------------------------------------------ batch shape
    episodes: int = setting(
        64, kind="int", low=1, doc="Episodes rolled out per iteration (N); a multiple of ``group_size``."
    )
    group_size: int = setting(
        1, kind="int", low=1, doc="Samples per task (G); group estimators (grpo, rloo, ...) need G >= 2."
    )
    epochs: int = setting(2, kind="int", low=1, doc="Passes of the policy over each iteration's episodes (E).")
    critic_epochs: int | None = setting(
        None,
        kind="int",
        low=1,
        optional=True,
        doc="Passes of the critic over each iteration's episodes, apart from the policy's (None: 4 with a "
        'learned critic). With ``critic_init="shared"`` the critic moves with the policy (E passes).',
    )
    minibatches: int = setting(
        4,
        kind="int",
        low=1,
        doc="Optimizer steps per epoch (M); the episodes are shuffled and split into M minibatches.",
    )
    micro_batch_tokens: int = setting(
        8192,
        kind="int",
        low=1,
        doc="Token budget (prompt + response, padded) of one forward/backward; a minibatch is cut into "
        "micro-batches under it and their gradients accumulated (the loss normaliser stays the "
        "minibatch's).",
    )

    # ------------------------------------------------------------------ rollout
    temperature: float = setting(1.0, low=0, low_open=True, doc="Sampling temperature of the rollout (> 0).")
    top_p: float = setting(
        1.0, low=0, high=1, low_open=True, doc="Nucleus sampling threshold of the rollout, in (0, 1]."
    )
    max_turn_tokens: int = setting(48, kind="int", low=1, doc="Tokens one assistant turn may take before it is cut.")
    max_total_tokens: int = setting(
        1024, kind="int", low=1, doc="Response tokens of one episode before it is truncated (with a bootstrap value)."
    )
    rollout_batch_size: int = setting(64, kind="int", low=1, doc="Episodes decoded together in the rollout.")
    oracle_noise: float | None = setting(
        0.25,
        low=0,
        high=1,
        optional=True,
        doc="Record the environment's exact oracle values (for the noisy expert of this noise rate) beside "
        "the critic's, for the critic-vs-oracle metrics; None skips the oracle (faster rollouts). With "
        '``critic="expert"`` these are the values the estimator reads.',
    )

    # ------------------------------------------------------------------ optimisation
    policy_lr: float = setting(1e-4, low=0, low_open=True, doc="AdamW learning rate of the policy.")
    critic_lr: float | None = setting(
        None,
        low=0,
        low_open=True,
        optional=True,
        doc="AdamW learning rate of the critic during RL (None: 3e-4 when the estimator uses a critic).",
    )
    weight_decay: float = setting(0.0, low=0, doc="AdamW weight decay (policy and critic).")
    grad_clip: float = setting(1.0, low=0, doc="Max global gradient norm per optimizer step (0 = no clipping).")
    value_clip: float | None = setting(
        None, low=0, optional=True, doc="ε_v of the clipped value loss (None: 0.5 with a critic; 0 = unclipped)."
    )
    kl_coef: float = setting(
        0.0, low=0, doc="Coefficient of the KL-to-reference penalty (reference = the policy when RL starts); 0 = off."
    )
    kl_estimator: str = setting(
        "k3",
        kind="choice",
        choices=tuple(KL_KINDS),
        doc="KL estimator of the penalty: ``k1``, ``k2``, ``k3`` (or verl's names ``kl``, ``mse``, ``low_var_kl``).",
    )
    entropy_coef: float = setting(
        0.0, low=0, doc="Coefficient of the entropy bonus (subtracted from the loss); 0 = off."
    )
    policy_lag: int = setting(
        0,
        kind="int",
        low=0,
        doc="Update on the rollouts of ``policy_lag`` iterations ago (0 = on-policy), to stress importance "
        "sampling: the ratios then start away from 1.",
    )

    # ------------------------------------------------------------------ SFT warm start
    sft_steps: int = setting(
        1000,
        kind="int",
        low=0,
        doc="Step budget of the SFT warm start on noisy-expert episodes (0 = no SFT). The 1M model needs a "
        "few hundred steps before it starts copying entity names from its context at all (the loss sits "
        "near 1.5 until then, with 0 greedy success); budget for that.",
    )
    sft_target_success: float = setting(
        0.4, low=0, high=1, doc="SFT stops once the greedy eval success reaches this (headroom is left for RL)."
    )
    sft_noise: float = setting(0.3, low=0, high=1, doc="Noise rate of the scripted expert whose episodes SFT imitates.")
    sft_batch_episodes: int = setting(16, kind="int", low=1, doc="Expert episodes per SFT step.")
    sft_lr: float = setting(
        3e-3,
        low=0,
        low_open=True,
        doc="AdamW learning rate of SFT (3e-3: on ``search`` at 1e-3 the 1M model had not started copying "
        "after 600 steps; at 6e-3 it stalled. The best rate depends on the task: on one-room "
        "``automation`` 1e-3 copied within 100 steps and 3e-3 did not in 300).",
    )
    sft_eval_interval: int = setting(
        50, kind="int", low=1, doc="SFT steps between greedy evaluations (which decide the stop)."
    )

    # ------------------------------------------------------------------ critic warm-up
    critic_warmup_episodes: int | None = setting(
        None,
        kind="int",
        low=10,
        optional=True,
        doc="Episodes of the start policy rolled out once as the warm-up's pool (None: 512, or for a short "
        "run the episodes its RL rolls out, ``iterations × episodes``, at least 64); a fifth of them is "
        "held out to measure the fit.",
    )
    critic_warmup_steps: int | None = setting(
        None,
        kind="int",
        low=0,
        optional=True,
        doc="Step budget of the warm-up: AdamW steps of 32 pool episodes each (None: 256, or half the "
        "pool's episodes when it has fewer than 512 — 16 passes over it either way; 0 = no warm-up). A pool "
        "whose returns do not vary (or whose held-out ones do not) takes no step: the critic is set to "
        "the constant at once.",
    )
    critic_warmup_ev: float | None = setting(
        None,
        high=1,
        optional=True,
        doc="The gate: the warm-up stops once the critic's explained variance of the Monte-Carlo returns on "
        "the held-out episodes reaches this (checked every 16 steps; None: 0.2).",
    )
    critic_warmup_lr: float | None = setting(
        None, low=0, low_open=True, optional=True, doc="AdamW learning rate of the warm-up (None: 1e-3)."
    )
    critic_warmup_positions: str | None = setting(
        None,
        kind="choice",
        choices=("all", "turn_start"),
        optional=True,
        doc='Which action tokens the warm-up\'s loss and explained variance read: ``"all"`` (None: every '
        'action token) or ``"turn_start"`` (each turn\'s first token only: the turn-level values that turn '
        "GAE and MAE's macro scale read).",
    )

    # ------------------------------------------------------------------ evaluation
    eval_episodes: int = setting(
        128,
        kind="int",
        low=1,
        doc="Tasks of the held-out evaluation set; each evaluation plays them once greedily and once "
        "sampled (at ``temperature``/``top_p``): the same tasks and the same sampling seeds every time.",
    )
    eval_seed: int | None = setting(
        None,
        kind="int",
        low=0,
        optional=True,
        doc="Fixes the evaluation tasks and their sampling seeds (None: ``seed``), so that every run "
        "sharing it (e.g. every method of one seed) is judged on the same set.",
    )
    eval_interval: int = setting(
        5,
        kind="int",
        low=0,
        doc="Iterations between evaluations (0 = none in between). ``run_all`` (and ``mpo-viz train``) "
        "always evaluates before the first RL iteration (recorded as iteration 0) and after the last.",
    )

    # ------------------------------------------------------------------ run folder
    save_trajectories_every: int = setting(
        1, kind="int", low=0, doc="Write ``trajectories/iter=NNNNNN.parquet`` every k-th iteration (0 = never)."
    )
    trajectories_max_mb: float = setting(
        2048.0, low=0, low_open=True, doc="Disk cap of ``trajectories/``: past it the oldest files are removed."
    )
    keep_checkpoints: int = setting(
        3,
        kind="int",
        low=1,
        doc="Checkpoints kept (the newest; at least 1). The SFT start (``start/``) is kept apart, always.",
    )
    log_to: str | None = setting(
        None,
        kind="choice",
        choices=TRACKER_KINDS,
        optional=True,
        doc='Mirror every metrics line and the config to an experiment tracker: ``"wandb"`` (offline '
        'unless ``WANDB_MODE`` says otherwise; ``RUN/wandb/``) or ``"tensorboard"`` (event files in '
        "``RUN/tensorboard/``); needs that package. The run folder stays the source of truth.",
    )

    # ------------------------------------------------------------------ run
    iterations: int = setting(
        50, kind="int", low=0, doc="RL iterations in all (``run_all()`` and the CLI continue up to this number)."
    )
    seed: int = setting(
        0, kind="int", low=0, doc="Master seed: models, rollouts, shuffles and SFT data all derive from it."
    )
    device: str = setting(
        "cpu", kind="str", doc="Torch device (``cpu``, ``cuda``, ``cuda:1``); CPU runs are bit-for-bit reproducible."
    )
    num_threads: int = setting(
        1,
        kind="int",
        low=0,
        doc="CPU threads of torch and of the numba estimator kernels (set when the Trainer starts; 0 = "
        "leave the defaults). One thread is the fastest for the tiny models on a shared CPU: with two "
        "busy cores, two threads ran a forward/backward ~10x slower than one, and numba's idle OpenMP "
        "workers slowed torch 5-7x unless held to the same count.",
    )

    side_thread: bool = setting(
        True,
        kind="bool",
        doc="On a CPU where the process may use at least twice ``num_threads`` cores, the critic's forwards during "
        "the rollout and its "
        "update run in a second thread beside the policy's: the same numbers bit for bit, in less wall "
        "time. Turn it off when several runs share the cores. Not part of the run's identity.",
    )

    def __post_init__(self):
        _validate(self)

    @classmethod
    def options(cls) -> dict[str, Option]:
        """``{field: Option}``: every field's declaration (kind, bounds, default, doc), in order."""
        return declared(cls)

    # ------------------------------------------------------------------ derived
    @property
    def uses_critic(self) -> bool:
        """True when the estimator needs critic values (learned or oracle)."""
        return "values" in get_estimator(self.estimator).needs

    @property
    def learns_critic(self) -> bool:
        """True when a critic is trained: the estimator reads values and ``critic="learned"``."""
        return self.uses_critic and self.critic == "learned"

    @property
    def eval_key(self) -> int:
        """The seed that fixes the evaluation set (``eval_seed``, else ``seed``)."""
        return self.seed if self.eval_seed is None else self.eval_seed

    def critic_option(self, name: str):
        """A critic field resolved: its value, or its default when None (see :data:`CRITIC_DEFAULTS`;
        the warm-up's pool and budget: :func:`warmup_pool`, :func:`warmup_steps`)."""
        v = getattr(self, name)
        if v is not None:
            return v
        if name == "critic_warmup_episodes":
            return warmup_pool(self.iterations, self.episodes)
        if name == "critic_warmup_steps":
            return warmup_steps(self.critic_option("critic_warmup_episodes"))
        return CRITIC_DEFAULTS[name]

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "config") -> Config:
        """A Config from a dict (unknown keys refused by name)."""
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a JSON object of Config fields, found {type(d).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in d if k not in names]
        if unknown:
            raise ValueError(
                f"{source}: unknown field(s) {', '.join(map(repr, unknown))}; Config fields: {', '.join(names)}"
            )
        return cls(**d)

    @classmethod
    def from_json(cls, text: str, *, source: str = "config") -> Config:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: expected JSON, found a syntax error ({exc})") from None
        return cls.from_dict(d, source=source)

    def save(self, path) -> Path:
        """Write the config as JSON (temporary name, then rename)."""
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(self.to_json() + "\n")
        tmp.replace(p)
        return p

    @classmethod
    def load(cls, path) -> Config:
        p = Path(path)
        if not p.is_file():
            raise OptionError("config", f"expected a JSON file, found {str(p)!r} (missing)")
        try:
            return cls.from_json(p.read_text(), source=str(p))
        except OptionError as exc:  # a bad field of the file: name the file too
            raise ValueError(f"{p}: {exc}") from None

    def replace(self, **changes) -> Config:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def identity(self) -> dict:
        """The fields that define a run (all but :data:`RESUMABLE_FIELDS`, and the
        :data:`LATER_FIELDS` left unset)."""
        return {
            k: v
            for k, v in self.to_dict().items()
            if k not in RESUMABLE_FIELDS and not (k in LATER_FIELDS and v is None)
        }

    def hash(self) -> str:
        """sha256 (first 16 hex digits) of :meth:`identity` as canonical JSON."""
        text = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def differences(self, other: Config) -> list[str]:
        """Fields (outside :data:`RESUMABLE_FIELDS`) whose values differ, as ``name: a != b``."""
        a, b = self.to_dict(), other.to_dict()
        return [f"{k}: {a[k]!r} != {b[k]!r}" for k in a if k not in RESUMABLE_FIELDS and a[k] != b[k]]


def warmup_pool(iterations: int, episodes: int) -> int:
    """The default warm-up pool: ``min(512, max(64, iterations × episodes))`` — 512, unless the RL
    run itself rolls out fewer episodes (a pool larger than the run it prepares costs more than the
    run; 64 keeps a held-out fifth of 13 episodes)."""
    cap = int(str(CRITIC_DEFAULTS["critic_warmup_episodes"]))
    return int(min(cap, max(WARMUP_POOL_MIN, iterations * episodes)))


def warmup_steps(pool: int) -> int:
    """The default warm-up budget for a pool of ``pool`` episodes: ``min(256, ceil(pool / 2))`` —
    the default's 16 passes of 32-episode steps over the pool (256 at 512), at most 256."""
    return int(min(int(str(CRITIC_DEFAULTS["critic_warmup_steps"])), -(-pool // 2)))


# ---------------------------------------------------------------------------------------------
# validation


def _validate(cfg: Config) -> None:
    """Every field against its declaration, the estimator's and the loss's options against theirs,
    then the refusals: settings that cannot do what they say."""
    if isinstance(cfg.difficulty, tuple):
        cfg.difficulty = list(cfg.difficulty)
    if is_spec(cfg.env) or library_of(cfg.env) or (isinstance(cfg.env, str) and cfg.env in available_envs()):
        resolve_env(cfg.env)  # package.module:factory, gem:/textarena:<id> or an entry point: imported, registered
    check_fields(cfg)
    _check_difficulty(cfg.difficulty)
    _check_env_options(cfg)
    _check_options(
        cfg.estimator_options,
        {o.name: o for o in estimator_declarations(cfg.estimator)},
        "estimator_options",
        f"estimator {cfg.estimator!r}",
    )
    _check_options(
        cfg.loss_options, {o.name: o for o in loss_declarations(cfg.loss)}, "loss_options", f"loss {cfg.loss!r}"
    )
    if cfg.loss_options.get("agg") == "none":
        raise OptionError(
            "loss_options.agg", "expected a reducing mode (token-mean, seq-mean-token-mean, ...), found 'none'"
        )
    _check_batch_shape(cfg)
    _check_critic(cfg)
    if cfg.loss in ("turn_ppo", "token_ppo") and cfg.epochs == 1 and cfg.minibatches == 1 and cfg.policy_lag == 0:
        warnings.warn(
            f"loss {cfg.loss!r} with epochs=1, minibatches=1 and policy_lag=0: the only update is made at the "
            "rollout policy, every importance ratio is 1 and the clipped trust region does nothing "
            "(raise epochs or minibatches, or set policy_lag)",
            TrustRegionWarning,
            stacklevel=3,
        )


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_difficulty(d) -> None:
    if d is not None and not (_is_int(d) or (isinstance(d, list) and len(d) == 2 and all(_is_int(x) for x in d))):
        raise OptionError("difficulty", f"expected an int or [min, max] of expert turns, or None, found {d!r}")


def _check_env_options(cfg: Config) -> None:
    """``env_options`` (and ``difficulty``) against the options the environment declares (none
    declared: anything goes); the error names ``env_options.<option>``."""
    declared = env_declarations(cfg.env)
    if declared is None:
        return
    if cfg.difficulty is not None and "difficulty" not in declared:
        raise OptionError(
            "difficulty",
            f"the {cfg.env} environment declares no difficulty option "
            f"({', '.join(declared) or 'none'}); found difficulty={cfg.difficulty!r}",
        )
    for k, v in cfg.env_options.items():
        if k not in declared:
            raise OptionError(
                f"env_options.{k}",
                f"expected an option of the {cfg.env} environment "
                f"({', '.join(declared) or 'none'}), found one it does not take",
            )
        try:
            declared[k].check(v)
        except OptionError as exc:
            raise OptionError(f"env_options.{k}", exc.detail) from None


def _check_options(given: dict, spec: dict[str, Option], field: str, owner: str) -> None:
    """Each option must be one ``owner`` declares and pass its declared check (type, bounds,
    choices); the error names ``field.option``."""
    for k, v in given.items():
        if k not in spec:
            raise OptionError(field, f"{owner} has no option {k!r}; valid options: {', '.join(spec) or 'none'}")
        try:
            spec[k].check(v)
        except OptionError as exc:
            raise OptionError(f"{field}.{k}", exc.detail) from None


def _check_batch_shape(cfg: Config) -> None:
    if cfg.episodes % cfg.group_size:
        raise OptionError("episodes", f"expected a multiple of group_size={cfg.group_size}, found {cfg.episodes}")
    if cfg.minibatches > cfg.episodes:
        raise OptionError(
            "minibatches",
            f"expected at most episodes={cfg.episodes} (one episode each at least), found {cfg.minibatches}",
        )
    if "groups" in get_estimator(cfg.estimator).needs and cfg.group_size < 2:
        raise OptionError(
            "group_size",
            f"the group estimator {cfg.estimator!r} compares the G samples of a task "
            f"and needs group_size >= 2, found {cfg.group_size} (every advantage would "
            f"be 0)",
        )


def _check_critic(cfg: Config) -> None:
    """Critic settings that would do nothing: with a critic-free estimator, or with the oracle's
    values (no critic trained), or a critic schedule of a critic that moves with the policy."""
    set_ = [k for k in CRITIC_DEFAULTS if getattr(cfg, k) is not None]
    found = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in set_)
    if "values" not in get_estimator(cfg.estimator).needs:
        if set_:
            raise OptionError(
                set_[0],
                f"the estimator {cfg.estimator!r} uses no critic, so critic "
                f"settings would do nothing; found {found} "
                f"(leave them unset, or pick a critic estimator such as mpo or gae)",
            )
        if cfg.critic != "learned":
            raise OptionError(
                "critic",
                f"the estimator {cfg.estimator!r} reads no values, so critic={cfg.critic!r} "
                f"would do nothing (pick a critic estimator such as mpo or gae)",
            )
    elif cfg.critic in ("expert", "mc"):
        what = "the scripted expert's exact values" if cfg.critic == "expert" else "the policy's Monte-Carlo values"
        if set_:
            raise OptionError(
                set_[0],
                f"critic={cfg.critic!r} reads {what} and trains no critic, "
                f"so learned-critic settings would do nothing; found {found}",
            )
        if cfg.critic == "expert" and cfg.oracle_noise is None:
            raise OptionError(
                "oracle_noise",
                "critic='expert' reads the oracle values of the noisy expert of "
                "oracle_noise; expected a noise rate in [0, 1], found None",
            )
    if cfg.mc_samples is not None and cfg.critic != "mc":
        raise OptionError(
            "mc_samples",
            f"mc_samples sets the continuations of critic='mc', found critic="
            f"{cfg.critic!r} (leave mc_samples unset, or set critic='mc')",
        )
    if cfg.critic_init == "shared" and cfg.critic_epochs is not None:
        raise OptionError(
            "critic_epochs",
            f"with critic_init='shared' the critic's trunk is the policy's and moves "
            f"with it (epochs={cfg.epochs}); found critic_epochs={cfg.critic_epochs}",
        )


# ---------------------------------------------------------------------------------------------
# the docs' field table

TABLE_START = "<!-- config-table: generated from the declarations by mpo_viz.train.config.config_table() -->"
TABLE_END = "<!-- /config-table -->"


def _default_text(v) -> str:
    return json.dumps(v) if isinstance(v, str) else repr(v)


def config_table() -> str:
    """The field table of docs/training.md (markdown), generated from the declarations: field,
    default, what a valid value is, and the doc. ``tests/train/test_config.py`` checks that
    the committed table is this one; :func:`write_config_table` rewrites it."""
    rows = ["| field | default | valid values | meaning |", "|---|---|---|---|"]
    for name, o in Config.options().items():
        if callable(o.choices):  # a registry: its names now depend on what the process registered
            valid = f"a name of `{o.choices.__module__}.{o.choices.__name__}()`"
        else:
            valid = o.expected() + (" or None" if o.optional and not o.expect else "")
        doc = o.doc.replace("``", "`").replace("|", "\\|")
        rows.append(f"| `{name}` | `{_default_text(o.default)}` | {valid} | {doc} |")
    return "\n".join(rows)


def write_config_table(path) -> bool:
    """Put :func:`config_table` between the markers of ``path`` (docs/training.md); returns
    whether the file changed."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    head, _, rest = text.partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    new = f"{head}{TABLE_START}\n{config_table()}\n{TABLE_END}{tail}"
    if new != text:
        p.write_text(new, encoding="utf-8")
    return new != text
