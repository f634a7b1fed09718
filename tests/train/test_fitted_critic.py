"""fit_critic (train/fitted_critic.py): values for logs that carry none — what the fit can learn and
records, the targets, cut rows' bootstrap values, refusals, the shell command, a pretrained trunk,
early stopping with the best evaluation's weights kept, and the threads it runs on."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import mpo_viz as mv
import mpo_viz.train.fitted_critic as fc
from mpo_viz.analysis import explained_variance
from mpo_viz.checks import OptionError
from mpo_viz.cli import main
from mpo_viz.models import trunk_critic
from mpo_viz.train.critic_fit import FIT_WINDOW, holdout_split
from mpo_viz.train.fitted_critic import fit_critic, fit_critic_file, fit_sample, fit_targets
from tests.train.critic_helpers import label_batch, spread

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def test_fit_critic_learns_what_can_be_learned_and_records_it(tmp_path):
    b = label_batch(60)
    res = fit_critic(b, steps=200, lr=3e-3, batch_episodes=16, holdout=0.25, gate=0.95, eval_every=10, progress=False)
    assert res.fit.heldout_ev > 0.95 and res.fit.stop == "gate"
    # the values written are the fitted critic's, aligned as the rollout's: V before each token
    v = res.batch.values.numpy()
    m = res.batch.mask.bool().numpy()
    wins = np.array([i % 2 == 0 for i in range(60)])
    assert np.abs(v[wins][m[wins]] - 1).max() < 0.3 and np.abs(v[~wins][m[~wins]]).max() < 0.3
    info = res.batch.meta["critic_fit"]
    assert res.batch.meta["values_source"] == "fitted_critic" and b.meta.get("values_source") is None
    assert (
        info["heldout_explained_variance"] == res.fit.heldout_ev and info["target"] == "mc" and info["n_heldout"] == 15
    )
    for k in (
        "values_mean_across",
        "values_mean_within",
        "values_median_across_within_ratio",
        "train_explained_variance",
    ):
        assert k in info
    mv.save(res.batch, tmp_path / "fitted.parquet")  # the metadata survives the file
    back = mv.load(tmp_path / "fitted.parquet")
    assert back.meta["values_source"] == "fitted_critic"
    assert back.meta["critic_fit"]["heldout_explained_variance"] == pytest.approx(res.fit.heldout_ev)


def test_fit_critic_turn_target_and_bootstrap_of_cut_rows():
    rows = [
        {
            "traj_id": f"t{i}",
            "group_id": "g",
            "prompt_ids": [1, 3 if i % 2 else 4],
            "response_ids": [5, 6, 7, 8],
            "loss_mask": [1, 1, 0, 1],
            "reward": float(i % 2),
            "turn_rewards": [0.5, 0.0],
            "truncated": i == 0,
        }
        for i in range(10)
    ]
    b = mv.TrajectoryBatch.from_rows(rows)
    # turn target: the return from each turn's first action token, on the whole turn
    t = fit_targets(b, "turn")[1].numpy()
    np.testing.assert_allclose(t, [1.5, 1.5, 0.0, 1.0])
    res = fit_critic(b, target="turn", steps=2, size="1m", holdout=0.2, progress=False)
    assert res.info["target"] == "turn" and res.info["truncated_bootstrapped"] == 1
    bv = res.batch.bootstrap_value
    assert np.isfinite(float(bv[0])) and np.isnan(bv[1:].numpy()).all()
    # the bootstrap value is the critic's output after the whole response
    seq = torch.tensor([[1, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        assert float(bv[0]) == pytest.approx(float(res.critic(seq)[0, -1]), abs=1e-6)


def test_fit_critic_refuses_what_cannot_be_fitted():
    b = label_batch(10)
    no_reward = mv.TrajectoryBatch.from_rows([{**r, "reward": float("nan")} for r in rows_of_batch(b)])
    with pytest.raises(ValueError, match="logs.jsonl: no trajectory carries a reward"):
        fit_critic(no_reward, source="logs.jsonl", progress=False)
    flat = mv.TrajectoryBatch.from_rows([{**r, "reward": 1.0} for r in rows_of_batch(b)])
    with pytest.raises(ValueError, match=r"logs.jsonl: every return is the same \(1.0\)"):
        fit_critic(flat, source="logs.jsonl", progress=False)
    with pytest.raises(ValueError, match="a held-out split of 0.2 leaves 3 training and 1 held-out trajectories of 4"):
        fit_critic(label_batch(4), progress=False)
    with pytest.raises(ValueError, match="^size: expected one of 1m, 3m, 10m, found '2m'"):
        fit_critic(b, size="2m", progress=False)
    with pytest.raises(ValueError, match="^target: expected one of mc, turn, found 'gae'"):
        fit_critic(b, target="gae", progress=False)
    with pytest.raises(ValueError, match=r"^holdout: expected a share in \(0, 1\), found 0"):
        fit_critic(b, holdout=0, progress=False)


def rows_of_batch(b):
    return [
        {"traj_id": t, "group_id": g, "prompt_ids": list(p), "response_ids": list(r), "loss_mask": list(m)}
        for t, g, p, r, m in zip(
            b.field("traj_id"),
            b.field("group_id"),
            b.field("prompt_ids"),
            b.field("response_ids"),
            b.field("loss_mask"),
        )
    ]


def test_fit_critic_from_the_shell(tmp_path, capsys):
    from mpo_viz.cli import main

    src = tmp_path / "logs.parquet"
    mv.save(label_batch(20), src)
    out = tmp_path / "fitted.parquet"
    assert main(["fit-critic", str(src), "-o", str(out), "--steps", "3", "--seed", "1", "--lr", "1e-7", "-q"]) == 0
    cap = capsys.readouterr()
    assert "critic fit: 3 steps, held-out explained variance" in cap.out and f"wrote {out}" in cap.out
    assert "warning: the critic explains almost none" in cap.err  # 3 tiny steps explain nothing
    b = mv.load(out)
    assert b.has("values") and b.meta["values_source"] == "fitted_critic" and b.meta["critic_fit"]["seed"] == 1
    assert b.meta["critic_fit"]["window"] == FIT_WINDOW == 1024  # the flag's default is the function's
    assert main(["fit-critic", str(src), "-o", str(tmp_path / "w.parquet"), "--steps", "1", "--window", "0", "-q"]) == 0
    assert mv.load(tmp_path / "w.parquet").meta["critic_fit"]["window"] is None  # 0: every row whole
    assert main(["fit-critic", str(src), "-o", str(tmp_path / "x.parquet"), "--window", "-1", "-q"]) == 2
    assert "--window: expected an integer >= 0 (0: every row whole), found -1" in capsys.readouterr().err
    assert main(["fit-critic", str(src), "-o", str(tmp_path / "x.parquet"), "--size", "2m", "-q"]) == 1
    assert "mpo-viz fit-critic: error: --size: expected one of 1m, 3m, 10m, found '2m'" in capsys.readouterr().err
    assert main(["fit-critic", str(tmp_path / "missing.parquet"), "-o", str(out)]) == 1
    assert "missing.parquet: no such file or folder" in capsys.readouterr().err


def test_fit_on_a_pretrained_trunk(hf_dir):
    res = fit_critic(label_batch(40), trunk=hf_dir, steps=4, eval_every=2, progress=False)
    lm = AutoModelForCausalLM.from_pretrained(str(hf_dir))
    # the critic starts as the folder's trunk, weight for weight, with a fresh head; the fit then moved it
    start = trunk_critic(hf_dir, label_batch(40))
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
    rows = [
        {
            "traj_id": f"t{i}",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [5, 5000],
            "loss_mask": [1, 1],
            "reward": float(i % 2),
        }
        for i in range(10)
    ]
    with pytest.raises(
        OptionError,
        match=r"^trunk: expected a model whose vocabulary covers logs.parquet's token ids, "
        r"found id 5000 in logs.parquet but \d+ embedding rows in",
    ):
        fit_critic(mv.TrajectoryBatch.from_rows(rows), trunk=hf_dir, steps=1, progress=False, source="logs.parquet")
    other = label_batch(10, response_tokens=["zz", "zz", "zz", "zz", "zz"])  # decoded by some other tokenizer
    with pytest.raises(
        OptionError,
        match=r"^trunk: expected the tokenizer that wrote batch, found .* decodes 5 of 5 "
        r"tokens of t0 to other text than its response_tokens",
    ):
        fit_critic(other, trunk=hf_dir, steps=1, progress=False)
    with pytest.raises(OptionError, match="^trunk: expected a Hugging Face causal-LM folder"):
        fit_critic(label_batch(10), trunk=hf_dir.parent, steps=1, progress=False)
    # a file fitted on a sample: an id past the embedding in a row outside the sample, refused before the fit
    with pytest.raises(OptionError, match=r"found id 5000 in x.parquet but \d+ embedding rows"):
        fit_critic(
            label_batch(10), trunk=hf_dir, serve=(np.array([5000]), 8), steps=1, progress=False, source="x.parquet"
        )


def test_fit_critic_trunk_from_the_shell(hf_dir, tmp_path, capsys):
    src, out = tmp_path / "logs.parquet", tmp_path / "fitted.parquet"
    mv.save(label_batch(40), src)
    assert (
        main(["fit-critic", str(src), "-o", str(out), "--trunk", str(hf_dir), "--steps", "2", "--target", "turn", "-q"])
        == 0
    )
    cap = capsys.readouterr().out
    assert f"fitting a critic on the trunk of {hf_dir} to the turn returns of {src} (40 trajectories;" in cap
    assert "fitted on 40 of 40 trajectories" in cap
    assert mv.load(out).meta["critic_fit"]["trunk"] == str(hf_dir)
    assert mv.load(out).meta["critic_fit"]["num_threads"] == 1  # the default --threads
    assert main(["fit-critic", str(src), "-o", str(out), "--threads", "0"]) == 2
    assert "--threads: expected an integer >= 1, found 0" in capsys.readouterr().err
    assert main(["fit-critic", str(src), "-o", str(out), "--trunk", str(tmp_path / "nope")]) == 2
    assert "--trunk: expected a Hugging Face model folder, found no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):  # argparse refuses a target that is not one
        main(["fit-critic", str(src), "-o", str(out), "--target", "gae"])
    assert "argument --target: invalid choice: 'gae' (choose from 'mc', 'turn')" in capsys.readouterr().err


def test_early_stopping_keeps_the_best_evaluations_weights(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the best weights wait: emptied after
    # rewards drawn independently of the prompts: nothing to learn, so the held-out EV peaks by chance
    # early and the fit stops on patience (a learnable batch at lr 0.3 now climbs to EV 0.98 in 64 steps)
    r = np.random.default_rng(0).integers(0, 2, 40)
    b = mv.TrajectoryBatch.from_rows(
        [
            {
                "traj_id": f"t{i}",
                "group_id": f"g{i}",
                "prompt_ids": [1, 10 + i % 30],
                "response_ids": [5, 6, 7, 8, 9],
                "loss_mask": [1, 1, 0, 1, 1],
                "reward": float(r[i]),
            }
            for i in range(40)
        ]
    )
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
    assert list(tmp_path.iterdir()) == []  # the best weights' file removed once restored
    # --keep-last: the last weights, whatever their EV
    last = fit_critic(b, patience=3, keep_best=False, **kw).fit
    assert last.kept_step == last.steps and last.heldout_ev == evs[-1] and last.heldout_ev < last.best_ev
    with pytest.raises(OptionError, match="^patience: expected an integer >= 1"):
        fit_critic(b, patience=0, **kw)


def test_the_fit_runs_on_num_threads_and_gives_the_count_back(monkeypatch):
    """fit_critic trains on ``num_threads`` torch threads (1 by default, as the trainer's runs) and
    the process has its own count again afterwards; None leaves the count alone."""
    import mpo_viz.train.fitted_critic as CF

    seen = []
    real = CF.fit_values
    monkeypatch.setattr(CF, "fit_values", lambda *a, **k: (seen.append(torch.get_num_threads()), real(*a, **k))[1])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        res = fit_critic(label_batch(40), steps=2, eval_every=1, progress=False)
        assert seen == [1] and torch.get_num_threads() == 2 and res.info["num_threads"] == 1
        fit_critic(label_batch(40), steps=2, eval_every=1, progress=False, num_threads=None)
        assert seen == [1, 2] and torch.get_num_threads() == 2
        with pytest.raises(ValueError, match=r"^num_threads: expected an integer >= 1, found 0"):
            fit_critic(label_batch(40), steps=2, progress=False, num_threads=0)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- a whole file, chunk by chunk
FIT = dict(steps=24, lr=3e-3, batch_episodes=8, holdout=0.25, eval_every=8, seed=3)


def _rows_with_cut(n: int) -> mv.TrajectoryBatch:
    """label_batch's rows over a spread vocabulary (the compact critic), one row in five cut short,
    rows of different lengths, so chunks differ in width and ids."""
    rows = []
    for i, r in enumerate(spread(label_batch(n), 50_000).rows()):
        k = 1 + i % 3
        rows.append(
            {**r, "response_ids": list(r["response_ids"])[: k + 2], "loss_mask": [1] * (k + 2), "truncated": i % 5 == 0}
        )
    return mv.TrajectoryBatch.from_rows(rows)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_fit_critic_file_chunk_by_chunk_is_the_whole_batch_fit(tmp_path, suffix):
    """A file of at most fit_rows rows, split over two files of a folder and read a few rows at a
    time: the fit is the whole batch's (the same critic vocabulary and positions, split and steps) and
    every row's values and bootstrap value are the whole fit's, to float rounding of the batching."""
    b = _rows_with_cut(40)
    src = tmp_path / "in"
    mv.save(b[:17], src / "a.parquet")
    mv.save(b[17:], src / "b.parquet")
    whole = fit_critic(mv.load(src), progress=False, **FIT)
    res = fit_critic_file(src, tmp_path / f"out{suffix}", max_tokens=9, progress=False, **FIT)
    out = mv.load(tmp_path / f"out{suffix}")
    assert out.traj_ids == b.traj_ids and res.fit.heldout_ev == whole.fit.heldout_ev
    np.testing.assert_allclose(out.values.numpy(), whole.batch.values.numpy(), atol=1e-5)
    np.testing.assert_allclose(out.bootstrap_value, whole.batch.bootstrap_value, atol=1e-5)
    info = out.meta["critic_fit"]
    assert info["rows"] == info["fit_rows"] == 40 and info["truncated_bootstrapped"] == 8
    assert out.meta["values_source"] == "fitted_critic"
    for k in ("heldout_explained_variance", "train_explained_variance", "n_train", "n_heldout", "kept_step"):
        assert info[k] == pytest.approx(whole.info[k], abs=1e-9), k
    for k in ("values_mean_across", "values_mean_within", "values_median_across_within_ratio"):
        assert info[k] == pytest.approx(whole.info[k], rel=1e-4, abs=1e-9), k


def test_the_fit_sample_is_whole_groups_drawn_by_the_seed():
    groups = [f"g{i // 3}" for i in range(30)]  # ten groups of three
    assert fit_sample(groups, 30, 0).tolist() == list(range(30))  # at most fit_rows: every row
    a, b, c = fit_sample(groups, 10, 0), fit_sample(groups, 10, 0), fit_sample(groups, 10, 1)
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()
    assert len(a) == 12 and a.tolist() == sorted(a.tolist())  # four whole groups: 10 rows reached
    for s in (a, c):
        picked = {groups[i] for i in s}
        assert sorted(s.tolist()) == sorted(i for i, g in enumerate(groups) if g in picked)


def test_fit_critic_file_on_a_sample_gives_every_row_values(tmp_path, capsys):
    src = tmp_path / "logs.parquet"
    b = _rows_with_cut(40)
    mv.save(b, src)
    out = tmp_path / "fitted.jsonl"
    argv = ["fit-critic", str(src), "-o", str(out), "--steps", "8", "--fit-rows", "12", "--max-tokens", "20", "-q"]
    assert main(argv) == 0
    assert "fitted on 12 of 40 trajectories; critic fit: 8 steps" in capsys.readouterr().out
    back = mv.load(out)
    info = back.meta["critic_fit"]
    assert back.traj_ids == b.traj_ids and info["rows"] == 40 and info["fit_rows"] == 12
    assert info["n_train"] + info["n_heldout"] == 12 and info["truncated_bootstrapped"] == 8
    v, m = back.values.numpy(), back.mask.bool().numpy()
    cut = np.array([i % 5 == 0 for i in range(40)])
    assert np.isfinite(v[m]).all() and np.isfinite(np.asarray(back.bootstrap_value)[cut]).all()
    with pytest.raises(OptionError, match="fit_rows: expected an integer >= 4"):
        fit_critic_file(src, tmp_path / "x.parquet", fit_rows=2)
    # a bound on tokens: the groups drawn stop at 30 response tokens (rows of 3-5 tokens)
    assert main(["fit-critic", str(src), "-o", str(out), "--fit-tokens", "30", "--steps", "2", "-q"]) == 0
    info = mv.load(out).meta["critic_fit"]
    assert 6 <= info["fit_rows"] <= 10 and info["rows"] == 40
    # a .jsonl output beside other JSONL files (they share _meta.json): refused before any work
    (tmp_path / "other.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"share _meta.json, and fitted.jsonl \(and 1 more\) already use it"):
        fit_critic_file(src, tmp_path / "again.jsonl")


def test_fit_critic_file_gives_each_passes_memory_back_before_the_fit(tmp_path, monkeypatch):
    """The survey's and the gathering's high-water marks are released before the critic is built,
    and the fit's before every row's values are computed (data.io.release_memory); the record says
    the fit used the fused AdamW kernel."""
    calls = []
    monkeypatch.setattr(fc, "release_memory", lambda: calls.append("release"))
    for name in ("_survey", "_gather", "fit_critic"):
        real = getattr(fc, name)
        monkeypatch.setattr(fc, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    src = tmp_path / "logs.parquet"
    mv.save(_rows_with_cut(12), src)
    res = fc.fit_critic_file(src, tmp_path / "out.parquet", progress=False, **FIT)
    assert calls == ["_survey", "release", "_gather", "release", "fit_critic", "release"]
    assert res.info["fused_optimizer"] is True
    mv.data.io.release_memory()  # and it runs where it is called for real


def test_the_fit_sample_stops_at_the_token_bound():
    groups = [f"g{i // 2}" for i in range(20)]  # ten groups of two
    lengths = np.full(20, 5)
    assert fit_sample(groups, 100, 0, lengths, 100).tolist() == list(range(20))  # 100 tokens: all
    s = fit_sample(groups, 100, 0, lengths, 30)
    assert len(s) == 6 and lengths[s].sum() == 30  # three groups of 10 tokens
    assert len(fit_sample(groups, 100, 0, np.full(20, 1000), 30)) == 2  # the first group is always taken
