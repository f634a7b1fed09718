"""``mpo-viz train --model-dir`` and ``Trainer`` with a plain Hugging Face causal-LM folder (the policy;
the critic built as the config says), the error for a folder that is neither layout, and the one-line
error for a device this torch lacks."""

import json

import pytest
import torch

import mpo_viz.models as M
from mpo_viz.cli import main
from mpo_viz.envs.registry import make_env
from mpo_viz.train import Trainer
from tests.models.model_helpers import make_instruct_folder
from tests.train.train_helpers import TINY, tiny


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A plain folder (config.json, safetensors, byte-level tokenizer with a ChatML template) for search."""
    return make_instruct_folder(tmp_path_factory.mktemp("plain") / "hf", make_env("search"))


def test_trainer_takes_a_plain_folder_and_builds_the_critic(plain, tmp_path):
    ref = M.load_policy(plain)
    tr = Trainer(tiny(model_dir=str(plain), iterations=1), tmp_path / "run", quiet=True)
    assert isinstance(tr.policy.layout, M.TemplateLayout) and tr.policy.num_parameters() == ref.num_parameters()
    # critic_init defaults to "policy": a copy of the policy's trunk with its own head
    assert tr.critic is not None and not tr.critic.shared
    trunk = dict(tr.critic.trunk.named_parameters())
    for name, p in tr.policy.model.base_model.named_parameters():
        assert torch.equal(p, trunk[name]) and p.data_ptr() != trunk[name].data_ptr()
    out = tr.run_all(log=lambda _: None)
    assert len(out) == 1 and out[0]["iteration"] == 1
    shared = Trainer(tiny(model_dir=str(plain), iterations=1, critic_init="shared"), tmp_path / "run2", quiet=True)
    assert shared.critic.shared and shared.critic.trunk is shared.policy.model.base_model
    assert (
        Trainer(tiny(model_dir=str(plain), estimator="grpo", group_size=2), tmp_path / "run3", quiet=True).critic
        is None
    )


def test_train_cli_with_a_plain_folder(plain, tmp_path, capsys):
    d = {k: v for k, v in TINY.items() if k not in ("env", "iterations", "episodes")}
    (tmp_path / "c.json").write_text(json.dumps({**d, "critic_warmup_steps": 0}))
    rc = main(
        [
            "train",
            "--env",
            "search",
            "--model-dir",
            str(plain),
            "--iterations",
            "1",
            "--episodes",
            "4",
            "--run-dir",
            str(tmp_path / "run"),
            "--config",
            str(tmp_path / "c.json"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "done: 1 iterations" in out


def test_a_folder_that_is_neither_layout(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "weights.bin").write_bytes(b"")
    with pytest.raises(
        ValueError,
        match=r"m: expected a model folder written by mpo_viz \(policy/: .*critic/: optional.*\), "
        r"or a plain Hugging Face causal-LM folder \(config.json with a \*ForCausalLM "
        r"architecture, weights .* and a tokenizer.*\); found neither \(contents: "
        r"\['weights.bin'\]\)",
    ):
        M.load(tmp_path / "m")
    rc = main(
        [
            "train",
            "--env",
            "search",
            "--model-dir",
            str(tmp_path / "m"),
            "--iterations",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "or a plain Hugging Face causal-LM folder" in err


@pytest.mark.skipif(torch.version.cuda is not None, reason="a CUDA build of torch has the backend")
def test_device_without_the_backend_is_one_line(tmp_path, capsys):
    rc = main(["train", "--env", "search", "--device", "cuda", "--iterations", "1", "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("mpo-viz train: error: --device: expected a device this torch has, found 'cuda' but torch ")
    assert (
        "is a CPU-only build; install a CUDA build of torch: pip install --force-reinstall torch --index-url "
        "https://download.pytorch.org/whl/cu126" in err
    )
    assert not (tmp_path / "r").exists()
    rc = main(
        [
            "generate",
            "--env",
            "search",
            "--policy",
            "model",
            "--device",
            "cuda",
            "--episodes",
            "2",
            "--group-size",
            "1",
            "--out",
            str(tmp_path / "g.parquet"),
        ]
    )
    assert rc == 1 and "--device: expected a device this torch has" in capsys.readouterr().err
    if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        with pytest.raises(
            ValueError,
            match=r"^device: expected a device this torch has, found 'mps' but the MPS "
            r"backend is not available \(it needs macOS on Apple silicon\)",
        ):
            M.resolve_device("mps")
    with pytest.raises(ValueError, match=r"^device: expected 'cpu', 'cuda', 'cuda:N' or 'mps', found 'tpu'"):
        M.resolve_device("tpu")
