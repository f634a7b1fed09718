"""The fit loop's critic calls (train/critic_fit.py): the unmasked causal forward equals the masked one
on every real token, for a tiny critic and a pretrained trunk. (The fits themselves: tests/train/test_critic.py;
fit_critic: tests/train/test_fitted_critic.py.) A row longer than the window trains window by window:
the same outputs and loss, a backward truncated at the windows' edges."""

import numpy as np
import pytest
import torch

import mpo_viz as mv
from mpo_viz.checks import OptionError
from mpo_viz.losses import value_loss
from mpo_viz.models import compact_critic, trunk_critic
from mpo_viz.models.critic import vocab_critic
from mpo_viz.train.critic_fit import (
    causal_values,
    check_window,
    critic_outputs,
    embedding_grad_in_place,
    fit_values,
    mlp_in_slices,
    row_window,
    window_outputs,
    windowed_step,
)
from mpo_viz.train.update import forward_critic, make_micro, rows_of

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.mark.parametrize("lengths", [(2, 9, 5, 1), (4, 4, 4), (7,)], ids=["ragged", "no padding", "one row"])
def test_causal_values_equal_the_masked_forward(lengths, hf_dir):
    rng = np.random.default_rng(0)
    rows = [
        {
            "traj_id": f"t{i}",
            "group_id": "g",
            "prompt_ids": [int(x) for x in rng.integers(1, 300, 3)],
            "response_ids": [int(x) for x in rng.integers(1, 300, n)],
            "loss_mask": [1] * n,
            "reward": 1.0,
        }
        for i, n in enumerate(lengths)
    ]
    b = mv.TrajectoryBatch.from_rows(rows)
    r = rows_of(b)
    mb = make_micro(r, np.arange(len(b)), 0, "cpu")
    for critic in (compact_critic(b, seed=1), trunk_critic(hf_dir, b, seed=1)):
        with torch.no_grad():
            want, got = forward_critic(critic, mb), causal_values(critic, mb)
        m = mb.take(r.mask)
        np.testing.assert_allclose(got[m].numpy(), want[m].numpy(), rtol=1e-5, atol=1e-6)  # every real token


# ---------------------------------------------------------------------------------------------
# windowed training of long rows (critic_fit.window_outputs, windowed_step)


def _long_batch(lengths=(37,), prompt=5, seed=0) -> mv.TrajectoryBatch:
    rng = np.random.default_rng(seed)
    return mv.TrajectoryBatch.from_rows(
        [
            {
                "traj_id": f"t{i}",
                "group_id": "g",
                "prompt_ids": [int(x) for x in rng.integers(1, 300, prompt)],
                "response_ids": [int(x) for x in rng.integers(1, 300, n)],
                "loss_mask": [int(x) for x in rng.integers(0, 2, n)],
                "reward": 1.0,
            }
            for i, n in enumerate(lengths)
        ]
    )


@pytest.mark.parametrize("window", [1, 7, 16, 41, 42, 100], ids=lambda w: f"window {w}")
def test_windowed_outputs_equal_the_whole_rows_forward(window, hf_dir):
    """42 positions cut into windows of every kind (one token, ragged last window, exactly one,
    longer than the row): the concatenated outputs are the whole forward's, for a tiny critic and a
    pretrained trunk."""
    b = _long_batch()
    ids = torch.tensor([list(b.field("prompt_ids")[0]) + list(b.field("response_ids")[0])])
    for critic in (compact_critic(b, seed=1), trunk_critic(hf_dir, b, seed=1)):
        with torch.no_grad():
            want = critic(input_ids=ids)
            got = torch.cat([out for _, out in window_outputs(critic, ids, window)], dim=1)
        assert got.shape == want.shape == (1, 42)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def _grads(critic) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("window", [4, 13, 42], ids=lambda w: f"window {w}")
