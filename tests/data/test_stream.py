"""info and validate stream: the counts, statistics and problems (with their line and row numbers) of a
file read a few rows at a time are those of the whole file loaded at once, across the files of a folder."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz.cli import main
from mpo_viz.data.io import file_facts, pieces, summarize
from mpo_viz.data.summary import Summarizer, row_sums
from tests.data.messy import messy_rows, write_jsonl_folder, write_parquet_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stream")
    return {
        "jsonl": write_jsonl_folder(messy_rows(300, bad=True), tmp / "jsonl", 3, garbage=True),
        "parquet": write_parquet_folder(messy_rows(300, seed=1), tmp / "pq", 4),
    }


def whole_summary(path) -> dict:
    b = mv.load(path, errors="collect")
    return {**b.summary(), "rejected_rows": len(b.rejected)}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_summarize_equals_the_summary_of_the_whole_load(folders, fmt):
    s = summarize(folders[fmt])
    assert s == whole_summary(folders[fmt])  # floats included: to the last bit
    assert s["trajectories"] > 250 and s["groups"] >= 60
    assert (s["rejected_rows"] > 0) == (fmt == "jsonl")


def test_the_summary_of_any_cut_is_the_whole_one():
    b = mv.TrajectoryBatch.from_rows(messy_rows(101, seed=2), {"gamma": 0.9})
    whole = {**b.summary(), "rejected_rows": 0}
    for cuts in ([1], [50, 51], [2, 3, 5, 8, 13, 21, 34, 55, 89], list(range(1, 101))):
        s = Summarizer(b.meta)
        for a, z in zip([0, *cuts], [*cuts, len(b)]):
            s.add(b[a:z])
        assert s.result() == whole, cuts


def test_row_sums_of_empty_rows_anywhere():
    flat = np.array([0.1, 0.2, 0.3, 1e16, 1.0, -1e16])
    off = np.array([0, 0, 3, 3, 6, 6])  # empty rows first, in the middle and last
    alone = [row_sums(flat[a:z], np.array([0, z - a]))[0] for a, z in ((0, 3), (3, 6))]
    assert row_sums(flat, off).tolist() == [0.0, alone[0], 0.0, alone[1], 0.0]
    assert abs(alone[0] - 0.6) < 1e-15
    assert row_sums(np.array([1, 0, 1], dtype=np.int8), np.array([0, 2, 3]), np.int64).tolist() == [1, 1]
    assert row_sums(np.zeros(0), np.zeros(3, dtype=np.int64)).tolist() == [0.0, 0.0]
    # a row's sum does not depend on the rows around it nor on where it starts in memory
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 300, 30)
    off = np.concatenate([[0], np.cumsum(lengths)])
    flat = rng.normal(size=off[-1]) * 10.0 ** rng.integers(-3, 8, off[-1])
    whole = row_sums(flat, off)
    for i in range(30):
        moved = np.concatenate([rng.normal(size=i % 7 + 1), flat[off[i] : off[i + 1]]])
        assert row_sums(moved, np.array([0, i % 7 + 1, len(moved)]))[1] == whole[i]


def test_info_streams_with_the_numbers_of_a_load(folders, capsys):
    path = folders["jsonl"]
    assert main(["info", "--json", str(path)]) == 1  # rejected rows: exit 1
    doc = json.loads(capsys.readouterr().out)
    files = doc.pop("files")
    assert doc == json.loads(json.dumps(whole_summary(path), default=str))
    assert files["files"] == 3 and files["format"] == "jsonl" and "rows" not in files


def test_info_reads_parquet_metadata_without_decoding(folders, capsys):
    path = folders["parquet"]
    facts = file_facts(path)
    assert facts["rows"] == 300 and facts["files"] == 4 and facts["row_groups"] >= 4
    assert set(facts["columns"]) >= {"response_ids", "loss_mask", "values"}
    assert main(["info", "--metadata", str(path)]) == 0
    out = capsys.readouterr().out
    assert "4 parquet files" in out and "300 rows in" in out and "trajectories" not in out
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "300 rows in" in out and "trajectories     300  in 75 groups" in out


def test_validate_streams_the_problems_of_a_load(folders, capsys):
    path = folders["jsonl"]
    b = mv.load(path, errors="collect")
    problems = b.rejected
    assert len(problems) > 10
    rows = len({(p.file, p.line, p.row) for p in problems})
    assert main(["validate", "--max-problems", "0", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[:-1] == [str(p) for p in problems]  # the same problems, lines and order as a whole load
    assert out[-1] == f"INVALID: {len(problems)} problem(s) in {rows} row(s); {len(b)} valid row(s)"
    assert main(["validate", "--max-problems", "4", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == [str(p) for p in problems[:4]] and out[4] == f"... and {len(problems) - 4} more"


def test_problems_do_not_depend_on_how_the_reader_cuts(folders):
    # a duplicate traj_id is named the same way whether its first occurrence is in the same piece or an earlier one
    path = folders["jsonl"]
    by_size = {n: [q for p in pieces(path, "collect", rows_per_chunk=n) for q in p.rejected] for n in (1, 7, 4096)}
    assert by_size[1] == by_size[7] == by_size[4096]
    dup = [p for p in by_size[1] if p.field == "traj_id"]
    assert dup and all("(first in " in p.found for p in dup)  # files apart: the file is named
    one = write_jsonl_folder([messy_rows(4)[i] for i in (0, 1, 0)], folders["jsonl"].parent / "dup", 1)
    for n in (1, 4096):
        (p,) = [q for b in pieces(one, "collect", rows_per_chunk=n) for q in b.rejected]
        assert p.found == "a duplicate of 'r0000' (first at line 1)"


def test_the_histograms_by_hand():
    from mpo_viz.data.summary import summarize_rows

    numbers = {
        "length": np.array([0, 1, 3, 4, 7, 8, 300]),
        "action": np.array([0, 1, 1, 2, 3, 4, 10]),
        "turns": np.array([1, 1, 2, 2, 2, 3, 9]),
        "reward": np.array([0.0, 0.5, 1.0, 1.0, np.nan, 0.25, 0.05]),
        "score": np.zeros(7),
        "prompt": np.ones(7, dtype=np.int64),
        "group_id": np.array(list("aabbccd"), dtype=object),
    }
    h = summarize_rows(numbers, [], {})["histograms"]
    assert h["turns"] == {"values": [1, 2, 3, 9], "counts": [2, 3, 1, 1]}
    # doubling bins [0,1) [1,2) [2,4) [4,8) [8,16) ... [256,512): 0 | 1 | 3 | 4 7 | 8 | 300
    assert h["response_length"]["edges"] == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert h["response_length"]["counts"] == [1, 1, 1, 2, 1, 0, 0, 0, 0, 1]
    # ten bins over [0, 1] of the six finite rewards (the NaN is reward_missing): 0 | .05 | .25 | .5 | 1 1
    assert h["reward"]["counts"] == [2, 0, 1, 0, 0, 1, 0, 0, 0, 2]
    assert h["reward"]["edges"][0] == 0.0 and h["reward"]["edges"][-1] == 1.0
    one = summarize_rows({**numbers, "reward": np.full(7, 2.0)}, [], {})["histograms"]["reward"]
    assert one == {"edges": [2.0, 2.0], "counts": [7]}
    # rewards that differ by float rounding only (0.3 and 0.1 + 0.2): one bin, not numpy's "too many bins"
    close = summarize_rows({**numbers, "reward": np.array([0.3, 0.1 + 0.2] * 3 + [0.3])}, [], {})["histograms"]
    assert close["reward"]["counts"] == [7]
    none = summarize_rows({k: v[:0] for k, v in numbers.items()}, [], {})["histograms"]
    assert none == {
        "turns": {"values": [], "counts": []},
        "response_length": {"edges": [], "counts": []},
        "reward": {"edges": [], "counts": []},
        "score": {"edges": [], "counts": []},
    }
    assert h["score"] == {"edges": [0.0, 0.0], "counts": [7]}  # the scores, all 0: one bin


def test_info_prints_the_histograms(tmp_path, capsys):
    b = mv.TrajectoryBatch.from_rows(messy_rows(40, seed=3), {})
    mv.save(b, tmp_path / "b.parquet")
    assert main(["info", str(tmp_path / "b.parquet")]) == 0
    out = capsys.readouterr().out
    turns = b.summary()["histograms"]["turns"]
    expected = "  ".join(f"{v}:{c}" for v, c in zip(turns["values"], turns["counts"]))
    assert f"turns hist       {expected}" in out
    assert "length hist      [" in out and "reward hist      |" in out and "score hist       |" in out
