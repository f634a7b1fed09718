"""verl adapter: hand-computed rows, the value alignment, the GAE cross-check against a loop written
the way verl's compute_gae_advantage_return is, reward moves, file loading and refusals."""

import pickle
import types

import numpy as np
import pytest
import torch

from mpo_viz import TrajectoryError
from mpo_viz.adapters import from_verl
from mpo_viz.advantages import gae


def tiny():
    """Two rows, P = 3 (row 0 left-padded by one), R = 8 (right-padded). Row 0: turn of 2, tool reply
    of 2, turn of 2; its score (1.0) sits on its last action token. Row 1: turn of 3, tool reply of 1
    carrying 0.5 (an observation token), turn of 1 with the outcome 1.0."""
    prompts = torch.tensor([[0, 5, 6], [7, 8, 9]])
    responses = torch.tensor([[10, 11, 20, 21, 12, 13, 0, 0], [14, 15, 16, 22, 17, 0, 0, 0]])
    rmask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0, 0, 0]])
    attn = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]])
    scores = torch.zeros(2, 8)
    scores[0, 5] = 1.0
    scores[1, 3] = 0.5
    scores[1, 4] = 1.0
    values = torch.arange(16, dtype=torch.float32).reshape(2, 8) / 10
    return dict(
        prompts=prompts,
        responses=responses,
        response_mask=rmask,
        attention_mask=attn,
        token_level_scores=scores,
        values=values,
        old_log_probs=-values,
        uid=["a", "a"],
        input_ids=torch.cat([prompts, responses], 1),
        data_source=["calc", "calc"],
    )


def test_hand_computed_rows():
    b, rep = from_verl(tiny())
    r0, r1 = b.row(0), b.row(1)
    assert r0["traj_id"] == "a:0" and r0["group_id"] == "a" and r1["traj_id"] == "a:1"
    assert r0["prompt_ids"] == [5, 6] and r1["prompt_ids"] == [7, 8, 9]  # left padding gone
    assert r0["response_ids"] == [10, 11, 20, 21, 12, 13] and r1["response_ids"] == [14, 15, 16, 22, 17]
    assert r0["loss_mask"] == [1, 1, 0, 0, 1, 1] and r0["turn_ids"] == [0, 0, 0, 0, 1, 1]
    assert r1["turn_ids"] == [0, 0, 0, 0, 1]
    assert r0["token_rewards"] == [0, 0, 0, 0, 0, 1.0] and r0["reward"] == 1.0
    # row 1: the 0.5 on the tool reply (position 3) moves to the last action token before it (position 2)
    assert r1["token_rewards"] == [0, 0, 0.5, 0, 1.0] and r1["reward"] == 1.5
    assert np.allclose(r1["values"], [0.8, 0.9, 1.0, 1.1, 1.2]) and np.allclose(
        r1["old_logprobs"], [-0.8, -0.9, -1.0, -1.1, -1.2]
    )
    assert r0["extra_json"] == '{"data_source":"calc"}'
    assert rep.rows_in == 2 and rep.trajectories == 2 and rep.rewards_moved == 1
    assert set(rep.fields_dropped) == {"attention_mask", "input_ids"}
    assert b.meta["source_framework"] == "verl" and b.meta["values_source"] == "critic"


def test_obs_reward_error_refuses_the_row():
    with pytest.raises(
        TrajectoryError,
        match=r"row 1, traj_id='a:1': field 'token_level_scores': expected rewards on "
        r"action tokens only \(obs_reward='error'\), found 0.5 on observation token 3",
    ):
        from_verl(tiny(), obs_reward="error")
    b, rep = from_verl(tiny(), obs_reward="error", errors="collect")
    assert b.traj_ids == ["a:0"] and len(b.rejected) == 1 and rep.rejected == b.rejected


def test_values_alignment():
    """verl's critic output at sequence position P + t - 1 is the value of response token t
    (dp_critic: values[:, -R - 1 : -1]); v1 means the same: the estimate before token t."""
    d = tiny()
    P, R = 3, 8
    full = torch.randn(2, P + R, generator=torch.Generator().manual_seed(0))
    d["values"] = full[:, -R - 1 : -1] * d["response_mask"]
    b, _ = from_verl(d)
    for i in range(2):
        v = np.asarray(b.row(i)["values"])
        m = np.asarray(b.row(i)["loss_mask"]) == 1
        t = np.flatnonzero(m)
        assert np.allclose(v[t], full[i, P + t - 1].numpy())
    # the first token of turn 1 (row 0, position 4) gets the critic's output on the tool reply's last
    # token (position P + 3): the value of the state after the observation, V(s_1)
    turns = b.turns()
    assert np.isclose(
        turns.loc[(turns.traj_id == "a:0") & (turns.turn == 1), "value_first"].item(), full[0, P + 3].item()
    )


