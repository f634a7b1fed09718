"""Private copies of Python's and numpy's *global* RNGs, swapped in around calls into a library.

Game libraries (gem, textarena) draw tasks and dynamics from the global ``random`` and
``numpy.random`` and reseed them on every reset. :class:`GlobalRNG` holds an environment's own
copy of both states; ``with rng:`` saves the caller's states, installs the environment's, runs the
call and swaps back, so the caller's global states are untouched and the environment's dynamics
draw from their own stream (replay is exact even when other code draws globally between steps).

Cost. ``numpy.random.get_state``/``set_state`` copy the 624-word Mersenne Twister through a Python
dict (about 30 µs each), and ``random.getstate`` builds a tuple of 625 ints (about 8 µs): four of
each per call would be most of a game step. The swap per call (``with rng:``) therefore moves the
raw bytes, one ``memmove`` each: numpy's global bit generator's ``mt19937_state`` (624 words and
the position) and its ``RandomState``'s Gaussian cache (``has_gauss``, ``gauss``), and CPython's
``random.Random`` object's ``index, state[624]`` after the object header (its ``gauss_next``
attribute beside). Each layout is checked once per process against ``get_state``/``getstate``
and a redraw (the cache's place found by the value ``set_state`` writes there); where one differs
(another bit generator, another interpreter) that generator is swapped with
``get_state``/``getstate`` instead. Either way the whole state moves: the raw bytes are all that
``get_state``/``getstate`` report.
"""

from __future__ import annotations

import ctypes
import hashlib
import random
import struct
from typing import Any, cast

import numpy as np

__all__ = ["GlobalRNG", "isolated"]

_MT_BYTES = 624 * 4 + 4  # numpy's mt19937_state: uint32 key[624]; int pos
_PY_BYTES = 4 + 624 * 4  # CPython's RandomObject after its header: int index; uint32_t state[624]
_PY_OFFSET = object.__basicsize__  # the header (PyObject_HEAD)
_RAW: dict[str, bool] = {}  # "np" / "py" -> whether the raw layout was checked and holds
_NP_ADDR: tuple[Any, int] | None = None  # (numpy's global bit generator, the address of its state)
_GAUSS: int | None = None  # offset of the Gaussian cache in a RandomState (has_gauss, pad, gauss: 16 bytes)


def _np_addr() -> int:
    """The address of numpy's global MT19937 state (cached while the bit generator is the same)."""
    global _NP_ADDR
    bg = np.random.mtrand._rand._bit_generator
    if _NP_ADDR is None or _NP_ADDR[0] is not bg:
        _NP_ADDR = (bg, int(bg.ctypes.state_address))
    return _NP_ADDR[1]


def _check_np() -> bool:
    """Whether numpy's global bit generator is an MT19937 whose raw state is ``key[624], pos``
    (checked once against ``get_state`` and a redraw, the caller's state put back)."""
    global _GAUSS
    if type(np.random.mtrand._rand._bit_generator).__name__ != "MT19937":
        return False
    _GAUSS = _gauss_offset()
    if _GAUSS is None:
        return False
    addr = _np_addr()
    saved = np.random.get_state()
    try:
        np.random.seed(12345)
        np.random.random(7)
        raw = ctypes.string_at(addr, _MT_BYTES)
        st = tuple(np.random.get_state())
        key = np.frombuffer(raw[: 624 * 4], dtype=np.uint32)
        pos = int(np.frombuffer(raw[624 * 4 :], dtype=np.int32)[0])
        if not (np.array_equal(key, st[1]) and pos == st[2]):
            return False
        a = np.random.random(3)
        ctypes.memmove(addr, raw, _MT_BYTES)
        return bool(np.array_equal(a, np.random.random(3)))
    finally:
        np.random.set_state(saved)


def _gauss_offset() -> int | None:
    """Where a ``RandomState`` keeps its Gaussian cache (``int has_gauss`` then ``double gauss``, 8
    bytes apart): found once on a scratch ``RandomState`` by the value ``set_state`` writes there,
    and confirmed with a second value; None where it cannot be found (then the raw path is off)."""
    rs = np.random.RandomState(0)
    size = type(rs).__basicsize__
    kind, key, pos0, *_ = cast(tuple, rs.get_state())
    found = None
    for has, x in ((1, 1.2345678912345e-7), (0, -9.87654321987e5)):
        rs.set_state((kind, key, pos0, has, x))
        raw = ctypes.string_at(id(rs), size)
        pos = raw.find(struct.pack("d", x))
        if pos < 8 or raw.count(struct.pack("d", x)) != 1 or struct.unpack_from("i", raw, pos - 8)[0] != has:
            return None
        if found is not None and found != pos - 8:
            return None
        found = pos - 8
    return found


