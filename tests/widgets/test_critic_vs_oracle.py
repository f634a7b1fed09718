"""A rollout file with a learned critic and the oracle's values: the value curve draws both, the
explorer's turn table shows the critic's error per turn, and the file opens in the report."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mpo_viz as mv
from mpo_viz import models
from mpo_viz.envs import build_tokenizer, make_env
from mpo_viz.envs.generate import GenerateConfig, generate
from mpo_viz.render import plots
from mpo_viz.rollout import rollout
from mpo_viz.widgets import TrajectoryExplorer


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    env = make_env("search", difficulty=2)
    pol = models.tiny_policy(build_tokenizer(env), seed=0)
    b = rollout(pol, env, 4, group_size=2, critic=models.make_critic(pol, "policy"), max_turn_tokens=6)
    torch.set_num_threads(n)
    path = mv.save(b, tmp_path_factory.mktemp("r") / "model.parquet")
    return mv.load(path)  # through the file, as a user opens it


def test_value_curve_has_the_oracle_line(batch):
    fig = plots.value_curve(batch, 1)
    names = [t.name for t in fig.data]
    assert names[:3] == ["value", "turn mean", "oracle value"]
    o = batch.padded("oracle_values")[1].numpy()
    oracle = fig.data[2]
    x, y = np.asarray(oracle.x, dtype=float), np.asarray(oracle.y, dtype=float)
    keep = np.isfinite(y)  # gaps over observations are NaN
    xs = x[keep].astype(int)
    assert len(xs) > 5
    np.testing.assert_allclose(y[keep], o[xs], rtol=1e-6)
    assert all(batch.row(1)["loss_mask"][x] == 1 for x in xs)
    # an expert file (values = oracle values) draws no second line
    expert = generate(GenerateConfig(env="search", episodes=2, group_size=1))
    assert "oracle value" not in [t.name for t in plots.value_curve(expert, 0).data]


def test_explorer_turn_table_shows_critic_error(batch):
    ex = TrajectoryExplorer(batch, estimators=["mpo"], row=2)
    tt = ex.turn_df
    v = batch.padded("values")[2].numpy()
    o = batch.padded("oracle_values")[2].numpy()
    starts = tt["start"].to_numpy()
    np.testing.assert_allclose(tt["oracle_first"], o[starts], rtol=1e-6)
    np.testing.assert_allclose(tt["critic_err"], v[starts] - o[starts], rtol=1e-5, atol=1e-7)
    assert "critic_err" in ex.turns.value


def test_report_opens_a_rollout_file(batch, tmp_path):
    from mpo_viz.render.report import write_report

    out = write_report(batch, tmp_path / "r.html")
    assert out.stat().st_size > 10_000
