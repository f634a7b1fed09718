"""Small helpers of the trainer shared by its modules: derived seeds, thread settings, environment options."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from mpo_viz.train.config import Config

__all__ = ["derive_seed", "env_kwargs", "set_threads", "threads"]


def derive_seed(seed: int, *parts) -> int:
    """A 31-bit seed from the master seed and labels (stable across processes and platforms)."""
    text = "/".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def set_threads(n: int) -> None:
    """Torch's and numba's CPU threads to ``n``. Both matter: after a parallel estimator kernel,
    numba's OpenMP workers keep spinning, and a torch forward/backward in the same process then ran
    5-7x slower (measured on 2 cores) unless numba is held to the same thread count. Numba first:
    starting its OpenMP layer resets the process's OpenMP thread count, torch's included."""
    try:
        import numba

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - numba is a dependency
        pass
    torch.set_num_threads(n)


@contextmanager
def threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch (and numba) CPU threads (:func:`set_threads`), and give the
    process its torch thread count back after; ``None`` changes nothing."""
    if n is None:
        yield
        return
    if n < 1:
        raise ValueError(f"num_threads: expected an integer >= 1, found {n!r}")
    before = torch.get_num_threads()
    set_threads(int(n))
    try:
        yield
    finally:
        set_threads(before)


def env_kwargs(cfg: Config) -> dict:
    """The keyword options ``make_env`` gets from a Config (``env_options`` plus ``difficulty``)."""
    kw = dict(cfg.env_options)
    if cfg.difficulty is not None:
        kw["difficulty"] = tuple(cfg.difficulty) if isinstance(cfg.difficulty, list) else cfg.difficulty
    return kw
