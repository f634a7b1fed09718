"""The caller's global RNG states (Python's ``random`` and numpy's legacy generator), taken and compared:
the adapter tests check that no call into a game library moves them."""

import random

import numpy as np


def global_states():
    return random.getstate(), np.random.get_state()


def same_global(a, b) -> bool:
    (pa, na), (pb, nb) = a, b
    return pa == pb and na[0] == nb[0] and np.array_equal(na[1], nb[1]) and tuple(na[2:]) == tuple(nb[2:])
