"""A click on a TrainingDashboard curve opens that iteration's episodes (real JupyterLab 4,
Chromium): a run folder with two iterations; "sort by" set to "lowest reward" in the page, then a
click on iteration 2's point of the success curve opens iteration 2's episodes below the dashboard,
lowest reward first, the lowest one in the strip."""

from __future__ import annotations

import json

import pytest

from mpo_viz.data.runfolder import RunFolder
from mpo_viz.data.trajectory import TrajectoryBatch
from tests.browser.jupyter_helpers import open_notebook, run_all, write_notebook

pytestmark = pytest.mark.browser

MASKS = [[1, 1, 0, 1, 1], [1, 0, 1, 1, 0], [1, 1, 1, 0, 1]]
REWARDS = {1: [0.0, 1.0, 0.5], 2: [0.5, 1.0, 0.0]}
DASH = ".jp-OutputArea-output .mpo-dashboard"


def _write_run(path) -> None:
    run = RunFolder(path)
    run.create()
    run.config_path.write_text(json.dumps({"estimator": "grpo", "loss": "turn_ppo"}))
    for it, rewards in REWARDS.items():
        run.append_metrics(
            {
                "iteration": it,
                "phase": "rl",
                "success": sum(r == 1 for r in rewards) / 3,
                "reward_mean": sum(rewards) / 3,
            }
        )
        rows = [
            {
                "traj_id": f"it{it}-ep{i}",
                "group_id": "g",
                "prompt_ids": [1],
                "response_ids": [5, 6, 7, 8, 9],
                "loss_mask": MASKS[i],
                "reward": r,
                "advantages": [r - 0.5] * 5,
            }
            for i, r in enumerate(rewards)
        ]
        run.write_trajectories(TrajectoryBatch.from_rows(rows), it, max_mb=100)


def test_a_click_on_iteration_2_opens_its_episodes_sorted(page, page_errors, jupyter_server):
    root = jupyter_server.root
    _write_run(root / "run")
    cells = [
        "from mpo_viz.widgets import TrainingDashboard\n"
        f"dash = TrainingDashboard({str(root / 'run')!r}, live=False)\ndash"
    ]
    write_notebook(root / "dash.ipynb", cells)
    page.set_viewport_size({"width": 1440, "height": 2200})
    open_notebook(page, jupyter_server, "dash.ipynb")
    run_all(page)
    page.wait_for_selector(f"{DASH} .js-plotly-plot .scatterlayer .point", timeout=90_000)
    # the score is chosen in the page: "sort by" -> lowest reward
    page.locator(f"{DASH} .widget-dropdown:has(label:text-is('sort by')) select").select_option(label="lowest reward")
    # the success curve is the first trace; its second point is iteration 2
    pt = page.locator(f"{DASH} .js-plotly-plot .scatterlayer .trace").first.locator(".point").nth(1)
    pt.scroll_into_view_if_needed()
    box = pt.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.up()
    ex = f"{DASH} .mpo-explorer"
    page.wait_for_selector(f"{ex} .mpo-strip-title", timeout=60_000)
    # iteration 2's rewards 0.5, 1.0, 0.0: lowest first -> ep2, ep0, ep1; the lowest one is shown
    page.wait_for_function(
        "(s) => document.querySelector(s + ' .mpo-strip-title').textContent.includes('it2-ep2')", arg=ex
    )
    labels = page.locator(f"{ex} .mpo-picker-list select option").all_inner_texts()
    assert [lab.split("\u00a0")[0].strip() for lab in labels] == ["it2-ep2", "it2-ep0", "it2-ep1"]
    assert page.locator(f"{ex} .mpo-picker .widget-dropdown select").first.input_value() == "reward"
    chosen = page.locator(f"{DASH} .widget-dropdown:has(label:text-is('trajectories')) select").input_value()
    assert (
        "000002"
        in page.locator(
            f"{DASH} .widget-dropdown:has(label:text-is('trajectories')) select option:checked"
        ).inner_text()
    ), chosen
    assert not [e for e in page_errors if "pageerror" in e], page_errors
