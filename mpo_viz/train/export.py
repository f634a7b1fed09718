"""Trained checkpoints as models: a run folder's checkpoint rebuilt as a policy and critic.

Wherever a model folder goes, a checkpoint goes too.

A checkpoint (``RUN/checkpoints/iter=N/``) holds weights only; the model they fit is the one the run
built (:func:`~mpo_viz.train.runtime.build_models`: a tiny policy over its environment's tokenizer,
or its ``model_dir``'s), so :func:`load_trained` rebuilds that from the run's config (the config the
checkpoint recorded) and loads the weights into it. :func:`load_model` takes any of: a model folder
(``DIR/policy``), a plain Hugging Face folder, a checkpoint folder, or a run folder (its checkpoint of
``iteration``, default the latest); :func:`export` writes a checkpoint as a plain model folder
(``mpo-viz export RUN -o DIR``).

Invariant: the policy :func:`load_trained` gives back computes what the trainer's policy computed
at that iteration (the same architecture, tokenizer and weights, bit for bit), and so does the
folder :func:`export` writes once loaded with :func:`mpo_viz.models.load`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from mpo_viz import models
from mpo_viz.checks import OptionError
from mpo_viz.data.runfolder import RunFolder
from mpo_viz.envs.registry import make_env
from mpo_viz.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_candidates,
    checkpoint_name,
    latest_checkpoint,
)
from mpo_viz.train.config import Config
from mpo_viz.train.runtime import build_models, env_kwargs

__all__ = ["locate", "is_trained", "load_trained", "load_model", "export", "TrainedModel", "TRAINED"]

#: the other thing a model argument may be (said after :data:`mpo_viz.models.store.LAYOUTS` in errors)
TRAINED = "or a trained checkpoint (RUN/checkpoints/iter=N, or a run folder RUN with --iteration N)"


def _is_checkpoint(path: Path) -> bool:
    return (path / "state.json").is_file() and (path / "policy.safetensors").is_file()


def _is_run(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "checkpoints").is_dir()


def is_trained(path) -> bool:
    """Whether ``path`` is a run folder or one of its checkpoints (not a model folder)."""
    path = Path(path)
    return path.is_dir() and (_is_checkpoint(path) or _is_run(path))


def locate(path, iteration: int | None = None) -> Path:
    """The checkpoint folder ``path`` names: ``path`` itself (``RUN/checkpoints/iter=N``), or a run
    folder's checkpoint of ``iteration`` (default: the one ``checkpoints/latest`` names). An
    :class:`~mpo_viz.checks.OptionError` names what was expected and found (``iteration``: the kept
    checkpoints)."""
    path = Path(path)
    if _is_checkpoint(path):
        if iteration is not None and int(path.name.partition("=")[2] or -1) != iteration:
            raise OptionError(
                "iteration", f"expected no --iteration with a checkpoint folder, found {iteration} with {path}"
            )
        return path
    if not _is_run(path):
        raise OptionError(
            "model",
            f"expected a run folder (config.json and checkpoints/) or a checkpoint "
            f"(RUN/checkpoints/iter=N with state.json, policy.safetensors), found {path}",
        )
    ckpts = RunFolder(path).checkpoints
    kept = sorted(checkpoint_candidates(ckpts))
    if iteration is not None:
        want = ckpts / checkpoint_name(int(iteration))
        if not _is_checkpoint(want):
            its = ", ".join(str(int(p.name.partition("=")[2])) for p in kept) or "none"
            raise OptionError(
                "iteration",
                f"expected an iteration whose checkpoint {path} keeps ({its}; "
                f"keep_checkpoints keeps the newest), found {iteration}",
            )
        return want
    try:
        latest = latest_checkpoint(ckpts)
    except ValueError:
        latest = None
    if latest is None:
        if not kept:
            raise OptionError("model", f"expected a run folder with a checkpoint, found {path} with none")
        latest = kept[-1]
    return latest


def _config_of(ckpt: Path) -> Config:
    """The config the checkpoint was written with (its state.json's, else the run's config.json)."""
    try:
        state = json.loads((ckpt / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{ckpt / 'state.json'}: unreadable ({exc})") from None
    with warnings.catch_warnings():  # the run already warned about its settings when it started
        warnings.simplefilter("ignore")
        if isinstance(state.get("config"), dict):
            return Config.from_dict(state["config"], source=str(ckpt / "state.json"))
        return Config.load(ckpt.parent.parent / "config.json")


class TrainedModel:
    """What :func:`load_trained` rebuilt: ``policy``, ``critic`` (or None), ``config``, ``checkpoint``
    (its folder) and ``iteration``."""

    def __init__(self, policy, critic, config: Config, checkpoint: Path, iteration: int):
        self.policy, self.critic, self.config = policy, critic, config
        self.checkpoint, self.iteration = checkpoint, iteration


def load_trained(path, *, iteration: int | None = None, device="cpu") -> TrainedModel:
    """The policy (and critic) of a trained checkpoint (:func:`locate`), rebuilt as the run built them
    and loaded with the checkpoint's weights (safetensors)."""
    ckpt = locate(path, iteration)
    cfg = _config_of(ckpt)
    dev = models.resolve_device(device)
    try:
        env = make_env(cfg.env, **env_kwargs(cfg))
    except OptionError as exc:
        raise OptionError(
            "model",
            f"{ckpt}: the run's environment {cfg.env!r} does not build here ({exc.detail}); "
            "register it, or name it as package.module:factory",
        ) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_cfg = cfg.replace(device=str(dev))
    try:
        policy, critic = build_models(run_cfg, env, dev, load=load_model)
    except (OSError, ValueError) as exc:
        raise OptionError(
            "model", f"{ckpt}: cannot rebuild the run's model (it started from --model-dir {cfg.model_dir!r}): {exc}"
        ) from None
    holder = Checkpoint(path=ckpt, state={}, rng={}, optimizers={})
    holder.load_weights("policy", policy.model)
    if critic is not None and holder.has_weights("critic"):
        holder.load_weights("critic", critic)
    policy.model.eval()
    it = int(ckpt.name.partition("=")[2]) if ckpt.name.startswith("iter=") else -1
    named = models.Policy(policy.model, policy.tokenizer, name=f"{ckpt} ({cfg.env}, iteration {it})")
    return TrainedModel(named, critic, cfg, ckpt, it)


