"""From an iteration to its episodes: the dashboard's and the run comparison's open_iteration, on
run folders whose episodes' scores are read off the rows below (widget state, no browser)."""

import json

import pytest
from plotly.callbacks import Points

from mpo_viz.data.runfolder import RunFolder
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.widgets import RunComparison, TrainingDashboard
from mpo_viz.widgets.iterations import IterationOpener

MASKS = [[1, 1, 0, 1], [1, 0, 1, 1], [1, 1, 1, 0]]
ADV = [[0.5, -2.0, 9.0, 1.0], [0.1, 0.0, 0.3, -0.4], [-1.0, -1.0, -1.0, 7.0]]  # max |A| on actions: 2, 0.4, 1
RATIO = [[1.0, 1.5, 1.0, 3.0], [2.0, 1.0, 9.0, 1.0], [1.0, 4.0, 1.0, 1.0]]  # max on actions: 3, 9, 4


def _batch(it, rewards, ratio=False):
    rows = []
    for i in range(3):
        r = {
            "traj_id": f"it{it}-e{i}",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [5, 6, 7, 8],
            "loss_mask": MASKS[i],
            "reward": rewards[i],
            "advantages": ADV[i],
            "old_logprobs": [-0.5] * 4,
        }
        if ratio:
            r["ratio"] = RATIO[i]
        rows.append(r)
    return TrajectoryBatch.from_rows(rows)


def _run(path, iterations):
    run = RunFolder(path)
    run.create()
    run.config_path.write_text(json.dumps({"estimator": "grpo", "loss": "turn_ppo"}))
    for it in iterations:
        run.append_metrics({"iteration": it, "phase": "rl", "success": 0.5, "reward_mean": 0.1 * it})
        run.write_trajectories(_batch(it, [0.5, 1.0, 0.0], ratio=it == 2), it, max_mb=100)
    return run


def _order(ex):
    return [ex.batch.traj_ids[r] for r in ex.picker.page_rows]


def test_open_iteration_sorts_by_the_chosen_score_and_finds_an_iteration_written_since(tmp_path):
    run = _run(tmp_path / "run", [1])
    dash = TrainingDashboard(run.path, live=False)
    assert dash.iterations.options == ("iter=000001",) and dash.sort.value == "abs_advantage"
    ex = dash.open_iteration(1, estimators=["grpo"])
    # largest |advantage| first: e0 (2), e2 (1), e1 (0.4); the best one is shown
    assert (ex.picker.sort_by.value, ex.picker.descending.value) == ("max|adv|", True)
    assert _order(ex) == ["it1-e0", "it1-e2", "it1-e1"] and ex.row == 0
    assert ex.picker.table["max|adv|"].tolist() == pytest.approx([2.0, 0.4, 1.0])
    assert dash.explorer is ex and dash.explorer_box.children == (ex,)
    ex = dash.open_iteration(1, sort="reward", estimators=["grpo"])  # lowest reward first
    assert (ex.picker.sort_by.value, ex.picker.descending.value) == ("reward", False)
    assert _order(ex) == ["it1-e2", "it1-e0", "it1-e1"] and ex.row == 2 and dash.sort.value == "reward"
    # the run writes iteration 2 while the dashboard is open: found without a refresh
    run.append_metrics({"iteration": 2, "phase": "rl", "success": 0.4})
    run.write_trajectories(_batch(2, [0.5, 1.0, 0.0], ratio=True), 2, max_mb=100)
    ex = dash.open_iteration(2, sort="ratio", estimators=["grpo"])
    assert _order(ex) == ["it2-e1", "it2-e2", "it2-e0"] and ex.row == 1  # token ratios 9, 4, 3
    assert dash.iterations.options == ("iter=000001", "iter=000002") and dash.iterations.value == "iter=000002"
    assert dash.opener.opened == (2, "ratio")
    assert dash.open_iteration("iter=000001", estimators=["grpo"]).batch.traj_ids[0] == "it1-e0"  # a name works


def test_a_sort_the_file_cannot_rank_by_is_named_and_the_button_opens_unsorted(tmp_path):
    run = _run(tmp_path / "run", [1, 2])
    dash = TrainingDashboard(run.path, live=False)
    with pytest.raises(ValueError, match="sort: 'ratio' needs the per-token field ratio; the batch carries"):
        dash.open_iteration(1, sort="ratio")
    with pytest.raises(ValueError, match=r"n: expected an iteration with saved episodes in .* \(1, 2\), found 7"):
        dash.open_iteration(7)
    dash.sort.value, dash.iterations.value = "ratio", "iter=000001"
    dash.opener.clicked()
    assert (
        dash.opener.opened == (1, None)
        and "carries no fields to rank by largest token ratio" in dash.opener.message.value
    )
    dash.iterations.value = "iter=000002"
    dash.opener.clicked()
    assert dash.opener.opened == (2, "ratio") and dash.opener.message.value == ""
    assert _order(dash.explorer) == ["it2-e1", "it2-e2", "it2-e0"]
    with pytest.raises(ValueError, match="sort: expected one of abs_advantage"):
        IterationOpener(run.path, sort="best")


