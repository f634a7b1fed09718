"""Helpers for widget tests in a real JupyterLab (the ``jupyter_server`` fixture of conftest.py):
write a notebook, open it, run every cell through the Run menu, wait for the widgets.

Cells are run with JupyterLab's own "Run All Cells" menu item (command ``runmenu:run-all``), the way
a user does it; a final cell prints a marker whose output tells us every cell ran.
"""

from __future__ import annotations

import time
from pathlib import Path

import nbformat

DONE = "MPO-CELLS-DONE"


def write_notebook(path: Path, cells: list[str]) -> Path:
    """A notebook of code cells (python3 kernel) ending with a cell that prints :data:`DONE`."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells] + [nbformat.v4.new_code_cell(f"print({DONE!r})")]
    nbformat.write(nb, str(path))
    return path


def open_notebook(page, server, name: str, timeout_ms: int = 60_000) -> None:
    """Open ``name`` (relative to the server root) in JupyterLab and wait until its kernel is idle."""
    page.goto(f"{server.url}/lab/tree/{name}", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=timeout_ms)
    # JupyterLab may ask which kernel to start: accept its proposal (the server's python3)
    try:
        page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click(timeout=5_000)
    except Exception:  # noqa: BLE001 - no dialog: the kernel started on its own
        pass
    # the kernel status in the notebook toolbar reads "Idle" once the kernel started
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-NotebookPanel-toolbar [aria-label], .jp-Toolbar-kernelStatus')]"
        ".some(e => /idle/i.test(e.getAttribute('aria-label') || '') || /idle/i.test(e.textContent || ''))"
        " || !!document.querySelector('.jp-Notebook-ExecutionIndicator[data-status=\"idle\"]')",
        timeout=timeout_ms,
    )


def tidy_for_screenshots(page) -> None:
    """Collapse the left sidebar (wider notebook) and dismiss the "Jupyter news" notification."""
    try:
        page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").first.click(timeout=3_000)
    except Exception:  # noqa: BLE001 - already collapsed
        pass
    try:
        page.locator(".jp-Notification-Toast-Close, .Toastify__close-button").first.click(timeout=2_000)
    except Exception:  # noqa: BLE001 - no notification
        pass


def run_all(page, timeout_ms: int = 120_000) -> float:
    """Run every cell via the Run menu ("Run All Cells"); wait for the :data:`DONE` output.
    Returns the seconds it took."""
    t0 = time.monotonic()
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    page.wait_for_selector(f".jp-OutputArea-output:has-text('{DONE}')", timeout=timeout_ms)
    return time.monotonic() - t0


def plot_data(page, selector: str, trace: int, key: str = "y") -> list:
    """``gd.data[trace][key]`` of the plotly graph div matched by ``selector`` (first match)."""
    return page.evaluate(
        "([sel, i, k]) => { const gd = document.querySelector(sel); const v = gd.data[i][k];"
        " return Array.from(v, (x) => (x === null || Number.isNaN(x) ? null : x)); }",
        [selector, trace, key],
    )
