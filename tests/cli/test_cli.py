"""The `mpo-viz` command: info and validate on good and bad files (in-process and as a subprocess)."""

import json
import subprocess
import sys

import pytest

import mpo_viz as mv
from mpo_viz.cli import main


def test_info_and_validate_good(tmp_path, capsys):
    b = mv.synthetic.make_batch(8, seed=0, turn_len=(2, 6), obs_len=(1, 4))
    path = mv.save(b, tmp_path / "x.parquet")
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "trajectories     8  in 2 groups" in out and "values" in out
    assert main(["info", "--json", str(path)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["trajectories"] == 8 and s["response_tokens"] == b.num_tokens
    assert main(["validate", str(path)]) == 0
    assert "OK: 8 valid trajectories" in capsys.readouterr().out


def test_validate_lists_every_problem(tmp_path, capsys):
    good = dict(traj_id="a", group_id="g", prompt_ids=[], response_ids=[1, 2], loss_mask=[1, 1], reward=0.0)
    lines = [json.dumps(good), "{oops", json.dumps(good | {"traj_id": "b", "loss_mask": [1, 5]}), json.dumps(good)]
    (tmp_path / "x.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["validate", str(tmp_path / "x.jsonl")]) == 1
    out = capsys.readouterr().out
    assert "line 2: field '<line>'" in out
    assert "line 3, traj_id='b': field 'loss_mask': expected 0 or 1, found 5 at position 1" in out
    assert "line 4, traj_id='a': field 'traj_id': expected a unique traj_id" in out
    assert "INVALID: 3 problem(s) in 3 row(s); 1 valid row(s)" in out


def test_bad_input_no_traceback(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "mpo_viz.cli", "info", str(tmp_path / "nope.jsonl")], capture_output=True, text=True
    )
    assert r.returncode == 1
    assert "no such file" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "mpo_viz.cli", "--debug", "info", str(tmp_path / "nope.jsonl")],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_output_into_a_closed_pipe_is_quiet(tmp_path):
    # `mpo-viz validate big | head`: the reader exits early; no "Broken pipe" error or traceback
    rows = [
        dict(traj_id=f"t{i}", group_id="g", prompt_ids=[], response_ids=[1, 2], loss_mask=[1, 5], reward=0.0)
        for i in range(3000)
    ]
    (tmp_path / "x.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    p = subprocess.Popen(
        [sys.executable, "-m", "mpo_viz.cli", "validate", "--max-problems", "0", str(tmp_path / "x.jsonl")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141
    assert "Broken pipe" not in err and "Traceback" not in err and "Exception ignored" not in err


def test_info_with_rejected_rows_exits_1_in_both_formats(tmp_path, capsys):
    good = dict(traj_id="a", group_id="g", prompt_ids=[7], response_ids=[1, 2, 3], loss_mask=[1, 0, 1], reward=0.0)
    (tmp_path / "x.jsonl").write_text(json.dumps(good) + "\n{oops\n")
    assert main(["info", str(tmp_path / "x.jsonl")]) == 1
    out = capsys.readouterr().out
    assert "response tokens  3  (action 2)\n  prompt tokens    1\n" in out and "REJECTED" in out
    assert main(["info", "--json", str(tmp_path / "x.jsonl")]) == 1
    assert json.loads(capsys.readouterr().out)["rejected_rows"] == 1


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"mpo-viz {mv.__version__}"


def test_parser_does_not_import_transformers():
    # transformers costs about a second; only `generate` (the tokenizer) needs it
    code = (
        "import sys; from mpo_viz.cli import build_parser; build_parser(); "
        "assert 'transformers' not in sys.modules, 'transformers imported'; "
        "from mpo_viz.envs import build_tokenizer, ChatLayout; "
        "assert 'transformers' in sys.modules"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_usage_errors_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["advantages", str(tmp_path / "x.jsonl"), "--within", "bogus", "-o", str(tmp_path / "o.parquet")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "usage:" not in err
    assert err.startswith("mpo-viz advantages: error: argument --within: invalid choice: 'bogus'")
    assert err.rstrip().endswith("(see mpo-viz advantages --help)")
    assert main([]) == 2 and "validate" in capsys.readouterr().out  # bare `mpo-viz` lists the commands


def test_validate_of_a_file_without_trajectories_says_so_and_exits_1(tmp_path, capsys):
    path = mv.save(mv.TrajectoryBatch.from_rows([]), tmp_path / "empty.parquet")
    assert main(["validate", str(path)]) == 1
    assert (
        capsys.readouterr().out.strip() == f"EMPTY: {path} holds no trajectories (0 rows); nothing to check or analyse"
    )
