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
import subprocess
from pathlib import Path

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
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env, timeout=900, capture_output=True
        )
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


@pytest.fixture
def open_html(page, tmp_path):
    """``open_html(html)``: write a self-contained test page to a file, open it in ``page`` and wait
    until its script sets ``window.ready = true`` (file:// pages cannot import modules from files,
    so the tested ES modules are inlined in ``html``)."""

    def _open(html: str, name: str = "page.html"):
        f = tmp_path / name
        f.write_text(html)
        page.goto(f.as_uri())
        page.wait_for_function("window.ready === true")
        return page

    return _open


@pytest.fixture
def jupyter_server(tmp_path):
    """A fresh JupyterLab server for one test: 127.0.0.1, a free port, no token, ``--allow-root``,
    root folder ``tmp_path / "root"``; isolated config/runtime/workspace folders. Yields an object
    with ``url`` (``http://127.0.0.1:PORT``), ``port``, ``root`` (Path), ``pid`` and ``log`` (Path).
    """
    from tests.browser.jupyter_helpers import LabError, jupyter_lab

    try:
        lab = jupyter_lab(tmp_path)
        server = lab.__enter__()
    except LabError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        lab.__exit__(None, None, None)
