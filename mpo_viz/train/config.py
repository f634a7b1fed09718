"""The trainer's configuration: one flat dataclass, validated on construction, JSON round trip.

``Config(env="search", estimator="mpo", loss="turn_ppo")`` — every field has a default that works
for the tiny CPU models. A bad value raises :class:`~mpo_viz.checks.OptionError` (a ``ValueError``) naming the field, what was expected and
what was found; unknown keys in a JSON file are refused by name. Estimator options are checked
against the advantages registry (:func:`mpo_viz.advantages.get`), loss options by a dry call of
:func:`mpo_viz.losses.policy_loss` on a one-token batch, so every option either estimator or loss
accepts is accepted here and nothing else.

Critic fields (``critic_lr``, ``value_clip``, ``critic_epochs``, ``critic_warmup_*``,
``critic_init``) default to ``None`` = "the default, when the estimator uses a learned critic";
setting one with a critic-free estimator (grpo, rloo, ...) or with ``critic="oracle"`` is refused,
since it would silently do nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from mpo_viz.checks import OptionError

__all__ = ["Config", "CRITIC_DEFAULTS", "CRITIC_KINDS", "RESUMABLE_FIELDS", "TrustRegionWarning"]

#: what each critic field means when left at None (and the estimator needs a critic)
CRITIC_DEFAULTS = {
    "critic_lr": 3e-4,
    "value_clip": 0.5,
    "critic_epochs": 4,
    "critic_warmup_episodes": 512,
    "critic_warmup_steps": 256,
    "critic_warmup_ev": 0.2,
    "critic_warmup_lr": 1e-3,
    "critic_init": "policy",
}
#: where an estimator's values can come from (``Config.critic``)
CRITIC_KINDS = ("learned", "oracle")
#: fields a resume may change (``mpo-viz train --resume DIR --iterations N``)
RESUMABLE_FIELDS = ("iterations",)

_LOSS_KEYWORDS = ("clip_low", "clip_high", "ratio", "agg")


class TrustRegionWarning(UserWarning):
    """A PPO-style loss configured so that every importance ratio is 1 (the clip never acts)."""


@dataclass
class Config:
    """Everything one training run needs (see docs/training.md for a guide to each group)."""

    # ------------------------------------------------------------------ environment
    env: str = "search"
    """Registered environment name (``search``, ``tooluse``, ``automation``, or your own)."""
    difficulty: int | list | None = None
    """Expert turns per task: an int or ``[min, max]``; None = the environment's default (3–6)."""
    env_options: dict = field(default_factory=dict)
    """Further keyword options of the environment (``slack``, ``max_turns``, ``distractors``, ...)."""

    # ------------------------------------------------------------------ models
    model_size: str = "1m"
    """Size of the tiny Llama policy built for the environment's tokenizer: ``1m``, ``3m``, ``10m``."""
    model_dir: str | None = None
    """A local model folder to start from instead (``DIR/policy``, and ``DIR/critic`` when present)."""
    critic: str = "learned"
    """Where the values the estimator reads come from: ``"learned"`` (a critic trained on the
    returns; default) or ``"oracle"`` (the environment's exact values under the noisy expert of
    ``oracle_noise``, read as ``values``; no critic is trained). The oracle is the critic the paper's
    premise assumes: with it, a method's result is not limited by a weak learned critic."""
    critic_init: str | None = None
    """How the critic starts: ``"policy"`` (a copy of the policy's trunk; default), ``"fresh"`` (a new
    trunk), or ``"shared"`` (the policy's trunk itself plus a value head; the value loss then also
    trains the shared trunk through the policy's optimizer)."""

    # ------------------------------------------------------------------ algorithm
    estimator: str = "mpo"
    """Advantage estimator, any name of :func:`mpo_viz.advantages.available` (mpo, gae, grpo, ...)."""
    estimator_options: dict = field(default_factory=dict)
    """Options of the estimator (``gamma``, ``lam``, ``beta``, ...), checked against its registry entry."""
    loss: str = "turn_ppo"
    """Policy loss kind, any name of :func:`mpo_viz.losses.available` (turn_ppo, token_ppo, gspo, sao)."""
    loss_options: dict = field(default_factory=dict)
    """Options of the loss: ``clip_low``, ``clip_high``, ``ratio``, ``agg`` and the kind's own (``dual_clip``;
    ``token_clip`` for turn_ppo — default 2.0, ``None`` for the bare turn-level trust region — and gspo)."""

    # ------------------------------------------------------------------ batch shape
    episodes: int = 64
    """Episodes rolled out per iteration (N); a multiple of ``group_size``."""
    group_size: int = 1
    """Samples per task (G); group estimators (grpo, rloo, ...) need G >= 2."""
    epochs: int = 2
    """Passes of the policy over each iteration's episodes (E)."""
    critic_epochs: int | None = None
    """Passes of the critic over each iteration's episodes, apart from the policy's (None: 4 with a
    learned critic). With ``critic_init="shared"`` the critic moves with the policy (E passes)."""
    minibatches: int = 4
    """Optimizer steps per epoch (M); the episodes are shuffled and split into M minibatches."""
    micro_batch_tokens: int = 8192
    """Token budget (prompt + response, padded) of one forward/backward; a minibatch is cut into
    micro-batches under it and their gradients accumulated (the loss normaliser stays the minibatch's)."""

    # ------------------------------------------------------------------ rollout
    temperature: float = 1.0
    """Sampling temperature of the rollout (> 0)."""
    top_p: float = 1.0
    """Nucleus sampling threshold of the rollout, in (0, 1]."""
    max_turn_tokens: int = 48
    """Tokens one assistant turn may take before it is cut."""
    max_total_tokens: int = 1024
    """Response tokens of one episode before it is truncated (with a bootstrap value)."""
    rollout_batch_size: int = 64
    """Episodes decoded together in the rollout."""
    oracle_noise: float | None = 0.25
    """Record the environment's exact oracle values (for the noisy expert of this noise rate) beside
    the critic's, for the critic-vs-oracle metrics; None skips the oracle (faster rollouts). With
    ``critic="oracle"`` these are the values the estimator reads."""

    # ------------------------------------------------------------------ optimisation
    policy_lr: float = 1e-4
    """AdamW learning rate of the policy."""
    critic_lr: float | None = None
    """AdamW learning rate of the critic during RL (None: 3e-4 when the estimator uses a critic)."""
    weight_decay: float = 0.0
    """AdamW weight decay (policy and critic)."""
    grad_clip: float = 1.0
    """Max global gradient norm per optimizer step (0 = no clipping)."""
    value_clip: float | None = None
    """ε_v of the clipped value loss (None: 0.5 with a critic; 0 = unclipped)."""
    kl_coef: float = 0.0
    """Coefficient of the KL-to-reference penalty (reference = the policy when RL starts); 0 = off."""
    kl_estimator: str = "k3"
    """KL estimator of the penalty: ``k1``, ``k2``, ``k3`` (or verl's names ``kl``, ``mse``, ``low_var_kl``)."""
    entropy_coef: float = 0.0
    """Coefficient of the entropy bonus (subtracted from the loss); 0 = off."""
    policy_lag: int = 0
    """Update on the rollouts of ``policy_lag`` iterations ago (0 = on-policy), to stress importance
    sampling: the ratios then start away from 1."""

    # ------------------------------------------------------------------ SFT warm start
    sft_steps: int = 1000
    """Step budget of the SFT warm start on noisy-expert episodes (0 = no SFT). The 1M model needs
    a few hundred steps before it starts copying entity names from its context at all (the loss
    sits near 1.5 until then, with 0 greedy success); budget for that."""
    sft_target_success: float = 0.4
    """SFT stops once the greedy eval success reaches this (headroom is left for RL)."""
    sft_noise: float = 0.3
    """Noise rate of the scripted expert whose episodes SFT imitates."""
    sft_batch_episodes: int = 16
    """Expert episodes per SFT step."""
    sft_lr: float = 3e-3
    """AdamW learning rate of SFT (3e-3: on ``search`` at 1e-3 the 1M model had not started copying
    after 600 steps; at 6e-3 it stalled. The best rate depends on the task: on one-room
    ``automation`` 1e-3 copied within 100 steps and 3e-3 did not in 300)."""
    sft_eval_interval: int = 50
    """SFT steps between greedy evaluations (which decide the stop)."""

    # ------------------------------------------------------------------ critic warm-up
    critic_warmup_episodes: int | None = None
    """Episodes of the start policy rolled out once as the warm-up's pool (None: 512); a fifth of
    them is held out to measure the fit."""
    critic_warmup_steps: int | None = None
    """Step budget of the warm-up: AdamW steps of 32 pool episodes each (None: 256; 0 = no warm-up)."""
    critic_warmup_ev: float | None = None
    """The gate: the warm-up stops once the critic's explained variance of the Monte-Carlo returns
    on the held-out episodes reaches this (checked every 16 steps; None: 0.2)."""
    critic_warmup_lr: float | None = None
    """AdamW learning rate of the warm-up (None: 1e-3)."""

    # ------------------------------------------------------------------ evaluation
    eval_episodes: int = 128
    """Tasks of the held-out evaluation set; each evaluation plays them once greedily and once
    sampled (at ``temperature``/``top_p``): the same tasks and the same sampling seeds every time."""
    eval_seed: int | None = None
    """Fixes the evaluation tasks and their sampling seeds (None: ``seed``), so that every run
    sharing it (e.g. every method of one seed) is judged on the same set."""
    eval_interval: int = 5
    """Iterations between evaluations (0 = none in between). ``run_all`` (and ``mpo-viz train``)
    always evaluates before the first RL iteration (recorded as iteration 0) and after the last."""

    # ------------------------------------------------------------------ run folder
    save_trajectories_every: int = 1
    """Write ``trajectories/iter=NNNNNN.parquet`` every k-th iteration (0 = never)."""
    trajectories_max_mb: float = 2048.0
    """Disk cap of ``trajectories/``: past it the oldest files are removed."""
    keep_checkpoints: int = 3
    """Checkpoints kept (the newest; at least 1)."""

    # ------------------------------------------------------------------ run
    iterations: int = 50
    """RL iterations in all (``run()`` and the CLI continue up to this number)."""
    seed: int = 0
    """Master seed: models, rollouts, shuffles and SFT data all derive from it."""
    device: str = "cpu"
    """Torch device (``cpu``, ``cuda``, ``cuda:1``); CPU runs are bit-for-bit reproducible."""
    num_threads: int = 1
    """CPU threads of torch and of the numba estimator kernels (set when the Trainer starts; 0 = leave
    the defaults). One thread is the fastest for the tiny models on a shared CPU: with two busy cores,
    two threads ran a forward/backward ~10x slower than one, and numba's idle OpenMP workers slowed
    torch 5-7x unless held to the same count."""

    def __post_init__(self):
        _validate(self)

    # ------------------------------------------------------------------ derived
    @property
    def uses_critic(self) -> bool:
        """True when the estimator needs critic values (learned or oracle)."""
        from mpo_viz.advantages import get

        return "values" in get(self.estimator).needs

    @property
    def learns_critic(self) -> bool:
        """True when a critic is trained: the estimator reads values and ``critic="learned"``."""
        return self.uses_critic and self.critic == "learned"

    @property
    def eval_key(self) -> int:
        """The seed that fixes the evaluation set (``eval_seed``, else ``seed``)."""
        return self.seed if self.eval_seed is None else self.eval_seed

    def critic_option(self, name: str):
        """A critic field resolved: its value, or its default when None (see :data:`CRITIC_DEFAULTS`)."""
        v = getattr(self, name)
        return CRITIC_DEFAULTS[name] if v is None else v

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
            raise ValueError(f"{source}: unknown field(s) {', '.join(map(repr, unknown))}; "
                             f"Config fields: {', '.join(names)}")
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
        """The fields that define a run (all but :data:`RESUMABLE_FIELDS`)."""
        return {k: v for k, v in self.to_dict().items() if k not in RESUMABLE_FIELDS}

    def hash(self) -> str:
        """sha256 (first 16 hex digits) of :meth:`identity` as canonical JSON."""
        text = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def differences(self, other: Config) -> list[str]:
        """Fields (outside :data:`RESUMABLE_FIELDS`) whose values differ, as ``name: a != b``."""
        a, b = self.identity(), other.identity()
        return [f"{k}: {a[k]!r} != {b[k]!r}" for k in a if a[k] != b[k]]


