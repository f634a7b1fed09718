"""docs/notebooks.md says what the notebooks do: the run names it quotes for notebook 03 are the
notebook's own (a run renamed or removed in the notebook fails here until the page follows)."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_notebook_03_run_names_quoted_in_the_docs_exist():
    page = (ROOT / "docs" / "notebooks.md").read_text()
    para = page[page.index("Notebook 03's runs are named") :]
    para = para[: para.index("\n\n")]
    quoted = re.findall(r'"([^"]+)"', para)
    nb = json.loads((ROOT / "notebooks" / "03_train_interactively.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    names = set(re.findall(r'^\s*"([^"]+)": Config\(', code, re.M))
    assert len(quoted) == 7 and set(quoted) == names, (quoted, names)
