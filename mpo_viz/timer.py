"""Wall seconds per named phase: the one :class:`Timer` of the rollout and the trainer.

Invariant: a phase's seconds only grow; each is the sum of every span timed under its name
(``time.perf_counter``), and :attr:`Timer.t` keeps the phases in the order each first ended.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Timer"]


class Timer:
    """Seconds per phase, added up: ``t`` maps each phase name to its seconds.

    ``with timer.phase("rollout"): ...`` times a block; ``t0 = timer.add("model", t0)`` closes a
    span started at ``t0`` and returns the time that opens the next one (for loops that time
    several phases back to back); :meth:`elapsed` is the seconds since the timer was made."""

    def __init__(self):
        self.t: dict[str, float] = {}
        self.started = time.perf_counter()

    @staticmethod
    def now() -> float:
        """The clock the spans are read on (``time.perf_counter``)."""
        return time.perf_counter()

    def add(self, name: str, t0: float) -> float:
        """Add the seconds since ``t0`` to phase ``name``; returns now."""
        now = time.perf_counter()
        self.t[name] = self.t.get(name, 0.0) + now - t0
        return now

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block under ``name`` (also when it raises)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, t0)

    def elapsed(self) -> float:
        """Seconds since the timer was made."""
        return time.perf_counter() - self.started
