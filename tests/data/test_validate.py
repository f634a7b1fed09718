"""One test per trajectory/v1 validation rule (docs/concepts.md §8). Each error names file, line or row,
traj_id, field, expected and found; errors='collect' keeps the good rows and loses none."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mpo_viz as mv
from mpo_viz import TrajectoryError

NAN = float("nan")


def good(tid="t0", **kw):
    r = dict(
        traj_id=tid,
        group_id="g",
        prompt_ids=[1, 2],
        response_ids=[5, 6, 7, 8, 9],
        loss_mask=[1, 1, 0, 1, 1],
        reward=1.0,
        values=[0.1, 0.2, 0.3, 0.4, 0.5],
    )
    r.update(kw)
    return r


def write_jsonl(path, rows):
    with open(path, "w") as fh:
        for r in rows:
            fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


CASES = {
    "unequal lengths": (dict(values=[0.1, 0.2]), "values", "5 items", "2"),
    "mask not 0/1": (dict(loss_mask=[1, 2, 0, 1, 1]), "loss_mask", "0 or 1", "2 at position 1"),
    "turn ids decrease": (dict(turn_ids=[0, 0, 1, 0, 1]), "turn_ids", "non-decreasing", "1 then 0 at position 3"),
    "turn ids skip": (dict(turn_ids=[0, 0, 0, 2, 2]), "turn_ids", "consecutive", "0 then 2"),
    "turn id without action token": (
        dict(turn_ids=[1, 1, 1, 2, 2]),
        "turn_ids",
        "turn 0 on the first action token",
        "turn 1",
    ),
    "NaN value on action token": (
        dict(values=[0.1, float("nan"), 0.3, 0.4, 0.5]),
        "values",
        "finite",
        "nan at position 1",
    ),
    "inf logprob on action token": (
        dict(old_logprobs=[0, 0, 0, float("-inf"), 0]),
        "old_logprobs",
        "finite",
        "-inf at position 3",
    ),
    "reward on masked token": (
        dict(token_rewards=[0, 0, 1.0, 0, 0]),
        "token_rewards",
        "0 on observation tokens",
        "1 at position 2",
    ),
    "token rewards do not sum to reward": (
        dict(token_rewards=[0, 0, 0, 0, 0.5]),
        "reward",
        "sum of token_rewards",
        "1",
    ),
    "turn rewards do not match turn count": (dict(turn_rewards=[0.1, 0.2, 0.3]), "turn_rewards", "2 entries", "3"),
    "mc values do not match turn count": (dict(mc_value=[0.5]), "mc_value", "2 entries", "1"),
    "mc value not finite": (dict(mc_value=[0.5, float("nan")]), "mc_value", "finite numbers", "nan"),
    "negative standard error": (dict(mc_value_se=[0.1, -0.1]), "mc_value_se", "standard errors >= 0", "-0.1"),
    "ratio not positive": (dict(ratio=[1, 1, 1, 0.0, 1]), "ratio", "ratios > 0 on action tokens", "0 at position 3"),
    "ratio not finite": (
        dict(ratio=[1, float("nan"), 1, 1, 1]),
        "ratio",
        "finite numbers on action tokens",
        "nan at position 1",
    ),
    "clipped not 0/1": (dict(clipped=[0, 0.5, 0, 0, 0]), "clipped", "0 or 1 (or a boolean)", "0.5 at position 1"),
    "turn ratio not positive": (dict(turn_ratio=[1.1, -0.5]), "turn_ratio", "ratios > 0", "-0.5"),
    "turn ratios do not match turn count": (dict(turn_ratio=[1.0]), "turn_ratio", "2 entries", "1"),
    "turn clipped not 0/1": (dict(turn_clipped=[0, 2]), "turn_clipped", "0 or 1 (or a boolean)", "2 at turn 1"),
    "token truth of the wrong length": (
        dict(mc_tok_adv=[0.1, 0.2], mc_tok_measured=[1, 1]),
        "mc_tok_adv",
        "5 items",
        "2",
    ),
    "token truth standard error < 0": (
        dict(
            mc_tok_measured=[0, 1, 0, 0, 0],
            mc_tok_adv=[NAN, 0.1, NAN, NAN, NAN],
            mc_tok_adv_se=[NAN, -0.1, NAN, NAN, NAN],
        ),
        "mc_tok_adv_se",
        "standard errors >= 0",
        "-0.1 at position 1",
    ),
    "token truth measured on an observation token": (
        dict(mc_tok_measured=[0, 0, 1, 0, 0], mc_tok_adv=[NAN, NAN, 0.1, NAN, NAN]),
        "mc_tok_measured",
        "1 only on action tokens",
        "1 at position 2, an observation token",
    ),
    "token truth not finite where measured": (
        dict(mc_tok_measured=[1, 0, 0, 0, 0], mc_tok_adv=[NAN] * 5),
        "mc_tok_adv",
        "finite numbers where mc_tok_measured is 1",
        "nan at position 0",
    ),
    "token truth control not measured": (
        dict(mc_tok_measured=[1, 0, 0, 0, 0], mc_tok_control=[0, 1, 0, 0, 0]),
        "mc_tok_control",
        "1 only on measured tokens",
        "1 at position 1",
    ),
    "token truth without its flags": (
        dict(mc_tok_adv=[0.1, NAN, NAN, NAN, NAN]),
        "mc_tok_measured",
        "the measured tokens' 0/1 flags beside mc_tok_adv",
        "nothing",
    ),
    "token truth probability out of range": (
        dict(mc_tok_measured=[0, 0, 0, 1, 0], mc_tok_pi=[NAN, NAN, NAN, 1.5, NAN]),
        "mc_tok_pi",
        "probabilities in [0, 1]",
        "1.5 at position 3",
    ),
    "token truth flag not 0/1": (dict(mc_tok_measured=[0, 2, 0, 0, 0]), "mc_tok_measured", "0 or 1", "2 at position 1"),
    "missing required field": (dict(response_ids=None), "response_ids", "the required field", "nothing"),
    "wrong type": (dict(reward="high"), "reward", "a float", "str 'high'"),
    "group id not a string": (dict(group_id=7), "group_id", "a string", "7"),
    "non-integer token ids": (dict(response_ids=[5, 6.5, 7, 8, 9]), "response_ids", "integers", "6.5"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rule_raises_with_location(tmp_path, case):
    bad_fields, field, expected, found = CASES[case]
    row = {k: v for k, v in good("bad1", **bad_fields).items() if v is not None}
    path = write_jsonl(tmp_path / "x.jsonl", [good("ok1"), row, good("ok2")])
    with pytest.raises(TrajectoryError) as e:
        mv.load(path)
    msg = str(e.value)
    assert str(path) in msg and "line 2" in msg and "traj_id='bad1'" in msg, msg
    assert f"field {field!r}" in msg and expected in msg and found in msg, msg
    p = e.value.problems[0]
    assert (p.file, p.line, p.traj_id, p.field) == (str(path), 2, "bad1", field)
    # collect: the two good rows survive, the bad one is listed, nothing is lost
    b = mv.load(path, errors="collect")
    assert b.traj_ids == ["ok1", "ok2"]
    assert {q.line for q in b.rejected} == {2}


def test_duplicate_traj_id(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [good("a"), good("b"), good("a")])
    with pytest.raises(
        TrajectoryError,
        match=r"line 3, traj_id='a': field 'traj_id': expected a unique traj_id, "
        r"found a duplicate of 'a' \(first at line 1\)",
    ):
        mv.load(path)
    assert mv.load(path, errors="collect").traj_ids == ["a", "b"]


def test_duplicate_across_files_of_a_folder(tmp_path):
    write_jsonl(tmp_path / "1.jsonl", [good("a")])
    write_jsonl(tmp_path / "2.jsonl", [good("b"), good("a")])
    with pytest.raises(
        TrajectoryError, match=r"2.jsonl, line 2, traj_id='a'.*duplicate of 'a' \(first in .*1.jsonl, line 1\)"
    ):
        mv.load(tmp_path)


def test_unreadable_line(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [good("a"), "{not json", good("b")])
    with pytest.raises(
        TrajectoryError, match="line 2: field '<line>': expected one JSON object, found unreadable JSON"
    ):
        mv.load(path)
    b = mv.load(path, errors="collect")
    assert b.traj_ids == ["a", "b"] and b.rejected[0].line == 2


def test_unknown_schema_version(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [good("a")])
    (tmp_path / "_meta.json").write_text(json.dumps({"schema": "mpo_viz.trajectory/v9"}))
    with pytest.raises(TrajectoryError, match="field 'schema'.*found 'mpo_viz.trajectory/v9'"):
        mv.load(path)


def test_unknown_schema_version_parquet(tmp_path):
    b = mv.TrajectoryBatch.from_rows([good("a")])
    b.meta["schema"] = "other/v2"
    mv.save(b, tmp_path / "x.parquet")
    with pytest.raises(TrajectoryError, match="schema"):
        mv.load(tmp_path / "x.parquet")


def test_parquet_rows_named_by_row_number(tmp_path):
    rows = [good("a"), good("b", loss_mask=[1, 1, 0, 3, 1])]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "x.parquet")
    with pytest.raises(
        TrajectoryError,
        match=r"x.parquet, row 1, traj_id='b': field 'loss_mask': expected 0 or 1, found 3 at position 3",
    ):
        mv.load(tmp_path / "x.parquet")
    assert mv.load(tmp_path / "x.parquet", errors="collect").traj_ids == ["a"]


def test_parquet_missing_column(tmp_path):
    rows = [{k: v for k, v in good(t).items() if k != "reward"} for t in "ab"]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet")
    b = mv.load(tmp_path / "x.parquet", errors="collect")
    assert len(b) == 0 and len(b.rejected) == 2
    assert all(p.field == "reward" and "no such column" in p.found for p in b.rejected)


def test_collect_loses_no_row(tmp_path):
    rows = []
    for i in range(30):
        case = list(CASES)[i % len(CASES)] if i % 3 == 0 else None
        r = good(f"t{i}", **(CASES[case][0] if case else {}))
        rows.append({k: v for k, v in r.items() if v is not None})
    path = write_jsonl(tmp_path / "x.jsonl", rows)
    b = mv.load(path, errors="collect")
    rejected_lines = {p.line for p in b.rejected}
    assert len(b) + len(rejected_lines) == 30
    assert set(b.traj_ids).isdisjoint({f"t{line - 1}" for line in rejected_lines})


def test_from_rows_names_row_index():
    with pytest.raises(TrajectoryError, match="row 1, traj_id='b'"):
        mv.TrajectoryBatch.from_rows([good("a"), good("b", loss_mask=[1, 1, 0, 1, 7])])


def test_errors_argument_checked(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [good("a")])
    with pytest.raises(ValueError, match="errors"):
        mv.load(path, errors="ignore")


@pytest.mark.parametrize(
    "field, values, expected",
    [
        ("response_ids", lambda r: [str(v) for v in r], "a list column of numbers"),
        ("values", lambda r: [str(v) for v in r], "a list column of numbers"),
        ("values", lambda r: [[v] for v in r], "a list column of numbers"),
        ("response_tokens", lambda r: list(range(len(r))), "a list<string> column"),
    ],
)
def test_parquet_list_of_wrong_element_type(tmp_path, field, values, expected):
    # The JSONL reader refuses strings/nested lists in numeric fields; Parquet must too (named,
    # not a TypeError from deep inside, and never a silent string -> float cast).
    rows = [good("a"), good("b")]
    for r in rows:
        r[field] = values(r["values"] if field == "values" else r["response_ids"])
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet")
    with pytest.raises(
        TrajectoryError, match=rf"x.parquet, row 0, traj_id='a': field '{field}': expected {expected}, found list<"
    ):
        mv.load(tmp_path / "x.parquet")
    b = mv.load(tmp_path / "x.parquet", errors="collect")
    assert len(b) == 0 and len(b.rejected) == 2


def test_parquet_bool_mask_accepted(tmp_path):
    rows = [good("a", loss_mask=[True, True, False, True, True])]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet")
    assert mv.load(tmp_path / "x.parquet").mask.tolist() == [[1.0, 1.0, 0.0, 1.0, 1.0]]


def test_update_fields_read_back_and_booleans_accepted(tmp_path):
    """ratio / clipped per token, turn_ratio / turn_clipped per turn: a ratio on an observation token
    is not checked; flags may be booleans (JSONL and Parquet) and come back as int8 0/1."""
    row = good(
        "a",
        ratio=[1.5, 0.5, 0.0, 1.0, 2.0],
        clipped=[True, False, False, False, True],
        turn_ratio=[0.9, 1.3],
        turn_clipped=[False, True],
    )
    path = write_jsonl(tmp_path / "x.jsonl", [row])
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "x.parquet")
    for b in (mv.load(path), mv.load(tmp_path / "x.parquet")):
        assert b.field("clipped")[0].tolist() == [1, 0, 0, 0, 1] and b.field("clipped")[0].dtype.name == "int8"
        assert b.field("turn_clipped")[0].tolist() == [0, 1] and b.field("turn_clipped")[0].dtype.name == "int8"
        assert b.field("ratio")[0].tolist() == [1.5, 0.5, 0.0, 1.0, 2.0]
        assert b.field("turn_ratio")[0].tolist() == [0.9, 1.3]
        mv.save(b, tmp_path / "again.parquet")
        c = mv.load(tmp_path / "again.parquet")
        assert c.field("turn_clipped")[0].tolist() == [0, 1] and c.field("clipped")[0].tolist() == [1, 0, 0, 0, 1]
    with pytest.raises(
        TrajectoryError,
        match=r"row 0, traj_id='a': field 'turn_clipped': expected 0 or 1 \(or a "
        r"boolean\), found 3 at turn 0",
    ):
        pq.write_table(pa.Table.from_pylist([dict(row, turn_clipped=[3, 0])]), tmp_path / "y.parquet")
        mv.load(tmp_path / "y.parquet")
