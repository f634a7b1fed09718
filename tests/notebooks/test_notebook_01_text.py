"""Notebook 01 says what its data show: its example trajectory for "values that move most inside
turns" is one where the across/within statistic is defined, and its comment on the shipped run's
curves quotes the run's own metrics (without executing the notebook)."""

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


def test_the_comment_on_the_shipped_run_matches_its_metrics():
    recs = [json.loads(x) for x in (ROOT / "trajectories" / "trained" / "run" / "metrics.jsonl").read_text().splitlines()]
    text = " ".join(cell("### What this run's curves show").split())
    evals = [r for r in recs if "eval_success" in r]
    rl = [r for r in recs if r["phase"] == "rl"]
    warm = next(r for r in recs if r["phase"] == "critic_warmup")
    first, last = evals[0], evals[-1]
    assert last["eval_success"] < first["eval_success"] and "got *worse*" in text  # the words match the direction
    assert (f"greedy eval success fell from {first['eval_success']:.2f} (iterations 0 and 3) to "
            f"{last['eval_success']:.2f} at iteration {last['iteration']}") in text
    assert evals[1]["eval_success"] == first["eval_success"] and [r["iteration"] for r in evals] == [0, 3, 6]
    assert f"sampled eval success from {first['eval_sampled_success']:.2f} to {last['eval_sampled_success']:.2f}" in text
    assert f"training success ended at its lowest, {rl[-1]['success']:.2f}" in text
    assert rl[-1]["success"] == min(r["success"] for r in rl)
    cfg = json.loads((ROOT / "trajectories" / "trained" / "run" / "config.json").read_text())
    assert f"Over its {len(rl)} iterations ({cfg['episodes']} episodes each" in text
    assert f"({cfg['eval_episodes']} eval tasks" in text
    assert (f"held-out explained variance {warm['warmup_explained_var']:.3f} against the gate "
            f"{warm['warmup_gate']:g}") in text
    assert f"fell to {rl[-1]['critic_explained_var']:.2f} at iteration 6".replace("-", "−") in text
    kl = [r["approx_kl"] for r in rl]
    assert kl[4] > max(kl[:4]) and kl[5] > max(kl[:4])  # "approx KL ... grew at iterations 5 and 6"


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
