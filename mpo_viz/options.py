"""The one typed option: a name, a kind, bounds or choices, a doc — declared once, checked everywhere.

:class:`Option` declares one setting: an estimator's keyword option (:mod:`mpo_viz.advantages.registry`),
a loss kind's (:func:`mpo_viz.losses.loss_options`), an environment's (``TextEnv.options``), a field of
:class:`~mpo_viz.rollout.RolloutConfig` or of the trainer's :class:`~mpo_viz.train.Config`. From
the declaration come the check (:meth:`Option.check`: a wrong kind, a value out of bounds or not
among the choices raises :class:`~mpo_viz.checks.OptionError` naming the option, in the form
``"<name>: expected <what>, found <value>"``), the ``mpo-viz`` flags (their type, ``--help`` text
and bounds), the explorer's controls, and the docs' tables.

A dataclass declares its fields with :func:`setting` (``dataclasses.field`` with the option in its
metadata); :func:`declared` returns them as :class:`Option` s named after the fields and
:func:`check_fields` checks an instance against them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpo_viz.checks import OptionError, number

__all__ = ["Option", "KINDS", "UNSET", "setting", "declared", "check_fields", "interval"]

#: the kinds of :class:`Option`
KINDS = ("float", "int", "bool", "choice", "str", "dict", "any")

UNSET = object()
"""The default of an :class:`Option` whose default is given elsewhere (an estimator's signature)."""

_NONE_WORDS = ("none", "null")


def interval(low, high, low_open: bool = False, high_open: bool = False, fmt: Callable = "{:g}".format) -> str:
    """``[0, 1]``, ``(0, inf)``, ``(-inf, 1]``: the bounds of a number as an interval (a missing
    bound is open), each written by ``fmt``."""
    lo = "-inf" if low is None else fmt(low)
    hi = "inf" if high is None else fmt(high)
    return f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"


@dataclass(frozen=True)
class Option:
    """One typed option (or config field).

    Attributes:
        name: the keyword argument (or field) it sets.
        default: its default (:data:`UNSET`: given elsewhere, e.g. an estimator's signature).
        kind: ``"float"``, ``"int"``, ``"bool"``, ``"choice"`` (one of ``choices``), ``"str"`` (a
            non-empty string), ``"dict"``, or ``"any"`` (unchecked; not shown on the command line or
            in the explorer).
        low, high: inclusive bounds of a number (None: unbounded); ``low_open``/``high_open``
            make them exclusive.
        choices: the allowed values of a ``choice``: a tuple, or a callable returning them (a
            registry that grows: ``mpo_viz.losses.available_losses``).
        doc: what it does, shown by ``--help``, as a control's tooltip and in the docs' tables.
        label: short display name (``"γ"``); default the name.
        span: ``(min, max)`` of a slider for a number without two finite bounds (e.g. β ≥ 0 on
            0…3); without it such a number gets a text box.
        advanced: shown folded away in the explorer (the CLI shows every option).
        optional: None is a valid value too (it means "off", or "the default").
        expect: what a valid value is, in words (``"a number > 1 (verl uses 3) or None"``),
            replacing the words derived from the kind and bounds in messages and ``--help``.
        parse: reads a flag's text into a value (default: by kind; ``none`` is None when
            ``optional``).
    """

    name: str
    default: object = UNSET
    kind: str = "float"
    low: float | None = None
    high: float | None = None
    choices: tuple | Callable[[], Iterable] = ()
    doc: str = ""
    label: str = ""
    span: tuple[float, float] | None = None
    advanced: bool = False
    low_open: bool = False
    high_open: bool = False
    optional: bool = False
    expect: str = ""
    parse: Callable[[str], object] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Option.name: expected a Python identifier, found {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"Option {self.name!r}: kind: expected one of {', '.join(KINDS)}, found {self.kind!r}")
        if (self.kind == "choice") != bool(self.choices):
            raise ValueError(f"Option {self.name!r}: choices go with kind='choice' (and only with it)")
        if not callable(self.choices):
            object.__setattr__(self, "choices", tuple(self.choices))

    # ------------------------------------------------------------------ reading the declaration
    @property
    def display(self) -> str:
        """The label, or the name."""
        return self.label or self.name

    @property
    def allowed(self) -> tuple:
        """The choices of a ``choice`` now (a callable's are read at each call)."""
        return tuple(self.choices()) if callable(self.choices) else self.choices

    @property
    def slider(self) -> tuple[float, float] | None:
        """``(min, max)`` of a slider for this number, or None (a text box)."""
        if self.kind != "float":
            return None
        if self.span is not None:
            return self.span
        if self.low is not None and self.high is not None:
            return (self.low, self.high)
        return None

    def bounds_text(self) -> str:
        """``[0, 1]``, ``(0, inf)``, ``one of intra, local`` or ``""``."""
        if self.kind == "choice":
            return "one of " + ", ".join(map(str, self.allowed))
        if self.low is None and self.high is None:
            return ""
        return interval(self.low, self.high, self.low_open, self.high_open)

    def expected(self) -> str:
        """What a valid value is, as the messages say it: ``expect``, else derived from the kind
        (``an integer >= 1``, ``a value in [0, 1]``, ``one of 'mc', 'turn'``)."""
        if self.expect:
            return self.expect
        if self.kind == "int":
            parts = [f"{'>' if self.low_open else '>='} {self.low:g}"] if self.low is not None else []
            parts += [f"{'<' if self.high_open else '<='} {self.high:g}"] if self.high is not None else []
            return "an integer" + (" " + " and ".join(parts) if parts else "")
        if self.kind == "float":
            return f"a value in {interval(self.low, self.high, self.low_open, self.high_open)}"
        if self.kind == "choice":
            return "one of " + ", ".join(map(repr, self.allowed))
        return {"bool": "True or False", "str": "a non-empty string", "dict": "a dict"}.get(self.kind, "anything")

    def same_meaning(self, other: Option) -> bool:
        """Same kind, bounds and choices (defaults and docs may differ between estimators)."""
        return (self.kind, self.low, self.high, self.low_open, self.high_open, self.choices) == (
            other.kind,
            other.low,
            other.high,
            other.low_open,
            other.high_open,
            other.choices,
        )

    # ------------------------------------------------------------------ checking a value
    def check(self, value):
        """``value`` if it is a valid setting of this option (an integer as a Python ``int``, a
        flag as a ``bool``), else :class:`~mpo_viz.checks.OptionError` naming it."""
        if value is None and self.optional or self.kind == "any":
            return value
        kind = self.kind
        if kind == "bool":
            ok = isinstance(value, (bool, np.bool_))
            value = bool(value) if ok else value
        elif kind == "choice":
            ok = value in self.allowed
        elif kind == "str":
            ok = isinstance(value, str) and bool(value)
        elif kind == "dict":
            ok = isinstance(value, dict)
        elif kind == "int":
            ok = (
                isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and self._inside(value)
            )
            value = int(value) if ok else value
        else:  # a float: "expected a number" for a string or a flag, then the bounds
            ok = self._inside(number(value, self.name))
        if not ok:
            raise OptionError(self.name, f"expected {self.expected()}, found {value!r}")
        return value

    def _inside(self, x) -> bool:
        if not math.isfinite(x):
            return False
        if self.low is not None and (x <= self.low if self.low_open else x < self.low):
            return False
        return not (self.high is not None and (x >= self.high if self.high_open else x > self.high))

    def from_text(self, text: str):
        """A flag's text as a value of this option (not yet checked): ``parse`` when declared; else
        ``none`` is None for an optional option, and the text is read by kind (an ``int``, a
        ``float``, ``true``/``false``, JSON for a ``dict``, the text itself otherwise).
        ``ValueError`` saying what was expected when it cannot be read."""
        if self.optional and text.strip().lower() in _NONE_WORDS and text not in self.allowed:
            return None
        if self.parse is not None:
            return self.parse(text)
        try:
            if self.kind == "int":
                return int(text)
            if self.kind == "float":
                return float(text)
            if self.kind == "bool":
                return {"true": True, "false": False, "1": True, "0": False}[text.strip().lower()]
            if self.kind == "dict":
                value = json.loads(text)
                if not isinstance(value, dict):
                    raise ValueError
                return value
        except (ValueError, KeyError, json.JSONDecodeError):
            none = " or none" if self.optional and not self.expect else ""
            raise ValueError(f"expected {self.expected()}{none}, found {text!r}") from None
        return text


# ---------------------------------------------------------------------------------------------
# options of a dataclass's fields


def setting(default=dataclasses.MISSING, *, default_factory=dataclasses.MISSING, **option) -> Any:
    """A dataclass field declared by an :class:`Option` (its keywords: ``kind``, ``low``, ``doc``,
    ...); the option takes the field's name and default. :func:`declared` reads them back."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"option": option})


_DECLARED: dict[type, dict[str, Option]] = {}


def declared(cls: type) -> dict[str, Option]:
    """``{field name: Option}`` of the fields of dataclass ``cls`` declared with :func:`setting`,
    in field order (defaults filled in; built once per class)."""
    if cls not in _DECLARED:
        out = {}
        for f in dataclasses.fields(cls):
            if "option" not in f.metadata:
                continue
            factory: Callable = f.default_factory  # type: ignore[assignment]  # set when there is no default
            default = f.default if f.default is not dataclasses.MISSING else factory()
            out[f.name] = Option(f.name, default=default, **f.metadata["option"])
        _DECLARED[cls] = out
    return _DECLARED[cls]


def check_fields(obj) -> None:
    """Check every declared field of a dataclass instance (:func:`declared`), in field order; a
    bad one raises :class:`~mpo_viz.checks.OptionError` naming it. Integers are stored as
    Python ints (a numpy integer is read as its value)."""
    for name, o in declared(type(obj)).items():
        value = getattr(obj, name)
        checked = o.check(value)
        if checked is not value:
            setattr(obj, name, checked)
