"""Importing mpo_viz never imports verl: the plugin module is only loaded by verl itself."""

import subprocess
import sys


def test_import_mpo_viz_does_not_import_verl():
    code = ("import sys, mpo_viz, mpo_viz.integrations, mpo_viz.advantages, mpo_viz.losses, mpo_viz.analysis; "
            "print(sorted(m for m in sys.modules if m == 'verl' or m.startswith(('verl.', 'mpo_viz.integrations.verl'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_entry_point_declared_in_pyproject():
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["verl.plugins"] == {"mpo_viz": "mpo_viz.integrations.verl"}
