"""The doctor chunk by chunk gives the findings of the whole input: same statuses, rows hit, example ids
and measured numbers, for a file split across chunks (a group cut at a chunk's edge, fields some chunks
lack) and across the files of a folder or a run folder; and the CLI prints the same table."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz.cli import main
from mpo_viz.doctor import Doctor, diagnose, examine, examine_stream
from tests.data.messy import messy_rows, write_jsonl_folder, write_parquet_folder, write_run_folder

CHUNKS = (1, 37, 300, 10**9)  # a row at a time; a group cut in two; several groups; the whole input


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("doctor_stream")
    return {
        "jsonl folder, refused rows": write_jsonl_folder(messy_rows(240, bad=True), tmp / "jsonl", 3, garbage=True),
        "parquet folder, shifted values": write_parquet_folder(messy_rows(200, seed=1, shift_every=1), tmp / "pq", 4),
        "returns in the first rows only": write_parquet_folder(
            messy_rows(160, seed=2, returns_until=40), tmp / "early", 2
        ),
        "run folder": write_run_folder(messy_rows(240, seed=3), tmp / "run", 4),
    }


@pytest.mark.parametrize(
    "name",
    ["jsonl folder, refused rows", "parquet folder, shifted values", "returns in the first rows only", "run folder"],
)
def test_streamed_findings_equal_the_whole_input(inputs, name):
    whole, batch = examine(inputs[name])
    assert len(batch) > 100
    assert sum(f.fired for f in whole) >= 3  # the set means something: several checks fire, with rows hit
    for max_tokens in CHUNKS:
        streamed, n = examine_stream(inputs[name], max_tokens=max_tokens)
        assert n == len(batch)
        assert streamed == whole, max_tokens


def test_the_sets_exercise_what_they_should(inputs):
    by = {name: {f.check: f for f in examine(p)[0]} for name, p in inputs.items()}
    assert by["jsonl folder, refused rows"]["reward_on_observation"].rows_hit > 5
    assert by["parquet folder, shifted values"]["values_shifted"].fired
    assert by["run folder"]["explained_variance_per_microbatch"].fired
    assert by["run folder"]["turn_collapse"].fired  # the step comes from each file's iteration
    early = by["returns in the first rows only"]
    assert early["return_dropped_before_observation"].detail.startswith("read logged returns")


def test_any_cut_of_a_batch_gives_the_whole_findings():
    b = mv.TrajectoryBatch.from_rows(messy_rows(120, seed=4, shift_every=2), {"gamma": 0.9})
    steps = np.arange(len(b)) % 5
    metrics = [{"step": s, "critic_explained_var": 0.5} for s in range(5)]
    whole = diagnose(b, steps=steps, metrics=metrics, shift_ratio=0.9)
    assert any(f.fired and f.rows_hit for f in whole)
    # cuts inside a group (groups of four rows), at a group's edge, one row alone, uneven pieces
    for cuts in ([1], [57], [58, 59], [60], [3, 7, 11, 50, 119], list(range(1, 120, 9))):
        doc = Doctor(metrics=metrics, shift_ratio=0.9)
        for a, z in zip([0, *cuts], [*cuts, len(b)]):
            doc.add(b[a:z], steps=steps[a:z])
        assert doc.findings() == whole, cuts
        assert doc.rows == len(b)


def test_a_chunk_of_refused_rows_only_and_an_input_without_valid_rows(tmp_path):
    bad = [
        dict(traj_id=f"x{i}", group_id="g", prompt_ids=[], response_ids=[1, 2], loss_mask=[1, 5], reward=0.0)
        for i in range(5)
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in bad) + "\n")
    whole, batch = examine(path)
    streamed, n = examine_stream(path, max_tokens=1)
    assert n == len(batch) == 0 and streamed == whole
    assert {f.status for f in whole if f.check != "reward_on_observation"} == {"skipped"}
    good = messy_rows(40, seed=5)
    path.write_text("\n".join(json.dumps(r) for r in bad + good + bad[:0]) + "\n")
    assert examine_stream(path, max_tokens=20)[0] == examine(path)[0]


def test_cli_table_does_not_depend_on_the_chunk_size(inputs, capsys):
    path = inputs["jsonl folder, refused rows"]
    outs = []
    for max_tokens in ("5", "100000"):
        main(["doctor", str(path), "--max-tokens", max_tokens])
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "valid row(s)" in outs[0]
    assert main(["doctor", "--json", str(inputs["run folder"]), "--max-tokens", "50"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"] == 240 and doc["findings"] == [f.to_dict() for f in examine(inputs["run folder"])[0]]
