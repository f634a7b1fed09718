"""Notebook 07 (train on Sokoban) says what it does: the runs its table names are the ones it launches,
its committed size is the one its first cell states, the start it reads is shipped with a record
(made on the rooms the notebook trains on, and the record its text quotes), its times are stated with
their load, and the GEM section runs GEM's own game through the adapter with the same views."""

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
    gem = re.search(r"GEM_EPISODES, GEM_ITERATIONS, GEM_TOTAL_TOKENS = (\d+), (\d+), \d+", committed).groups()
    assert f"the GEM section's {gem[1]} iterations of {gem[0]} episodes" in intro


def test_the_shipped_start_is_there_with_its_record():
    start = ROOT / "trajectories" / "starts" / "sokoban"
    record = json.loads((start / "start.json").read_text())
    assert (start / "policy" / "config.json").is_file()
    assert record["sft_steps"] > 0 and 0 <= record["sft_success"] <= 1
    code = _cells("code")[0]
    assert 'START = ROOT / "trajectories" / "starts" / "sokoban"' in code


def test_the_gem_section_trains_on_gems_own_game_with_the_same_views():
    nb = json.loads(NOTEBOOK.read_text())
    sources = ["".join(c["source"]) for c in nb["cells"]]
    title = next(i for i, s in enumerate(sources) if s.startswith("## GEM games"))
    assert nb["cells"][title]["cell_type"] == "markdown" and "no exact oracle" in sources[title]
    code = "\n".join(s for c, s in zip(nb["cells"][title:], sources[title:]) if c["cell_type"] == "code")
    assert 'GEM = "gem:game:Sokoban-v0-easy"' in code and "env=GEM" in code
    assert 'env_options={"lenient": True}' in code  # a new model's first reply would end every episode
    for view in ("TrainingDashboard(", "mc_truth(", "TrajectoryExplorer("):  # the views of the exact model's runs
        assert view in code, view
    assert "oracle" not in code  # a library game has none: nothing in the section reads one


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
