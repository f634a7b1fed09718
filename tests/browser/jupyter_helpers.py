"""Helpers for widget tests in a real JupyterLab (the ``jupyter_server`` fixture of conftest.py):
write a notebook, open it, run every cell through the Run menu, wait for the widgets.

Cells are run with JupyterLab's own "Run All Cells" menu item (command ``runmenu:run-all``), the way
a user does it; a final cell prints a marker whose output tells us every cell ran.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import nbformat

DONE = "MPO-CELLS-DONE"


def write_notebook(path: Path, cells: list[str]) -> Path:
    """A notebook of code cells (python3 kernel) ending with a cell that prints :data:`DONE`."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells] + [nbformat.v4.new_code_cell(f"print({DONE!r})")]
    nbformat.write(nb, str(path))
    return path


FRONT = ".jp-NotebookPanel:not(.lm-mod-hidden)"
"""The notebook panel in front (earlier notebooks stay open in hidden panels)."""


def open_notebook(page, server, name: str, timeout_ms: int = 60_000, *, reset: bool = False) -> None:
    """Open ``name`` (relative to the server root) in JupyterLab and wait until the kernel of the
    notebook in front is idle. ``reset``: a fresh workspace, so earlier notebooks (their kernels
    gone) are not restored beside it."""
    page.goto(f"{server.url}/lab/tree/{name}{'?reset' if reset else ''}", wait_until="domcontentloaded")
    page.wait_for_selector(f"{FRONT} .jp-Cell", timeout=timeout_ms)
    # JupyterLab may ask which kernel to start: accept its proposal (the server's python3)
    try:
        page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click(timeout=5_000)
    except Exception:  # noqa: BLE001 - no dialog: the kernel started on its own
        pass
    # the kernel status in the front notebook's toolbar reads "Idle" once the kernel started
    page.wait_for_function(
        "(front) => { const p = document.querySelector(front); return (!!p && [...p.querySelectorAll("
        "'.jp-NotebookPanel-toolbar [aria-label], .jp-Toolbar-kernelStatus')].some(e => /idle/i.test("
        "e.getAttribute('aria-label') || '') || /idle/i.test(e.textContent || ''))) || !!document.querySelector("
        "'.jp-Notebook-ExecutionIndicator[data-status=\"idle\"]'); }",
        arg=FRONT,
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


# --- a JupyterLab server (the conftest fixture and benchmarks/widgets.py both use it) ------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Stop the server we started: SIGTERM to its PID, then SIGKILL to its own process group
    (kernels it started) if anything is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group was created for this server (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


class LabError(RuntimeError):
    """JupyterLab did not start."""


@contextlib.contextmanager
def jupyter_lab(tmp: Path):
    """A fresh JupyterLab server: 127.0.0.1, a free port, no token, ``--allow-root``, root folder
    ``tmp / "root"``; isolated config/runtime/workspace folders. Yields an object with ``url``,
    ``port``, ``root`` (Path), ``pid`` and ``log`` (Path); stops the server (by its PID) on exit."""
    tmp = Path(tmp)
    root = tmp / "root"
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = tmp / "jupyter.log"
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp / "jconfig"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "jruntime"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "jworkspaces"),
        "IPYTHONDIR": str(tmp / "ipython"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        "--ServerApp.token=",
        "--ServerApp.password=",
        "--ServerApp.disable_check_xsrf=True",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    fh = open(log, "wb")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=root, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise LabError(f"JupyterLab exited with {proc.returncode} before answering:\n{log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LabError(f"JupyterLab did not answer on {url} within 90 s:\n{log.read_text()[-2000:]}")
            time.sleep(0.25)
        yield SimpleNamespace(url=url, port=port, root=root, pid=proc.pid, log=log)
    finally:
        _stop(proc)
        fh.close()


# --- latency, measured in the page from the input to the last redraw ---------------------------

_WAIT_DRAWN = """
  const frame = () => new Promise((r) => requestAnimationFrame(() => r()));
  const start = performance.now();
  while (!done()) {
    if (performance.now() - start > limit)
      throw new Error('mpo timing: the view did not update within ' + limit + ' ms');
    await frame();
  }
  const t1 = performance.now();
  await frame(); await frame();  // the frame with the new content is painted
  return {ms: t1 - t0, painted_ms: performance.now() - t0};
"""


def time_pick(page, scope: str, index: int, traj_id: str, limit_ms: int = 60_000) -> dict:
    """Pick option ``index`` of the picker in ``scope`` (as a user does: the select's change event)
    and measure, in the page, the milliseconds until the strip, the value curve and the header
    show ``traj_id`` (``ms``), and until the frame after that is painted (``painted_ms``)."""
    return page.evaluate(
        "async ([scope, index, tid, limit]) => {"
        "  const root = document.querySelector(scope);"
        "  const sel = root.querySelector('.mpo-picker-list select');"
        "  const done = () => {"
        "    const title = (root.querySelector('.mpo-strip-title') || {}).textContent || '';"
        "    const gd = root.querySelector('.js-plotly-plot');"
        "    const ft = gd && gd.layout && gd.layout.title ? String(gd.layout.title.text || gd.layout.title) : '';"
        "    const head = root.querySelector('.mpo-status') || root;"
        "    return title.includes(tid) && (!gd || ft.includes(tid)) && head.textContent.includes(tid); };"
        "  const t0 = performance.now();"
        "  sel.selectedIndex = index;"
        "  sel.dispatchEvent(new Event('input', {bubbles: true}));"
        "  sel.dispatchEvent(new Event('change', {bubbles: true}));" + _WAIT_DRAWN + "}",
        [scope, index, traj_id, limit_ms],
    )


def time_slider(
    page, scope: str, label: str, value: str, trace: str, first_value: float, limit_ms: int = 60_000
) -> dict:
    """Type ``value`` into the slider ``label`` of ``scope`` and press Enter (as a user can); measure,
    in the page, from the Enter key to the figure's ``trace`` starting at ``first_value`` and the
    header naming the new setting (``ms``; ``painted_ms``: the next frame painted)."""
    import re

    page.evaluate(
        "() => { window.__mpoT0 = null; const on = (e) => { if (e.key === 'Enter') {"
        " window.__mpoT0 = performance.now(); document.removeEventListener('keydown', on, true); } };"
        " document.addEventListener('keydown', on, true); }"
    )
    slider = (
        page.locator(scope)
        .first.locator(".widget-slider")
        .filter(has=page.locator(".widget-label", has_text=re.compile(f"^{re.escape(label)}$")))
    )
    slider.locator(".widget-readout").click()
    page.keyboard.press("Control+A")
    page.keyboard.type(value)
    page.keyboard.press("Enter")
    return page.evaluate(
        "async ([scope, trace, v, setting, limit]) => {"
        "  const root = document.querySelector(scope);"
        "  const t0 = window.__mpoT0;"
        "  if (t0 === null) throw new Error('mpo timing: the Enter key was not seen');"
        "  const done = () => {"
        "    const gd = root.querySelector('.js-plotly-plot');"
        "    const t = gd && gd.data ? gd.data.find((d) => d.name === trace) : null;"
        "    if (!t) return false;"
        "    const ys = Array.from(t.y).filter((y) => y !== null && !Number.isNaN(y));"
        "    const head = root.querySelector('.mpo-status') || root;"
        "    return ys.length > 0 && Math.abs(ys[0] - v) < 1e-5 && head.textContent.includes(setting); };"
        + _WAIT_DRAWN
        + "}",
        [scope, trace, first_value, f"={float(value):g}", limit_ms],
    )
