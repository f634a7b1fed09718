"""Notebook 01 says what its data show: its example trajectory for "values that move most inside
turns" is one where the across/within statistic is defined, and its comment on the replayed
run's curves quotes the run's own metrics (without executing the notebook)."""

import json
from pathlib import Path

import numpy as np

import mpo_viz as mv
from mpo_viz.analysis import value_variance

ROOT = Path(__file__).resolve().parents[2]
NB = json.loads((ROOT / "notebooks" / "01_explore_credit_assignment.ipynb").read_text())
CELLS = ["".join(c["source"]) for c in NB["cells"]]


def cell(starting: str) -> str:
    (text,) = [c for c in CELLS if c.startswith(starting)]
    return text


def test_the_variance_example_is_a_trajectory_with_two_turns_or_more():
    batch = mv.load(ROOT / "trajectories" / "search.parquet")

    class Recorder:  # VarianceView's table and open_trajectory, without the widgets
        def __init__(self, b):
            self.table, self.opened = value_variance(b), []

        def open_trajectory(self, traj):
            self.opened.append(traj)

    ns = {"VarianceView": Recorder, "batch": batch}
    exec(cell("variance = VarianceView(batch)"), ns)
    (tid,) = ns["variance"].opened
    t = ns["variance"].table.set_index("traj_id")
    assert (t["n_turns"] < 2).any()  # the shipped set has one-turn trajectories, whose ratio is 0 by definition
    assert t.loc[tid, "n_turns"] >= 2 and np.isfinite(t.loc[tid, "ratio"]) and t.loc[tid, "within"] > 0
    assert t.loc[tid, "ratio"] == t[t["n_turns"] >= 2]["ratio"].min()


def test_the_comment_on_the_replayed_run_matches_its_metrics():
    """The dashboard section replays an archived replication run and its text says what the run's own
    metrics show: held-out sampled success up at every evaluation, greedy a little down, training
    success noisy, the critic's explained variance low (its warm-up missed the gate)."""
    folder = ROOT / "experiments" / "records" / "v3" / "e3" / "runs" / "automation-d5-6" / "mpo_token" / "seed=1"
    assert '"mpo_token" / "seed=1"' in cell("import shutil")
    recs = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    text = " ".join(cell("### What this run's curves show").split())
    evals = [r for r in recs if r.get("eval_sampled_success") is not None]
    rl = [r for r in recs if r["phase"] == "rl"]
    sampled = [r["eval_sampled_success"] for r in evals]
    assert all(b > a for a, b in zip(sampled, sampled[1:]))  # "rose at every evaluation"
    assert f"from {sampled[0]:.2f} before RL to {sampled[-1]:.2f} after {len(rl)} iterations" in text
    assert "(" + ", ".join(f"{x:.2f}" for x in sampled) + ")" in text
    first, last = evals[0]["eval_success"], evals[-1]["eval_success"]
    assert last < first and f"({first:.2f} to {last:.2f})" in text
    succ = [r["success"] for r in rl]
    assert f"between {min(succ):.2f} and {max(succ):.2f}" in text
    ev = [r["critic_explained_var"] for r in rl]
    assert f"between {min(ev):.2f} and {max(ev):.2f}".replace("-", "−") in text and max(ev) < 0.3
    warm = json.loads((folder / "warmup.json").read_text())
    assert warm["warmup_explained_var"] < 0.2 and warm["warmup_stop"] == "budget"  # "missed the 0.2 gate"


def test_the_disagreement_example_opens_where_the_disagreement_is():
    """The explorer opens the trajectory with the most MPO/GRPO sign flips at λ_T = 0, at λ_T = 0: at
    the default λ_T = 0.9 the text says the signs agree on every turn, and they do."""
    from mpo_viz.analysis import compute_advantages, sign_flips

    batch = mv.load(ROOT / "trajectories" / "search.parquet")
    res = compute_advantages(batch, ["mpo", "grpo"])
    assert len(sign_flips(batch, {"mpo": res["mpo"], "grpo": res["grpo"]})) == 0  # "n_sign_flips = 0"
    ns = {"compute_advantages": compute_advantages, "sign_flips": sign_flips, "batch": batch, "results": res}
    exec(cell("mpo_turn = compute_advantages(batch"), ns)
    row, flips = ns["row"], ns["flips"]
    assert (flips["row"] == row).sum() >= 1
    assert "TrajectoryExplorer(batch, row=row, turn_lam=0.0)" in cell("# open it at λ_T = 0")
