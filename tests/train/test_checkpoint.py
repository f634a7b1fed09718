"""Checkpoints and run folders: atomic writes, latest, keep-K, exact RNG and optimizer round trips,
metrics truncation on resume, trajectory disk cap."""

import json
import random

import numpy as np
import pytest
import torch

from mpo_viz.data.runfolder import RunFolder, read_metrics
from mpo_viz.train.checkpoint import (
    capture_rng,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)


def _model_and_opt(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for _ in range(3):
        m(torch.randn(5, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return m, opt


def test_checkpoint_round_trip_is_exact(tmp_path):
    m, opt = _model_and_opt()
    g = torch.Generator().manual_seed(7)
    torch.randn(3, generator=g)
    random.random()
    np.random.rand()
    rng = capture_rng({"shuffle": g})
    expect = (torch.randn(4), random.random(), np.random.rand(), torch.randn(2, generator=g))
    p = save_checkpoint(tmp_path / "ck", 2, modules={"policy": m}, optimizers={"policy": opt}, rng=rng,
                        state={"seed_cursor": 5}, keep=3)
    assert p.name == "iter=000002" and latest_checkpoint(tmp_path / "ck") == p
    ck = load_checkpoint(p)
    assert ck.state["iteration"] == 2 and ck.state["seed_cursor"] == 5
    m2, opt2 = _model_and_opt(seed=1)
    ck.load_weights("policy", m2)
    opt2.load_state_dict(ck.optimizers["policy"])
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    # one more identical step on both gives identical weights (the AdamW moments came back exactly)
    x = torch.randn(5, 4)
    for mm, oo in ((m, opt), (m2, opt2)):
        mm(x).pow(2).mean().backward()
        oo.step()
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    g2 = torch.Generator()
    restore_rng(ck.rng, {"shuffle": g2})
    got = (torch.randn(4), random.random(), np.random.rand(), torch.randn(2, generator=g2))
    assert torch.equal(got[0], expect[0]) and got[1] == expect[1] and got[2] == expect[2]
    assert torch.equal(got[3], expect[3])


def test_optimizer_state_is_read_without_unpickling(tmp_path, monkeypatch):
    m, opt = _model_and_opt()
    p = save_checkpoint(tmp_path, 1, modules={"policy": m}, optimizers={"policy": opt}, rng=capture_rng(), state={})
    calls = []
    real = torch.load

    def spy(*a, **k):
        calls.append(k.get("weights_only"))
        return real(*a, **k)

    monkeypatch.setattr(torch, "load", spy)
    load_checkpoint(p)
    assert calls and all(c is True for c in calls)


def test_keep_last_k_and_rewrite_in_place(tmp_path):
    m, opt = _model_and_opt()
    for it in range(6):
        save_checkpoint(tmp_path, it, modules={"policy": m}, optimizers={"policy": opt}, rng=capture_rng(),
                        state={"k": it}, keep=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["iter=000004", "iter=000005", "latest"]
    save_checkpoint(tmp_path, 5, modules={"policy": m}, optimizers={"policy": opt}, rng=capture_rng(),
                    state={"k": "again"}, keep=2)
    assert json.loads((tmp_path / "iter=000005" / "state.json").read_text())["k"] == "again"
    assert (tmp_path / "latest").read_text().strip() == "iter=000005"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_missing_files_are_named(tmp_path):
    m, opt = _model_and_opt()
    p = save_checkpoint(tmp_path, 1, modules={"policy": m}, optimizers={"policy": opt}, rng=capture_rng(), state={})
    (p / "rng.pt").unlink()
    with pytest.raises(ValueError, match="rng.pt"):
        load_checkpoint(p)
    (tmp_path / "latest").write_text("iter=000009\n")
    with pytest.raises(ValueError, match="iter=000009"):
        latest_checkpoint(tmp_path)


def test_metrics_append_and_truncate(tmp_path):
    run = RunFolder(tmp_path)
    run.create()
    for it in range(5):
        run.append_metrics({"iteration": it, "x": float("nan") if it == 2 else it * 1.5, "n": np.int64(it)})
    with open(run.metrics_path, "a") as fh:
        fh.write('{"iteration": 5, "x"')  # a writer caught mid-line
    recs = read_metrics(run.metrics_path).records
    assert [r["iteration"] for r in recs] == [0, 1, 2, 3, 4]
    assert recs[2]["x"] is None and recs[3]["n"] == 3
    assert run.truncate_metrics(2) == 3  # lines 3, 4 and the partial one
    assert [r["iteration"] for r in read_metrics(run.metrics_path).records] == [0, 1, 2]
    assert run.metrics_path.read_bytes().endswith(b"\n")


def test_trajectory_disk_cap_drops_the_oldest(tmp_path):
    from mpo_viz.data import synthetic

    run = RunFolder(tmp_path)
    b = synthetic.make_batch(16, seed=0)
    p = run.write_trajectories(b, 1, max_mb=1000)
    size = p.stat().st_size / 2**20
    for it in range(2, 6):
        run.write_trajectories(b, it, max_mb=size * 2.5)
    assert sorted(f.name for f in run.trajectories.iterdir()) == ["iter=000004.parquet", "iter=000005.parquet"]
    run.remove_trajectories_after(4)
    assert sorted(f.name for f in run.trajectories.iterdir()) == ["iter=000004.parquet"]
