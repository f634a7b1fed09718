"""Checkpoints that survive damage: a truncated or unreadable newest checkpoint is skipped for the
previous one with a warning naming the file; none usable is a one-line error; ``--resume`` on a
missing folder says so."""

import json

import pytest

from mpo_viz.cli import main
from mpo_viz.train import Trainer
from mpo_viz.train.checkpoint import CheckpointError, CheckpointWarning, checkpoint_candidates
from tests.train.train_helpers import tiny


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
    with pytest.warns(CheckpointWarning, match=r"iter=000002/policy.safetensors: unreadable .*resumed from "
                                               r"iter=000001 instead"):
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
