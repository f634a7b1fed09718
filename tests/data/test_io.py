"""load/save/scan: lossless JSONL <-> Parquet round trips, folders, metadata, bounded scans."""

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mpo_viz as mv
from mpo_viz import TrajectoryBatch
from mpo_viz.checks import OptionError
from mpo_viz.data import io as mv_io
from mpo_viz.data.io import group_chunks

f32 = st.floats(min_value=-1e6, max_value=1e6, width=32, allow_nan=False)


@st.composite
def ragged_rows(draw):
    n = draw(st.integers(0, 6))
    rows = []
    for i in range(n):
        L = draw(st.integers(0, 12))
        mask = draw(st.lists(st.integers(0, 1), min_size=L, max_size=L))
        row = dict(
            traj_id=f"t{i}",
            group_id=draw(st.sampled_from(["g0", "g1"])),
            prompt_ids=draw(st.lists(st.integers(0, 50_000), max_size=5)),
            response_ids=draw(st.lists(st.integers(0, 50_000), min_size=L, max_size=L)),
            loss_mask=mask,
            reward=draw(st.one_of(st.just(float("nan")), st.floats(-5, 5, allow_nan=False))) if any(mask) else 0.0,
        )
        if draw(st.booleans()):
            row["values"] = draw(st.lists(f32, min_size=L, max_size=L))
        if draw(st.booleans()):
            row["old_logprobs"] = draw(st.lists(f32, min_size=L, max_size=L))
        if draw(st.booleans()):
            row["response_tokens"] = draw(st.lists(st.text(max_size=4), min_size=L, max_size=L))
        if draw(st.booleans()):
            row["step"] = draw(st.integers(0, 10_000))
        if draw(st.booleans()):
            row["stop_reason"] = draw(st.sampled_from(["eos", "length"]))
        if draw(st.booleans()):
            row["bootstrap_value"] = draw(st.floats(-1, 1, allow_nan=False))
        if draw(st.booleans()):
            row["truncated"] = draw(st.booleans())
        k = len([1 for j in range(L) if mask[j] and (j == 0 or not mask[j - 1])])
        if draw(st.booleans()):
            row["turn_rewards"] = draw(st.lists(st.floats(-1, 1, allow_nan=False), min_size=k, max_size=k))
        if draw(st.booleans()):
            row["extra_json"] = json.dumps({"note": i})
        rows.append(row)
    return rows


def same(a: TrajectoryBatch, b: TrajectoryBatch):
    assert len(a) == len(b)
    for i in range(len(a)):
        ra, rb = a.row(i), b.row(i)
        assert ra.keys() == rb.keys(), (ra.keys(), rb.keys())
        for k in ra:
            x, y = ra[k], rb[k]
            if isinstance(x, float):
                assert (math.isnan(x) and math.isnan(y)) or x == y, k
            else:
                assert x == y, k  # exact: float32 survives JSON and Parquet bit for bit


@given(ragged_rows())
def test_roundtrip_jsonl_parquet(tmp_path_factory, rows):
    d = tmp_path_factory.mktemp("rt")
    b = TrajectoryBatch.from_rows(rows, {"tokenizer": "word-level", "gamma": 0.99})
    mv.save(b, d / "a.jsonl")
    j = mv.load(d / "a.jsonl")
    same(b, j)
    mv.save(j, d / "b.parquet")
    p = mv.load(d / "b.parquet")
    same(b, p)
    assert p.meta == j.meta == {"schema": mv.SCHEMA_VERSION, "tokenizer": "word-level", "gamma": 0.99}
    if len(b):
        for name in ("mask", "turn_ids", "token_rewards"):
            assert np.array_equal(getattr(b, name).numpy(), getattr(p, name).numpy())


def test_extra_columns_preserved(tmp_path):
    b = mv.synthetic.make_batch(6, seed=3, turn_len=(2, 5), obs_len=(1, 3))
    b = b.with_token_fields(adv_mpo=b.values * 2)
    for name in ("x.parquet", "x.jsonl"):
        mv.save(b, tmp_path / name)
        again = mv.load(tmp_path / name)
        assert np.array_equal(again.padded("adv_mpo").numpy(), b.padded("adv_mpo").numpy())


def test_folder_and_atomic_write(tmp_path):
    b = mv.synthetic.make_batch(10, seed=1, turn_len=(2, 5), obs_len=(1, 3))
    mv.save(b[:4], tmp_path / "run" / "iter=000001.parquet")
    mv.save(b[4:], tmp_path / "run" / "iter=000002.parquet")
    assert not list((tmp_path / "run").glob("*.tmp"))
    both = mv.load(tmp_path / "run")
    assert both.traj_ids == b.traj_ids
    assert both.meta["source_framework"] == "mpo_viz.data.synthetic"


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        mv.load(tmp_path / "missing.parquet")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(ValueError, match="expected a .jsonl or .parquet"):
        mv.load(tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError, match="found none"):
        mv.load(tmp_path / "empty_dir" if (tmp_path / "empty_dir").mkdir() is None else None)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_scan_bounds(tmp_path, suffix, monkeypatch):
    monkeypatch.setattr(mv_io.parquet, "ROW_GROUP_TOKENS", 2_000)  # several row groups
    b = mv.synthetic.make_batch(40, seed=2, turn_len=(5, 30), obs_len=(5, 30))
    path = mv.save(b, tmp_path / f"x{suffix}")
    max_tokens = 1_000
    lengths = b.lengths.numpy()
    assert lengths.max() <= max_tokens < lengths.sum()
    seen = []
    for piece in mv.scan(path, max_tokens=max_tokens):
        assert 0 < piece.num_tokens <= max_tokens
        seen.extend(piece.traj_ids)
    assert seen == b.traj_ids  # every row once, in order
    # a trajectory longer than max_tokens comes alone
    pieces = list(mv.scan(path, max_tokens=10))
    assert [len(p) for p in pieces] == [1] * len(b)


