"""Checkpoints of a run: ``checkpoints/iter=NNNNNN/`` and the ``latest`` file.

A checkpoint folder holds everything the next iteration depends on, so that a resumed run continues
bit for bit (on CPU):

* ``<name>.safetensors`` — the weights of each module (policy, critic, reference policy);
* ``optimizers.pt`` — the AdamW states, a dict of tensors and numbers, read back with
  ``torch.load(weights_only=True)`` (nothing is unpickled);
* ``rng.pt`` — torch RNG states (the global one and each named ``torch.Generator``), also read with
  ``weights_only=True``; ``rng.json`` — Python's ``random`` and numpy's global states;
* ``state.json`` — iteration, config hash, environment seed cursor, elapsed time, flags;
* ``batches/<name>.parquet`` — trajectory batches the next iterations need (``policy_lag``).

Writing: into ``.iter=NNNNNN.tmp`` then renamed, then ``latest`` is replaced atomically, then all but
the newest ``keep`` checkpoints are removed. A reader never sees a half-written checkpoint.

Reading: a file that is missing, truncated or otherwise unreadable raises :class:`CheckpointError`
(a ``ValueError``) naming the file; :func:`checkpoint_candidates` lists the checkpoints a resume may
fall back to, newest first, and :func:`restore_usable` restores the newest that reads (a damaged
one is skipped for the previous one, with a :class:`CheckpointWarning`).

Resuming: :func:`resume_config` is the config a run folder continues with (refusing one that
differs in more than the resumable fields); :meth:`Checkpoint.restore` puts weights, optimizer
states and RNG states back into the trainer's objects, :meth:`Checkpoint.train_state` its counters.
``RUN/start`` (:func:`save_start`) is the SFT start kept as a model folder, which no checkpoint
rule removes.

Invariant: what a resumed run reads back is exactly what the run that never stopped held at that
iteration; a checkpoint is never half-written, and one of another config is refused.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from mpo_viz.checks import outside_stacklevel
from mpo_viz.data.io import load as load_batch
from mpo_viz.data.io import save as save_batch
from mpo_viz.data.runfolder import RunFolder, clean_json
from mpo_viz.train.config import RESUMABLE_FIELDS, Config

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointWarning",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "checkpoint_candidates",
    "checkpoint_name",
    "capture_rng",
    "restore_rng",
    "write_atomic",
    "restore_usable",
    "resume_config",
    "save_start",
    "TRAIN_STATE_KEYS",
]

#: the trainer's counters and flags a checkpoint's ``state.json`` holds (:meth:`Checkpoint.train_state`)
TRAIN_STATE_KEYS = ("iteration", "seed_cursor", "sft_done", "critic_warm", "elapsed_s", "config_hash", "config")


class CheckpointError(ValueError):
    """A checkpoint file that is missing, truncated or unreadable; the message names the file."""


class CheckpointWarning(UserWarning):
    """A damaged checkpoint was skipped for an older one."""


def _read(f: Path, reader):
    """``reader(f)``, any failure to read it (a truncated safetensors header, a damaged zip of
    ``torch.save``, bad JSON) as a one-line :class:`CheckpointError` naming ``f``."""
    if not f.is_file():
        raise CheckpointError(f"{f.parent}: expected {f.name} in a checkpoint folder, found it missing")
    try:
        return reader(f)
    except Exception as exc:  # safetensors, torch and json each raise their own kind
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(f"{f}: unreadable ({type(exc).__name__}: {first[:200]})") from None


def checkpoint_name(iteration: int) -> str:
    return f"iter={iteration:06d}"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary name and a rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@dataclass
class Checkpoint:
    """A loaded checkpoint: ``path``, ``state`` (state.json), ``rng`` (see :func:`capture_rng`),
    ``optimizers`` (name -> state dict) and ``batches`` (name -> TrajectoryBatch); weights are
    loaded into modules with :meth:`load_weights`."""

    path: Path
    state: dict
    rng: dict
    optimizers: dict
    batches: dict = field(default_factory=dict)

    def load_weights(self, name: str, module: torch.nn.Module) -> None:
        f = self.path / f"{name}.safetensors"
        if not f.is_file():
            raise CheckpointError(f"{self.path}: expected weights {f.name}, found none")
        missing, unexpected = _read(f, lambda x: load_model(module, str(x), strict=True))
        if missing or unexpected:  # strict=True raises first; kept for older safetensors
            raise CheckpointError(f"{f}: weights do not match the module (missing {missing}, unexpected {unexpected})")

    def has_weights(self, name: str) -> bool:
        return (self.path / f"{name}.safetensors").is_file()

    def check_config(self, cfg: Config) -> None:
        """Refuse a checkpoint written with another config, naming the differing fields."""
        st = self.state
        if st.get("config_hash") != cfg.hash():
            stored = Config.from_dict(st["config"]) if "config" in st else None
            diff = cfg.differences(stored) if stored else ["(the checkpoint does not record its config)"]
            raise ValueError(
                f"config: the checkpoint {self.path} was written with a different config; differing "
                f"fields: {'; '.join(diff)}"
            )

    def restore(
        self,
        modules: dict[str, torch.nn.Module],
        optimizers: dict[str, torch.optim.Optimizer],
        generators: dict[str, torch.Generator],
    ) -> None:
        """Load the weights of each of ``modules`` (by name), the state of each of ``optimizers`` and
        every RNG state (:func:`restore_rng`)."""
        for name, module in modules.items():
            self.load_weights(name, module)
        for name, opt in optimizers.items():
            opt.load_state_dict(self.optimizers[name])
        restore_rng(self.rng, generators)

    def train_state(self) -> dict:
        """The trainer's counters and flags (:data:`TRAIN_STATE_KEYS`) from ``state.json``."""
        return {k: self.state[k] for k in TRAIN_STATE_KEYS}

    def lagged(self) -> list:
        """The rollouts that wait for their update (``policy_lag``), oldest first."""
        return [self.batches[f"lag{i}"] for i in range(int(self.state.get("n_lagged", 0)))]