def test_the_windowed_step_is_the_whole_rows_loss_with_a_truncated_backward(window):
    """The windows' losses sum to the whole row's ½·Σ m (V − G)² / scale. What no later position
    reads — the value head, the last layer's MLP and the final norm — gets the whole row's gradient
    exactly; the attention projections get the truncated one (different unless one window holds the
    row: window 42 covers all 42 positions and every gradient is the whole row's)."""

    b = _long_batch()
    r = rows_of(b)
    mb = make_micro(r, np.array([0]), 0, "cpu")
    g = torch.linspace(-1, 1, mb.Lb)[None]
    m = mb.take(r.mask)
    critic = compact_critic(b, seed=3)
    loss, _ = value_loss(causal_values(critic, mb), None, g, m, clip=None, scale=11.0)
    loss.backward()
    whole = _grads(critic)
    critic.zero_grad(set_to_none=True)
    got = windowed_step(critic, mb, g, m, scale=11.0, window=window)
    windowed = _grads(critic)
    # the loss by hand: ½ Σ_t m_t (V_t − G_t)² / 11 with V read at position P + t − 1
    with torch.no_grad():
        v = critic(input_ids=mb.ids)[0, mb.pos[0]]
    by_hand = float((0.5 * ((v - g[0]) ** 2) * m[0]).sum() / 11.0)
    assert got == pytest.approx(float(loss.detach()), rel=1e-5) and got == pytest.approx(by_hand, rel=1e-5)
    exact = [n for n in whole if n.split(".")[-2] == "head" or ".layers.3.mlp" in n or n.endswith("trunk.norm.weight")]
    assert len(exact) == 6  # head weight and bias, the last MLP's three projections, the final norm
    for n in exact:
        torch.testing.assert_close(windowed[n], whole[n], rtol=1e-4, atol=1e-6)
    q0 = "trunk.layers.0.self_attn.q_proj.weight"
    if window >= mb.ids.shape[1]:
        for n in whole:
            torch.testing.assert_close(windowed[n], whole[n], rtol=1e-4, atol=1e-6)
    else:
        assert not torch.allclose(windowed[q0], whole[q0], rtol=1e-3, atol=1e-6)


def test_a_fit_with_a_window_longer_than_every_row_is_the_whole_fit():
    """Rows up to the window train whole: the fit (its loss curve, held-out EV and values) is the
    window=None fit exactly; a window shorter than the rows fits on, its truncated gradient taking it
    elsewhere after the first step."""
    b = _long_batch(lengths=(30, 12, 25, 40, 8, 33, 19, 27), seed=4)
    targets = torch.zeros(len(b), 40, dtype=torch.float64)
    targets[:, :] = torch.linspace(0, 1, 40)
    fits = {}
    for w in (None, 45, 10):
        critic = compact_critic(b, seed=2)
        fits[w] = fit_values(
            critic, b, targets, steps=6, batch_episodes=4, gate=None, eval_every=3, all_values=True, window=w
        )
    assert fits[45].history == fits[None].history and fits[45].heldout_ev == fits[None].heldout_ev
    torch.testing.assert_close(fits[45].values, fits[None].values, rtol=0, atol=0)
    assert fits[10].heldout_ev != fits[None].heldout_ev and np.isfinite(fits[10].heldout_ev)  # they part
    # the first step's loss (from the same weights) is the whole rows' through the windowed path, rows
    # above the window alone and the shorter ones micro-batched together
    first = {
        w: fit_values(
            compact_critic(b, seed=2), b, targets, steps=1, batch_episodes=8, gate=None, eval_every=1, window=w
        )
        for w in (None, 26, 0)
    }
    assert first[26].history[1]["loss"] == pytest.approx(first[None].history[1]["loss"], rel=1e-5)
    assert first[0].history == first[None].history  # 0: every row whole, as None
    for bad in (-3, 2.5, True):
        with pytest.raises(OptionError, match=r"window: expected an integer >= 1, or 0 or None"):
            fit_values(compact_critic(b, seed=2), b, targets, steps=1, batch_episodes=4, window=bad)
    assert check_window(np.int64(12)) == 12 and check_window(0) is None


