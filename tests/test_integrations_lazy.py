"""Importing mpo_viz never imports verl: the plugin module is only loaded by verl itself."""

import subprocess
import sys


def test_import_mpo_viz_does_not_import_verl():
    code = (
        "import sys, mpo_viz, mpo_viz.integrations, mpo_viz.advantages, mpo_viz.losses, mpo_viz.analysis; "
        "print(sorted(m for m in sys.modules if m == 'verl' or m.startswith(('verl.', 'mpo_viz.integrations.verl'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_entry_point_declared_in_pyproject():
    """`pip install mpo_viz` is enough for verl: the entry point group verl scans names our plugin."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    section = text.split('[project.entry-points."verl.plugins"]\n', 1)[1].split("\n[", 1)[0]
    entries = [ln for ln in section.splitlines() if ln.strip() and not ln.startswith("#")]
    assert entries == ['mpo_viz = "mpo_viz.integrations.verl"']