def verl_gae(r, v, m, gamma, lam):
    """GAE as verl's compute_gae_advantage_return computes it (loop over t backwards, values and
    TD errors skipped on observation tokens, then masked_whiten with the unbiased variance)."""
    nextvalues, lastgaelam, rev = 0, 0, []
    for t in reversed(range(r.shape[-1])):
        delta = r[:, t] + gamma * nextvalues - v[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = v[:, t] * m[:, t] + (1 - m[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * m[:, t] + (1 - m[:, t]) * lastgaelam
        rev.append(lastgaelam)
    adv = torch.stack(rev[::-1], dim=1)
    returns = adv + v
    n = m.sum()
    mean = (adv * m).sum() / (n + 1e-8)
    var = ((adv - mean) ** 2 * m).sum() / (n + 1e-8) * n / (n - 1)
    return (adv - mean) * torch.rsqrt(var + 1e-8), returns


def multi_turn_batch(seed=0, obs_rewards=False):
    """Four padded multi-turn rows with random critic values and rewards at turn ends (action tokens)."""
    g = torch.Generator().manual_seed(seed)
    masks = [[1, 1, 0, 0, 0, 1, 1, 1, 0, 0], [1, 0, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1], [1, 1, 0, 1, 0, 0, 1, 1, 0]]
    B, R, P = 4, 10, 4
    rm = torch.zeros(B, R, dtype=torch.long)
    attn = torch.zeros(B, P + R, dtype=torch.long)
    attn[:, :P] = 1
    attn[1, 0] = 0
    scores = torch.zeros(B, R, dtype=torch.float64)
    for i, m in enumerate(masks):
        rm[i, : len(m)] = torch.tensor(m)
        attn[i, P : P + len(m)] = 1
        ends = [t for t in range(len(m)) if m[t] and (t + 1 == len(m) or not m[t + 1])]
        for t in ends:
            scores[i, t] = float(torch.rand(1, generator=g)) - 0.3
        if obs_rewards and not m[-1]:
            scores[i, len(m) - 1] = 1.0  # the score on the last valid token, a tool reply
    values = (torch.rand(B, R, generator=g) * rm).to(torch.float32)
    return dict(
        prompts=torch.randint(1, 50, (B, P), generator=g),
        responses=torch.randint(1, 50, (B, R), generator=g),
        response_mask=rm,
        attention_mask=attn,
        token_level_rewards=scores.to(torch.float32),
        values=values,
        uid=["g0", "g0", "g1", "g1"],
    )


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)])
def test_gae_cross_check_with_verl(gamma, lam):
    d = multi_turn_batch()
    m = d["response_mask"].to(torch.float64)
    want_adv, want_ret = verl_gae(d["token_level_rewards"].double(), d["values"].double(), m, gamma, lam)
    d["advantages"], d["returns"] = want_adv.float(), want_ret.float()  # what verl logs
    b, rep = from_verl(d)
    assert rep.rewards_moved == 0
    adv, ret = gae(
        b.padded("rewards", torch.float64), b.padded("values", torch.float64), b.mask, gamma=gamma, lam=lam, whiten=True
    )
    act = b.mask.bool()
    L = b.mask.shape[1]
    assert torch.allclose(adv[act], want_adv[:, :L][act], atol=1e-6)
    assert torch.allclose(ret[act], want_ret[:, :L][act], atol=1e-6)
    # the logged advantages were carried over as they were
    assert torch.allclose(b.padded("advantages")[act], want_adv[:, :L][act].float())


def test_verl_gae_drops_rewards_on_observations_and_the_move_keeps_them():
    d = multi_turn_batch(seed=1, obs_rewards=True)
    r, v, m = d["token_level_rewards"].double(), d["values"].double(), d["response_mask"].double()
    on_obs = (r != 0) & (m == 0)
    assert on_obs.sum() == 2
    # verl's own loop ignores a reward on an observation token: same result as without it
    assert torch.allclose(verl_gae(r, v, m, 1.0, 1.0)[0], verl_gae(r * ~on_obs, v, m, 1.0, 1.0)[0])
    b, rep = from_verl(d)
    assert rep.rewards_moved == 2
    assert torch.allclose(b.padded("rewards", torch.float64).sum(1), r.sum(1))  # nothing lost
    moved = b.padded("rewards", torch.float64)
    L = moved.shape[1]
    adv, _ = gae(moved, b.padded("values", torch.float64), b.mask, whiten=True)
    act = b.mask.bool()
    want, _ = verl_gae(torch.nn.functional.pad(moved, (0, 10 - L)), v, m, 1.0, 1.0)
    assert torch.allclose(adv[act], want[:, :L][act], atol=1e-6)