# ---------------------------------------------------------------------------------------------
# validation


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(cfg, name, lo=None, hi=None, allow_none=False):
    v = getattr(cfg, name)
    if v is None and allow_none:
        return
    rng = (f" >= {lo}" if lo is not None else "") + (f" and <= {hi}" if hi is not None else "")
    if not _is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
        raise OptionError(name, f"expected an integer{rng}, found {v!r}")


def _num(cfg, name, lo=None, hi=None, *, lo_open=False, hi_open=False, allow_none=False):
    v = getattr(cfg, name)
    if v is None and allow_none:
        return
    ok = _is_num(v)
    if ok and lo is not None:
        ok = v > lo if lo_open else v >= lo
    if ok and hi is not None:
        ok = v < hi if hi_open else v <= hi
    if not ok:
        parts = []
        if lo is not None:
            parts.append(f"{'>' if lo_open else '>='} {lo}")
        if hi is not None:
            parts.append(f"{'<' if hi_open else '<='} {hi}")
        raise OptionError(name, f"expected a finite number{' ' + ' and '.join(parts) if parts else ''}, found {v!r}")


def _str(cfg, name, choices=None, allow_none=False):
    v = getattr(cfg, name)
    if v is None and allow_none:
        return
    if not isinstance(v, str) or not v:
        raise OptionError(name, f"expected a non-empty string, found {v!r}")
    if choices is not None and v not in choices:
        raise OptionError(name, f"expected one of {', '.join(map(repr, choices))}, found {v!r}")


