"""Browser test harness: Debian Chromium driven by Playwright, and a fresh JupyterLab per test.

* Chromium is ``/usr/bin/chromium`` (Debian's package; ``make browser-deps`` installs it). When it
  is missing the harness tries ``apt-get install chromium`` once and otherwise **fails** the tests
  loudly — browser tests are never skipped silently. Playwright's own browser downloads are never
  used (no ``playwright install``).
* Fixtures: ``chromium_path`` (session), ``browser`` (session, one headless Chromium), ``page``
  (per test: a fresh context and page; ``page_errors`` lists uncaught page errors and console
  errors, ``page_requests`` every URL the page fetched), ``jupyter_server`` (per test: a fresh
  JupyterLab on 127.0.0.1 at a free port, no token, root = a temporary folder; stopped by PID).

Every test in this folder is marked ``browser``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}


@pytest.hookimpl(tryfirst=True)  # before `-m` selection reads the markers
def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)


def _install_chromium() -> str:
    """Try ``apt-get install chromium``; return a message describing the outcome."""
    if shutil.which("apt-get") is None:
        return "apt-get is not available"
    if os.geteuid() != 0:
        return "not root, cannot apt-get install (run `make browser-deps` as root)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env, timeout=900,
                       capture_output=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        out = getattr(exc, "stderr", b"") or b""
        return f"apt-get install chromium failed: {exc}; {out.decode(errors='replace')[-500:]}"
    return "installed"


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Path of Debian's Chromium, installed on first use when missing; fails (never skips) otherwise."""
    if not os.access(CHROMIUM, os.X_OK):
        msg = _install_chromium()
        if not os.access(CHROMIUM, os.X_OK):
            pytest.fail(
                f"browser tests need Chromium at {CHROMIUM} ({msg}). Install it with "
                "`make browser-deps` (apt-get install chromium).",
                pytrace=False,
            )
    return CHROMIUM


@pytest.fixture(scope="session")
def browser(chromium_path):
    """One headless Chromium for the session (Playwright, executable_path = Debian's Chromium)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page_errors() -> list:
    """Uncaught page errors and console errors of the ``page`` fixture (strings)."""
    return []


@pytest.fixture
def page_requests() -> list:
    """Every URL requested by the ``page`` fixture."""
    return []


@pytest.fixture
def page(browser, page_errors, page_requests):
    """A fresh browser context and page (1280×900) per test."""
    ctx = browser.new_context(viewport=VIEWPORT)
    pg = ctx.new_page()
    pg.on("pageerror", lambda e: page_errors.append(f"pageerror: {e}"))
    pg.on("console", lambda m: page_errors.append(f"console.error: {m.text}") if m.type == "error" else None)
    pg.on("request", lambda r: page_requests.append(r.url))
    pg.set_default_timeout(30_000)
    try:
        yield pg
    finally:
        ctx.close()


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


@pytest.fixture
def jupyter_server(tmp_path):
    """A fresh JupyterLab server for one test: 127.0.0.1, a free port, no token, ``--allow-root``,
    root folder ``tmp_path / "root"``; isolated config/runtime/workspace folders. Yields an object
    with ``url`` (``http://127.0.0.1:PORT``), ``port``, ``root`` (Path), ``pid`` and ``log`` (Path).
    """
    root = tmp_path / "root"
    root.mkdir()
    port = _free_port()
    log = tmp_path / "jupyter.log"
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jconfig"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jruntime"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "jworkspaces"),
        "IPYTHONDIR": str(tmp_path / "ipython"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
        "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
        "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
        f"--ServerApp.root_dir={root}", "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    fh = open(log, "wb")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=root, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode} before answering:\n{log.read_text()[-2000:]}",
                            pytrace=False)
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer on {url} within 90 s:\n{log.read_text()[-2000:]}", pytrace=False)
            time.sleep(0.25)
        yield SimpleNamespace(url=url, port=port, root=root, pid=proc.pid, log=log)
    finally:
        _stop(proc)
        fh.close()