def test_files_weights_only_and_trust(tmp_path):
    d = tiny()
    torch.save(d, tmp_path / "batch.pt")
    b, _ = from_verl(tmp_path / "batch.pt")
    assert b.row(1)["token_rewards"] == [0, 0, 0.5, 0, 1.0]
    # nested like a DataProto: batch / non_tensor_batch / meta_info
    nested = {
        "batch": {k: v for k, v in d.items() if torch.is_tensor(v)},
        "non_tensor_batch": {"uid": d["uid"]},
        "meta_info": {"global_steps": 7},
    }
    torch.save(nested, tmp_path / "nested.pt")
    b2, _ = from_verl(tmp_path / "nested.pt")
    assert b2.field("step") == [7, 7] and b2.row(0)["response_ids"] == b.row(0)["response_ids"]
    nested["non_tensor_batch"] = {}  # no uid: ids from the step and the row, each row its own group
    torch.save(nested, tmp_path / "nouid.pt")
    assert from_verl(tmp_path / "nouid.pt")[0].traj_ids == ["step7/row0", "step7/row1"]
    # numpy arrays inside need unpickling: refused without trust, with a pointer to --trust
    d2 = dict(d, uid=np.array(["a", "a"], dtype=object))
    torch.save(d2, tmp_path / "np.pt")
    with pytest.raises(
        ValueError, match=r"np.pt: expected a torch.save'd dict of tensors.*pass trust=True \(--trust\)"
    ):
        from_verl(tmp_path / "np.pt")
    b3, _ = from_verl(tmp_path / "np.pt", trust=True)
    assert b3.traj_ids == ["a:0", "a:1"]
    # a pickled DataProto-like object (batch + non_tensor_batch attributes): only with trust
    proto = types.SimpleNamespace(
        batch={k: v for k, v in d.items() if torch.is_tensor(v)},
        non_tensor_batch={"uid": np.array(["a", "b"], dtype=object)},
        meta_info={},
    )
    with open(tmp_path / "proto.pkl", "wb") as fh:
        pickle.dump(proto, fh)
    with pytest.raises(ValueError, match="trust"):
        from_verl(tmp_path / "proto.pkl")
    b4, _ = from_verl(tmp_path / "proto.pkl", trust=True)
    assert b4.group_ids == ["a", "b"]


@pytest.mark.parametrize(
    "change,field,found",
    [
        (lambda d: d.pop("responses"), "responses", "no 'responses'"),
        (lambda d: d.update(values=torch.zeros(2, 7)), "values", "shape (2, 7)"),
        (lambda d: (d.pop("response_mask"), d.pop("attention_mask")), "response_mask", "neither"),
        (lambda d: d.update(response_mask=d["response_mask"] * 2), "response_mask", "2 at row 0, position 0"),
    ],
)
def test_layout_errors_name_field_and_layout(tmp_path, change, field, found):
    d = tiny()
    change(d)
    torch.save(d, tmp_path / "bad.pt")
    with pytest.raises(TrajectoryError) as e:
        from_verl(tmp_path / "bad.pt", errors="collect")  # a wrong layout is raised even when collecting
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'bad.pt'}: field {field!r}: expected verl layout: ") and found in msg


def test_nothing_in_the_padding_is_lost():
    d = tiny()
    d["response_mask"][1, 6] = 1  # a stray 1 in the padding (attention 0 there)
    d["token_level_scores"][1, 6] = 2.0  # and a reward on it
    b, rep = from_verl(d)
    r1 = b.row(1)
    assert r1["response_ids"] == [14, 15, 16, 22, 17] and r1["loss_mask"] == [1, 1, 1, 0, 1]
    assert r1["token_rewards"] == [0, 0, 0.5, 0, 3.0] and r1["reward"] == 3.5 and rep.rewards_moved == 2