def _check_py() -> bool:
    """Whether a ``random.Random`` holds ``index, state[624]`` right after its object header, as
    ``getstate`` reports them (checked once on a scratch generator)."""
    r = random.Random(12345)
    r.random()
    raw = ctypes.string_at(id(r) + _PY_OFFSET, _PY_BYTES)
    index = int(np.frombuffer(raw[:4], dtype=np.int32)[0])
    words = np.frombuffer(raw[4:], dtype=np.uint32)
    internal = r.getstate()[1]
    if len(internal) != 625 or internal[-1] != index or list(words) != list(internal[:624]):
        return False
    a = [r.random() for _ in range(3)]
    ctypes.memmove(id(r) + _PY_OFFSET, raw, _PY_BYTES)
    return a == [r.random() for _ in range(3)]


def _raw_ok(which: str) -> bool:
    """Whether the raw swap of ``"np"`` / ``"py"`` holds on this interpreter (checked once)."""
    ok = _RAW.get(which)
    if ok is None:
        try:
            ok = _check_np() if which == "np" else _check_py()
        except Exception:  # another bit generator, a numpy without .ctypes, another interpreter
            ok = False
        _RAW[which] = ok
    return ok


def _np_save() -> Any:
    if _raw_ok("np"):
        assert _GAUSS is not None
        gauss = ctypes.string_at(id(np.random.mtrand._rand) + _GAUSS, 16)
        return ctypes.string_at(_np_addr(), _MT_BYTES) + gauss
    return np.random.get_state()


def _np_load(state: Any) -> None:
    if isinstance(state, bytes):
        assert _GAUSS is not None
        ctypes.memmove(_np_addr(), state, _MT_BYTES)
        ctypes.memmove(id(np.random.mtrand._rand) + _GAUSS, state[_MT_BYTES:], 16)
    else:
        np.random.set_state(state)


def _py_save() -> Any:
    inst = random._inst  # type: ignore[attr-defined]  # the generator behind random's functions
    if _raw_ok("py"):
        return ctypes.string_at(id(inst) + _PY_OFFSET, _PY_BYTES), getattr(inst, "gauss_next", None)
    return random.getstate()


def _py_load(state: Any) -> None:
    if isinstance(state[0], bytes):
        inst = random._inst  # type: ignore[attr-defined]
        ctypes.memmove(id(inst) + _PY_OFFSET, state[0], _PY_BYTES)
        setattr(inst, "gauss_next", state[1])  # noqa: B010 (a Random's attribute typeshed does not list)
    else:
        random.setstate(state)


class GlobalRNG:
    """An environment's own states of the global ``random`` and ``numpy.random``.

    ``GlobalRNG(*seed)``: both seeded by ``seed`` (any printable values; the same in every process:
    ``random.seed("protocol-<seed>")`` and ``numpy.random.seed`` of its hash). ``with rng:`` runs a
    call on them (module docstring). Not reentrant; ``copy.deepcopy`` copies it.
    """

    __slots__ = ("py", "np", "_outer")

    def __init__(self, *seed: object):
        words = "protocol-" + "-".join(map(str, seed))  # the words ProtocolEnv has always seeded from
        digest = int.from_bytes(hashlib.sha256(words.encode()).digest()[:4], "little")
        outer = _py_save(), _np_save()
        random.seed(words)
        np.random.seed(digest)
        self.py: Any = _py_save()
        self.np: Any = _np_save()
        _py_load(outer[0])
        _np_load(outer[1])
        self._outer: tuple | None = None

    def __enter__(self) -> GlobalRNG:
        if self._outer is not None:
            raise RuntimeError("GlobalRNG: already swapped in (calls into a library do not nest)")
        self._outer = (_py_save(), _np_save())
        _py_load(self.py)
        _np_load(self.np)
        return self

    def __exit__(self, *exc) -> None:
        outer, self._outer = self._outer, None
        assert outer is not None
        self.py = _py_save()
        self.np = _np_save()
        _py_load(outer[0])
        _np_load(outer[1])

    def __deepcopy__(self, memo) -> GlobalRNG:
        other = GlobalRNG.__new__(GlobalRNG)
        other.py, other.np, other._outer = self.py, self.np, None
        return other


class isolated:
    """``with isolated():`` — whatever runs inside may draw from or reseed the global ``random``
    and ``numpy.random``; the caller's complete states are put back afterwards (a library's
    constructor that draws, an import that seeds)."""

    def __enter__(self) -> isolated:
        self._saved = (random.getstate(), np.random.get_state())
        return self

    def __exit__(self, *exc) -> None:
        random.setstate(self._saved[0])
        np.random.set_state(self._saved[1])
