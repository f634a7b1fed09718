"""benchmarks/fit_critic.py at 2 steps: the table with both rows, the ratio and the held-out EV."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script(ROOT / "benchmarks" / "fit_critic.py", "bench_fit_critic")


def test_table(bench, capsys):
    assert bench.main(["--steps", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "search: 400 trajectories" in out and "2 steps of 16 episodes" in out
    bare = re.search(r"\| bare loop \| ([\d.]+) \| ([\d.]+) \| 1\.00 \| (yes|no) \|", out)
    fit = re.search(r"\| fit_critic \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| (yes|no) \|", out)
    assert bare and fit
    ratio, wall_fit, wall_bare = float(fit.group(3)), float(fit.group(1)), float(bare.group(1))
    assert abs(ratio - wall_fit / wall_bare) <= 0.05 * ratio  # the printed seconds are rounded to 0.1
    assert re.search(r"held-out explained variance: -?[\d.]+", out)
