"""experiments/headroom.py (v4 E2', secondary): turn GAE's credit on half the Monte-Carlo values
against the other half's turn truth, on the archived E1 snapshots."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import mpo_viz as mv
from experiments import headroom


@pytest.fixture(scope="module")
def start():
    return mv.load(headroom.SNAPSHOTS / "start" / "truth.parquet")


def test_at_turn_lam_0_the_credit_is_the_other_halfs_truth_formula(start):
    # λ_T = 0: A^T_k = R_k + V_a(s_{k+1}) − V_a(s_k), the truth formula on half a, so its correlation with
    # half b's truth is the split-half reliability exactly, and its disattenuated value √ρ_half
    va = headroom.per_turn(start, "mc_value_a")
    np.testing.assert_allclose(headroom.turn_credit(start, va, 0.0), headroom.truth_of(start, va), atol=1e-9)
    (row,) = [r for r in headroom.snapshot_rows("start", start) if r["turn_lam"] == 0.0]
    assert row["corr"] == pytest.approx(row["truth_half_reliability"], abs=1e-9)
    assert row["corr_dis"] == pytest.approx(np.sqrt(row["truth_half_reliability"]), abs=1e-9)


def test_turn_gae_by_hand_on_one_trajectory(start):
    # A^T_k = Σ_l λ^l δ_{k+l}, δ_k = R_k + V_{k+1} − V_k (V = 0 after the last turn), on the first row
    one = start[:1]
    v = headroom.per_turn(one, "mc_value_a")
    delta = headroom.truth_of(one, v)
    lam = 0.9
    want = [sum(lam**j * delta[k + j] for j in range(len(v) - k)) for k in range(len(v))]
    np.testing.assert_allclose(headroom.turn_credit(one, v, lam), want, atol=1e-9)


def test_the_archived_table_is_what_the_archive_gives(tmp_path):
    assert headroom.main(["--out", str(tmp_path / "a.csv")]) == 0
    new, old = pd.read_csv(tmp_path / "a.csv"), pd.read_csv(headroom.OUT)
    pd.testing.assert_frame_equal(new, old, atol=1e-5)
    dis = new[new.turn_lam == 0.9].corr_dis
    assert dis.between(0.55, 0.65).all()  # E2's λ_T = 0.9 arm: far from near-true (λ_T = 0 reaches ~0.8)