# ---------------------------------------------------------------------------------------------
# RNG states


def capture_rng(generators: dict[str, torch.Generator] | None = None) -> dict:
    """Every RNG state the run draws from: torch's global CPU (and CUDA) state, the named
    generators, Python's ``random`` and numpy's global state."""
    out = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    for k, g in (generators or {}).items():
        out[f"gen/{k}"] = g.get_state()
    return out


def restore_rng(rng: dict, generators: dict[str, torch.Generator] | None = None) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    for k, g in (generators or {}).items():
        key = f"gen/{k}"
        if key not in rng:
            raise ValueError(f"rng: the checkpoint has no state for generator {k!r}")
        g.set_state(rng[key])


def _rng_split(rng: dict) -> tuple[dict, dict]:
    tensors = {k: v for k, v in rng.items() if isinstance(v, torch.Tensor)}
    if "cuda" in rng:
        tensors.update({f"cuda/{i}": t for i, t in enumerate(rng["cuda"])})
    py = rng["python"]
    npst = rng["numpy"]
    plain = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [npst[0], npst[1].tolist(), int(npst[2]), int(npst[3]), float(npst[4])],
    }
    return tensors, plain


def _rng_join(tensors: dict, plain: dict) -> dict:
    out = {k: v for k, v in tensors.items() if not k.startswith("cuda/")}
    cuda = sorted((int(k.split("/")[1]), v) for k, v in tensors.items() if k.startswith("cuda/"))
    if cuda:
        out["cuda"] = [v for _, v in cuda]
    py = plain["python"]
    out["python"] = (py[0], tuple(py[1]), py[2])
    n = plain["numpy"]
    out["numpy"] = (n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4])
    return out


# ---------------------------------------------------------------------------------------------
# save / load


def save_checkpoint(
    ckpt_dir: Path,
    iteration: int,
    *,
    modules: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    rng: dict,
    state: dict,
    batches: dict | None = None,
    keep: int = 3,
) -> Path:
    """Write ``ckpt_dir/iter=NNNNNN/`` atomically, point ``ckpt_dir/latest`` at it and keep the
    newest ``keep`` checkpoints. Returns the checkpoint's path."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(iteration)
    final = ckpt_dir / name
    tmp = ckpt_dir / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for k, m in modules.items():
        save_model(m, str(tmp / f"{k}.safetensors"))
    torch.save({k: o.state_dict() for k, o in optimizers.items()}, tmp / "optimizers.pt")
    tensors, plain = _rng_split(rng)
    torch.save(tensors, tmp / "rng.pt")
    (tmp / "rng.json").write_text(json.dumps(plain))
    for k, b in (batches or {}).items():
        save_batch(b, tmp / "batches" / f"{k}.parquet")
    (tmp / "state.json").write_text(json.dumps({**state, "iteration": iteration}, indent=2))
    old = None
    if final.exists():  # rewriting the same iteration (e.g. iteration 0 after SFT)
        old = ckpt_dir / f".{name}.old"
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    write_atomic(ckpt_dir / "latest", name + "\n")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _prune(ckpt_dir, keep, name)
    return final


def _prune(ckpt_dir: Path, keep: int, newest: str) -> None:
    done = sorted(p for p in ckpt_dir.iterdir() if p.is_dir() and p.name.startswith("iter="))
    for p in done[:-keep] if keep > 0 else []:
        if p.name != newest:
            shutil.rmtree(p, ignore_errors=True)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The checkpoint ``latest`` names, or None when there is none yet."""
    f = Path(ckpt_dir) / "latest"
    if not f.is_file():
        return None
    name = f.read_text().strip()
    p = Path(ckpt_dir) / name
    if not p.is_dir():
        raise ValueError(f"{f}: names {name!r}, but {p} is missing")
    return p