def test_run_comparison_opens_a_chosen_runs_iteration(tmp_path):
    a, b = _run(tmp_path / "a", [1]), _run(tmp_path / "b", [1, 2])
    rc = RunComparison([a.path, b.path], metrics=["success"])
    assert rc.opener.iterations.options == ("iter=000001",)  # the first run's
    ex = rc.open_iteration(1, 2, sort="ratio", estimators=["grpo"])
    assert rc.run.value == str(b.path) and rc.opener.iterations.options == ("iter=000001", "iter=000002")
    assert _order(ex) == ["it2-e1", "it2-e2", "it2-e0"] and rc.explorer is ex
    ex = rc.open_iteration(a.path, 1, sort="reward", estimators=["grpo"])
    assert rc.run.value == str(a.path) and _order(ex) == ["it1-e2", "it1-e0", "it1-e1"]
    with pytest.raises(ValueError, match="run: expected one of the runs"):
        rc.open_iteration(tmp_path / "c", 1)


def test_a_click_on_a_panel_opens_that_iteration_sorted_by_the_menu(tmp_path):
    run = _run(tmp_path / "run", [1, 3])
    dash = TrainingDashboard(run.path, live=False, sort="reward")
    success = next(t for t in dash.figure.data if t.meta == "success")
    # plotly's click on the point of iteration 3 (what the front end sends back to the kernel)
    success._dispatch_on_click(Points(point_inds=[1], xs=[3], ys=[0.5], trace_name="success", trace_index=0), None)
    assert dash.opener.opened == (3, "reward") and dash.iterations.value == "iter=000003"
    assert _order(dash.explorer) == ["it3-e2", "it3-e0", "it3-e1"]
    # iteration 2 saved no episodes: the next saved one; past the last: said, nothing opened
    reward = next(t for t in dash.figure.data if t.meta == "reward_mean")
    reward._dispatch_on_click(Points(point_inds=[0], xs=[1], ys=[0.1], trace_name="reward_mean", trace_index=1), None)
    assert dash.opener.opened == (1, "reward") and dash.explorer.batch.traj_ids[0] == "it1-e0"
    reward._dispatch_on_click(Points(point_inds=[0], xs=[2], ys=[0.2], trace_name="reward_mean", trace_index=1), None)
    assert dash.opener.opened == (3, "reward")
    reward._dispatch_on_click(Points(point_inds=[0], xs=[4], ys=[0.4], trace_name="reward_mean", trace_index=1), None)
    assert (
        dash.opener.opened == (3, "reward") and "no saved episodes at or after iteration 4" in dash.opener.message.value
    )


def test_the_dashboard_names_a_collapse_and_opens_its_episodes(tmp_path):
    run = RunFolder(tmp_path / "run")
    run.create()
    run.config_path.write_text(json.dumps({"estimator": "grpo", "loss": "turn_ppo"}))
    run.append_metrics({"iteration": 1, "phase": "rl", "success": 0.5})
    run.write_trajectories(_batch(1, [0.5, 1.0, 0.0]), 1, max_mb=100)
    dash = TrainingDashboard(run.path, live=False)
    assert dash.findings == [] and dash.collapse_html.value == "" and dash.collapse_button.layout.display == "none"
    with pytest.raises(ValueError, match=r"metric: expected a collapse signature with saved episodes \(none\)"):
        dash.open_collapse()
    # the run goes on and collapses at iteration 2 (success 0.5 -> 0.0), flagged by the trainer
    run.append_metrics({"iteration": 2, "phase": "rl", "success": 0.0, "collapse": ["success"]})
    run.write_trajectories(_batch(2, [0.0, 1.0, 0.5]), 2, max_mb=100)
    dash.refresh()
    (f,) = dash.findings
    assert (f.metric, f.first, f.episodes_iteration, f.ranking) == ("success", 2, 2, "reward")
    assert (
        "<b>success</b> first crossed its threshold at iteration 2 (episodes of iteration 2, sorted by lowest reward)"
        in dash.collapse_html.value
        and dash.collapse_button.layout.display == ""
    )
    dash.collapse_button.click()
    assert dash.opener.opened == (2, "reward") and _order(dash.explorer) == ["it2-e0", "it2-e2", "it2-e1"]
