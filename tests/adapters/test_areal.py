"""AReaL rollout batches → v1: every form of the sample gives the source's fields back (after a save
and load), AReaL's −1 turn ids against a per-token loop, and errors that name the row and field."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

import mpo_viz as mv
from mpo_viz import TrajectoryError
from mpo_viz.adapters import from_areal
from mpo_viz.adapters.areal import areal_turn_ids
from tests.adapters.adapter_data import SAMPLES

SAMPLE = SAMPLES / "areal_rollout.safetensors"


@pytest.fixture(scope="module")
def raw():
    """The sample's tensors as numpy: what AReaL's trainer holds before compute_advantages."""
    return {k: v.numpy() for k, v in load_file(str(SAMPLE)).items()}


def records(raw):
    """The same trajectories unpadded, one dict of lists per trajectory (the JSONL/Parquet form)."""
    out = []
    for i in range(len(raw["rewards"])):
        n = int(raw["attention_mask"][i].sum())
        rec = {
            k: raw[k][i, :n].tolist() for k in ("input_ids", "loss_mask", "logprobs", "versions", "turn_ids", "values")
        }
        rec["rewards"] = float(raw["rewards"][i])
        out.append(rec)
    return out


def turn_ids_loop(areal_ids, mask):
    """Reference: walk the tokens; a generated token whose AReaL id differs from the last one seen
    starts the next v1 turn; every other token keeps the current turn."""
    out, cur, last = [], 0, None
    for t, m in zip(areal_ids, mask):
        if m:
            if last is not None and t != last:
                cur += 1
            last = t
        out.append(cur)
    return out


def test_the_sample_round_trips_to_the_source_fields(raw, tmp_path):
    b, rep = from_areal(SAMPLE)
    assert not rep.rejected and rep.rows_in == len(b) == 4
    mv.save(b, tmp_path / "a.parquet")
    back = mv.load(tmp_path / "a.parquet")  # validated again on load
    assert back.meta["source_framework"] == "areal" and back.meta["values_source"] == "critic"
    for i in range(4):
        r = back.row(i)
        n = int(raw["attention_mask"][i].sum())
        m = raw["loss_mask"][i, :n]
        p = int(np.flatnonzero(m)[0])
        assert r["prompt_ids"] == raw["input_ids"][i, :p].tolist()
        assert r["response_ids"] == raw["input_ids"][i, p:n].tolist()
        assert r["loss_mask"] == m[p:].tolist()
        np.testing.assert_array_equal(r["rollout_logprobs"], raw["logprobs"][i, p:n])
        np.testing.assert_array_equal(r["versions"], raw["versions"][i, p:n])
        np.testing.assert_array_equal(r["values"], raw["values"][i, p - 1 : n - 1])  # one position later
        assert r["reward"] == float(raw["rewards"][i])
        assert r["turn_ids"] == turn_ids_loop(raw["turn_ids"][i, p:n], m[p:])
        assert r["policy_version"] == raw["versions"][i, p:n][m[p:] == 1].min()
    assert set(rep.fields_mapped) == {
        "input_ids",
        "attention_mask",
        "loss_mask",
        "turn_ids",
        "versions",
        "rewards",
        "logprobs",
        "values",
    }
    assert rep.fields_dropped == {}


def test_the_sample_is_the_episodes(load_script):
    """The sample was written from the shipped episodes: turns and values come back as they were."""
    eps, _ = load_script(SAMPLES / "make_samples.py", "make_samples").episodes()
    b, _ = from_areal(SAMPLE)
    for i, e in enumerate(eps):
        assert b.row(i)["turn_ids"] == list(e["row"]["turn_ids"])
        np.testing.assert_allclose(b.row(i)["values"], e["row"]["values"], rtol=1e-6)
    assert b.row(1)["policy_version"] == 3 and set(b.row(1)["versions"]) == {-1.0, 3.0, 4.0}


@pytest.mark.parametrize("form", ["jsonl", "parquet", "list", "list_1xL", "pt", "dict"])
def test_every_form_gives_the_same_rows(raw, tmp_path, form):
    want, _ = from_areal(SAMPLE)
    recs = records(raw)
    if form == "jsonl":
        src = tmp_path / "r.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    elif form == "parquet":
        src = tmp_path / "r.parquet"
        pq.write_table(pa.Table.from_pylist(recs), src)
    elif form == "list":
        src = recs
    elif form == "list_1xL":  # a workflow's own output: (1, L) tensors, a (1,) reward
        src = [{k: torch.tensor([v]) for k, v in r.items()} for r in recs]
    elif form == "pt":
        src = tmp_path / "b.pt"
        torch.save({k: torch.from_numpy(v) for k, v in raw.items()}, src)
    else:
        src = {k: torch.from_numpy(v) for k, v in raw.items()}
    got, rep = from_areal(src)
    assert not rep.rejected
    keys = ("prompt_ids", "response_ids", "loss_mask", "turn_ids", "reward", "policy_version")
    for i in range(4):
        a, w = got.row(i), want.row(i)
        assert {k: a[k] for k in keys} == {k: w[k] for k in keys}
        for k in ("rollout_logprobs", "values", "versions"):
            np.testing.assert_allclose(a[k], w[k], rtol=1e-6)


@pytest.mark.parametrize(
    "areal, mask, want, renumbered",
    [
        ([-1, 0, 0, -1, 1, 1, -1], [0, 1, 1, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1], False),
        ([-1, 2, 2, -1, 5, -1], [0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 1, 1], True),  # gaps closed
        ([0, 0, -1, 0, 1], [1, 1, 0, 1, 1], [0, 0, 0, 0, 1], False),  # one turn around a tool reply, then a new one
        ([0, 1, 1], [1, 1, 1], [0, 1, 1], False),  # a new turn without a token between
        ([-1, -1], [0, 0], [0, 0], False),  # nothing generated
        ([7], [1], [0], True),  # one-token turn
    ],
)
def test_areal_turn_ids_by_hand(areal, mask, want, renumbered):
    ids, bad, ren = areal_turn_ids(areal, mask)
    assert bad is None and ids.tolist() == want == turn_ids_loop(areal, mask) and ren == renumbered


def test_areal_turn_ids_against_the_loop():
    g = np.random.default_rng(3)
    for _ in range(200):
        n = int(g.integers(1, 30))
        mask = (g.random(n) < 0.6).astype(int)
        ids = np.where(mask == 1, np.cumsum(g.random(n) < 0.2) * int(g.integers(1, 3)), -1)
        got, bad, _ = areal_turn_ids(ids, mask)
        assert bad is None and got.tolist() == turn_ids_loop(ids, mask)


@pytest.mark.parametrize(
    "ids, mask, found",
    [
        ([0, -1, 1], [1, 1, 1], "-1 at response position 1"),
        ([1, -1, 0], [1, 0, 1], "0 after 1 at response position 2"),
    ],
)
def test_bad_turn_ids_are_refused(ids, mask, found):
    rec = {"input_ids": [5, 6, 7, 8], "loss_mask": [0, *mask], "turn_ids": [-1, *ids], "rewards": 1.0}
    with pytest.raises(TrajectoryError, match=rf"row 0, traj_id='row0': field 'turn_ids': expected .*found {found}"):
        from_areal([rec])


def _jsonl(tmp_path, recs):
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


def test_row_errors_name_the_line_and_field(raw, tmp_path):
    recs = records(raw)
    short = dict(recs[1], logprobs=recs[1]["logprobs"][:-1])
    two = dict(recs[2], loss_mask=[2 if i == 50 else x for i, x in enumerate(recs[2]["loss_mask"])])
    src = _jsonl(tmp_path, [recs[0], short, two, recs[3]])
    with pytest.raises(
        TrajectoryError,
        match=r"r\.jsonl, line 2, traj_id='line2': field 'logprobs': expected areal layout: "
        rf"{len(recs[1]['input_ids'])} entries",
    ):
        from_areal(src)
    b, rep = from_areal(src, errors="collect")
    assert len(b) == 2 and b.traj_ids == ["line1", "line4"]
    assert [(p.line, p.field) for p in b.rejected] == [(2, "logprobs"), (3, "loss_mask")]
    assert "2 at position 50" in str(b.rejected[1])


def test_padding_must_be_on_the_right():
    rec = {"input_ids": [5, 6, 7], "attention_mask": [0, 1, 1], "loss_mask": [0, 1, 1], "rewards": 0.0}
    with pytest.raises(
        TrajectoryError, match=r"field 'attention_mask': expected areal layout: 1s then 0s .*found 0 at position 0"
    ):
        from_areal([rec])


def test_a_row_without_generated_tokens_is_refused():
    with pytest.raises(TrajectoryError, match=r"field 'loss_mask': expected .*at least one generated token"):
        from_areal([{"input_ids": [5, 6], "loss_mask": [0, 0], "rewards": 0.0}])


def test_a_batch_after_compute_advantages_is_refused_even_when_collecting(raw):
    batch = {k: torch.from_numpy(v) for k, v in raw.items()}
    batch["advantages"] = torch.zeros_like(batch["logprobs"])
    with pytest.raises(
        TrajectoryError,
        match=r"field 'advantages': expected areal layout: a rollout batch before "
        r"compute_advantages",
    ):
        from_areal(batch, errors="collect")


def test_a_pickle_is_never_unpickled(tmp_path):
    """A .pt that needs unpickling (a numpy array inside) is refused: weights_only=True only."""
    p = tmp_path / "np.pt"
    torch.save({"input_ids": np.zeros((1, 3), dtype=np.int64)}, p)
    with pytest.raises(TrajectoryError, match=r"np\.pt: field '<file>': .*never unpickled.*needs unpickling"):
        from_areal(p)


def test_areal_text_dump_is_explained(tmp_path):
    """AReaL's own rollout dump (workflow_executor._dump_trajectory) holds text, not token ids."""
    src = _jsonl(
        tmp_path,
        [
            {
                "task_id": 0,
                "sample_idx": 0,
                "seqlen": 9,
                "prompt_len": 4,
                "head_version": 1,
                "tail_version": 1,
                "reward": 1.0,
                "prompt": "2+3?",
                "completion": "5",
            }
        ],
    )
    with pytest.raises(TrajectoryError, match=r"AReaL's text dump .*no token ids"):
        from_areal(src)


