"""Notebook 07 (train on Sokoban) says what it does: the runs its table names are the ones it launches,
its committed size is the one its first cell states, the start it reads is shipped with a record
(made on the rooms the notebook trains on, and the record its text quotes), its times are stated with
their load, and the place left for the GEM games holds no code."""

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "07_train_on_sokoban.ipynb"


def _cells(kind):
    nb = json.loads(NOTEBOOK.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == kind]


def test_the_run_table_names_the_methods_launched():
    intro = _cells("markdown")[0]
    table = set(re.findall(r"^\s*\| \*\*([^*]+)\*\* \| `([a-z_]+)`[^|]*\| `([a-z_]+)` \|$", intro, re.M))
    code = "\n".join(_cells("code"))
    launched = set(re.findall(r'^\s*"([^"]+)": \("([a-z_]+)", "([a-z_]+)"\),', code, re.M))
    assert table == launched and len(launched) == 3, (table, launched)


def test_the_stated_size_is_the_committed_one():
    intro = _cells("markdown")[0]
    code = _cells("code")[0]
    committed = code[code.index("else:") :]
    m = re.search(r"EPISODES, ITERATIONS, EVAL_EPISODES = (\d+), (\d+), (\d+)", committed)
    episodes, iterations, eval_episodes = m.groups()
    seeds = len(re.search(r"^SEEDS = \[([^]]*)\]", code, re.M).group(1).split(","))
    stated = re.search(r"(\d+) seeds? of each method, (\d+) iterations of (\d+) episodes", intro)
    assert stated is not None and stated.groups() == (str(seeds), iterations, episodes)
    assert f"{eval_episodes} held-out rooms" in intro


def test_the_shipped_start_is_there_with_its_record():
    start = ROOT / "trajectories" / "starts" / "sokoban"
    record = json.loads((start / "start.json").read_text())
    assert (start / "policy" / "config.json").is_file()
    assert record["sft_steps"] > 0 and 0 <= record["sft_success"] <= 1
    code = _cells("code")[0]
    assert 'START = ROOT / "trajectories" / "starts" / "sokoban"' in code


def test_the_gem_section_is_reserved_without_code():
    nb = json.loads(NOTEBOOK.read_text())
    titles = [i for i, c in enumerate(nb["cells"]) if "".join(c["source"]).startswith("## GEM games")]
    assert len(titles) == 1 and nb["cells"][titles[0]]["cell_type"] == "markdown"
    after = nb["cells"][titles[0] + 1]
    assert after["cell_type"] == "code" and "notebook done in" in "".join(after["source"])  # the closing line only


def _parameters():
    """The first code cell's assignments of literals (ENV_OPTIONS, DIFFICULTY, ...), by name."""
    values = {}
    for node in ast.parse(_cells("code")[0]).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return values


def test_the_start_was_made_on_the_rooms_the_notebook_trains_on():
    recipe = (ROOT / "trajectories" / "starts" / "make_start.py").read_text()
    recipe = recipe[recipe.index("``sokoban/``") : recipe.index("make_start.py /tmp/sokoban-sft/start sokoban")]
    options = ast.literal_eval(re.search(r"env_options=(\{[^}]*\})", recipe).group(1))
    difficulty = ast.literal_eval(re.search(r"difficulty=(\[[^]]*\])", recipe).group(1))
    params = _parameters()
    assert options == params["ENV_OPTIONS"] and difficulty == params["DIFFICULTY"]
    steps = int(re.search(r"sft_steps=(\d+)", recipe).group(1))
    code = _cells("code")[0]
    assert f"SFT_STEPS, EPOCHS, MINIBATCHES = {steps}," in code[code.index("else:") :]


def test_the_start_record_stated_is_the_shipped_one():
    record = json.loads((ROOT / "trajectories" / "starts" / "sokoban" / "start.json").read_text())
    text = next(c for c in _cells("markdown") if c.startswith("## The start"))
    m = re.search(r"stopped after ([\d,]+) SFT steps at greedy success (\d\.\d\d)", text)
    assert m is not None, text
    assert int(m.group(1).replace(",", "")) == record["sft_steps"]
    assert m.group(2) == f"{record['sft_success']:.2f}"


def test_the_times_are_stated_with_their_load():
    intro = _cells("markdown")[0]
    assert not re.search(r"\b[A-Z]{3,}-[A-Z]{3,}\b", intro), "a placeholder is left"
    assert "load average" in intro
    assert re.search(r"committed size .* took \d+ min \d+ s", intro, re.S)
    assert re.search(r"fast size .* \d+ s", intro, re.S)
