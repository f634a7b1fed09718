"""Run the trainer in a subprocess and keep a handle: the notebook stays responsive.

::

    from mpo_viz.train import Config, launch
    from mpo_viz.widgets import TrainingDashboard

    h = launch(Config(env="search", iterations=30), "runs/mpo")
    TrainingDashboard("runs/mpo")           # live curves while it runs
    h.running, h.log(tail=5)                # still going? the last lines of its log
    h.stop()                                # Ctrl-C for the subprocess: ends at a checkpoint
    h.wait()                                # its exit code

The subprocess is ``python -m mpo_viz.cli train --config RUN/launch_config.json --run-dir RUN`` (or
``--resume RUN`` when the folder already holds a run), with stdout and stderr in ``RUN/train.log``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mpo_viz.data.runfolder import RunFolder
from mpo_viz.train.config import Config

__all__ = ["RunHandle", "launch"]


class RunHandle:
    """A training subprocess: ``running``, ``returncode``, ``stop()``, ``wait()``, ``log()``."""

    def __init__(self, proc: subprocess.Popen, run_dir: Path, log_path: Path, command: list[str]):
        self.proc = proc
        self.run_dir = Path(run_dir)
        self.log_path = Path(log_path)
        self.command = command

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        """True while the subprocess is alive."""
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code (None while running): 0 done, 130 stopped by :meth:`stop`, else an error."""
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the end (at most ``timeout`` seconds); the exit code, or None on timeout."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 120.0) -> int | None:
        """Interrupt the run as Ctrl-C would (SIGINT): the current iteration is abandoned and the
        run folder is left at its last checkpoint, resumable. Waits up to ``timeout`` seconds, then
        terminates the process. Returns the exit code."""
        if not self.running:
            return self.returncode
        self.proc.send_signal(signal.SIGINT)
        rc = self.wait(timeout)
        if rc is None:
            self.proc.terminate()
            rc = self.wait(10)
            if rc is None:
                self.proc.kill()
                rc = self.proc.wait()
        return rc

    def log(self, tail: int | None = None) -> str:
        """The subprocess's output so far (the last ``tail`` lines if given)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        if tail is not None:
            text = "\n".join(text.splitlines()[-int(tail) :])
        return text

    def __repr__(self) -> str:
        state = "running" if self.running else f"exited {self.returncode}"
        return f"RunHandle(pid={self.pid}, {state}, run_dir={str(self.run_dir)!r})"


def launch(
    cfg: Config, run_dir, *, iterations: int | None = None, env: dict | None = None, python: str | None = None
) -> RunHandle:
    """Start ``mpo-viz train`` on ``cfg`` in a subprocess writing ``run_dir``; returns a
    :class:`RunHandle` at once. A folder that already holds a run is resumed (with the same config,
    else the subprocess refuses, naming the fields). ``iterations``: total RL iterations (default
    ``cfg.iterations``). ``env``: extra environment variables (e.g. ``{"OMP_NUM_THREADS": "2"}``)."""
    if not isinstance(cfg, Config):
        raise ValueError(f"cfg: expected a mpo_viz.train.Config, found {type(cfg).__name__}")
    run = RunFolder(run_dir)
    run.create()
    total = cfg.iterations if iterations is None else int(iterations)
    cfg_path = run.path / "launch_config.json"
    cfg.replace(iterations=total).save(cfg_path)
    py = python or sys.executable
    if (run.checkpoints / "latest").exists():
        cmd = [
            py,
            "-m",
            "mpo_viz.cli",
            "train",
            "--resume",
            str(run.path),
            "--config",
            str(cfg_path),
            "--iterations",
            str(total),
        ]
    else:
        cmd = [py, "-m", "mpo_viz.cli", "train", "--config", str(cfg_path), "--run-dir", str(run.path)]
    penv = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    root = str(Path(__file__).resolve().parents[2])  # so that a source checkout imports this mpo_viz
    penv["PYTHONPATH"] = root + (os.pathsep + penv["PYTHONPATH"] if penv.get("PYTHONPATH") else "")
    log = open(run.log_path, "a")
    log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
    log.flush()
    try:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=penv)
    finally:
        log.close()
    return RunHandle(proc, run.path, run.log_path, cmd)