def _validate(cfg: Config) -> None:
    from mpo_viz.advantages import available as estimators
    from mpo_viz.advantages import get as get_estimator
    from mpo_viz.envs.registry import available_envs
    from mpo_viz.losses import KL_KINDS
    from mpo_viz.losses import available as losses

    _str(cfg, "env", available_envs())
    if cfg.difficulty is not None:
        d = cfg.difficulty
        if isinstance(d, tuple):
            cfg.difficulty = d = list(d)
        if not (_is_int(d) or (isinstance(d, list) and len(d) == 2 and all(_is_int(x) for x in d))):
            raise OptionError("difficulty", f"expected an int or [min, max] of expert turns, or None, found {d!r}")
    if not isinstance(cfg.env_options, dict):
        raise OptionError("env_options", f"expected a dict of environment options, found {cfg.env_options!r}")
    _str(cfg, "model_size", ("1m", "3m", "10m"))
    _str(cfg, "model_dir", allow_none=True)
    _str(cfg, "critic", CRITIC_KINDS)
    _str(cfg, "critic_init", ("policy", "fresh", "shared"), allow_none=True)

    _str(cfg, "estimator", estimators())
    _str(cfg, "loss", losses())
    if not isinstance(cfg.estimator_options, dict):
        raise OptionError("estimator_options", f"expected a dict, found {cfg.estimator_options!r}")
    if not isinstance(cfg.loss_options, dict):
        raise OptionError("loss_options", f"expected a dict, found {cfg.loss_options!r}")
    _check_estimator_options(cfg.estimator, cfg.estimator_options)
    _check_loss_options(cfg.loss, cfg.loss_options)

    _int(cfg, "episodes", 1)
    _int(cfg, "group_size", 1)
    if cfg.episodes % cfg.group_size:
        raise OptionError("episodes", f"expected a multiple of group_size={cfg.group_size}, found {cfg.episodes}")
    _int(cfg, "epochs", 1)
    _int(cfg, "critic_epochs", 1, allow_none=True)
    _int(cfg, "minibatches", 1)
    if cfg.minibatches > cfg.episodes:
        raise OptionError("minibatches", f"expected at most episodes={cfg.episodes} (one episode each at least), "
                         f"found {cfg.minibatches}")
    _int(cfg, "micro_batch_tokens", 1)
    _num(cfg, "temperature", 0, lo_open=True)
    _num(cfg, "top_p", 0, 1, lo_open=True)
    _int(cfg, "max_turn_tokens", 1)
    _int(cfg, "max_total_tokens", 1)
    _int(cfg, "rollout_batch_size", 1)
    _num(cfg, "oracle_noise", 0, 1, allow_none=True)

    _num(cfg, "policy_lr", 0, lo_open=True)
    _num(cfg, "critic_lr", 0, lo_open=True, allow_none=True)
    _num(cfg, "weight_decay", 0)
    _num(cfg, "grad_clip", 0)
    _num(cfg, "value_clip", 0, allow_none=True)
    _num(cfg, "kl_coef", 0)
    _str(cfg, "kl_estimator", tuple(KL_KINDS))
    _num(cfg, "entropy_coef", 0)
    _int(cfg, "policy_lag", 0)

    _int(cfg, "sft_steps", 0)
    _num(cfg, "sft_target_success", 0, 1)
    _num(cfg, "sft_noise", 0, 1)
    _int(cfg, "sft_batch_episodes", 1)
    _num(cfg, "sft_lr", 0, lo_open=True)
    _int(cfg, "sft_eval_interval", 1)
    _int(cfg, "critic_warmup_episodes", 10, allow_none=True)
    _int(cfg, "critic_warmup_steps", 0, allow_none=True)
    _num(cfg, "critic_warmup_ev", hi=1, allow_none=True)
    _num(cfg, "critic_warmup_lr", 0, lo_open=True, allow_none=True)

    _int(cfg, "eval_episodes", 1)
    _int(cfg, "eval_seed", 0, allow_none=True)
    _int(cfg, "eval_interval", 0)
    _int(cfg, "save_trajectories_every", 0)
    _num(cfg, "trajectories_max_mb", 0, lo_open=True)
    _int(cfg, "keep_checkpoints", 1)
    _int(cfg, "iterations", 0)
    _int(cfg, "seed", 0)
    _str(cfg, "device")
    _int(cfg, "num_threads", 0)

    # ---- refusals: settings that cannot do what they say
    est = get_estimator(cfg.estimator)
    if "groups" in est.needs and cfg.group_size < 2:
        raise OptionError("group_size", f"the group estimator {cfg.estimator!r} compares the G samples of a task "
                         f"and needs group_size >= 2, found {cfg.group_size} (every advantage would be 0)")
    set_ = [k for k in CRITIC_DEFAULTS if getattr(cfg, k) is not None]
    found = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in set_)
    if "values" not in est.needs:
        if set_:
            raise OptionError(set_[0], f"the estimator {cfg.estimator!r} uses no critic, so critic "
                             f"settings would do nothing; found {found} "
                             f"(leave them unset, or pick a critic estimator such as mpo or gae)")
        if cfg.critic != "learned":
            raise OptionError("critic", f"the estimator {cfg.estimator!r} reads no values, so critic={cfg.critic!r} "
                                        f"would do nothing (pick a critic estimator such as mpo or gae)")
    elif cfg.critic == "oracle":
        if set_:
            raise OptionError(set_[0], f"critic='oracle' reads the environment's exact values and trains no critic, "
                                       f"so learned-critic settings would do nothing; found {found}")
        if cfg.oracle_noise is None:
            raise OptionError("oracle_noise", "critic='oracle' reads the oracle values of the noisy expert of "
                                              "oracle_noise; expected a noise rate in [0, 1], found None")
    if cfg.critic_init == "shared" and cfg.critic_epochs is not None:
        raise OptionError("critic_epochs", f"with critic_init='shared' the critic's trunk is the policy's and moves "
                                           f"with it (epochs={cfg.epochs}); found critic_epochs={cfg.critic_epochs}")
    if cfg.loss in ("turn_ppo", "token_ppo") and cfg.epochs == 1 and cfg.minibatches == 1 and cfg.policy_lag == 0:
        warnings.warn(
            f"loss {cfg.loss!r} with epochs=1, minibatches=1 and policy_lag=0: the only update is made at the "
            "rollout policy, every importance ratio is 1 and the clipped trust region does nothing "
            "(raise epochs or minibatches, or set policy_lag)", TrustRegionWarning, stacklevel=3)


