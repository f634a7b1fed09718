"""Small argument checks and type aliases shared by the estimators and the losses."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["number", "TensorLike", "warn_once"]

#: What the tensor API accepts for a ``(B, L)`` (or ``(B,)``) input: a torch tensor, a numpy array
#: or a nested sequence of numbers.
TensorLike = torch.Tensor | np.ndarray | Sequence

_WARNED: set[str] = set()


def warn_once(key: str, message: str, *, stacklevel: int = 3) -> None:
    """``warnings.warn(message)`` (a ``UserWarning``) the first time ``key`` is seen in this process.

    For surprises that are not errors (an option that switches a feature off, groups of one): the
    user sees it once, not on every slider move of a widget. ``_WARNED.clear()`` resets it (tests).
    """
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, UserWarning, stacklevel=stacklevel)


def number(value, name: str) -> float:
    """``float(value)`` for a real number; ValueError naming ``name`` for a string, a bool or
    anything else (``float("0.2")`` would quietly accept a string, ``float(True)`` a flag)."""
    if isinstance(value, (str, bytes, bool, np.bool_)):
        raise ValueError(f"{name}: expected a number, found {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number, found {value!r}") from None
