"""`mpo-viz convert`: every sample, the same bytes twice, chunked = unchunked, the report, and errors
that name the flag."""

import json
import pickle

import pytest

import mpo_viz as mv
from mpo_viz.cli import main
from mpo_viz.data.trajectory import row_to_json
from tests.adapters.adapter_data import SAMPLES

TOK = str(SAMPLES / "tokenizer")
CASES = [
    ("verl", "verl_batch.pt", False, 4),
    ("areal", "areal_rollout.safetensors", False, 4),
    ("skyrl", "skyrl_generator_output.json", False, 4),
    ("steps", "verifiers_rollouts.jsonl", False, 4),
    ("steps", "rllm_episodes.jsonl", False, 10),
    ("steps", "agl_rollouts.jsonl", False, 4),
    ("openai", "openai_chat.jsonl", True, 4),
    ("trl", "trl", True, 4),
    ("art", "art/trajectories/train", True, 4),
]


def run(kind, src, out, tok, *extra):
    return main(
        ["convert", "--from", kind, str(SAMPLES / src), "-o", str(out), *(["--tokenizer", TOK] if tok else []), *extra]
    )


@pytest.mark.parametrize("kind,src,tok,n", CASES, ids=[c[1].split("/")[0] for c in CASES])
def test_every_sample_converts_twice_to_the_same_bytes(tmp_path, capsys, kind, src, tok, n):
    assert run(kind, src, tmp_path / "a.parquet", tok) == 0
    out = capsys.readouterr().out
    assert f"trajectories written  {n}" in out and f"wrote {n} trajectories to" in out
    assert run(kind, src, tmp_path / "b.parquet", tok) == 0
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    b = mv.load(tmp_path / "a.parquet")
    assert len(b) == n and b.meta["source_framework"] == kind


def test_chunks_folder_and_report_json(tmp_path, capsys):
    whole = tmp_path / "whole.parquet"
    assert run("steps", "rllm_episodes.jsonl", whole, False) == 0
    # chunks of 2 trajectories: as a folder of parts, and joined into one file
    assert run("steps", "rllm_episodes.jsonl", tmp_path / "parts", False, "--chunk-rows", "2") == 0
    assert (
        run(
            "steps",
            "rllm_episodes.jsonl",
            tmp_path / "joined.parquet",
            False,
            "--chunk-rows",
            "2",
            "--report-json",
            str(tmp_path / "r.json"),
        )
        == 0
    )
    parts = sorted(p.name for p in (tmp_path / "parts").iterdir())
    assert parts == [f"part-{i:05d}.parquet" for i in range(len(parts))] and len(parts) >= 3
    want = mv.load(whole)
    for other in (mv.load(tmp_path / "parts"), mv.load(tmp_path / "joined.parquet")):
        assert [row_to_json(r) for r in other.rows()] == [row_to_json(r) for r in want.rows()]  # NaN == NaN
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["trajectories"] == 10 and rep["rows_in"] == 4 and rep["merged_steps"] > 0 and rep["rejected"] == []
    assert "report in" in capsys.readouterr().out
    # converting again into the folder replaces its parts
    assert run("steps", "rllm_episodes.jsonl", tmp_path / "parts", False) == 0
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == ["part-00000.parquet"]