def test_the_fused_optimizer_takes_the_default_ones_steps_to_float_rounding():
    """fused=True (fit_critic's AdamW kernel, without the default's temporaries) moves the weights as
    the default implementation does: equal at step 0, within float rounding after the first steps."""
    b = _long_batch(lengths=(30, 12, 25, 40, 8, 33, 19, 27), seed=4)
    targets = torch.zeros(len(b), 40, dtype=torch.float64)
    targets[:, :] = torch.linspace(0, 1, 40)
    weights, fits = {}, {}
    for fused in (False, True):
        critic = compact_critic(b, seed=2)
        before = [p.detach().clone() for p in critic.parameters()]
        fits[fused] = fit_values(critic, b, targets, steps=2, batch_episodes=4, gate=None, eval_every=1, fused=fused)
        weights[fused] = [p.detach() for p in critic.parameters()]
    moved = max(float((w - w0).abs().max()) for w, w0 in zip(weights[False], before))
    assert moved > 1e-4  # the steps moved the weights (lr 1e-3)
    for a, c in zip(weights[False], weights[True]):
        torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-6)
    assert fits[True].heldout_ev == pytest.approx(fits[False].heldout_ev, abs=1e-5)


def test_a_long_rows_window_keeps_its_attention_pairs_bounded():
    """min(window, max(64, 2,000,000 // T)): the window until T·window passes 2M pairs, then shorter,
    never below 64 tokens."""
    assert [row_window(T, 1024) for T in (1000, 1953, 1954, 15000, 31250, 10**6)] == [1024, 1024, 1023, 133, 64, 64]
    assert row_window(15000, 100) == 100 and row_window(5, 1024) == 1024


def test_a_value_fit_reads_rows_without_their_optional_fields():
    """``rows_of(fields=False)`` (what fit_values and the values pass read): the same ids, lengths,
    mask and turn ids; log-probs and values left out, where ``rows_of`` pads each to ``(B, L)``."""
    b = _long_batch(lengths=(9, 4, 12))
    B, L = b.mask.shape
    b = b.with_token_fields(
        old_logprobs=-torch.ones(B, L), values=torch.full((B, L), 0.5), ref_logprobs=torch.zeros(B, L)
    )
    full, lean = rows_of(b), rows_of(b, fields=False)
    assert full.old_logp is not None and full.values is not None and full.ref_logp is not None
    assert (lean.old_logp, lean.values, lean.ref_logp, lean.rollout_logp, lean.advantages) == (None,) * 5
    assert all(torch.equal(x, y) for x, y in zip(full.seqs, lean.seqs))
    assert torch.equal(full.mask, lean.mask) and torch.equal(full.turn_ids, lean.turn_ids)
    assert full.prompt_len.tolist() == lean.prompt_len.tolist() == [5, 5, 5]
    assert full.resp_len.tolist() == lean.resp_len.tolist() == [9, 4, 12]


def test_the_embedding_gradient_added_in_place_is_the_default_backwards():
    """embedding_grad_in_place (the windowed step's backward): ``grad[id] += ∂L/∂e`` for each
    position, into the gradient already there: repeated ids sum, the padding id (0) gets nothing, as
    the default backward (which builds a dense (vocab, H) gradient for each backward). Every other
    parameter's gradient is unchanged; a frozen embedding and a critic of another kind are left alone;
    the hook is gone after the block."""
    ids = torch.tensor([[3, 7, 3, 0, 9, 7, 7, 1]])  # repeats, and the padding id at position 3
    pos = torch.arange(8)[None]

    def two_backwards(critic):
        for a, b in ((0, 5), (5, 8)):  # two windows' backwards accumulate into one gradient
            out = critic(input_ids=ids[:, a:b], position_ids=pos[:, a:b])
            (out * torch.linspace(-1, 2, b - a)).sum().backward()
        return _grads(critic)

    want = two_backwards(vocab_critic(12, seed=5).train())
    critic = vocab_critic(12, seed=5).train()
    with embedding_grad_in_place(critic):
        assert critic.trunk.embed_tokens(ids).is_leaf  # the lookup's graph is cut: the hook adds the gradient
        got = two_backwards(critic)
    assert not critic.trunk.embed_tokens(ids).is_leaf
    assert set(got) == set(want)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-6, atol=1e-7)
    emb = "trunk.embed_tokens.weight"
    assert float(want[emb][0].abs().sum()) == 0.0 and float(want[emb][3].abs().sum()) > 0  # padding id: none
    assert float(want[emb][2].abs().sum()) == 0.0  # an id no position reads: none
    assert not critic.trunk.embed_tokens._forward_hooks  # removed after the block
    frozen = vocab_critic(12, seed=5).train()
    frozen.trunk.embed_tokens.weight.requires_grad_(False)
    with embedding_grad_in_place(frozen):
        assert not frozen.trunk.embed_tokens._forward_hooks  # nothing to do
        two_backwards(frozen)
    assert frozen.trunk.embed_tokens.weight.grad is None
    with embedding_grad_in_place(torch.nn.Linear(2, 1)):  # no trunk: a no-op
        pass


