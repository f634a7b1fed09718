"""Experiment trackers: every line of a run's ``metrics.jsonl`` mirrored to wandb or TensorBoard.

``Config(log_to="wandb")`` / ``mpo-viz train --log-to tensorboard``. The run folder stays the source
of truth; a tracker receives each metrics line as it is written
(:attr:`~mpo_viz.data.runfolder.RunFolder.mirror`) and the run's config once:

* ``tensorboard`` — event files in ``RUN/tensorboard/`` (``torch.utils.tensorboard``; needs the
  ``tensorboard`` package): every numeric metric as a scalar (nested ones joined with ``/``:
  ``timings/rollout``; a bool as 0/1) at step = ``iteration``; the config, and each line's
  ``phase``, ``collapse`` and other text, as text summaries. A resumed run purges the steps past its
  checkpoint (``purge_step``), as the run folder does.
* ``wandb`` — a wandb run in ``RUN/wandb/`` (``WANDB_MODE``: ``offline`` unless set, so nothing
  leaves the machine unless asked; ``wandb sync RUN/wandb/offline-run-*`` uploads it), its config the
  run's Config, each metrics line one ``log`` at step = ``iteration`` (lines of one iteration
  merge into one step); resumed runs continue the same wandb run (its id is kept in
  ``RUN/tracker.json``).

A missing package is one clear error before anything is written (:func:`check_available`).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["TRACKERS", "check_available", "open_tracker", "attach_tracker", "flat_metrics", "Tracker"]

#: tracker name -> the package it needs (``pip install mpo-viz[trackers]`` installs both)
TRACKERS = {"wandb": "wandb", "tensorboard": "tensorboard"}


def check_available(kind: str) -> None:
    """Refuse a tracker whose package is not installed, naming the package and the extra."""
    if kind not in TRACKERS:
        raise ValueError(f"log_to: expected one of {', '.join(TRACKERS)}, found {kind!r}")
    if importlib.util.find_spec(TRACKERS[kind]) is None:
        raise ValueError(
            f"log_to: {kind!r} needs the {TRACKERS[kind]} package, which is not installed here "
            f"(pip install {TRACKERS[kind]}, or pip install 'mpo-viz[trackers]')"
        )


def flat_metrics(record: dict, prefix: str = "") -> tuple[dict[str, float], dict[str, str]]:
    """A metrics line as ``(numbers, texts)``: nested dicts flattened with ``/``, bools as 0/1,
    numbers as floats, None skipped, everything else (strings, lists) as JSON text."""
    nums: dict[str, float] = {}
    texts: dict[str, str] = {}
    for k, v in record.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            n, t = flat_metrics(v, name + "/")
            nums.update(n)
            texts.update(t)
        elif isinstance(v, bool | int | float):
            nums[name] = float(v)
        elif v is not None:
            texts[name] = v if isinstance(v, str) else json.dumps(v)
    return nums, texts


class Tracker:
    """What the trainer calls: :meth:`log` with each metrics line, :meth:`close` at the end."""

    kind = ""
    #: True when this run had no tracker of this kind before (a resume then sends the lines so far)
    fresh = True

    def log(self, record: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class TensorBoardTracker(Tracker):
    kind = "tensorboard"

    def __init__(self, run_dir: Path, config: dict, *, resume_from: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.path = Path(run_dir) / "tensorboard"
        self.fresh = not self.path.exists()
        self.writer = SummaryWriter(log_dir=str(self.path), purge_step=None if resume_from is None else resume_from + 1)
        if self.fresh:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```", 0)
            self.writer.flush()

    def log(self, record: dict) -> None:
        step = int(record.get("iteration", 0))
        nums, texts = flat_metrics(record)
        for k, x in nums.items():
            if k != "iteration":
                self.writer.add_scalar(k, x, step)
        for k, text in texts.items():
            self.writer.add_text(k, text, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    kind = "wandb"

    def __init__(self, run_dir: Path, config: dict, *, resume_from: int | None = None):
        import wandb

        state = Path(run_dir) / "tracker.json"
        known = json.loads(state.read_text()) if state.is_file() else {}
        self.fresh = not known
        mode: Any = os.environ.get("WANDB_MODE", "offline")  # wandb checks it
        self.run = wandb.init(
            mode=mode,
            dir=str(run_dir),
            project=os.environ.get("WANDB_PROJECT", "mpo_viz"),
            name=Path(run_dir).name,
            id=known.get("wandb_id"),
            resume="allow" if known else None,
            config=config,
            reinit="create_new",
        )
        state.write_text(json.dumps({"wandb_id": self.run.id}) + "\n")

    def log(self, record: dict) -> None:
        nums, texts = flat_metrics(record)
        step = int(nums.pop("iteration", 0))
        self.run.log({**nums, **texts}, step=step)

    def close(self) -> None:
        self.run.finish()


def attach_tracker(kind: str, run, config: dict, *, resume_from: int | None = None) -> Tracker:
    """:func:`open_tracker` for the run folder ``run`` (a :class:`~mpo_viz.data.runfolder.RunFolder`),
    mirroring every metrics line written from now on (``run.mirror``); a tracker opened for the first
    time on a resumed run first receives the lines already written."""
    tracker = open_tracker(kind, run.path, config, resume_from=resume_from)
    if resume_from is not None and tracker.fresh:
        for rec in run.metrics():
            tracker.log(rec)
    run.mirror = tracker.log
    return tracker


def open_tracker(kind: str, run_dir, config: dict, *, resume_from: int | None = None) -> Tracker:
    """The tracker ``kind`` (``"wandb"``, ``"tensorboard"``) for the run folder ``run_dir``, given
    the run's config (a dict). ``resume_from``: the iteration a resumed run continues from."""
    check_available(kind)
    cls = {"wandb": WandbTracker, "tensorboard": TensorBoardTracker}[kind]
    return cls(Path(run_dir), config, resume_from=resume_from)
