"""The shipped trajectory sets under trajectories/: valid, small, and reproducible by their command."""

from pathlib import Path

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz.envs.generate import GenerateConfig, generate

ROOT = Path(__file__).resolve().parents[2] / "trajectories"
SETS = ["search", "tooluse", "automation"]


def test_shipped_sets_are_small():
    total = sum((ROOT / f"{n}.parquet").stat().st_size for n in SETS)
    assert total <= 5 * 2**20


@pytest.mark.parametrize("name", SETS)
def test_shipped_set_is_valid_and_reproducible(name):
    b = mv.load(ROOT / f"{name}.parquet")
    assert b.meta["values_source"] == "oracle"
    gen = dict(b.meta["generator"])
    assert gen["env"] == name and gen["group_size"] == 4 and 0.2 <= gen["noise"] <= 0.3
    assert 200 <= len(b) <= 1000
    gen["difficulty"] = tuple(gen["difficulty"])
    again = generate(GenerateConfig(**gen))
    assert again.traj_ids == b.traj_ids
    for i in (0, len(b) // 2, len(b) - 1):
        r, s = again.row(i), b.row(i)
        assert list(r["response_ids"]) == list(s["response_ids"])
        np.testing.assert_allclose(r["values"], s["values"], atol=1e-6)
        assert r["extra_json"] == s["extra_json"]