def checkpoint_candidates(ckpt_dir: Path) -> list[Path]:
    """The checkpoints a resume may start from, newest first: the one ``latest`` names, then the
    older ``iter=NNNNNN`` folders. When ``latest`` is missing, unreadable or names a missing folder,
    every checkpoint folder counts (newest first). Empty when there is none."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = sorted((p for p in ckpt_dir.iterdir() if p.is_dir() and p.name.startswith("iter=")), reverse=True)
    try:
        named = latest_checkpoint(ckpt_dir)
    except (OSError, UnicodeDecodeError, ValueError):
        named = None
    return found if named is None else [p for p in found if p.name <= named.name]


def _torch_tensors(f: Path):
    return torch.load(f, weights_only=True, map_location="cpu")


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint folder (weights are loaded later, into modules). Nothing is unpickled:
    tensors through ``torch.load(weights_only=True)``, the rest from JSON."""
    path = Path(path)
    for f in ("state.json", "optimizers.pt", "rng.pt", "rng.json"):
        if not (path / f).is_file():
            raise CheckpointError(f"{path}: expected {f} in a checkpoint folder, found it missing")
    state = _read(path / "state.json", lambda f: json.loads(f.read_text()))
    optim = _read(path / "optimizers.pt", _torch_tensors)
    tensors = _read(path / "rng.pt", _torch_tensors)
    rng = _rng_join(tensors, _read(path / "rng.json", lambda f: json.loads(f.read_text())))
    batches = {}
    bdir = path / "batches"
    if bdir.is_dir():
        for part in sorted(bdir.glob("*.parquet")):
            batches[part.stem] = _read(part, load_batch)
    return Checkpoint(path=path, state=state, rng=rng, optimizers=optim, batches=batches)


# ---------------------------------------------------------------------------------------------
# resuming a run


def restore_usable(ckpt_dir: Path, restore: Callable[[Path], None]) -> Path:
    """``restore(path)`` on the newest checkpoint that reads (:func:`checkpoint_candidates`): one
    whose ``restore`` raises :class:`CheckpointError` (a truncated or unreadable file) is skipped for
    the previous one with a :class:`CheckpointWarning` naming the file; none usable is a one-line
    :class:`CheckpointError`. Any other error (a checkpoint of another config) propagates. Returns
    the path restored."""
    cands = checkpoint_candidates(ckpt_dir)
    damaged: list[CheckpointError] = []
    for path in cands:
        try:
            restore(path)
        except CheckpointError as exc:
            damaged.append(exc)
            continue
        for err in damaged:
            warnings.warn(
                f"damaged checkpoint skipped: {err}; resumed from {path.name} instead",
                CheckpointWarning,
                stacklevel=outside_stacklevel(),
            )
        return path
    first = f"; the newest: {damaged[0]}" if damaged else ""
    raise CheckpointError(f"{ckpt_dir}: no usable checkpoint ({len(cands)} found{first})")


def resume_config(run: RunFolder, cfg: Config | None = None, iterations: int | None = None) -> Config:
    """The config the run in ``run`` continues with: its ``config.json``, with the resumable fields
    of ``cfg`` (one that differs in anything else is refused, naming the fields) and ``iterations``
    (the new total). Refuses a folder that is missing, has no ``config.json`` or no checkpoint."""
    if not run.path.is_dir():
        raise ValueError(f"run_dir: no such folder {str(run.path)!r} (nothing to resume)")
    if not run.config_path.is_file():
        raise ValueError(f"run_dir: expected a run folder with config.json, found {str(run.path)!r} without one")
    stored = Config.load(run.config_path)
    if cfg is not None:
        diff = stored.differences(cfg)
        if diff:
            raise ValueError(
                f"config: cannot resume {str(run.path)!r} with a different config; differing "
                f"fields (stored != given): {'; '.join(diff)}"
            )
        stored = stored.replace(**{k: getattr(cfg, k) for k in RESUMABLE_FIELDS})
    if iterations is not None:
        stored = stored.replace(iterations=iterations)
    if not checkpoint_candidates(run.checkpoints):
        raise ValueError(f"run_dir: {str(run.path)!r} has no checkpoint to resume from (checkpoints/ holds none)")
    return stored


def save_start(
    run: RunFolder, policy, critic=None, *, sft_record: dict | None = None, config_hash: str | None = None
) -> Path:
    """Write the start (the policy after SFT; ``critic`` too once warmed up) as the model folder
    ``RUN/start`` (through a temporary name), with ``start.json`` (the SFT record and the config
    hash; without ``sft_record`` the existing record is kept): ``--model-dir RUN/start`` reuses it."""
    final, tmp = run.start, run.path / ".start.tmp"
    info_path = final / "start.json"
    info = json.loads(info_path.read_text()) if sft_record is None and info_path.is_file() else {}
    if sft_record is not None:
        info = {
            "source": f"mpo-viz train: the SFT start of {run.path.name}",
            "sft_config_hash": config_hash,
            "sft": sft_record,
        }
    if critic is not None:
        info["critic"] = "warmed up on the start's rollouts (see the critic_warmup line of metrics.jsonl)"
    # the models (transformers, about a second) only when a start is written: the `mpo-viz` parser
    # imports this module (CheckpointError) and must not pay for them
    from mpo_viz import models

    if tmp.exists():
        shutil.rmtree(tmp)
    models.save(tmp, policy, critic)
    (tmp / "start.json").write_text(json.dumps(clean_json(info), indent=1) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final
