"""trajectories/trained/: the shipped trajectories of real MPO training runs load as v1, carry what they
promise (learned critic values, real log-probs, the advantages trained on, oracle columns), name the
config they came from, and stay small."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz.train import Config

TRAINED = Path(__file__).resolve().parents[2] / "trajectories" / "trained"
ENVS = ("automation", "search", "tooluse")


def test_total_size_at_most_3_mb():
    total = sum(p.stat().st_size for p in TRAINED.rglob("*") if p.is_file())
    assert total <= 3 * 2**20, total


@pytest.mark.parametrize("env", ENVS)
def test_early_and_late_sets(env):
    early, late = mv.load(TRAINED / f"{env}_early.parquet"), mv.load(TRAINED / f"{env}_late.parquet")
    for b in (early, late):
        assert len(b) > 0
        for f in ("values", "old_logprobs", "advantages", "returns", "oracle_values", "oracle_token_adv"):
            assert b.has(f), f
        m = b.mask.bool()
        assert np.isfinite(b.values[m].numpy()).all()
        assert (b.padded("old_logprobs")[m] < 0).all()  # real log-probs of sampled tokens
        assert b.meta["config_hash"]
    assert early.meta["iteration"] < late.meta["iteration"]
    assert early.meta["config_hash"] == late.meta["config_hash"]
    # the learned critic is not the oracle
    m = late.mask.bool()
    assert not np.allclose(late.values[m].numpy(), late.padded("oracle_values")[m].numpy())


@pytest.mark.parametrize("name", ["run", "run_search", "run_tooluse"])
def test_run_folder_is_a_trainer_run(name):
    run = TRAINED / name
    cfg = Config.load(run / "config.json")
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in recs if r.get("phase") == "rl"]
    assert [r["iteration"] for r in rl] == list(range(1, cfg.iterations + 1))
    files = sorted((run / "trajectories").glob("iter=*.parquet"))
    assert len(files) == 3
    for f in files:
        assert mv.load(f).meta["config_hash"] == cfg.hash()
    assert mv.load(TRAINED / f"{cfg.env}_late.parquet").meta["config_hash"] == cfg.hash()