def test_other_keys_go_to_extra_json_or_are_reported():
    rec = {
        "input_ids": [5, 6, 7],
        "loss_mask": [0, 1, 1],
        "rewards": 0.5,
        "original_rewards": 1.0,
        "task": "t0",
        "entropy_like": [0.1, 0.2, 0.3],
        "traj_id": "a",
        "group_id": "g",
    }
    b, rep = from_areal([rec])
    r = b.row(0)
    assert (r["traj_id"], r["group_id"], r["reward"]) == ("a", "g", 0.5)
    assert json.loads(r["extra_json"]) == {"original_rewards": 1.0, "task": "t0"}
    assert "entropy_like" in rep.fields_dropped and rep.fields_mapped["original_rewards"] == "extra_json"
    assert r["turn_ids"] == [0, 0] and "no turn_ids: turns are the runs of loss_mask 1" in rep.notes


def test_a_folder_of_step_files(raw, tmp_path):
    """One batch per training step: ids prefixed by the file's stem, its number the step, groups per file."""
    from safetensors.torch import save_file

    d = tmp_path / "rollouts"
    d.mkdir()
    batch = {k: torch.from_numpy(v) for k, v in raw.items()}
    save_file(batch, str(d / "12.safetensors"))
    (d / "3.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records(raw)[:2]))
    (d / "notes.txt").write_text("not a batch")
    b, rep = from_areal(d)
    assert b.traj_ids == ["3/line1", "3/line2", "12/row0", "12/row1", "12/row2", "12/row3"]  # step order
    assert list(b.field("step")) == [3, 3, 12, 12, 12, 12]
    assert not set(b.group_ids[:2]) & set(b.group_ids[2:]) and b.group_ids[2].startswith("12/")
    assert rep.rows_in == 6
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TrajectoryError, match=r"expected areal layout: a folder of \.safetensors"):
        from_areal(empty)


def test_the_report_lists_every_key_read():
    b, rep = from_areal(SAMPLE)
    d = rep.to_dict()
    assert d["fields_mapped"]["logprobs"] == "rollout_logprobs" and d["fields_dropped"] == {}
    assert "  mapped field          values -> values (one position later" in str(rep)
    # a later chunk's report adds its keys without replacing the first description
    other = type(rep)("areal")
    other.mapped("logprobs", "something else")
    other.mapped("ref_logp", "ref_logprobs (one position later)")
    other.drop("entropy_like", "why")
    rep.update(other)
    assert rep.fields_mapped["logprobs"] == "rollout_logprobs"
    assert rep.fields_mapped["ref_logp"].startswith("ref_logprobs") and "entropy_like" in rep.fields_dropped
