"""A trained checkpoint wherever a model goes: RUN/checkpoints/iter=N and RUN [--iteration N] are accepted
by truth --model, generate --model and --model-dir, and mpo-viz export writes a model folder that gives
the same log-probs."""

import numpy as np
import pytest
import torch

import mpo_viz as mv
from mpo_viz import models
from mpo_viz.checks import OptionError
from mpo_viz.cli import main
from mpo_viz.train import Trainer
from mpo_viz.train.export import export, load_model, load_trained, locate
from tests.train.train_helpers import tiny

pytestmark = pytest.mark.usefixtures("one_thread")

GEN = [
    "generate",
    "--env",
    "search",
    "--difficulty",
    "2",
    "--episodes",
    "2",
    "--group-size",
    "1",
    "--max-turn-tokens",
    "8",
    "--max-total-tokens",
    "160",
    "--seed",
    "5",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of one RL iteration with a learned critic (its checkpoints iter=0 and iter=1)."""
    run = tmp_path_factory.mktemp("export") / "run"
    tr = Trainer(tiny(iterations=1, eval_interval=0, critic_warmup_steps=0), run, quiet=True)
    tr.run_all()
    return tr, run


def _logits(policy, ids=(3, 7, 9, 12, 4, 5)):
    with torch.no_grad():
        return policy.model(torch.tensor([list(ids)])).logits


def _values(critic, ids=(3, 7, 9, 12, 4, 5)):
    with torch.no_grad():
        return critic(torch.tensor([list(ids)]), torch.ones(1, len(ids), dtype=torch.long))


def test_a_checkpoint_and_a_run_folder_load_the_trained_weights(trained):
    tr, run = trained
    assert locate(run) == run / "checkpoints" / "iter=000001"
    a, ca = load_model(run)
    b, cb = load_model(run / "checkpoints" / "iter=000001")
    assert torch.equal(_logits(a), _logits(tr.policy)) and torch.equal(_logits(b), _logits(tr.policy))
    assert torch.equal(_values(ca), _values(tr.critic)) and torch.equal(_values(cb), _values(tr.critic))
    start = load_trained(run, iteration=0)
    assert start.iteration == 0 and not torch.equal(_logits(start.policy), _logits(tr.policy))  # RL moved it
    with pytest.raises(OptionError, match=r"^iteration: expected an iteration whose checkpoint .* keeps \(0, 1; "):
        locate(run, 7)
    with pytest.raises(OptionError, match="expected a run folder with --iteration"):
        load_model(run / "trajectories", iteration=1)


def test_export_writes_a_model_folder_with_the_same_outputs(trained, tmp_path):
    tr, run = trained
    out = export(run, tmp_path / "m")
    assert sorted(p.name for p in out.iterdir()) == ["critic", "export.json", "policy"]
    policy, critic = models.load(out)
    assert torch.equal(_logits(policy), _logits(tr.policy)) and torch.equal(_values(critic), _values(tr.critic))
    with pytest.raises(OptionError, match="^out: expected a new \\(or empty\\) folder"):
        export(run, out)


def test_commands_take_a_checkpoint_or_a_run_folder_as_model(trained, tmp_path, capsys):
    tr, run = trained
    ck = run / "checkpoints" / "iter=000001"
    a, b, c = (tmp_path / f"{x}.parquet" for x in "abc")
    assert main([*GEN, "--model", str(run), "--out", str(a)]) == 0
    assert main([*GEN, "--model", str(ck), "--out", str(b)]) == 0
    assert main(["export", str(run), "--iteration", "1", "-o", str(tmp_path / "m")]) == 0
    assert main([*GEN, "--model", str(tmp_path / "m"), "--out", str(c)]) == 0
    ba, bb, bc = mv.load(a), mv.load(b), mv.load(c)
    for i in range(len(ba)):  # the same weights: the same episodes, log-probs and critic values
        ra, rb, rc = ba.row(i), bb.row(i), bc.row(i)
        assert ra["response_ids"] == rb["response_ids"] == rc["response_ids"]
        np.testing.assert_array_equal(ra["old_logprobs"], rb["old_logprobs"])
        np.testing.assert_array_equal(ra["old_logprobs"], rc["old_logprobs"])
        np.testing.assert_array_equal(ra["values"], rc["values"])
    capsys.readouterr()
    t1, t2 = tmp_path / "t1.parquet", tmp_path / "t2.parquet"
    assert main(["truth", str(a), "-o", str(t1), "--model", str(run), "-M", "2", "-q"]) == 0
    assert f"the policy {ck} (search, iteration 1)" in capsys.readouterr().out
    assert main(["truth", str(a), "-o", str(t2), "--model", str(ck), "-M", "2", "-q"]) == 0
    for x, y in zip(mv.load(t1).field("mc_value"), mv.load(t2).field("mc_value")):
        np.testing.assert_array_equal(x, y)
    capsys.readouterr()
    assert main(["truth", str(a), "-o", str(t2), "--model", str(run), "--iteration", "9", "-M", "2"]) == 1
    assert "--iteration: expected an iteration whose checkpoint" in capsys.readouterr().err
    assert main([*GEN, "--model", str(tmp_path), "--out", str(c)]) == 1
    err = capsys.readouterr().err
    assert f"--model: {tmp_path}: expected a model folder written by mpo_viz" in err
    assert "or a trained checkpoint (RUN/checkpoints/iter=N, or a run folder RUN with --iteration N)" in err


def test_a_new_run_starts_from_a_checkpoint(trained, tmp_path):
    tr, run = trained
    new = Trainer(tiny(iterations=0, model_dir=str(run), critic_warmup_steps=0), tmp_path / "next", quiet=True)
    assert torch.equal(_logits(new.policy), _logits(tr.policy))
