"""Every notebook executed at its committed size: wall time and load, and the figures docs/notebooks.md shows.

Each notebook runs top to bottom in a fresh kernel (nbclient, as ``make notebooks-html`` does),
from ``notebooks/``, with ``MPO_VIZ_NOTEBOOK_FAST`` unset. One row per notebook: wall seconds, the
load average before and after (the notebooks that train start background processes of their own),
the number of code cells and the error if one stopped it. docs/notebooks.md states these times.

``--figures`` also writes ``docs/notebook_03_curves.png``: the curves figure of notebook 03's last
comparison (all six runs), taken from the executed notebook's own output and drawn by plotly's
static export (needs ``pip install kaleido`` and a Chrome/Chromium; ``BROWSER_PATH=/usr/bin/chromium``).

    python benchmarks/notebooks.py                              # 01-05 and 07; 06 when its model is there
    python benchmarks/notebooks.py 03 --figures                 # one notebook, and the docs figure
    python benchmarks/notebooks.py 06 --smollm2 models/smollm2-135m

Notebook 06 needs SmolLM2-135M-Instruct as a local folder (``mpo-viz get-model smollm2-135m --out
DIR``); without one it is skipped, and the row says so. Nothing is downloaded here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import nbformat
import plotly.io as pio
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
PLOTLY = "application/vnd.plotly.v1+json"
#: the cell of notebook 03 whose figure docs/notebooks.md shows: its comparison of all six runs of the loss section
CURVES_CELL = "compare([*configs, *variants])"


def execute(path: Path, timeout: int) -> tuple[nbformat.NotebookNode, float, str]:
    """Run ``path`` in a fresh kernel from its folder; ``(notebook with outputs, seconds, error or '')``."""
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    err = ""
    try:
        NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
        ).execute()
    except CellExecutionError as exc:
        err = str(exc).strip().splitlines()[-1][:200]
    return nb, time.perf_counter() - t0, err


def curves_figure(nb, out: Path) -> Path:
    """Write the plotly figure that notebook 03's :data:`CURVES_CELL` displayed to ``out`` (PNG)."""
    for cell in nb.cells:
        if cell.cell_type == "code" and CURVES_CELL in cell.source:
            for o in cell.get("outputs", []):
                if PLOTLY in o.get("data", {}):
                    fig = pio.from_json(json.dumps(o["data"][PLOTLY]))
                    fig.write_image(str(out), width=1400, height=420, scale=1)
                    return out
    raise RuntimeError(
        f"notebook 03: no plotly output in the cell with {CURVES_CELL!r} (was it run with "
        f"PLOTLY_RENDERER=plotly_mimetype?)"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("only", nargs="*", help="notebook numbers (01 ... 07); default all")
    ap.add_argument("--figures", action="store_true", help="write docs/notebook_03_curves.png from notebook 03's run")
    ap.add_argument("--smollm2", type=Path, default=None, help="SmolLM2-135M-Instruct folder for notebook 06")
    ap.add_argument("--keep", type=Path, default=None, help="also write each executed notebook (with its outputs) here")
    ap.add_argument("--timeout", type=int, default=5400, help="seconds per cell")
    args = ap.parse_args(argv)
    os.environ.pop("MPO_VIZ_NOTEBOOK_FAST", None)
    os.environ["PLOTLY_RENDERER"] = "plotly_mimetype"  # figures kept in the outputs (for --figures)
    if args.smollm2 is not None:
        os.environ["MPO_VIZ_SMOLLM2_DIR"] = str(args.smollm2.resolve())
    smol = Path(os.environ.get("MPO_VIZ_SMOLLM2_DIR", REPO / "models" / "smollm2-135m"))
    paths = [p for p in sorted(NOTEBOOKS.glob("*.ipynb")) if not args.only or p.name[:2] in args.only]
    print(f"\n## notebooks at their committed sizes ({os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M')})\n")
    print("| notebook | wall | load before | load after | code cells | error |\n|---|---|---|---|---|---|", flush=True)
    for p in paths:
        if p.name.startswith("06") and not (smol / "config.json").is_file():
            print(
                f"| {p.name} | skipped | | | | no model folder at {smol} (mpo-viz get-model smollm2-135m --out DIR) |"
            )
            continue
        before = os.getloadavg()[0]
        nb, sec, err = execute(p, args.timeout)
        cells = sum(c.cell_type == "code" for c in nb.cells)
        print(
            f"| {p.name} | {sec // 60:.0f} min {sec % 60:.0f} s | {before:.1f} | {os.getloadavg()[0]:.1f} | {cells} | "
            f"{err} |",
            flush=True,
        )
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, args.keep / p.name)
        if args.figures and p.name.startswith("03") and not err:
            print(f"wrote {curves_figure(nb, REPO / 'docs' / 'notebook_03_curves.png')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