def test_errors_name_the_flag(tmp_path, capsys):
    assert run("openai", "openai_chat.jsonl", tmp_path / "o.parquet", False) == 1
    assert "error: --tokenizer: expected a local tokenizer folder" in capsys.readouterr().err
    assert run("verl", "verl_batch.pt", tmp_path / "o.parquet", True) == 1
    assert "error: --tokenizer: expected none (verl logs hold token ids already)" in capsys.readouterr().err
    assert run("verl", "verl_batch.pt", tmp_path / "o.jsonl", False) == 1
    assert "error: --out: expected a .parquet path or a folder" in capsys.readouterr().err
    assert run("steps", "verifiers_rollouts.jsonl", tmp_path / "o.parquet", False, "--trust") == 1
    assert "error: --trust: expected only with verl or skyrl" in capsys.readouterr().err
    assert main(["convert", "--from", "verl", str(tmp_path / "nope.pt"), "-o", str(tmp_path / "o.parquet")]) == 1
    assert "error: IN: expected a verl log file or folder, found no such path" in capsys.readouterr().err
    with open(tmp_path / "proto.pkl", "wb") as fh:
        pickle.dump({"responses": [[1]]}, fh)
    assert main(["convert", "--from", "skyrl", str(tmp_path / "proto.pkl"), "-o", str(tmp_path / "o.parquet")]) == 1
    assert "pass trust=True (--trust) only for a file you trust" in capsys.readouterr().err
    # a layout from another framework: the error names file, field and the expected layout
    assert (
        main(["convert", "--from", "skyrl", str(SAMPLES / "openai_chat.jsonl"), "-o", str(tmp_path / "o.parquet")]) == 1
    )
    err = capsys.readouterr().err
    assert "openai_chat.jsonl: field 'prompt_token_ids': expected skyrl layout: a GeneratorOutput dict" in err
    assert "found no 'prompt_token_ids'; keys: ['group_id', 'id', 'messages']" in err


def test_collect_lists_bad_rows_and_exits_1(tmp_path, capsys):
    lines = (SAMPLES / "openai_chat.jsonl").read_text().splitlines()
    (tmp_path / "c.jsonl").write_text("\n".join([lines[0], "{oops", lines[1]]) + "\n")
    assert (
        main(
            [
                "convert",
                "--from",
                "openai",
                str(tmp_path / "c.jsonl"),
                "-o",
                str(tmp_path / "o.parquet"),
                "--tokenizer",
                TOK,
            ]
        )
        == 1
    )
    assert "c.jsonl, line 2: field '<line>': expected one JSON object" in capsys.readouterr().err
    assert (
        main(
            [
                "convert",
                "--from",
                "openai",
                str(tmp_path / "c.jsonl"),
                "-o",
                str(tmp_path / "o.parquet"),
                "--tokenizer",
                TOK,
                "--errors",
                "collect",
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "rejected rows         1" in out and "line 2: field '<line>'" in out
    assert len(mv.load(tmp_path / "o.parquet")) == 2


def test_framework_names_and_a_text_file_given_as_verl(tmp_path, capsys):
    assert (
        main(["convert", "--from", "rllm", str(SAMPLES / "rllm_episodes.jsonl"), "-o", str(tmp_path / "r.parquet")])
        == 0
    )
    assert len(mv.load(tmp_path / "r.parquet")) == 10
    capsys.readouterr()
    assert (
        main(["convert", "--from", "verl", str(SAMPLES / "openai_chat.jsonl"), "-o", str(tmp_path / "o.parquet")]) == 1
    )
    assert (
        "openai_chat.jsonl: field '<file>': expected verl layout: a torch.save'd batch (zip archive) or a pickled "
        "DataProto, found a file starting with b'{\"id'"
    ) in capsys.readouterr().err


def test_binary_input_for_a_text_layout(tmp_path, capsys):
    assert main(["convert", "--from", "steps", str(SAMPLES / "verl_batch.pt"), "-o", str(tmp_path / "o.parquet")]) == 1
    assert "verl_batch.pt: field '<file>': expected steps layout: a UTF-8 JSONL file" in capsys.readouterr().err


@pytest.mark.parametrize("kind,src,tok,n", CASES, ids=[c[1].split("/")[0] for c in CASES])
def test_the_report_and_rows_do_not_depend_on_the_chunks(tmp_path, kind, src, tok, n):
    # one trajectory (or one token's worth) a chunk against everything at once: the same report, the same rows
    from mpo_viz.adapters import convert

    opts = {"tokenizer": TOK} if tok else {}
    whole = convert(kind, SAMPLES / src, tmp_path / "whole.parquet", **opts)
    for name, chunks in (("rows", {"chunk_rows": 1}), ("tokens", {"chunk_tokens": 1})):
        part = convert(kind, SAMPLES / src, tmp_path / f"{name}.parquet", **opts, **chunks)
        assert part.to_json() == whole.to_json(), name
        got, want = mv.load(tmp_path / f"{name}.parquet"), mv.load(tmp_path / "whole.parquet")
        assert [row_to_json(r) for r in got.rows()] == [row_to_json(r) for r in want.rows()]
