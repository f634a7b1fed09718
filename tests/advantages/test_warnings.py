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


def _gigpo(R, M, g, **kw):
    return A.gigpo(R, M, g, prompt_ids=[[1]] * 3, response_ids=[[5, 6, 7]] * 3, **kw)


CALLS = {
    "grpo": (lambda R, M, g: A.grpo(R, M, g), r"grpo gives A = s/\(1 \+ eps\)", 2.0 / (1 + 1e-6)),
    "drgrpo": (lambda R, M, g: A.drgrpo(R, M, g), r"drgrpo gives A = s, the raw score", 2.0),
    "rloo": (lambda R, M, g: A.rloo(R, M, g), r"rloo gives A = 0", 0.0),
    "reinforce_pp_baseline": (
        lambda R, M, g: A.reinforce_pp_baseline(R, M, g, whiten=False),
        r"reinforce_pp_baseline gives A = s, the raw score",
        2.0,
    ),
    # per-trajectory statistics (the former default): GRPO's rule; row 1 has two turns
    "gigpo": (
        lambda R, M, g: _gigpo(R, M, g, episode_stats="trajectories"),
        r"gigpo gives an episode-level A\^E = s/\(1 \+ eps\)",
        2.0 / (1 + 1e-6),
    ),
    "gigpo mean_norm": (
        lambda R, M, g: _gigpo(R, M, g, norm="mean_norm", episode_stats="trajectories"),
        r"gigpo gives an episode-level A\^E = s/\(1 \+ eps\) .*\(s with norm='mean_norm'\)",
        2.0,
    ),
    # the default, statistics over the turns: its two turns are two values, mean s, std 0
    "gigpo steps": (_gigpo, r"with 'steps' \(the default\) .* A\^E = 0 when it has several", 0.0),
    "mt_grpo": (lambda R, M, g: A.mt_grpo(R, M, g), r"mt_grpo gives A = 0 with turn_baseline='loo'", 0.0),
    "mt_grpo index": (
        lambda R, M, g: A.mt_grpo(R, M, g, turn_baseline="index"),
        r"with 'index' the outcome part O/\(1 \+ eps\)",
        2.0 / (1 + 1e-4),
    ),
    "mt_grpo index_present": (
        lambda R, M, g: A.mt_grpo(R, M, g, turn_baseline="index_present"),
        r"likewise with 'index_present'",
        2.0 / (1 + 1e-4),
    ),
    "empg": (
        lambda R, M, g: A.empg(R, M, g, entropy=np.ones_like(M), zeta=0.0, center=False),
        r"empg gives the base advantage s/\(1 \+ eps\)",
        2.0 / (1 + 1e-6) / (1 + 1e-8),
    ),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_groups_of_one_warn_once(name):
    fn, msg, single = CALLS[name]
    R, M = _batch()
    g = ["a", "z", "a"]  # row 1 is alone in group "z"
    with pytest.warns(
        UserWarning,
        match=rf"group_ids: 1 of 2 groups hold a single trajectory \(e.g. row 1, "
        rf"group 'z'\); .*{msg}",
    ) as rec:
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
    with pytest.warns(
        UserWarning,
        match=r"critic_target='turn': .*flat inside each turn.*micro scale switches "
        r"itself off",
    ) as rec:
        A.mae(R, V, M, critic_target="turn")
    assert len(rec) == 1 and rec[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        A.mae(R, V, M, critic_target="turn")


def _rows(rewards, groups, turn_rewards=None):
    """A batch of one-turn rows (3 action tokens) with these outcome rewards and groups."""
    from mpo_viz.data.trajectory import TrajectoryBatch

    rows = []
    for i, (r, g) in enumerate(zip(rewards, groups)):
        row = {
            "traj_id": f"t{i}",
            "group_id": g,
            "prompt_ids": [1],
            "response_ids": [5, 6, 7],
            "loss_mask": [1, 1, 1],
            "reward": r,
        }
        if turn_rewards and turn_rewards[i] is not None:
            row["turn_rewards"] = [turn_rewards[i]]
        rows.append(row)
    return TrajectoryBatch.from_rows(rows)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "reinforce_pp_baseline", "gigpo"])
def test_group_estimators_warn_about_rows_without_a_reward(name):
    nan = float("nan")
    # group a: t1 has no reward (scored 0 beside 1 and 1); group b: nothing rewarded at all;
    # group c: t5's outcome is in its turn_rewards (NaN reward is v1's "see the turn rewards")
    b = _rows(
        [1.0, nan, 1.0, nan, nan, nan, 1.0],
        ["a", "a", "a", "b", "b", "c", "c"],
        turn_rewards=[None, None, None, None, None, 1.0, None],
    )
    with pytest.warns(
        UserWarning,
        match=rf"^{name}: 3 of 7 trajectories have no reward .*: 't1', 't3', 't4', in 2 "
        r"group\(s\) \('a', 'b'\)\. Their score counts as 0.*; 1 group\(s\) hold no "
        r"reward at all and get advantage 0 on every token",
    ) as rec:
        res = A.compute(b, name)
    assert len([w for w in rec if "no reward" in str(w.message)]) == 1
    if name == "grpo":  # what the warning describes: t1 scored 0 against 1, 1; group b all zeros
        s = np.array([1.0, 0.0, 1.0])
        want = (s - s.mean()) / (s.std(ddof=1) + 1e-6)
        np.testing.assert_allclose(res.advantages.numpy()[:3, 0], want, rtol=1e-6)
        assert (res.advantages.numpy()[3:5] == 0).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        A.compute(b, name)  # once per process
        A.compute(_rows([1.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b"]), name)  # every row rewarded: silent
        A.compute(b, "reinforce_pp")  # not a group estimator: silent


def test_warnings_point_at_the_first_line_outside_the_package_at_any_depth():
    """The same warning raised two frames deep (A.grpo) and four or more (the registry's compute on
    a batch): both point at this file, with no hand-counted stacklevel."""
    from mpo_viz.data.trajectory import TrajectoryBatch

    R, M = _batch()
    with pytest.warns(UserWarning, match="groups hold a single trajectory") as rec:
        A.grpo(R, M, ["a", "z", "a"])
    assert [w.filename for w in rec] == [__file__]
    checks._WARNED.clear()
    batch = TrajectoryBatch.from_rows(
        [
            {
                "traj_id": f"t{i}",
                "group_id": g,
                "prompt_ids": [1],
                "response_ids": [5, 6],
                "loss_mask": [1, 1],
                "reward": float(i),
            }
            for i, g in enumerate("aza")
        ]
    )
    with pytest.warns(UserWarning, match="groups hold a single trajectory") as rec:
        A.compute(batch, "grpo")
    assert [w.filename for w in rec] == [__file__]
