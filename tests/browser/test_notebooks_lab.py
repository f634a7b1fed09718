"""The shipped notebooks in a real JupyterLab (one server, Chromium): open each, run all its cells
through the Run menu at the fast size (MPO_VIZ_NOTEBOOK_FAST=1), and check that every widget the
notebook displays rendered (its view is in the page, nothing reads "Error displaying widget") and
that no cell raised.

The notebooks are copied into the server's root beside links to the repository's
``trajectories/`` and ``experiments/``, which is how they find their data. Screenshots of one widget per notebook go to
``docs/notebook_*.png`` with ``MPO_VIZ_SCREENSHOTS=1``, else to the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import nbformat
import pytest

from tests.browser.jupyter_helpers import FRONT, open_notebook, tidy_for_screenshots  # noqa: I001

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
WRITE_DOCS = os.environ.get("MPO_VIZ_SCREENSHOTS") == "1"

#: notebook -> (the widget views it must show, as (CSS class, at least how many), the one to screenshot)
NOTEBOOKS = {
    "01_explore_credit_assignment.ipynb": (
        [("mpo-explorer", 1), ("mpo-variance", 1), ("mpo-comparison", 1), ("mpo-dashboard", 1)],
        "mpo-dashboard",
    ),
    "02_value_variance.ipynb": ([("mpo-variance", 2)], "mpo-variance"),
    "03_train_interactively.ipynb": ([("mpo-dashboard", 1), ("mpo-explorer", 3)], "mpo-dashboard"),
    "04_bring_your_own_logs.ipynb": ([("mpo-explorer", 1), ("mpo-comparison", 1)], "mpo-comparison"),
    "05_scale_out_with_verl.ipynb": ([("mpo-dashboard", 1), ("mpo-variance", 1), ("mpo-explorer", 2)], "mpo-variance"),
    "07_train_on_sokoban.ipynb": (
        [("mpo-dashboard", 2), ("mpo-run-comparison", 1), ("mpo-explorer", 3)],  # GEM: a dashboard, an explorer
        "mpo-dashboard",
    ),
}


@pytest.fixture
def fast_size(monkeypatch, tmp_path):
    """The kernels JupyterLab starts inherit the server's environment: the notebooks' fast size.
    And no windowing in JupyterLab's notebook view, so that every cell's output is in the page."""
    monkeypatch.setenv("MPO_VIZ_NOTEBOOK_FAST", "1")
    settings = tmp_path / "jconfig" / "lab" / "user-settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))


#: the notebook in front (JupyterLab keeps earlier notebooks' panels in the page, hidden)


def _marker(name: str) -> str:
    return f"MPO-NOTEBOOK-DONE-{name.split('_')[0]}"


def _copy_with_marker(src: Path, dst: Path) -> None:
    """The notebook with a last cell printing a marker of its own: its output says every cell ran."""
    nb = nbformat.read(str(src), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(f"print({_marker(src.name)!r})"))
    nbformat.write(nb, str(dst))


def _run_all(page, name: str, timeout_ms: int) -> None:
    """Run every cell through the Run menu and wait for this notebook's marker."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    page.wait_for_selector(f"{FRONT} .jp-OutputArea-output:has-text('{_marker(name)}')", timeout=timeout_ms)


def test_notebooks_render_in_jupyterlab(fast_size, page, page_errors, jupyter_server, tmp_path):
    root = jupyter_server.root
    for data in ("trajectories", "experiments"):  # the shipped data and the archived runs notebook 01 replays
        (root / data).symlink_to(REPO / data, target_is_directory=True)
    shots = REPO / "docs" if WRITE_DOCS else tmp_path
    page.set_viewport_size({"width": 1440, "height": 2600})
    for name, (expected, shot) in NOTEBOOKS.items():
        _copy_with_marker(REPO / "notebooks" / name, root / name)
        open_notebook(page, jupyter_server, name, reset=True)
        tidy_for_screenshots(page)
        _run_all(page, name, timeout_ms=600_000)  # notebook 03 trains (tiny runs in subprocesses)
        errors = page.locator(
            f"{FRONT} .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']", has_text="Traceback"
        )
        assert errors.count() == 0, f"{name}: {errors.first.inner_text()[:2000]}"
        for css, n in expected:
            page.wait_for_selector(f"{FRONT} .jp-OutputArea-output .{css} .js-plotly-plot .main-svg", timeout=60_000)
            assert page.locator(f"{FRONT} .jp-OutputArea-output .{css}").count() >= n, (
                name,
                css,
            )  # views nest explorers
        text = page.locator(f"{FRONT} .jp-Notebook").first.inner_text()
        assert "Error displaying widget" not in text, name
        assert "Loading widget..." not in text, name
        page.mouse.move(5, 5)
        page.wait_for_timeout(300)
        page.locator(f"{FRONT} .jp-OutputArea-output .{shot}").first.screenshot(
            path=str(shots / f"notebook_{name.split('_')[0]}.png")
        )
        # close the notebook (and its kernel) before the next: one kernel at a time on a small machine
        for s in _sessions(jupyter_server.url):
            _delete_session(jupyter_server.url, s)
    errs = [e for e in page_errors if "favicon" not in e]
    assert errs == []


def _sessions(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/api/sessions", timeout=10) as r:
        return [s["id"] for s in json.loads(r.read())]


def _delete_session(url: str, sid: str) -> None:
    req = urllib.request.Request(f"{url}/api/sessions/{sid}", method="DELETE")
    urllib.request.urlopen(req, timeout=30).close()
