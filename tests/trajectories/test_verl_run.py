"""trajectories/verl/: the run folder written by the verl plugin's run logger (make_verl_run.py).

Runs without verl: the folder must load as validated v1 trajectories and parseable metrics, and
what the generating script says about it must hold — the advantages verl trained on are mpo_viz's
MAE of the logged rewards and critic values, the metrics are what the files hold, and the settings
recorded in made_with.json are the script's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import mpo_viz as mv
from mpo_viz.advantages import mae
from mpo_viz.train import Config

HERE = Path(__file__).resolve().parents[2] / "trajectories" / "verl"
RUN = HERE / "run"


@pytest.fixture(scope="module")
def made_with():
    return json.loads((HERE / "made_with.json").read_text())


@pytest.fixture(scope="module")
def records():
    return [json.loads(line) for line in (RUN / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def steps():
    return {int(p.stem.split("=")[1]): mv.load(p) for p in sorted((RUN / "trajectories").glob("iter=*.parquet"))}


def turns_of(mask_row):
    """Index lists of the maximal runs of 1 in a 0/1 row (the turns, as verl's response_mask has them)."""
    out, prev = [], 0
    for t, m in enumerate(mask_row):
        if m and not prev:
            out.append([])
        if m:
            out[-1].append(t)
        prev = m
    return out


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_folder_is_small_and_complete(records, steps):
    assert _bytes(RUN) < 1_000_000, f"{_bytes(RUN)} bytes"
    # the budget of shipped training data: trajectories/trained and this folder together
    assert _bytes(HERE) + _bytes(HERE.parent / "trained") <= 3 * 2**20
    assert (RUN / "config.json").is_file()
    assert [r["iteration"] for r in records] == sorted(steps) and len(steps) >= 5
    assert all(r["phase"] == "train" and r["estimator"] == "mpo" for r in records)


def test_trajectories_are_v1_from_verl(steps, records):
    for it, b in steps.items():
        assert b.meta["source_framework"] == "verl" and b.meta.get("schema", "mpo_viz.trajectory/v1").endswith("/v1")
        assert {"values", "old_logprobs", "rollout_logprobs", "advantages", "returns"} <= set(b.fields)
        assert set(b.field("step")) == {it}
        rec = next(r for r in records if r["iteration"] == it)
        assert rec["log/rows_saved"] == len(b) == rec["n_traj"] and rec["log/rows_rejected"] == 0
        # groups of the rollout (uid): every task sampled group_size times
        counts = np.unique(list(b.group_ids), return_counts=True)[1]
        assert set(counts) == {4}


def test_settings_are_the_scripts(made_with, records, steps, load_script):
    mod = load_script(HERE / "make_verl_run.py", "make_verl_run")
    cfg = Config(**mod.CONFIG)
    # the recorded config read by today's Config (a field added later, outside the run's identity, takes
    # its default, as Config.load does with an older config.json) is the script's, and hashes the same
    assert made_with["trainer_config_hash"] == cfg.hash()
    assert Config.from_dict(made_with["trainer_config"]) == cfg
    assert made_with["verl_overrides"] == mod.OVERRIDES + mod.VERL_REQUIRED and made_with[
        "iterations"
    ] == mod.ITERATIONS == len(records)
    conf = json.loads((RUN / "config.json").read_text())
    assert conf["framework"] == "verl" and conf["estimator"] == "mpo"
    assert conf["algorithm"]["adv_estimator"] == "mpo" and conf["mpo_viz_log"]["run_dir"].endswith("run")
    for step, rec in zip(made_with["steps"], records):
        assert step["step"] == rec["iteration"]
        assert step["score_mean"] == pytest.approx(rec["reward/mean"], abs=1e-6)  # the plugin sums float32


def test_trained_advantages_are_mpo_of_the_logged_values(steps):
    """What verl trained on (``advantages``) recomputed by mpo_viz's MAE from the file's rewards, values
    and mask, with the options config.json records (float32, as verl's tensors)."""
    opts = json.loads((RUN / "config.json").read_text())["estimator_options"]
    for it, b in steps.items():
        m = b.mask.float()
        r = b.padded("rewards", torch.float32)
        adv, ret = mae(r, b.values.float(), m, **opts)
        got = b.padded("advantages", torch.float32)
        torch.testing.assert_close(got * m, adv * m, rtol=0, atol=2e-6, msg=f"iter {it}")
        torch.testing.assert_close(b.padded("returns", torch.float32) * m, ret * m, rtol=0, atol=2e-6)
        # the mean of a turn's MAE advantages is the turn-level advantage: the same for every turn of a
        # row only by accident, so the micro term must not be all zero (beta = 1 with a real critic)
        spread = [np.ptp(got[i, t].numpy()) for i in range(len(b)) for t in turns_of(b.mask[i].tolist()) if len(t) > 1]
        assert max(spread) > 1e-4


def test_metrics_are_what_the_files_hold(steps, records):
    for rec in records:
        b = steps[rec["iteration"]]
        m = b.mask.numpy().astype(bool)
        score = b.padded("rewards", torch.float64).sum(1).numpy()
        assert rec["reward/mean"] == pytest.approx(score.mean(), rel=1e-9, abs=1e-12)
        adv = b.padded("advantages", torch.float64).numpy()
        assert rec["adv/trained/mean"] == pytest.approx(adv[m].mean(), rel=1e-6, abs=1e-9)
        assert rec["adv/mpo/corr_trained"] == pytest.approx(1.0, abs=1e-6)
        # the across/within split of the critic values, by hand: population variance of the turn means,
        # mean of the turns' variances, averaged over trajectories
        v = b.padded("values", torch.float64).numpy()
        across, within = [], []
        for i in range(len(b)):
            turns = turns_of(m[i].tolist())
            across.append(np.var([v[i, t].mean() for t in turns]))
            within.append(np.mean([v[i, t].var() for t in turns]))
        assert rec["values/across"] == pytest.approx(np.mean(across), rel=1e-5)
        assert rec["values/within"] == pytest.approx(np.mean(within), rel=1e-5)


def test_dashboard_opens_the_folder(steps):
    from mpo_viz.widgets import TrainingDashboard

    dash = TrainingDashboard(RUN, live=False)
    assert len(dash.records) == len(steps)
    last = f"iter={max(steps):06d}"
    ex = dash.open_iteration(last)
    assert len(ex.batch) == len(steps[max(steps)]) and "mpo" in ex.names
