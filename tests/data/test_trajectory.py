"""TrajectoryBatch on a hand-built batch: every number below is derived by hand."""

import math

import numpy as np
import pytest
import torch

from mpo_viz import TrajectoryBatch, TrajectoryError


def rows():
    return [
        # two turns given by mask runs (no turn_ids); outcome reward on the last action token
        dict(
            traj_id="a",
            group_id="g1",
            prompt_ids=[1, 2],
            response_ids=[5, 6, 7, 8, 9, 10],
            loss_mask=[1, 1, 0, 0, 1, 1],
            reward=1.0,
            values=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
            response_tokens=["I", "go", "<obs>", "x", "ok", "<eot>"],
        ),
        # explicit turn ids; NaN outcome plus per-turn rewards on each turn's last action token
        dict(
            traj_id="b",
            group_id="g1",
            prompt_ids=[1],
            response_ids=[5, 6, 7],
            loss_mask=[1, 0, 1],
            turn_ids=[0, 0, 1],
            reward=float("nan"),
            turn_rewards=[0.5, 0.25],
        ),
        # token rewards override everything and must sum to the reward
        dict(
            traj_id="c",
            group_id="g2",
            prompt_ids=[3],
            response_ids=[5, 6, 7, 8],
            loss_mask=[0, 1, 1, 0],
            token_rewards=[0.0, 0.3, 0.7, 0.0],
            reward=1.0,
            bootstrap_value=0.25,
        ),
        # outcome plus turn rewards add up on the last token
        dict(
            traj_id="d",
            group_id="g2",
            prompt_ids=[],
            response_ids=[5, 6],
            loss_mask=[1, 1],
            reward=2.0,
            turn_rewards=[0.5],
        ),
    ]


@pytest.fixture
def batch():
    return TrajectoryBatch.from_rows(rows(), {"values_source": "critic"})


