"""Checkpoints and run folders: atomic writes, latest, keep-K, exact RNG and optimizer round trips,
metrics truncation on resume, trajectory disk cap; and checkpoints that survive damage: a truncated or
unreadable newest checkpoint is skipped for the previous one with a warning naming the file, none
usable is a one-line error, ``--resume`` on a missing folder says so."""

import json
import random

import numpy as np
import pytest
import torch

from mpo_viz.cli import main
from mpo_viz.data.runfolder import RunFolder, read_metrics
from mpo_viz.train import Trainer
from mpo_viz.train.checkpoint import (
    CheckpointError,
    CheckpointWarning,
    capture_rng,
    checkpoint_candidates,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from tests.train.train_helpers import tiny


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
    p = save_checkpoint(
        tmp_path / "ck", 2, modules={"policy": m}, optimizers={"policy": opt}, rng=rng, state={"seed_cursor": 5}, keep=3
    )
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
        save_checkpoint(
            tmp_path, it, modules={"policy": m}, optimizers={"policy": opt}, rng=capture_rng(), state={"k": it}, keep=2
        )
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["iter=000004", "iter=000005", "latest"]
    save_checkpoint(
        tmp_path, 5, modules={"policy": m}, optimizers={"policy": opt}, rng=capture_rng(), state={"k": "again"}, keep=2
    )
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


# ---------------------------------------------------------------------------------------------
# damaged checkpoints: the fallback of restore_usable


def _truncate(f, keep: float = 0.5) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: int(len(data) * keep)])


@pytest.fixture()
def run2(tmp_path):
    """A tiny run of two iterations (checkpoints 0, 1, 2 kept), and the weights it had at iteration 1."""
    cfg = tiny(estimator="grpo", loss="token_ppo", group_size=2, iterations=2, eval_interval=0, keep_checkpoints=3)
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    list(tr.iterate(1))
    at1 = {k: v.clone() for k, v in tr.policy.model.state_dict().items()}
    list(tr.iterate(1))
    return tmp_path / "run", at1


def test_truncated_newest_weights_fall_back_to_the_previous_checkpoint(run2):
    run, at1 = run2
    bad = run / "checkpoints" / "iter=000002" / "policy.safetensors"
    _truncate(bad)
    with pytest.warns(
        CheckpointWarning,
        match=r"iter=000002/policy.safetensors: unreadable .*resumed from "
        r"iter=000001 instead",
    ):
        tr = Trainer.resume(run, quiet=True)
    assert tr.iteration == 1
    assert all(v.equal(at1[k]) for k, v in tr.policy.model.state_dict().items())
    # the metrics line and trajectories of iteration 2 belong to the skipped checkpoint: cut
    its = [json.loads(x)["iteration"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert its == [1]
    assert sorted(f.stem for f in (run / "trajectories").iterdir()) == ["iter=000001"]
    list(tr.iterate())  # and it continues, rewriting checkpoint 2
    assert tr.iteration == 2 and (run / "checkpoints" / "latest").read_text().strip() == "iter=000002"
    assert Trainer.resume(run, quiet=True).iteration == 2


@pytest.mark.parametrize("damage", ["optimizers.pt", "rng.pt", "state.json", "latest-missing"])
def test_other_damage_falls_back_too(run2, damage):
    run, _ = run2
    ck = run / "checkpoints"
    if damage == "latest-missing":  # `latest` names a folder that is gone: the newest folder left counts
        import shutil

        shutil.rmtree(ck / "iter=000002")
        assert checkpoint_candidates(ck) == [ck / "iter=000001", ck / "iter=000000"]
        assert Trainer.resume(run, quiet=True).iteration == 1
        return
    _truncate(ck / "iter=000002" / damage, 0.3)
    with pytest.warns(CheckpointWarning, match=f"iter=000002/{damage}: unreadable"):
        assert Trainer.resume(run, quiet=True).iteration == 1


def test_no_usable_checkpoint_is_one_line_and_the_shell_says_so(run2, capsys):
    run, _ = run2
    for d in (run / "checkpoints").glob("iter=*"):
        _truncate(d / "policy.safetensors", 0.0)
    with pytest.raises(CheckpointError, match=r"no usable checkpoint \(3 found; the newest: .*iter=000002"):
        Trainer.resume(run, quiet=True)
    rc = main(["train", "--resume", str(run)])
    err = capsys.readouterr().err
    assert rc == 1 and "no usable checkpoint" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_resume_of_a_missing_folder_says_no_such_folder(tmp_path, capsys):
    rc = main(["train", "--resume", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert rc == 1 and f"no such folder '{tmp_path / 'nope'}'" in err, err


def test_the_shell_prints_the_skip_as_one_line(run2, capsys):
    run, _ = run2
    _truncate(run / "checkpoints" / "iter=000002" / "policy.safetensors")
    rc = main(["train", "--resume", str(run), "--iterations", "2"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    line = next(x for x in cap.err.splitlines() if "damaged checkpoint" in x)
    assert line.startswith("mpo-viz train: warning: damaged checkpoint skipped:") and "policy.safetensors" in line
    assert "resuming" in cap.out and "at iteration 1 of 2" in cap.out
