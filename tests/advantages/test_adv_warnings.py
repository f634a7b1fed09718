"""Warnings for silent surprises, each shown once per process: groups of one in the group
estimators (each falls back to a fixed rule) and critic_target="turn" in MAE (it switches the
micro scale off)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpo_viz.advantages as A
from mpo_viz import checks


@pytest.fixture(autouse=True)
def fresh_warnings():
    checks._WARNED.clear()
    yield
    checks._WARNED.clear()


def _batch():
    M = np.array([[1, 1, 0], [1, 0, 1], [1, 1, 1]], dtype=np.float64)
    R = np.array([[0, 1.0, 0], [0, 0, 2.0], [0.5, 0, 0]])
    return R, M


def _gigpo(R, M, g):
    return A.gigpo(R, M, g, prompt_ids=[[1]] * 3, response_ids=[[5, 6, 7]] * 3)


CALLS = {
    "grpo": (lambda R, M, g: A.grpo(R, M, g), r"grpo gives A = s/\(1 \+ eps\)", 2.0 / (1 + 1e-6)),
    "drgrpo": (lambda R, M, g: A.drgrpo(R, M, g), r"drgrpo gives A = s, the raw score", 2.0),
    "rloo": (lambda R, M, g: A.rloo(R, M, g), r"rloo gives A = 0", 0.0),
    "reinforce_pp_baseline": (lambda R, M, g: A.reinforce_pp_baseline(R, M, g, whiten=False),
                              r"reinforce_pp_baseline gives A = s, the raw score", 2.0),
    "gigpo": (_gigpo, r"gigpo gives an episode-level A\^E = s/\(1 \+ eps\)", 2.0 / (1 + 1e-6)),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_groups_of_one_warn_once(name):
    fn, msg, single = CALLS[name]
    R, M = _batch()
    g = ["a", "z", "a"]  # row 1 is alone in group "z"
    with pytest.warns(UserWarning, match=rf"group_ids: 1 of 2 groups hold a single trajectory \(e.g. row 1, "
                                         rf"group 'z'\); .*{msg}") as rec:
        a, _ = fn(R, M, g)
    assert len(rec) == 1
    # the value the warning announces (gigpo: row 1's turns have no step group either, so A^S = 0)
    np.testing.assert_allclose(a.numpy()[1, 0], single, rtol=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn(R, M, g)  # once per process: no second warning
        checks._WARNED.clear()
        fn(R, M, ["a", "a", "a"])  # no group of one: no warning


def test_critic_target_turn_warns_once_and_only_where_it_matters():
    R, M = _batch()
    V = np.zeros_like(R)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        A.mae(R, V, M)  # the default Monte-Carlo target
        A.mae(R, V, M, critic_target="turn", beta=0.0)  # β = 0 is turn GAE anyway
        A.turn_gae(R, V, M)
    with pytest.warns(UserWarning, match=r"critic_target='turn': .*flat inside each turn.*micro scale switches "
                                         r"itself off") as rec:
        A.mae(R, V, M, critic_target="turn")
    assert len(rec) == 1 and rec[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        A.mae(R, V, M, critic_target="turn")