def test_mlps_in_slices_give_the_whole_forward_a_slice_at_a_time(hf_dir):
    """mlp_in_slices (every no-gradient pass of critic_outputs): each MLP reads at most ``tokens``
    positions (rows × positions) at a time, slices along the sequence with a shorter last one, and
    the outputs are the whole forward's to float rounding, for the tiny Llama critic and a pretrained
    trunk. A forward with gradient, and one that fits a slice, run whole; the MLPs' own forward comes
    back after the block (one set on the instance before it included)."""
    ids = torch.randint(1, 300, (2, 23), generator=torch.Generator().manual_seed(0))
    b = _long_batch((30, 11, 18))
    for critic in (vocab_critic(300, seed=2).eval(), trunk_critic(hf_dir, b, seed=1).eval()):
        mlps = [m for n, m in critic.named_modules() if n.endswith(".mlp")]
        assert mlps
        seen: list[tuple[int, int]] = []
        spy = mlps[0].down_proj if hasattr(mlps[0], "down_proj") else mlps[0].c_proj
        handle = spy.register_forward_hook(lambda mod, args, out, seen=seen: seen.append(tuple(args[0].shape[:2])))
        with torch.no_grad():
            want = critic(input_ids=ids)
            assert seen == [(2, 23)]
            seen.clear()
            with mlp_in_slices(critic, tokens=7):  # 2 rows: 3 positions a slice
                got = critic(input_ids=ids)
            assert seen == [(2, 3)] * 7 + [(2, 2)]
            seen.clear()
            with mlp_in_slices(critic, tokens=46):  # the whole input fits one slice
                critic(input_ids=ids)
            assert seen == [(2, 23)]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        seen.clear()
        with mlp_in_slices(critic, tokens=7):
            critic(input_ids=ids).sum().backward()  # with gradient: whole
        assert seen == [(2, 23)]
        handle.remove()
        assert all("forward" not in m.__dict__ for m in mlps)
    critic = vocab_critic(300, seed=2).eval()
    mine = critic.trunk.layers[0].mlp.forward
    critic.trunk.layers[0].mlp.forward = mine  # a forward already set on the instance
    with mlp_in_slices(critic, tokens=7):
        assert critic.trunk.layers[0].mlp.forward is not mine
    assert critic.trunk.layers[0].mlp.forward is mine
    with pytest.raises(ValueError, match="tokens >= 1"):
        with mlp_in_slices(critic, tokens=0):
            pass


def test_an_mlp_that_is_not_one_tensor_in_one_out_runs_whole():
    """mlp_in_slices slices only an MLP called with its one (b, T, H) tensor that returns a tensor
    of the same rows and positions: one called with more (Bloom's residual), or returning a tuple
    (a mixture of experts' router scores), runs whole, with the same result as without the block."""

    class Residual(torch.nn.Module):
        def forward(self, x, residual):
            return x * 2 + residual

    class Routed(torch.nn.Module):
        def forward(self, x):
            return x + 1, x.sum(-1)

    class Trunk(torch.nn.Module):
        def __init__(self, mlp):
            super().__init__()
            self.mlp = mlp

    x = torch.randn(2, 9, 4)
    with torch.no_grad():
        res, routed = Trunk(Residual()), Trunk(Routed())
        want_res, want_routed = res.mlp(x, x), routed.mlp(x)
        with mlp_in_slices(res, tokens=2), mlp_in_slices(routed, tokens=2):
            got_res, got_routed = res.mlp(x, x), routed.mlp(x)
            got_kw = res.mlp(x, residual=x)
    assert torch.equal(got_res, want_res) and torch.equal(got_kw, want_res)
    assert torch.equal(got_routed[0], want_routed[0]) and torch.equal(got_routed[1], want_routed[1])


