"""Small argument checks and type aliases shared by the estimators, the losses and the configs.

:class:`OptionError` is the one error for a bad option or config field: its ``option`` attribute
names the field, so a caller can say it in its own words — the ``mpo-viz`` command names the flag
(``--lam: expected ...``) from the parser's own dest -> flag table, without reading the message.
:func:`warn_once` is for surprises that are not errors.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["OptionError", "TensorLike", "number", "warn_once"]

#: What the tensor API accepts for a ``(B, L)`` (or ``(B,)``) input: a torch tensor, a numpy array
#: or a nested sequence of numbers.
TensorLike = torch.Tensor | np.ndarray | Sequence

_WARNED: set[str] = set()
#: the package's folder: frames under it are ours, the first frame outside is the user's line
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def outside_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the calling function point at the first
    frame outside mpo_viz (the user's line), however deep inside the package the call sits
    (1 = the calling function itself)."""
    here = inspect.currentframe()
    frame, level = here.f_back if here is not None else None, 1
    if frame is None:  # an interpreter without frame support: the caller's caller
        return 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def warn_once(key: str, message: str, *, stacklevel: int | None = None) -> None:
    """``warnings.warn(message)`` (a ``UserWarning``) the first time ``key`` is seen in this process.

    For surprises that are not errors (an option that switches a feature off, groups of one): the
    user sees it once, not on every slider move of a widget. The warning points at the first frame
    outside mpo_viz (:func:`outside_stacklevel`) unless ``stacklevel`` says otherwise.
    ``_WARNED.clear()`` resets it (tests).
    """
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, UserWarning, stacklevel=outside_stacklevel() if stacklevel is None else stacklevel)


class OptionError(ValueError):
    """A bad value of option or config field ``option``; ``str()`` is ``"<option>: <detail>"``.

    Attributes:
        option: the option's Python name (``"turn_lam"``).
        detail: the message without the name (``"expected a value in [0, 1], found 1.5"``).
    """

    def __init__(self, option: str, detail: str):
        super().__init__(f"{option}: {detail}")
        self.option = option
        self.detail = detail

    def __reduce__(self):  # picklable across processes (the trainer launches subprocesses)
        return (type(self), (self.option, self.detail))


def number(value, name: str) -> float:
    """``float(value)`` for a real number; :class:`OptionError` naming ``name`` for a string, a bool
    or anything else (``float("0.2")`` would quietly accept a string, ``float(True)`` a flag)."""
    if isinstance(value, (str, bytes, bool, np.bool_)):
        raise OptionError(name, f"expected a number, found {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise OptionError(name, f"expected a number, found {value!r}") from None
