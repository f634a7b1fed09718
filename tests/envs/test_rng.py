"""The private global-RNG states of mpo_viz/envs/rng.py: the caller's states (Gaussian caches included)
survive every swap, the environment's own stream continues across swaps as one uninterrupted
generator would, on the raw path and on the get_state fallback alike."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mpo_viz.envs import rng as rng_mod
from mpo_viz.envs.rng import GlobalRNG, isolated


def states():
    return random.getstate(), np.random.get_state()


def same(a, b) -> bool:
    (pa, na), (pb, nb) = a, b
    return pa == pb and na[0] == nb[0] and np.array_equal(na[1], nb[1]) and tuple(na[2:]) == tuple(nb[2:])


def draws():
    return [random.random(), random.gauss(0, 1), *np.random.random(3).tolist()]


@pytest.fixture(params=["raw", "fallback"])
def path(request, monkeypatch):
    if request.param == "fallback":
        monkeypatch.setattr(rng_mod, "_RAW", {"np": False, "py": False})
    return request.param


def test_the_raw_layouts_hold_on_this_interpreter():
    # otherwise the fast path is never what runs (and the overhead is ~130 µs a step)
    assert rng_mod._raw_ok("np") and rng_mod._raw_ok("py")


def test_the_seeded_states_are_those_of_the_seeds_words():
    # the same streams as random.Random(words) and RandomState(sha256(words)) (what ProtocolEnv always drew)
    import hashlib

    words = "protocol-3-4"
    digest = int.from_bytes(hashlib.sha256(words.encode()).digest()[:4], "little")
    expect = [random.Random(words).random(), *np.random.RandomState(digest).random_sample(2).tolist()]
    with GlobalRNG(3, 4):
        got = [random.random(), *np.random.random(2).tolist()]
    assert got == expect


def test_the_callers_states_survive_and_the_own_stream_continues(path):
    random.seed(1)
    np.random.seed(2)
    random.gauss(0, 1)  # pending Gaussians in both caches
    np.random.standard_normal()
    before = states()
    own = GlobalRNG("x", 5)
    with own:
        first = draws()
    with own:
        random.random()  # a foreign draw in between would not be in here: this one is the stream's
        second = draws()
    with own:
        random.seed(99)  # a library reseeding inside: only its own state
        np.random.seed(99)
        third = draws()
    assert same(before, states())
    # the same stream uninterrupted, from the same seed
    ref = GlobalRNG("x", 5)
    with ref:
        expect = draws()
        random.random()
        expect2 = draws()
        random.seed(99)
        np.random.seed(99)
        expect3 = draws()
    assert (first, second, third) == (expect, expect2, expect3)
    assert same(before, states())


def test_nested_swaps_are_refused_and_isolated_restores_everything():
    own = GlobalRNG(1)
    with own, pytest.raises(RuntimeError, match="already swapped in"):
        own.__enter__()
    before = states()
    with isolated():
        random.seed(3)
        np.random.seed(3)
        np.random.standard_normal()
    assert same(before, states())
