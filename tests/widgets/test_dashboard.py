"""TrainingDashboard on run folders written by the test, growing while the widget watches."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz.widgets import TrainingDashboard
from mpo_viz.widgets.dashboard import PANELS, panel_of


def _line(i, **extra):
    rec = {
        "iteration": i,
        "phase": "train",
        "time_s": 1.5 * i,
        "success_rate": 0.1 * i,
        "reward_mean": 0.2 * i,
        "policy_loss": 1.0 / (i + 1),
        "value_loss": 0.5,
        "approx_kl": 0.01 * i,
        "clipfrac_low": 0.02,
        "clipfrac_high": 0.03,
        "within_turn_shift": 0.001 * i,
        "value_across": 0.3,
        "value_within": 0.01,
        "timings": {"rollout_s": 2.0, "update_s": 1.0},
        **extra,
    }
    return json.dumps(rec) + "\n"


@pytest.fixture
def run(tmp_path):
    d = tmp_path / "run1"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"estimator": "mpo", "loss": {"kind": "turn_ppo", "clip": 0.2}}))
    return d


def test_panels_route_metric_names():
    titles = [p.title for p in PANELS]
    where = {
        k: titles[panel_of(k)]
        for k in (
            "success_rate",
            "reward_mean",
            "policy_loss",
            "approx_kl",
            "kl/k3",
            "clipfrac_high",
            "within_turn_shift",
            "value_across",
            "timings/rollout_s",
            "entropy",
            "ratio_max",
            "turn_ratio_max",
            "values_across_within_ratio",
            "critic_explained_var",
            "eval_sampled_success",
        )
    }
    assert where == {
        "success_rate": "success",
        "reward_mean": "reward",
        "policy_loss": "losses",
        "approx_kl": "KL",
        "kl/k3": "KL",
        "clipfrac_high": "clip fractions",
        "within_turn_shift": "within-turn shift",
        "value_across": "across / within variance",
        "timings/rollout_s": "phase timings (s, stacked)",
        "entropy": "entropy",
        "ratio_max": "importance ratios (log)",
        "turn_ratio_max": "importance ratios (log)",
        "values_across_within_ratio": "across / within ratio (log)",
        "critic_explained_var": "critic fit",
        "eval_sampled_success": "success",
    }
    assert panel_of("iteration") is None and panel_of("time_s") is None and panel_of("phase") is None


def test_figure_structure_legends_axes_and_stacks(run):
    """Success on top, one legend per panel with no colour repeated in it, ratios and variances on
    axes of their own (the ratios' a log one), the phase timings stacked (the total a line)."""
    rows = [{"iteration": 0, "phase": "eval", "eval_success": 0.5, "eval_sampled_success": 0.25}]
    rows += [
        {
            "iteration": i,
            "phase": "rl",
            "success": 0.1 * i,
            "reward_mean": 0.1 * i,
            "reward_std": 0.3,
            "entropy": 0.5 / i,
            "ratio_max": 3.0 * i,
            "turn_ratio_max": 1.1,
            "ratio_min": 1e-6,
            "values_across": 0.02,
            "values_within": 0.001,
            "values_across_within_ratio": 20.0,
            "timings": {"rollout": 2.0, "update": 1.0 * i, "total": 3.0 + i, "rollout_oracle": 0.5},
        }
        for i in (1, 2, 3)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fig = TrainingDashboard(run, live=False).figure
    by_panel = {}
    for t in fig.data:
        by_panel.setdefault(PANELS[panel_of(t.meta)].title, []).append(t)
    assert [t.meta for t in by_panel["success"]] == ["success", "eval_sampled_success", "eval_success"]
    assert (by_panel["success"][0].xaxis, by_panel["success"][0].yaxis) == ("x", "y")  # the top-left panel
    # the evaluation's points only where it was measured
    assert list(by_panel["success"][2].x) == [0] and list(by_panel["success"][2].y) == [0.5]
    for title, traces in by_panel.items():
        assert len({t.legend for t in traces}) == 1, title  # one legend per panel ...
        assert len({t.line.color for t in traces}) == len(traces), title  # ... without a repeated colour
    assert len({ts[0].legend for ts in by_panel.values()}) == len(by_panel)
    legend = by_panel["importance ratios (log)"][0].legend
    assert (
        fig.layout[legend].x > fig.layout[by_panel["importance ratios (log)"][0].xaxis.replace("x", "xaxis")].domain[1]
    )
    axis = {title: ts[0].yaxis.replace("y", "yaxis") for title, ts in by_panel.items()}
    assert fig.layout[axis["importance ratios (log)"]].type == "log"
    assert fig.layout[axis["across / within ratio (log)"]].type == "log"
    assert fig.layout[axis["across / within variance"]].type != "log"
    assert len(set(axis.values())) == len(axis)  # ratios and variances never share an axis
    ratios = {t.meta: t for t in by_panel["importance ratios (log)"]}
    assert list(ratios) == ["ratio_max", "turn_ratio_max", "ratio_min"] and ratios["ratio_min"].visible == "legendonly"
    np.testing.assert_allclose(ratios["ratio_max"].y, [3.0, 6.0, 9.0])
    timings = {t.meta: t for t in by_panel["phase timings (s, stacked)"]}
    assert {k for k, t in timings.items() if t.stackgroup} == {"timings/rollout", "timings/update"}
    assert timings["timings/total"].stackgroup is None and timings["timings/rollout_oracle"].stackgroup is None
    assert list(timings["timings/update"].x) == [1, 2, 3]  # not dropped to 0 at the evaluation line
    assert [t.meta for t in by_panel["entropy"]] == ["entropy"]


def test_dashboard_follows_a_growing_run(run):
    m = run / "metrics.jsonl"
    m.write_text(_line(0) + _line(1) + _line(2)[:40])  # two lines and a partial third
    dash = TrainingDashboard(run, live=False)
    assert len(dash.records) == 2 and dash.pending is None
    assert dash.config["loss"]["kind"] == "turn_ppo" and "loss/clip" in dash.config_html.value
    tr = {t.meta: t for t in dash.figure.data}
    assert {
        "success_rate",
        "policy_loss",
        "approx_kl",
        "clipfrac_low",
        "within_turn_shift",
        "value_across",
        "timings/rollout_s",
    } <= set(tr)
    np.testing.assert_allclose(tr["policy_loss"].y, [1.0, 0.5])
    fig_before = dash.figure
    # the writer finishes the line and writes another one
    with open(m, "a") as fh:
        fh.write(_line(2)[40:] + _line(3))
    assert dash.refresh() == 2
    assert [r["iteration"] for r in dash.records] == [0, 1, 2, 3]
    assert dash.figure is fig_before  # same metrics: traces updated in place
    tr = {t.meta: t for t in dash.figure.data}
    np.testing.assert_allclose(tr["policy_loss"].x, [0, 1, 2, 3])
    np.testing.assert_allclose(tr["policy_loss"].y, [1.0, 0.5, 1 / 3, 0.25])
    # a last line without its newline that already parses is shown, and not counted twice later
    with open(m, "a") as fh:
        fh.write(_line(4, turn_clipfrac=0.5).rstrip("\n"))
    assert dash.refresh() == 0 and dash.pending["iteration"] == 4
    assert "turn_clipfrac" in {t.meta for t in dash.figure.data}  # a new metric: the figure is rebuilt
    with open(m, "a") as fh:
        fh.write("\n")
    assert dash.refresh() == 1 and dash.pending is None and len(dash.records) == 5
    assert len(dash.table) == 5
    # trajectories and checkpoints appear
    assert dash.iterations.options == ()
    (run / "trajectories").mkdir()
    b = mv.synthetic.make_batch(4, seed=0, turns=(2, 3), turn_len=(3, 6), obs_len=(2, 4))
    mv.save(b, run / "trajectories" / "iter=000003.parquet")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest").write_text("iter=000003\n")
    dash.refresh()
    assert dash.iterations.options == ("iter=000003",) and dash.iterations.value == "iter=000003"
    assert "latest checkpoint iter=000003" in dash.status.value
    ex = dash.open_iteration(estimators=["mpo", "gae"])
    assert len(ex.batch) == 4 and dash.explorer_box.children == (ex,)
    html = dash.to_html()
    assert "fig-" in html and "turn_ppo" in html


def test_dashboard_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="run_dir: expected a run folder"):
        TrainingDashboard(tmp_path / "missing")
    with pytest.raises(ValueError, match="interval: expected > 0"):
        TrainingDashboard(tmp_path, interval=0)
    d = TrainingDashboard(tmp_path, live=False)  # an empty folder: nothing yet, no error
    assert d.records == [] and "0 iterations" in d.status.value


def test_live_refresh_on_a_running_loop(run):
    import asyncio

    m = run / "metrics.jsonl"
    m.write_text(_line(0))

    async def main():
        dash = TrainingDashboard(run, interval=0.05, live=True)  # the file is fresh: live
        assert dash.live.value and dash._task is not None
        with open(m, "a") as fh:
            fh.write(_line(1))
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(dash.records) == 2:
                break
        dash.live.value = False
        assert dash._task is None
        return len(dash.records)

    # a thread of its own: another test in this process (Playwright) may hold a running loop here
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(asyncio.run, main()).result(timeout=30) == 2


def test_status_counts_rl_iterations_only(tmp_path):
    recs = [
        {"iteration": 0, "phase": "critic_warmup"},
        {"iteration": 0, "phase": "eval", "eval_success": 0.5},
        {"iteration": 1, "phase": "rl", "success": 0.25},
        {"iteration": 2, "phase": "rl", "success": 0.5},
        {"iteration": 2, "phase": "eval", "eval_success": 0.75},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    d = TrainingDashboard(tmp_path, live=False)
    assert len(d.records) == 5
    assert "2 iterations" in d.status.value and "last iteration 2" in d.status.value
    # records without a phase (other loggers) count as iterations
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 1}\n{"iteration": 2}\n{"iteration": 3}\n')
    assert "3 iterations" in TrainingDashboard(tmp_path, live=False).status.value