def _check_estimator_options(name: str, options: dict) -> None:
    """Each option must be one the estimator declares (:func:`mpo_viz.advantages.options`) and pass
    its declared check (type, bounds, choices)."""
    from mpo_viz.advantages import options as declared

    spec = {o.name: o for o in declared(name)}
    for k, v in options.items():
        if k not in spec:
            raise OptionError("estimator_options", f"estimator {name!r} has no option {k!r}; "
                                                   f"valid options: {', '.join(spec) or 'none'}")
        try:
            spec[k].check(v)
        except OptionError as exc:
            raise OptionError(f"estimator_options.{k}", exc.detail) from None


def _check_loss_options(kind: str, options: dict) -> None:
    """Dry-run the loss on one action token with these options; its ValueError names the option."""
    import torch

    from mpo_viz.losses import get as get_loss
    from mpo_viz.losses import policy_loss

    spec = get_loss(kind)
    allowed = (*_LOSS_KEYWORDS, *spec.options)
    for k in options:
        if k not in allowed:
            raise OptionError("loss_options", f"loss {kind!r} has no option {k!r}; valid options: {', '.join(allowed)}")
    if options.get("agg") == "none":
        raise OptionError("loss_options.agg", "expected a reducing mode (token-mean, seq-mean-token-mean, ...), "
                                              "found 'none'")
    z = torch.zeros(1, 1)
    try:
        policy_loss(kind, z, z, z, torch.ones(1, 1), rollout_logp=z, **options)
    except OptionError as exc:
        raise OptionError(f"loss_options.{exc.option}", exc.detail) from None
    except ValueError as exc:  # "ratio: expected ..." from the loss itself
        name, _, detail = str(exc).partition(": ")
        raise OptionError(f"loss_options.{name}", detail or str(exc)) from None
