"""TrajectoryExplorer, the advantage engine and the picker, without a browser: the synced state
(strip payload, figure data, per-turn table) must hold what mpo_viz.advantages.compute gives."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch

import mpo_viz as mv
from mpo_viz import advantages as adv
from mpo_viz.analysis import td_error
from mpo_viz.render.strip import payload_lists, strip_payload
from mpo_viz.widgets import AdvantageEngine, ParamControls, TrajectoryExplorer, TrajectoryPicker
from mpo_viz.widgets.engine import options_of


@pytest.fixture(scope="module")
def batch():
    return mv.synthetic.make_batch(8, seed=3, turns=(2, 4), turn_len=(3, 12), obs_len=(2, 8))


def _expected(batch, name, **options):
    return adv.compute(batch, name, **options_of(name, options))


OPTION_SETS = [
    {},
    {"beta": 0.3, "lam": 0.7, "turn_lam": 0.5, "gamma": 0.9, "turn_gamma": 0.95},
    {"within": "local", "value_at": "mean"},
    {"within": "td", "value_at": "last", "beta": 2.0},
]


@pytest.mark.parametrize("options", OPTION_SETS)
def test_engine_equals_compute(batch, options):
    names = ["mpo", "gae", "turn_gae", "grpo", "reinforce_pp"]
    eng = AdvantageEngine(batch, names)
    got = eng.compute(options)
    for name in names:
        ref = _expected(batch, name, **options)
        assert torch.equal(got[name][0], ref.advantages), name
        assert torch.equal(got[name][1], ref.returns), name


def test_engine_refuses_what_the_batch_lacks():
    b = mv.TrajectoryBatch.from_rows(
        [
            {
                "traj_id": "a",
                "group_id": "g",
                "prompt_ids": [1],
                "response_ids": [2, 3],
                "loss_mask": [1, 1],
                "reward": 1.0,
            }
        ]
    )
    with pytest.raises(ValueError, match="estimators: 'mpo' needs"):
        AdvantageEngine(b, ["mpo"])
    with pytest.raises(ValueError, match="unknown"):
        ParamControls(bogus=1.0)
    with pytest.raises(ValueError, match="within"):
        ParamControls(within="sideways")
    # without values the explorer falls back to the estimators the batch supports (grpo)
    ex = TrajectoryExplorer(b)
    assert ex.names == ["grpo"] and ex.figure is None


def _channel(payload, name, n):
    v = payload["channels"][name]
    assert len(v) == n
    return np.asarray(v, dtype=np.float64)  # the widget's arrays as they are; a list's None as NaN


def test_slider_recomputes_strip_figure_and_turn_table(batch):
    ex = TrajectoryExplorer(batch, row=2, estimators=["mpo", "gae", "grpo"])
    n = int(batch.lengths[2])
    act = batch.mask[2, :n].numpy() != 0
    before = _channel(ex.strip.payload_dict, "adv_mpo", n)
    # λ is two controls (mpo's within-turn λ, gae's token λ): a plain `lam` must say whose
    with pytest.raises(
        ValueError,
        match=r"'lam' is a separate control per estimator here \(lam@mpo: mpo, default "
        r"0.95; lam@gae: gae, default 1\); say which",
    ):
        ex.params.set(beta=0.25, lam=0.8)
    assert ex.params.options["beta"] == 1.0  # nothing was set
    ex.params.set(beta=0.25, lam=0.8, turn_lam=0.6, estimator="mpo")
    opts = {**ex.params.options}
    assert opts["beta"] == 0.25 and opts["lam@mpo"] == 0.8 and opts["lam@gae"] == 1.0  # gae keeps its own λ
    ref = {k: _expected(batch, k, **opts) for k in ("mpo", "gae", "grpo")}
    p = ex.strip.synced_payload()  # what the browser holds: the payload pushed, the patch of channels since
    for k, r in ref.items():
        want = r.advantages[2, :n].numpy().astype(np.float64)
        got = _channel(p, f"adv_{k}", n)
        np.testing.assert_allclose(got[act], want[act], rtol=1e-4, atol=1e-7)  # rounded to 5 digits
        assert np.isnan(got[~act]).all()
        tr = next(t for t in ex.figure.data if t.name == f"A ({k})")
        np.testing.assert_allclose(np.asarray(tr.y, dtype=np.float64)[act], want[act], rtol=1e-6, atol=1e-7)
    assert not np.allclose(before[act], _channel(p, "adv_mpo", n)[act])
    # the returns trace follows mpo's returns
    tr = next(t for t in ex.figure.data if t.name == "return")
    np.testing.assert_allclose(
        np.asarray(tr.y, dtype=np.float64)[act], ref["mpo"].returns[2, :n].numpy()[act], rtol=1e-6
    )
    # per-turn table: mean advantage over each turn (A^T_k for MAE) as compute's turn table has it
    turns = ref["mpo"].turns
    want_turns = turns[turns["traj_id"] == batch.traj_ids[2]]["adv_mpo"].to_numpy()
    np.testing.assert_allclose(ex.turn_df["adv_mpo"].to_numpy(), want_turns, rtol=1e-5, atol=1e-7)
    # the partial payload update equals a payload built from scratch by the strip module
    full = strip_payload(
        batch[[2]],
        0,
        advantages={k: r.advantages[2:3, :n] for k, r in ref.items()},
        td=td_error(batch[[2]]),
        channel="adv_mpo",
    )
    assert p["channels"] == full["channels"]
    assert ex.timings["compute"] >= 0 and "push" in ex.timings


def test_beta_zero_makes_mae_constant_inside_turns(batch):
    ex = TrajectoryExplorer(batch, row=1, estimators=["mpo"])
    ex.params.set(beta=0.0)
    n = int(batch.lengths[1])
    act = batch.mask[1, :n].numpy() != 0
    tid = batch.turn_ids[1, :n].numpy()
    a = _channel(ex.strip.payload_dict, "adv_mpo", n)
    micro = _channel(ex.strip.payload_dict, "micro_mpo", n)
    np.testing.assert_allclose(micro[act], 0.0, atol=1e-6)
    for k in np.unique(tid[act]):
        vals = a[act & (tid == k)]
        assert np.ptp(vals) == 0.0
    # and equals turn GAE (docs/concepts.md §20 identity)
    tg = adv.compute(batch, "turn_gae", turn_lam=0.9).advantages[1, :n].numpy()
    np.testing.assert_allclose(a[act], tg[act], rtol=1e-4, atol=1e-7)


def test_pick_a_trajectory(batch):
    ex = TrajectoryExplorer(batch, estimators=["mpo", "gae"], page_size=3)
    ex.params.set(beta=0.5)
    target = ex.picker._order[4]  # on the second page
    row = int(ex.picker.table["row"].iat[target])
    ex.picker.pick(row)
    assert ex.picker.page == 1 and ex.picker.select.value == row
    assert ex.row == row
    n = int(batch.lengths[row])
    p = ex.strip.payload_dict
    assert p["title"] == f"trajectory {batch.traj_ids[row]}" and len(p["tokens"]) == n
    assert len(ex.figure.data[0].x) == n
    want = _expected(batch, "mpo", **ex.params.options).advantages[row, :n].numpy()
    act = batch.mask[row, :n].numpy() != 0
    np.testing.assert_allclose(_channel(p, "adv_mpo", n)[act], want[act], rtol=1e-4, atol=1e-7)
    # by traj_id, and bad rows
    ex.select(batch.traj_ids[0])
    assert ex.row == 0
    with pytest.raises(ValueError, match="row: no trajectory"):
        ex.select("nope")
    with pytest.raises(ValueError, match=r"row: expected an index in \[0, 8\)"):
        ex.select(8)


def test_what_the_update_did_in_the_turn_table_and_the_strip(batch):
    """A batch carrying a trainer's ratio / clipped / turn_ratio / turn_clipped: the explorer's turn
    table shows the turn fields per turn, the strip colours by the ratio (log) and the flag."""
    k = batch.num_turns
    rho = [np.round(1.0 + 0.1 * np.arange(n) - 0.05 * i, 6) for i, n in enumerate(k)]
    out = [(np.arange(n) % 2).astype(int) for n in k]
    ratio = np.where(batch.mask.numpy() != 0, 1.5, 1.0)
    b = batch.with_token_fields(ratio=ratio, clipped=batch.mask.numpy()).with_turn_fields(
        turn_ratio=rho, turn_clipped=out
    )
    ex = TrajectoryExplorer(b, estimators=["mpo"])
    ex.select(3)
    np.testing.assert_allclose(ex.turn_df["turn_ratio"].to_numpy(), rho[3])
    assert ex.turn_df["turn_clipped"].tolist() == out[3].tolist()
    n = int(b.lengths[3])
    act = b.mask[3, :n].numpy() != 0
    p = ex.strip.synced_payload()
    np.testing.assert_allclose(_channel(p, "update_ratio", n)[act], np.log(1.5), rtol=1e-4)
    assert (_channel(p, "clipped", n)[act] == 1).all() and p["channel_info"]["update_ratio"]["log"] is True


def test_picker_sorts_filters_and_pages_10k_rows():
    rng = np.random.default_rng(0)
    N = 10_000
    t = pd.DataFrame(
        {
            "row": np.arange(N),
            "traj_id": [f"t{i:05d}" for i in range(N)],
            "reward": rng.normal(size=N),
            "turns": rng.integers(1, 9, N),
        }
    )
    t.loc[7, "reward"] = np.nan
    p = TrajectoryPicker(t, sort_by="reward", descending=True, page_size=25)
    assert p.n_pages == 400 and len(p.select.options) == 25
    r = t["reward"].to_numpy()
    top = p.page_rows
    assert top == list(np.argsort(-np.nan_to_num(r, nan=-np.inf), kind="stable")[:25])
    p.goto(399)
    assert p.page_rows[-1] == 7  # NaN sorts last
    p.descending.value = False  # ascending, back to page 1
    assert p.page == 0 and p.page_rows[0] == int(np.nanargmin(r))
    p.sort_by.value = "traj_id"
    assert p.page_rows[:2] == [0, 1]
    p.filter.value = "t0999"
    assert p.page_rows == list(range(9990, 10000)) and p.n_pages == 1
    picked = []
    p.on_pick(picked.append)
    p.pick(5)  # hidden by the filter: the filter is cleared
    assert picked == [5] and p.filter.value == "" and p.select.value == 5
    p.set_column("score2", -r)
    assert "score2" in p.sort_by.options
    with pytest.raises(ValueError, match="table: expected a 'row' column"):
        TrajectoryPicker(t.drop(columns="row"))


def test_to_html_is_a_self_contained_snapshot(batch, tmp_path):
    ex = TrajectoryExplorer(batch, estimators=["mpo", "gae"])
    ex.params.set(beta=0.5)
    out = tmp_path / "ex.html"
    html = ex.to_html(out)
    assert out.read_text() == html
    assert "window.mpoStrip" in html and "mpoReportReady" in html and "Plotly" in html
    assert 'type="application/json"' in html and batch.traj_ids[0] in html
    assert "<script src=" not in html  # nothing fetched: plotly.js and the strip are inline
    # the snapshot's payload is the widget's payload
    m = re.search(r'id="(strip-\d+)-data">(.*?)</script>', html)
    snap = json.loads(m.group(2))
    assert snap["channels"] == payload_lists(ex.strip.payload_dict)["channels"]


def test_each_estimator_starts_from_its_own_defaults(batch):
    # λ means mpo's within-turn λ (default 0.95) and gae's token λ (default 1): two controls, each
    # at its estimator's default; γ means the same for both (default 1): one shared control
    ex = TrajectoryExplorer(batch, estimators=["mpo", "gae", "grpo"])
    o = ex.params.options
    assert o["lam@mpo"] == 0.95 and o["lam@gae"] == 1.0 and "lam" not in o
    assert o["gamma"] == 1.0 and "gamma@gae" not in o
    assert ex.params.controls["lam@gae"].description == "λ · gae"
    for name in ("mpo", "gae", "grpo"):  # exactly what compute gives with no options at all
        ref = adv.compute(batch, name)
        assert torch.equal(ex.results[name][0], ref.advantages), name
    # the header says what each ran with
    assert re.search(r"<b>gae</b> [^;]*lam=1\b", ex.status.value)
    assert re.search(r"<b>mpo</b> [^;]*lam=0.95\b", ex.status.value)
    # moving gae's λ leaves mpo alone
    before = ex.results["mpo"][0].clone()
    ex.params.set(**{"lam@gae": 0.5})
    assert torch.equal(ex.results["mpo"][0], before)
    assert torch.equal(ex.results["gae"][0], adv.compute(batch, "gae", lam=0.5).advantages)
    # reset: each control back to its own estimator's default, so every result equals compute()'s
    ex.params.set(lam=0.3, estimator="mpo")
    ex.params.reset("lam")
    assert ex.params.options["lam@mpo"] == 0.95 and ex.params.options["lam@gae"] == 1.0
    ex.params.reset()
    for name in ex.names:
        assert torch.equal(ex.results[name][0], adv.compute(batch, name).advantages), name
    with pytest.raises(ValueError, match="estimator: expected one of mpo, gae"):
        ex.params.set(lam=0.5, estimator="ppo")
    # at construction the same rule: a split option by its control key, a plain name refused
    ex2 = TrajectoryExplorer(batch, estimators=["mpo", "gae", "grpo"], **{"lam@mpo": 0.5}, beta=0.25)
    assert ex2.params.options["lam@mpo"] == 0.5 and ex2.params.options["lam@gae"] == 1.0
    assert ex2.params.options["beta"] == 0.25
    assert torch.equal(ex2.results["gae"][0], adv.compute(batch, "gae").advantages)
    assert torch.equal(ex2.results["mpo"][0], adv.compute(batch, "mpo", lam=0.5, beta=0.25).advantages)
    with pytest.raises(ValueError, match="'lam' is a separate control per estimator here"):
        TrajectoryExplorer(batch, estimators=["mpo", "gae"], lam=0.5)
    with pytest.raises(ValueError, match="unknown for gae 'beta'"):
        ex.params.set(beta=0.5, estimator="gae")
