"""Small argument checks shared by the estimators and the losses."""

from __future__ import annotations

import numpy as np

__all__ = ["number"]


def number(value, name: str) -> float:
    """``float(value)`` for a real number; ValueError naming ``name`` for a string, a bool or
    anything else (``float("0.2")`` would quietly accept a string, ``float(True)`` a flag)."""
    if isinstance(value, (str, bytes, bool, np.bool_)):
        raise ValueError(f"{name}: expected a number, found {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number, found {value!r}") from None