def test_critic_outputs_of_long_rows_are_the_plain_forwards(monkeypatch):
    """critic_outputs (the held-out evaluations and every row's values) slices a long row's MLPs:
    the values equal the plain causal forward's on every response token, 0 past each response."""
    import mpo_viz.train.critic_fit as cf

    b = _long_batch((40, 3, 25), prompt=6, seed=3)
    r = rows_of(b)
    critic = vocab_critic(300, seed=4).eval()
    mb = make_micro(r, np.arange(len(b)), 0, "cpu")
    with torch.no_grad():
        want = causal_values(critic, mb)
    calls: list[int] = []
    real = cf.mlp_in_slices

    def spy(c, tokens):
        calls.append(tokens)
        return real(c, tokens)

    monkeypatch.setattr(cf, "MLP_SLICE_TOKENS", 5)  # slices of 5 tokens: many, with a short last one
    monkeypatch.setattr(cf, "mlp_in_slices", spy)
    got = critic_outputs(critic, r, np.arange(len(b)), pad_id=0, device="cpu")
    assert calls == [5]
    L = got.shape[1]
    inside = torch.arange(L)[None] < torch.from_numpy(r.resp_len)[:, None]
    here = inside[:, : mb.Lb]
    torch.testing.assert_close(got[:, : mb.Lb][here], want[here], rtol=1e-5, atol=1e-6)
    assert float(got[~inside].abs().sum()) == 0.0


def test_the_best_weights_wait_in_a_file_and_come_back_bit_for_bit(tmp_path, monkeypatch):
    """_Best (keep_best) writes the best evaluation's weights to a temporary file, not a copy in
    memory: a worse evaluation leaves the file alone, a better one rewrites it, restore() puts those
    weights back exactly, and close() removes the file (keep=False writes none)."""
    import tempfile

    from mpo_viz.train.critic_fit import _Best

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    params = [torch.randn(3, 4, requires_grad=True), torch.randn(5, requires_grad=True)]
    first = [p.detach().clone() for p in params]
    best = _Best(0.1, params, keep=True)
    assert len(list(tmp_path.glob("mpo_viz_best_*/best.pt"))) == 1
    with torch.no_grad():
        params[0].add_(1.0)
    best.offer(0.05, 4)  # worse: the file keeps step 0's weights
    assert (best.step, best.stale) == (0, 1)
    best.restore()
    assert all(torch.equal(p, w) for p, w in zip(params, first))
    with torch.no_grad():
        params[1].mul_(-2.0)
    second = [p.detach().clone() for p in params]
    best.offer(0.2, 8)  # better: rewritten
    with torch.no_grad():
        params[0].add_(3.0)
    best.restore()
    assert (best.step, best.ev) == (8, 0.2) and all(torch.equal(p, w) for p, w in zip(params, second))
    best.close()
    assert list(tmp_path.iterdir()) == []
    _Best(0.1, params, keep=False).offer(0.3, 1)
    assert list(tmp_path.iterdir()) == []


def test_the_best_weights_stay_in_memory_where_no_file_can_be_written(monkeypatch):
    """A temporary folder that cannot be written (full, read-only) does not stop the fit: _Best warns
    once and keeps its copy in memory, and restore() still gives the best weights back exactly."""
    import mpo_viz.train.critic_fit as cf

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cf.torch, "save", full)
    params = [torch.randn(4, requires_grad=True)]
    with pytest.warns(RuntimeWarning, match="could not write the best weights .*No space left.*keeping them in memory"):
        best = cf._Best(0.1, params, keep=True)
    with torch.no_grad():
        params[0].mul_(3.0)
    second = params[0].detach().clone()
    best.offer(0.5, 2)  # no second warning: the copy in memory is updated in place
    with torch.no_grad():
        params[0].zero_()
    best.restore()
    assert torch.equal(params[0], second)
    best.close()
