"""fit_critic on a pretrained trunk (a Hugging Face folder), early stopping on the held-out
explained variance, and the best evaluation's weights kept."""


import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import mpo_viz as mv
from mpo_viz.analysis import explained_variance
from mpo_viz.checks import OptionError
from mpo_viz.cli import main
from mpo_viz.envs import make_env
from mpo_viz.train.critic_fit import fit_critic, fit_targets, holdout_split, trunk_critic
from tests.models.model_helpers import make_instruct_folder

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def label_batch(n: int = 40, **extra) -> mv.TrajectoryBatch:
    """The outcome is written in the prompt (id 3 = win, 4 = loss): every return is 1 or 0."""
    return mv.TrajectoryBatch.from_rows([
        {"traj_id": f"t{i}", "group_id": f"g{i}", "prompt_ids": [1, 3 if i % 2 == 0 else 4],
         "response_ids": [5, 6, 7, 8, 9], "loss_mask": [1, 1, 0, 1, 1], "reward": float(i % 2 == 0), **extra}
        for i in range(n)])


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return make_instruct_folder(tmp_path_factory.mktemp("hf") / "model", make_env("search"), seed=3)


def test_fit_on_a_pretrained_trunk(hf_dir):
    res = fit_critic(label_batch(), trunk=hf_dir, steps=4, eval_every=2, progress=False)
    lm = AutoModelForCausalLM.from_pretrained(str(hf_dir))
    # the critic starts as the folder's trunk, weight for weight, with a fresh head; the fit then moved it
    start = trunk_critic(hf_dir, label_batch())
    for name, w in lm.model.state_dict().items():
        assert torch.equal(start.trunk.state_dict()[name], w), name
    assert not torch.equal(res.critic.trunk.embed_tokens.weight, lm.model.embed_tokens.weight)
    assert res.info["size"] == "trunk" and res.info["trunk"] == str(hf_dir)
    assert res.batch.meta["values_source"] == "fitted_critic" and res.batch.has("values")
    # the written values are that critic's (the output before each response token)
    seq = torch.tensor([[1, 3, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        want = res.critic(seq)[0, 1:6].numpy()
    np.testing.assert_allclose(res.batch.values[0, :5].numpy(), want, rtol=1e-5, atol=1e-6)


def test_a_trunk_with_the_wrong_vocabulary_or_tokenizer_is_refused(hf_dir):
    rows = [{"traj_id": f"t{i}", "group_id": "g", "prompt_ids": [1], "response_ids": [5, 5000], "loss_mask": [1, 1],
             "reward": float(i % 2)} for i in range(10)]
    with pytest.raises(OptionError, match=r"^trunk: expected a model whose vocabulary covers logs.parquet's token ids, "
                                          r"found id 5000 in logs.parquet but \d+ embedding rows in"):
        fit_critic(mv.TrajectoryBatch.from_rows(rows), trunk=hf_dir, steps=1, progress=False, source="logs.parquet")
    other = label_batch(10, response_tokens=["zz", "zz", "zz", "zz", "zz"])  # decoded by some other tokenizer
    with pytest.raises(OptionError, match=r"^trunk: expected the tokenizer that wrote batch, found .* decodes 5 of 5 "
                                          r"tokens of t0 to other text than its response_tokens"):
        fit_critic(other, trunk=hf_dir, steps=1, progress=False)
    with pytest.raises(OptionError, match="^trunk: expected a Hugging Face causal-LM folder"):
        fit_critic(label_batch(10), trunk=hf_dir.parent, steps=1, progress=False)


def test_fit_critic_trunk_from_the_shell(hf_dir, tmp_path, capsys):
    src, out = tmp_path / "logs.parquet", tmp_path / "fitted.parquet"
    mv.save(label_batch(), src)
    assert main(["fit-critic", str(src), "-o", str(out), "--trunk", str(hf_dir), "--steps", "2", "--target", "turn",
                 "-q"]) == 0
    cap = capsys.readouterr().out
    assert f"fitting a critic on the trunk of {hf_dir} to the turn returns of 40 trajectories" in cap
    assert mv.load(out).meta["critic_fit"]["trunk"] == str(hf_dir)
    assert mv.load(out).meta["critic_fit"]["num_threads"] == 1  # the default --threads
    assert main(["fit-critic", str(src), "-o", str(out), "--threads", "0"]) == 2
    assert "--threads: expected an integer >= 1, found 0" in capsys.readouterr().err
    assert main(["fit-critic", str(src), "-o", str(out), "--trunk", str(tmp_path / "nope")]) == 2
    assert "--trunk: expected a Hugging Face model folder, found no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):  # argparse refuses a target that is not one
        main(["fit-critic", str(src), "-o", str(out), "--target", "gae"])
    assert "argument --target: invalid choice: 'gae' (choose from 'mc', 'turn')" in capsys.readouterr().err


def test_early_stopping_keeps_the_best_evaluations_weights():
    # rewards drawn independently of the prompts: nothing to learn, so the held-out EV peaks by chance
    # early and the fit stops on patience (a learnable batch at lr 0.3 now climbs to EV 0.98 in 64 steps)
    r = np.random.default_rng(0).integers(0, 2, 40)
    b = mv.TrajectoryBatch.from_rows([
        {"traj_id": f"t{i}", "group_id": f"g{i}", "prompt_ids": [1, 10 + i % 30], "response_ids": [5, 6, 7, 8, 9],
         "loss_mask": [1, 1, 0, 1, 1], "reward": float(r[i])} for i in range(40)])
    kw = dict(steps=64, lr=0.3, batch_episodes=8, eval_every=4, holdout=0.25, progress=False)
    res = fit_critic(b, patience=3, **kw)
    fit = res.fit
    evs = [h["heldout_ev"] for h in fit.history]
    best = int(np.nanargmax(evs))
    assert fit.stop == "patience" and fit.steps == fit.history[best]["step"] + 3 * 4 < 64
    assert fit.kept_step == fit.best_step == fit.history[best]["step"] and fit.heldout_ev == fit.best_ev == evs[best]
    # the values written are those of the kept weights: their held-out EV, recomputed here, is the best one
    assert res.info["holdout_by"] == "group"  # 40 groups of one: whole groups held out
    train, held = holdout_split(len(b), 0.25, 0, b.field("group_id"))
    g = fit_targets(b, "mc")
    ev = explained_variance(g[held], res.batch.values[held].double(), b.mask[held])
    assert ev == pytest.approx(fit.best_ev, abs=1e-6)
    assert "the best held-out EV, kept" in fit.summary() and "stopped early" in fit.summary()
    assert res.info["kept_step"] == fit.best_step and res.info["patience"] == 3
    # --keep-last: the last weights, whatever their EV
    last = fit_critic(b, patience=3, keep_best=False, **kw).fit
    assert last.kept_step == last.steps and last.heldout_ev == evs[-1] and last.heldout_ev < last.best_ev
    with pytest.raises(OptionError, match="^patience: expected an integer >= 1"):
        fit_critic(b, patience=0, **kw)


def spread(b: mv.TrajectoryBatch, vocab: int) -> mv.TrajectoryBatch:
    """``b`` with its ids spread over ``0 .. vocab − 1`` (id·7919 mod vocab: injective for these)."""
    rows = []
    for r in b.rows():
        r = dict(r)
        for f in ("prompt_ids", "response_ids"):
            r[f] = [int(i) * 7919 % vocab for i in r[f]]
        rows.append(r)
    return mv.TrajectoryBatch.from_rows(rows)


def test_a_large_vocabulary_gets_embedding_rows_for_the_ids_used_only():
    from mpo_viz.models.critic import RemappedCritic
    from mpo_viz.train.critic_fit import COMPACT_MIN_VOCAB, compact_critic, vocab_critic

    b = spread(label_batch(12), 49152)
    used = sorted({int(i) for f in ("prompt_ids", "response_ids") for x in b.field(f) for i in x})
    c = compact_critic(b, seed=2)
    assert isinstance(c, RemappedCritic) and c.trunk.embed_tokens.num_embeddings == len(used) + 1 == 9
    # the reference: the same trunk over the whole vocabulary, the compact rows at the ids they stand for
    full = vocab_critic(49152, seed=2)
    state = {k: v for k, v in c.inner.trunk.state_dict().items() if k != "embed_tokens.weight"}
    full.trunk.load_state_dict(state, strict=False)
    full.head.load_state_dict(c.head.state_dict())
    with torch.no_grad():
        full.trunk.embed_tokens.weight[used] = c.trunk.embed_tokens.weight[: len(used)]
        seq = torch.tensor([[used[0], used[3], used[1], used[5]]])
        np.testing.assert_allclose(c(seq).numpy(), full(seq).numpy(), rtol=1e-5, atol=1e-6)
        # an id the batch never used (inside or past the table) reads the one "unseen" row
        assert c.rows(torch.tensor([used[0] + 1, 60000, used[2]])).tolist() == [8, 8, 2]
    # small or dense vocabularies stay as they were (the shipped sets' fits do not change)
    assert not isinstance(compact_critic(label_batch(12)), RemappedCritic)
    assert not isinstance(compact_critic(spread(label_batch(12), COMPACT_MIN_VOCAB)), RemappedCritic)
    # fit_critic uses it, and its critic takes the batch's own ids
    res = fit_critic(b, steps=2, holdout=0.25, progress=False)
    assert isinstance(res.critic, RemappedCritic)
    seq = torch.tensor([[*b.field("prompt_ids")[0], *b.field("response_ids")[0]]])
    with torch.no_grad():
        np.testing.assert_allclose(res.batch.values[0, :5].numpy(), res.critic(seq)[0, 1:6].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lengths", [(2, 9, 5, 1), (4, 4, 4), (7,)], ids=["ragged", "no padding", "one row"])
def test_causal_values_equal_the_masked_forward(lengths, hf_dir):
    from mpo_viz.train.critic_fit import causal_values, compact_critic
    from mpo_viz.train.update import forward_critic, make_micro, rows_of

    rng = np.random.default_rng(0)
    rows = [{"traj_id": f"t{i}", "group_id": "g", "prompt_ids": [int(x) for x in rng.integers(1, 300, 3)],
             "response_ids": [int(x) for x in rng.integers(1, 300, n)], "loss_mask": [1] * n, "reward": 1.0}
            for i, n in enumerate(lengths)]
    b = mv.TrajectoryBatch.from_rows(rows)
    r = rows_of(b)
    mb = make_micro(r, np.arange(len(b)), 0, "cpu")
    for critic in (compact_critic(b, seed=1), trunk_critic(hf_dir, b, seed=1)):
        with torch.no_grad():
            want, got = forward_critic(critic, mb), causal_values(critic, mb)
        m = mb.take(r.mask)
        np.testing.assert_allclose(got[m].numpy(), want[m].numpy(), rtol=1e-5, atol=1e-6)  # every real token


def test_the_fit_runs_on_num_threads_and_gives_the_count_back(monkeypatch):
    """fit_critic trains on ``num_threads`` torch threads (1 by default, as the trainer's runs) and
    the process has its own count again afterwards; None leaves the count alone."""
    import mpo_viz.train.critic_fit as CF

    seen = []
    real = CF.fit_values
    monkeypatch.setattr(CF, "fit_values", lambda *a, **k: (seen.append(torch.get_num_threads()), real(*a, **k))[1])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        res = fit_critic(label_batch(), steps=2, eval_every=1, progress=False)
        assert seen == [1] and torch.get_num_threads() == 2 and res.info["num_threads"] == 1
        fit_critic(label_batch(), steps=2, eval_every=1, progress=False, num_threads=None)
        assert seen == [1, 2] and torch.get_num_threads() == 2
        with pytest.raises(ValueError, match=r"^num_threads: expected an integer >= 1, found 0"):
            fit_critic(label_batch(), steps=2, progress=False, num_threads=0)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
