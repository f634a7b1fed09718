"""Replication v4, E2' (secondary): how near the truth is turn GAE's credit on Monte-Carlo values.

    python -m experiments.headroom                  # prints the table, writes experiments/records/v4/e2p/accuracy.csv

On each of replication v3's five archived E1 snapshots (``experiments/records/v3/e1-e4/snapshots/*/truth.parquet``:
256 episodes, the policy's own Monte-Carlo values from M = 16 continuations per turn state, split in
two halves of 8), turn GAE is run on the values of one half (8 continuations: what E2's and E2''s
``critic="mc"`` arms read) at several λ_T, and its turn credit ``A^T_k`` is correlated over all turns
with the true turn advantage from the *other* half, ``Â_k = R_k + V̂_b(s_{k+1}) − V̂_b(s_k)``. Both
halves are independent given the episodes; both sides share the realized turn reward ``R_k`` and
next state, as any estimator of a realized turn's advantage does. The correlation is averaged over
the two directions (a → b, b → a), and disattenuated for the truth's noise only (the credit's own
noise is the arm's, kept): ``corr / √ρ_half`` with ``ρ_half = corr(Â^a_k, Â^b_k)``, the reliability of
one half's turn truth — the correlation with the noiseless truth, comparable with E1's
disattenuated ``turn_corr_dis`` of the learned critics. No model runs: the archive alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import mpo_viz as mv
from experiments.grids import REPO
from mpo_viz.advantages import turn_gae
from mpo_viz.analysis.arrays import batch_turn_index
from mpo_viz.data.turns import mc_turn_advantage

SNAPSHOTS = REPO / "experiments" / "records" / "v3" / "e1-e4" / "snapshots"
OUT = REPO / "experiments" / "records" / "v4" / "e2p" / "accuracy.csv"
TURN_LAMS = (0.0, 0.5, 0.9, 1.0)


def per_turn(batch: mv.TrajectoryBatch, name: str) -> np.ndarray:
    """A per-turn field flat over the batch's turns (row then turn order)."""
    return np.concatenate([np.asarray(v, dtype=np.float64) for v in batch.field(name)])


def broadcast(batch: mv.TrajectoryBatch, turn_values: np.ndarray) -> torch.Tensor:
    """``(B, L)`` float64 values: each turn's value on every action token of the turn (0 elsewhere)."""
    _, idx = batch_turn_index(batch)
    out = torch.zeros(batch.mask.shape, dtype=torch.float64)
    out[idx.rows, idx.cols] = torch.from_numpy(turn_values[idx.slot])
    return out


def turn_credit(batch: mv.TrajectoryBatch, turn_values: np.ndarray, turn_lam: float) -> np.ndarray:
    """Turn GAE's ``A^T_k`` (flat over turns) on per-turn values, γ = γ_T = 1."""
    adv, _ = turn_gae(
        batch.padded("rewards", torch.float64),
        broadcast(batch, turn_values),
        batch.mask,
        turn_ids=batch.turn_ids,
        turn_lam=turn_lam,
    )
    _, idx = batch_turn_index(batch)
    a = adv.numpy()[idx.rows, idx.cols]
    return np.bincount(idx.slot, weights=a, minlength=idx.n_slots) / np.maximum(idx.count, 1)


def truth_of(batch: mv.TrajectoryBatch, values: np.ndarray) -> np.ndarray:
    """``R_k + V̂(s_{k+1}) − V̂(s_k)`` flat over turns from per-turn values."""
    _, idx = batch_turn_index(batch)
    r = np.nan_to_num(batch.padded("rewards", torch.float64).numpy())
    rk = np.bincount(idx.slot, weights=r[idx.rows, idx.cols], minlength=idx.n_slots)
    return mc_turn_advantage(values, rk, idx.turn_row)


def snapshot_rows(name: str, batch: mv.TrajectoryBatch) -> list[dict]:
    va, vb = per_turn(batch, "mc_value_a"), per_turn(batch, "mc_value_b")
    ta, tb = truth_of(batch, va), truth_of(batch, vb)
    rel_half = float(np.corrcoef(ta, tb)[0, 1])
    rows = []
    for lam in TURN_LAMS:
        r_ab = float(np.corrcoef(turn_credit(batch, va, lam), tb)[0, 1])
        r_ba = float(np.corrcoef(turn_credit(batch, vb, lam), ta)[0, 1])
        rows.append(
            {
                "snapshot": name,
                "turn_lam": lam,
                "n_turns": len(va),
                "corr_a_on_b": r_ab,
                "corr_b_on_a": r_ba,
                "corr": (r_ab + r_ba) / 2,
                "truth_half_reliability": rel_half,
                "corr_dis": (r_ab + r_ba) / 2 / np.sqrt(rel_half),
            }
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.headroom", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"the CSV (default {OUT.relative_to(REPO)})")
    args = ap.parse_args(argv)
    rows = []
    for d in sorted(p for p in SNAPSHOTS.iterdir() if (p / "truth.parquet").is_file()):
        rows += snapshot_rows(d.name, mv.load(d / "truth.parquet"))
    table = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False, float_format="%.6g")
    wide = table.pivot(index="snapshot", columns="turn_lam", values="corr_dis")
    print(
        "turn GAE on 8-continuation Monte-Carlo values vs the other half's turn truth: correlation over turns,\n"
        "disattenuated for the truth's noise (raw values and the reliability in the CSV)"
    )
    print("| snapshot | " + " | ".join(f"λ_T = {lam:g}" for lam in wide.columns) + " |")
    print("|---|" + "---|" * len(wide.columns))
    for name, row in wide.iterrows():
        print(f"| {name} | " + " | ".join(f"{x:.3f}" for x in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