def test_padded_views(batch):
    assert len(batch) == 4
    assert batch.mask.dtype == torch.float32 and batch.mask.shape == (4, 6)
    np.testing.assert_array_equal(
        batch.mask.numpy(), [[1, 1, 0, 0, 1, 1], [1, 0, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        batch.turn_ids.numpy(), [[0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]
    )
    np.testing.assert_allclose(
        batch.token_rewards.numpy(),
        [[0, 0, 0, 0, 0, 1], [0.5, 0, 0.25, 0, 0, 0], [0, 0.3, 0.7, 0, 0, 0], [0, 2.5, 0, 0, 0, 0]],
        rtol=1e-6,
    )
    assert batch.token_rewards.dtype == torch.float32
    assert batch.padded("rewards", torch.float64).dtype == torch.float64
    np.testing.assert_array_equal(batch.lengths.numpy(), [6, 3, 4, 2])
    v = batch.values
    np.testing.assert_allclose(v[0].numpy(), [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], rtol=1e-6)
    assert (v[1:] == 0).all()  # rows without values: fill
    assert torch.isnan(batch.padded("values", fill=float("nan"))[1]).all()
    bv = batch.bootstrap_value
    assert bv.dtype == torch.float64 and math.isnan(bv[0]) and bv[2] == 0.25
    np.testing.assert_array_equal(batch.num_turns, [2, 2, 1, 1])
    assert batch.group_ids == ["g1", "g1", "g2", "g2"]
    assert batch.traj_ids == ["a", "b", "c", "d"]


def test_the_derived_arrays_are_rebuilt_the_same_after_clear_cache(batch):
    """clear_cache forgets what the padded views derived (turn ids, rewards, turn counts) and they
    come back the same: the hand-derived numbers of test_padded_views, after and before."""
    before = (batch.turn_ids.clone(), batch.token_rewards.clone(), batch.num_turns.copy(), batch.mask.clone())
    batch.clear_cache()
    assert batch._cache == {}
    after = (batch.turn_ids, batch.token_rewards, batch.num_turns, batch.mask)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(after[2], [2, 2, 1, 1])


def test_to_pandas(batch):
    df = batch.to_pandas()
    assert len(df) == 6 + 3 + 4 + 2
    assert list(df.columns[:3]) == ["traj_id", "group_id", "position"]
    for col in ["response_ids", "loss_mask", "turn_ids", "values", "token_rewards", "response_tokens", "rewards"]:
        assert col in df.columns
    a = df[df.traj_id == "a"]
    assert a.position.tolist() == [0, 1, 2, 3, 4, 5]
    assert a.turn_ids.tolist() == [0, 0, 0, 0, 1, 1]
    assert a.response_tokens.tolist() == ["I", "go", "<obs>", "x", "ok", "<eot>"]
    assert df[df.traj_id == "b"]["values"].isna().all()
    assert df[df.traj_id == "c"].token_rewards.tolist() == [0.0, 0.3, 0.7, 0.0]
    sub = batch.to_pandas(columns=["traj_id", "values"])
    assert list(sub.columns) == ["traj_id", "values"]
    with pytest.raises(KeyError, match="nope"):
        batch.to_pandas(columns=["nope"])


def test_turns_table(batch):
    t = batch.turns()
    assert len(t) == 6
    a = t[t.traj_id == "a"].reset_index(drop=True)
    assert a.turn.tolist() == [0, 1]
    assert a.n_tokens.tolist() == [2, 2]
    assert a.start.tolist() == [0, 4] and a.end.tolist() == [1, 5]
    assert a.n_obs_after.tolist() == [2, 0]
    assert a.reward.tolist() == [0.0, 1.0]
    np.testing.assert_allclose(a.value_first, [0.1, 0.5], rtol=1e-6)
    np.testing.assert_allclose(a.value_mean, [0.15, 0.55], rtol=1e-6)
    np.testing.assert_allclose(a.value_last, [0.2, 0.6], rtol=1e-6)
    b = t[t.traj_id == "b"]
    assert b.reward.tolist() == [0.5, 0.25] and b.n_obs_after.tolist() == [1, 0]
    assert t.row.tolist() == [0, 0, 1, 1, 2, 3]
    # per-estimator columns: adv_<name> = mean over the turn's action tokens, ret_<name> = at its first
    adv = np.arange(24, dtype=np.float64).reshape(4, 6)
    t2 = batch.turns(advantages={"x": adv}, returns={"x": torch.from_numpy(-adv)})
    # row a: turns at positions (0, 1) and (4, 5); row b: 0 and 2; row c: (1, 2); row d: (0, 1)
    np.testing.assert_allclose(t2.adv_x, [0.5, 4.5, 6, 8, 13.5, 18.5])
    np.testing.assert_allclose(t2.ret_x, [0, -4, -6, -8, -13, -18])
    with pytest.raises(ValueError, match=r"advantages\['y'\]: expected a \(B, L\) tensor with B = 4"):
        batch.turns(advantages={"y": adv[:2]})
    c = t[t.traj_id == "c"]
    np.testing.assert_allclose(c.reward, [1.0])
    assert c.start.tolist() == [1] and c.n_obs_after.tolist() == [1]


def test_turn_table_shows_the_updates_turn_fields(batch):
    """turn_ratio / turn_clipped become columns of their own name (NaN for a row without them); the
    flags refuse anything but 0/1."""
    assert "turn_ratio" not in batch.turns().columns
    b = batch.with_turn_fields(
        turn_ratio=[[0.9, 1.3], [1.0, 0.7], None, [1.05]], turn_clipped=[[0, 1], [False, True], None, [0]]
    )
    t = b.turns()
    np.testing.assert_allclose(t.turn_ratio, [0.9, 1.3, 1.0, 0.7, np.nan, 1.05])
    np.testing.assert_array_equal(t.turn_clipped, [0, 1, 0, 1, np.nan, 0])
    assert b.field("turn_clipped")[1].dtype == np.int8
    with pytest.raises(ValueError, match=r"turn_clipped: expected 0 or 1 \(or booleans\), found 0.5"):
        batch.with_turn_fields(turn_clipped=[[0, 0.5], [0, 0], None, [1]])
    with pytest.raises(ValueError, match=r"clipped: expected 0 or 1 \(or booleans\), found 2.0"):
        batch.with_token_fields(clipped=np.full((4, 6), 2.0))
    assert batch.with_token_fields(clipped=np.ones((4, 6))).field("clipped")[3].tolist() == [1, 1]


def test_selection_and_concat(batch):
    assert batch[1].traj_ids == ["b"]
    assert batch[-1].traj_ids == ["d"]
    assert batch[1:3].traj_ids == ["b", "c"]
    assert batch[[3, 0]].traj_ids == ["d", "a"]
    assert batch[np.array([True, False, True, False])].traj_ids == ["a", "c"]
    assert batch.select(traj_ids=["c", "a"]).traj_ids == ["c", "a"]
    assert batch["b"].row(0)["turn_rewards"] == [0.5, 0.25]
    with pytest.raises(KeyError, match="zz"):
        batch.select(traj_ids=["zz"])
    with pytest.raises(IndexError):
        batch[7]
    sub = batch[[2, 1]]
    np.testing.assert_allclose(sub.token_rewards.numpy(), [[0, 0.3, 0.7, 0], [0.5, 0, 0.25, 0]], rtol=1e-6)
    both = TrajectoryBatch.concat([batch[[0, 1]], batch[[2, 3]]])
    assert both.traj_ids == batch.traj_ids
    for i in range(4):
        assert _eq(both.row(i), batch.row(i))
    with pytest.raises(ValueError, match="duplicate traj_id 'a'"):
        TrajectoryBatch.concat([batch[[0]], batch[[0]]])


def test_row_roundtrip_and_with_token_fields(batch):
    again = TrajectoryBatch.from_rows(list(batch.rows()))
    for i in range(len(batch)):
        assert _eq(again.row(i), batch.row(i))
    adv = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    b2 = batch.with_token_fields(adv_mpo=adv)
    assert b2.row(1)["adv_mpo"] == [6.0, 7.0, 8.0]
    assert "adv_mpo" in b2.to_pandas().columns
    with pytest.raises(ValueError, match="adv: row 0: expected 6 values"):
        batch.with_token_fields(adv=[[1.0]] * 4)


def test_derived_turn_ids_match_given(batch):
    # row a has no turn_ids; deriving them from the mask gives the same as giving them explicitly
    r = rows()[0] | {"turn_ids": [0, 0, 0, 0, 1, 1]}
    given = TrajectoryBatch.from_rows([r])
    assert torch.equal(given.turn_ids, batch[0].turn_ids)


def test_empty_batch_and_no_action_rows():
    b = TrajectoryBatch.from_rows([])
    assert len(b) == 0 and b.mask.shape == (0, 0)
    r = dict(traj_id="x", group_id="g", prompt_ids=[1], response_ids=[4, 5], loss_mask=[0, 0], reward=0.0)
    b = TrajectoryBatch.from_rows([r])
    assert b.num_turns.tolist() == [0] and b.turns().empty and (b.token_rewards == 0).all()
    with pytest.raises(TrajectoryError, match="no action token"):
        TrajectoryBatch.from_rows([r | {"reward": 1.0}])


def _eq(a, b):
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if isinstance(x, list) and x and isinstance(x[0], float):
            if not np.allclose(np.asarray(x), np.asarray(y), equal_nan=True, rtol=1e-6):
                return False
        elif x != y:
            return False
    return True


def test_summary(batch):
    s = batch.summary()
    assert s["trajectories"] == 4 and s["groups"] == 2
    assert s["response_tokens"] == 15 and s["action_tokens"] == 10
    # turns per trajectory: a 2, b 2, c 1, d 1
    assert s["turns"] == pytest.approx({"n": 4, "mean": 1.5, "std": 0.5, "min": 1, "max": 2})
    assert s["reward_missing"] == 1


def test_from_columns_and_the_columns_accessor(batch):
    from mpo_viz.data.validate import columns_from_rows

    cols, problems = columns_from_rows(rows())
    b2 = TrajectoryBatch.from_columns(cols, {"values_source": "critic"}, problems=problems)
    assert [repr(b2.row(i)) for i in range(4)] == [repr(batch.row(i)) for i in range(4)]  # repr: NaN == NaN
    c = batch.columns
    np.testing.assert_array_equal(c.offsets, [0, 6, 9, 13, 15])  # response lengths 6, 3, 4, 2
    np.testing.assert_array_equal(batch.offsets, c.offsets)
    np.testing.assert_array_equal(c.tokens["loss_mask"], [1, 1, 0, 0, 1, 1, 1, 0, 1, 0, 1, 1, 0, 1, 1])
    np.testing.assert_array_equal(c.present["turn_ids"], [False, True, False, False])
    flat, off, pres = c.turn["turn_rewards"]
    np.testing.assert_array_equal(pres, [False, True, False, True])
    np.testing.assert_allclose(flat[off[1] : off[2]], [0.5, 0.25])
    np.testing.assert_array_equal(c.prompt[1], [0, 2, 3, 4, 4])
    # a bad row: collected with file/row/field named, the good rows kept
    bad = rows()
    bad[2]["loss_mask"] = [0, 2, 1, 0]
    cols, problems = columns_from_rows(bad, source="x.jsonl", lines=[1, 2, 3, 4])
    b3 = TrajectoryBatch.from_columns(cols, problems=problems, errors="collect")
    assert b3.traj_ids == ["a", "b", "d"]
    p = b3.rejected[0]
    assert (p.file, p.line, p.traj_id, p.field) == ("x.jsonl", 3, "c", "loss_mask")
    with pytest.raises(TrajectoryError, match="loss_mask"):
        TrajectoryBatch.from_columns(columns_from_rows(bad)[0])