def test_scan_collect_reports_bad_rows(tmp_path):
    rows = [
        json.dumps(
            dict(
                traj_id=f"t{i}",
                group_id="g",
                prompt_ids=[],
                response_ids=[1, 2],
                loss_mask=[1, 1 if i != 5 else 9],
                reward=0.0,
            )
        )
        for i in range(10)
    ]
    (tmp_path / "x.jsonl").write_text("\n".join(rows) + "\n")
    pieces = list(mv.scan(tmp_path / "x.jsonl", max_tokens=4, errors="collect"))
    assert sum(len(p) for p in pieces) == 9
    assert [p.line for piece in pieces for p in piece.rejected] == [6]


def test_jsonl_refuses_to_change_shared_metadata(tmp_path):
    b = mv.synthetic.make_batch(4, seed=0, turn_len=(2, 4), obs_len=(1, 2))
    mv.save(b[:2], tmp_path / "a.jsonl")
    mv.save(b[2:], tmp_path / "b.jsonl")  # same metadata: fine, both share _meta.json
    other = b[2:]
    other.meta = {**b.meta, "values_source": "oracle"}
    with pytest.raises(
        ValueError, match=r"c.jsonl: the JSONL files of a folder share _meta.json, and a.jsonl \(and 1 more\)"
    ):
        mv.save(other, tmp_path / "c.jsonl")
    assert not (tmp_path / "c.jsonl").exists()
    assert mv.load(tmp_path / "a.jsonl").meta["values_source"] == "synthetic"
    mv.save(other, tmp_path / "own" / "c.jsonl")  # a folder of its own works
    assert mv.load(tmp_path / "own").meta["values_source"] == "oracle"


def test_group_chunks_refuses_split_groups():
    b = mv.synthetic.make_batch(6, seed=1, group_size=2, turns=2, turn_len=3, obs_len=2)
    order = [0, 2, 4, 1, 3, 5]  # every group split
    chunks = [b[[i]] for i in order]
    with pytest.raises(ValueError, match="group_id: group .* appears again"):
        list(group_chunks(chunks))
    assert sum(len(c) for c in group_chunks(chunks, strict=False)) == 6
    # contiguous groups cut anywhere come out whole
    got = list(group_chunks([b[[0, 1, 2]], b[[3]], b[[4, 5]]]))
    assert [c.group_ids for c in got] == [b.group_ids[:2], b.group_ids[2:4], b.group_ids[4:]]


def test_scan_keep_groups_keeps_every_group_in_one_batch(tmp_path):
    b = mv.synthetic.make_batch(24, seed=3, group_size=4, turns=(2, 3), turn_len=(3, 9), obs_len=(2, 5))
    mv.save(b, tmp_path / "g.parquet")
    max_tokens = 70  # two or three rows a chunk: many cuts inside groups of 4
    plain = list(mv.scan(tmp_path / "g.parquet", max_tokens=max_tokens))
    assert any(p.group_ids[-1] == q.group_ids[0] for p, q in zip(plain, plain[1:]))  # plain scan splits groups
    kept = list(mv.scan(tmp_path / "g.parquet", max_tokens=max_tokens, keep_groups=True))
    assert [t for c in kept for t in c.traj_ids] == b.traj_ids  # every row once, in file order
    seen = [set(c.group_ids) for c in kept]
    for i, s in enumerate(seen):
        assert all(not (s & t) for t in seen[i + 1 :])
    assert all(sum(1 for g in c.group_ids if g == gid) == 4 for c in kept for gid in set(c.group_ids))


def test_count_rows_and_bad_max_tokens(tmp_path):
    b = mv.synthetic.make_batch(5, seed=1)
    mv.save(b, tmp_path / "a.parquet")
    mv.save(b[[0, 1]], tmp_path / "d" / "x.parquet")
    mv.save(b[[2]], tmp_path / "d" / "y.parquet")
    mv.save(b, tmp_path / "a.jsonl")
    assert mv_io.count_rows(tmp_path / "a.parquet") == 5
    assert mv_io.count_rows(tmp_path / "d") == 3
    assert mv_io.count_rows(tmp_path / "a.jsonl") is None
    with pytest.raises(OptionError, match=r"max_tokens: expected an integer >= 1, found 0") as e:
        next(mv.scan(tmp_path / "a.parquet", max_tokens=0))
    assert e.value.option == "max_tokens"
