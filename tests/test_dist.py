"""The package as a wheel (`make dist`): it builds from this checkout offline, carries the package's
data files, and installed into an empty folder it loads the verl plugin through its entry point."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_and_registers_the_verl_plugin(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(REPO),
        ],
        check=True,
        timeout=600,
    )
    wheels = list((tmp_path / "dist").glob("mpo_viz-*.whl"))
    assert len(wheels) == 1
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheels[0])],
        check=True,
        timeout=600,
    )
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from importlib.metadata import distribution\n"
        "d = distribution('mpo_viz')\n"
        "eps = [e for e in d.entry_points if e.group == 'verl.plugins']\n"
        "assert [e.value for e in eps] == ['mpo_viz.integrations.verl'], eps\n"
        "import mpo_viz, mpo_viz.render.strip\n"
        "assert mpo_viz.__file__.startswith(sys.argv[1]), mpo_viz.__file__\n"
        "from importlib.resources import files\n"
        "assert any(p.name.endswith('.js') for p in files('mpo_viz.render.strip').iterdir())\n"
        "print(eps[0].value)\n"
    )
    # from an empty working folder, so that the checkout's own mpo_viz is not on the path
    out = subprocess.run(
        [sys.executable, "-c", probe, str(target)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "mpo_viz.integrations.verl"