def load_model(path, *, iteration: int | None = None, device="cpu"):
    """``(policy, critic or None)`` of any model the commands take: a run folder or a checkpoint
    (:func:`load_trained`), else a model folder or a plain Hugging Face folder
    (:func:`mpo_viz.models.load`). ``iteration`` goes with a run folder only."""
    if is_trained(path):
        t = load_trained(path, iteration=iteration, device=device)
        return t.policy, t.critic
    if iteration is not None:
        raise OptionError(
            "iteration", f"expected a run folder with --iteration, found {path} (a model folder, which has one model)"
        )
    try:
        return models.load(path, device=device)
    except OptionError:
        raise
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{exc}; {TRAINED}") from None
    except ValueError as exc:
        raise ValueError(f"{exc}; {TRAINED}") from None


def export(path, out, *, iteration: int | None = None) -> Path:
    """Write a trained checkpoint (:func:`locate`) as a model folder ``out`` (``out/policy``, with its
    tokenizer; ``out/critic`` when the run learned one; ``out/export.json``: where it came from).
    ``out`` must not exist yet, or be empty."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OptionError("out", f"expected a new (or empty) folder, found {out} with files in it")
    t = load_trained(path, iteration=iteration)
    models.save(out, t.policy, t.critic)
    info = {
        "source": str(t.checkpoint),
        "iteration": t.iteration,
        "env": t.config.env,
        "env_options": t.config.env_options,
        "difficulty": t.config.difficulty,
        "config_hash": t.config.hash(),
    }
    (out / "export.json").write_text(json.dumps(info, indent=1) + "\n")
    return out
