"""Makefile targets whose command line depends on the machine (dry runs: `make -n`, nothing executed)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def lab_command(*args: str) -> str:
    out = subprocess.run(["make", "-n", "-s", "lab", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_lab_adds_allow_root_only_for_root():
    assert lab_command("USER_ID=0") == ".venv/bin/jupyter lab --allow-root notebooks/"
    assert lab_command("USER_ID=1000") == ".venv/bin/jupyter lab notebooks/"


def test_lab_reads_the_user_id_of_whoever_runs_make():
    assert ("--allow-root" in lab_command()) == (os.geteuid() == 0)


def _makefile() -> str:
    return (ROOT / "Makefile").read_text()


def test_phony_lists_exactly_the_targets():
    text = _makefile()
    phony = set(next(ln for ln in text.splitlines() if ln.startswith(".PHONY:")).split(":", 1)[1].split())
    targets = {
        ln.split(":", 1)[0]
        for ln in text.splitlines()
        if ln and not ln[0].isspace() and not ln.startswith((".", "#", "$")) and ":" in ln and "=" not in ln
    }
    assert phony == targets


def test_bench_runs_only_the_quick_speed_benchmarks():
    out = subprocess.run(["make", "-n", "-s", "bench"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    names = next(ln for ln in _makefile().splitlines() if ln.startswith("BENCH_QUICK :=")).split(":=", 1)[1].split()
    assert "for b in" in out and "--quick" in out and len(names) >= 8
    for name in names:
        script = (ROOT / "benchmarks" / f"{name}.py").read_text()
        assert '"--quick"' in script, f"benchmarks/{name}.py has no --quick"
    assert "learning" not in names and "notebooks" not in names  # no grid, no hour-long run


def test_ci_runs_the_tests_and_the_lint():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test\n" in ci and "make lint" in ci


def test_the_venv_installs_torch_first_then_the_project_with_the_game_extras():
    recipe = [ln.strip() for ln in _makefile().split("$(STAMP): pyproject.toml", 1)[1].split("\n\n", 1)[0].splitlines()]
    torch = next(i for i, ln in enumerate(recipe) if "pip install torch==" in ln)
    project = next(i for i, ln in enumerate(recipe) if "pip install -e" in ln)
    assert torch < project and "'.[dev,gem,textarena]'" in recipe[project]
