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