def big_batch(B=150, P=4, R=300, seed=0):
    """``B`` rows of random multi-turn responses (more than two blocks of BLOCK_ROWS rows), ragged
    prompts and responses, an outcome on each row's last action token and one on an observation."""
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(1, P + 1, (B,), generator=g)
    rlen = torch.randint(R // 3, R + 1, (B,), generator=g)
    pos_r, pos_p = torch.arange(R)[None], torch.arange(P)[None]
    live = pos_r < rlen[:, None]
    rmask = ((torch.randint(0, 4, (B, R), generator=g) > 0) & live).long()
    rmask[:, 0] = 1
    scores = torch.zeros(B, R)
    last = (rmask * pos_r).argmax(1)
    scores[torch.arange(B), last] = torch.rand(B, generator=g)
    scores[5, 1] += 0.25 * (1 - rmask[5, 1])  # a reward on an observation token, when token 1 is one
    attn = torch.cat([pos_p >= P - plen[:, None], live], 1).long()
    values = torch.rand(B, R, generator=g) * rmask
    return dict(
        prompts=torch.randint(1, 1000, (B, P), generator=g) * (pos_p >= P - plen[:, None]),
        responses=torch.randint(1, 1000, (B, R), generator=g) * live,
        response_mask=rmask,
        attention_mask=attn,
        token_level_rewards=scores,
        values=values,
        old_log_probs=-values,
        ref_log_prob=(-values).to(torch.bfloat16),  # converted on reading: a copy, never given back
        uid=[f"g{i // 8}" for i in range(B)],
    )


def test_a_mapped_file_converts_block_by_block_as_in_memory(tmp_path, monkeypatch):
    """A batch file of more rows than a block (read memory-mapped, each block's pages given back once
    converted) gives the same rows as the same batch converted from memory — a bf16 field (a
    converted copy, not a view of the file) included — and a bad mask entry in a later block is named
    by its row and position."""
    from mpo_viz.adapters import verl

    d = big_batch()
    assert len(d["uid"]) > 2 * verl.BLOCK_ROWS
    torch.save(d, tmp_path / "big.pt")
    given: list[int] = []
    real = verl.drop_mapped_pages
    monkeypatch.setattr(verl, "drop_mapped_pages", lambda a, maps: given.append(real(a, maps)) or given[-1])
    want, rep_w = from_verl(dict(d))
    assert given == []  # a batch in memory: nothing is a mapping
    got, rep_g = from_verl(tmp_path / "big.pt")
    assert sum(given) > 100_000  # the file's pages were given back as the blocks were read
    assert len(got) == len(want) == 150
    for i in range(len(want)):
        assert got.row(i) == want.row(i)
    assert rep_g.rewards_moved == rep_w.rewards_moved
    np.testing.assert_allclose(  # the bf16 log-probs arrive as the file holds them
        np.concatenate([np.asarray(got.row(i)["ref_logprobs"]) for i in (0, 149)]),
        np.concatenate([d["ref_log_prob"][i, : int(d["attention_mask"][i, 4:].sum())].float() for i in (0, 149)]),
    )
    bad = dict(d, response_mask=d["response_mask"].clone())
    bad["response_mask"][140, 7] = 3
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(TrajectoryError, match="3 at row 140, position 7"):
        from_verl(tmp_path / "bad.pt")


def test_pages_of_a_file_mapping_are_given_back_and_read_again(tmp_path):
    """drop_mapped_pages: a view of a memory-mapped file gives its whole pages back (the bytes are
    counted) and reads the same numbers after; memory that is not a mapping of the file is left alone."""
    from mpo_viz.data.io import drop_mapped_pages, file_mappings

    x = torch.arange(4 * 65536, dtype=torch.float32).reshape(4, 65536)  # rows of 256 kB
    torch.save({"x": x}, tmp_path / "x.pt")
    y = torch.load(tmp_path / "x.pt", mmap=True, weights_only=True)["x"].numpy()
    maps = file_mappings(tmp_path / "x.pt")
    assert maps and any(lo <= y.ctypes.data < hi for lo, hi in maps)
    assert float(y[1:3].sum()) == float(x[1:3].sum())  # read: resident
    assert drop_mapped_pages(y[1:3], maps) == 0  # writable: no promise that no one wrote to it
    y.setflags(write=False)
    given = drop_mapped_pages(y[1:3], maps)
    assert 0 < given <= y[1:3].nbytes and given % 4096 == 0
    np.testing.assert_array_equal(y, x.numpy())  # read again from the file
    assert drop_mapped_pages(y[:, ::2], maps) == 0  # not contiguous
    z = x.numpy().copy()
    z.setflags(write=False)
    assert drop_mapped_pages(z[1:3], maps) == 0  # anonymous memory: never dropped
    np.testing.assert_array_equal(z, x.numpy())
    assert file_mappings(tmp_path / "not-mapped.pt") == []
