"""Replication v3, E1: which estimator's credit is right for the policy being trained?

    python benchmarks/truth_accuracy.py                      # run (or continue) E1
    python benchmarks/truth_accuracy.py --quick              # a smoke run of the pipeline (minutes)
    python benchmarks/truth_accuracy.py --report-only        # the table from the CSV so far

What is compared is fixed in docs/results.md ("Replication v3", E1) before any run:

* **Snapshots**: the shipped automation start, and iterations 10 and 20 of one ``ppo`` and one
  ``mpo`` run (``benchmarks/learning.py``'s v2 budget, cell ``automation-d3-4``, seed 0, the
  critic's value target Monte-Carlo), saved as model folders when the run passes them.
* **Episodes**: per snapshot 256 (64 tasks × G = 4, seed 0) with the scripted expert's values
  recorded beside them, and the snapshot's own Monte-Carlo truth at every turn start
  (``mpo_viz.rollout.truth.mc_truth``, M = 16, split halves; ``--q`` adds Q̂ after each turn).
* **Critics**: fitted as in the learned-critic study (a fresh tiny trunk, or the snapshot's policy
  trunk; Monte-Carlo targets; 256 AdamW steps at lr 1e-3, 16 episodes a step; a fifth of the
  groups held out), 3 critic seeds each.
* **Scored**: every estimator and variant of ``benchmarks/credit_accuracy.py`` (``within="baseline"``
  and λ_T = 0 among them) on the held-out episodes, with each critic's values, with the expert's
  values as a "critic", and with *flattened* critic values (each turn's start value broadcast over
  the turn: is the critic's within-turn variation signal or noise?), per turn against the
  snapshot's truth: correlation raw and disattenuated, calibration slope
  (``mpo_viz.analysis.mc_accuracy``), with the truth's reliability.

Output: ``OUT/e1.csv``, one row per (snapshot, critic fit, values, estimator); a fit already in it
is skipped, a snapshot's episodes and truth are made once (``OUT/snapshots/``). Reading: at which
critic quality (held-out EV) each estimator's credit is closest to the truth, intervals over the 3
critic seeds (``--report-only``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
for p in (str(HERE.parent), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import credit_accuracy as ca  # noqa: E402
import learning  # noqa: E402

CELL = "automation-d3-4"
SNAPSHOTS = ("start", "ppo@10", "ppo@20", "mpo@10", "mpo@20")
FULL = dict(episodes=256, m=16, steps=256, seeds=(0, 1, 2), trunks=("fresh", "policy"), train_size="v2")
QUICK = dict(episodes=16, m=2, steps=4, seeds=(0,), trunks=("fresh",), train_size="tiny")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def snapshot_dir(out: Path, name: str) -> Path:
    return out / "snapshots" / name.replace("@", "_it")


def make_snapshots(out: Path, arm: str, iterations: tuple[int, ...], size: str) -> None:
    """Train ``arm`` (seed 0) and save its policy at each of ``iterations`` (made once; a run
    interrupted before its last snapshot starts again)."""
    from mpo_viz import models
    from mpo_viz.train import Trainer

    todo = [it for it in iterations if not (snapshot_dir(out, f"{arm}@{it}") / "policy").is_dir()]
    if not todo:
        return
    warm = learning.make_warmup(size, CELL, 0, out)
    cfg = learning.run_config(size, CELL, arm, 0, warm).replace(iterations=max(iterations), eval_interval=0,
                                                                save_trajectories_every=0)
    tr = Trainer(cfg, out / "train" / arm, quiet=True)
    for rec in tr.iterate(max(iterations)):
        if rec["iteration"] in todo:
            models.save(snapshot_dir(out, f"{arm}@{rec['iteration']}"), tr.policy, None)
            log(f"snapshot {arm}@{rec['iteration']} saved")


def snapshot_policy(out: Path, name: str):
    from mpo_viz import models

    return models.load(learning.START if name == "start" else snapshot_dir(out, name))[0]


def snapshot_truth(out: Path, name: str, episodes: int, m: int, q: bool):
    """The snapshot's episodes with its Monte-Carlo truth (made once, ``truth.parquet``)."""
    import mpo_viz as mv
    from mpo_viz.envs import NoisyExpert, make_env
    from mpo_viz.rollout import rollout
    from mpo_viz.rollout.truth import mc_truth

    path = snapshot_dir(out, name) / "truth.parquet"
    if path.is_file():
        return mv.load(path)
    policy = snapshot_policy(out, name)
    env = make_env("automation", difficulty=tuple(learning.CELLS[CELL]))
    batch = rollout(policy, env, episodes, group_size=4, seed=0, oracle=NoisyExpert(noise=learning.ORACLE_NOISE),
                    progress=False)
    t0 = time.perf_counter()
    batch = mc_truth(batch, policy, m=m, seed=0, q=q, progress=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    mv.save(batch, path)
    log(f"{name}: {len(batch)} episodes (success {np.mean(batch.reward):.2f}), truth at M = {m} in "
        f"{time.perf_counter() - t0:.0f} s")
    return batch


def flattened(batch, values: np.ndarray) -> np.ndarray:
    """Each turn's start value broadcast over the turn's tokens (observation tokens keep theirs)."""
    out = values.copy()
    tt = batch.turns()
    tids = batch.turn_ids.numpy()
    mask = batch.mask.numpy() != 0
    for row, k, start in zip(tt["row"], tt["turn"], tt["start"]):
        sel = mask[row] & (tids[row] == k)
        out[row, sel] = values[row, start]
    return out


def score(sub, values: np.ndarray, label: str) -> list[dict]:
    """Every estimator of ``benchmarks/credit_accuracy.py`` on ``sub`` with ``values``, against the truth."""
    from mpo_viz.advantages import compute
    from mpo_viz.analysis import mc_accuracy

    b = sub.with_token_fields(values=np.asarray(values, dtype=np.float32))
    advs = {name: compute(b, est, **opts).advantages.double().numpy() for name, est, opts in ca.ESTIMATORS}
    return [{"values": label, **r} for r in mc_accuracy(b, advs).to_dict("records")]


def fit_rows(out: Path, name: str, batch, trunk: str, seed: int, steps: int) -> list[dict]:
    """One critic fit on the snapshot's episodes, scored on the held-out groups (learned, flattened)
    and, once per snapshot (seed 0), with the expert's values."""
    from mpo_viz import models
    from mpo_viz.analysis import value_variance, variance_summary
    from mpo_viz.train.critic_fit import critic_outputs, fit_values, holdout_split, mc_returns
    from mpo_viz.train.update import rows_of

    groups = batch.field("group_id")
    _, held = holdout_split(len(batch), 0.2, seed, groups)
    critic = (models.make_critic(snapshot_policy(out, name), init="policy", seed=seed) if trunk == "policy"
              else ca.make_critic("automation", "fresh", batch, seed))
    fit = fit_values(critic, batch, mc_returns(batch), steps=steps, lr=1e-3, batch_episodes=16, holdout=0.2,
                     gate=None, seed=seed, pad_id=0, groups=groups)
    values = critic_outputs(critic, rows_of(batch), np.arange(len(batch)), pad_id=0, device="cpu").numpy()
    sub = batch[held]
    v_held = values[held][:, : sub.mask.shape[1]]
    ratio = variance_summary(value_variance(sub, v_held))["median_ratio"]
    rows = score(sub, v_held, "critic") + score(sub, flattened(sub, v_held), "flattened")
    if seed == 0 and trunk == "fresh":
        rows += score(sub, sub.padded("oracle_values").numpy(), "expert")
    base = {"snapshot": name, "trunk": trunk, "seed": seed, "steps": steps, "heldout_ev": fit.heldout_ev,
            "values_ratio": ratio, "held_episodes": int(len(held))}
    return [{**base, **r} for r in rows]


def run(out: Path, spec: dict, q: bool) -> pd.DataFrame:
    csv = out / "e1.csv"
    done = pd.read_csv(csv) if csv.is_file() else pd.DataFrame(columns=["snapshot", "trunk", "seed"])
    finished = set(zip(done.snapshot, done.trunk, done.seed))
    for arm in ("ppo", "mpo"):
        make_snapshots(out, arm, (10, 20) if spec is FULL else (1, 2), spec["train_size"])
    names = SNAPSHOTS if spec is FULL else ("start", "ppo@1", "mpo@2")
    for name in names:
        batch = snapshot_truth(out, name, spec["episodes"], spec["m"], q)
        for trunk in spec["trunks"]:
            for seed in spec["seeds"]:
                if (name, trunk, seed) in finished:
                    continue
                t0 = time.perf_counter()
                rows = pd.DataFrame(fit_rows(out, name, batch, trunk, seed, spec["steps"]))
                rows.to_csv(csv, mode="a", header=not csv.is_file(), index=False)
                log(f"{name} {trunk} seed {seed}: held-out EV {rows.heldout_ev.iloc[0]:.3f} "
                    f"({time.perf_counter() - t0:.0f} s)")
    return pd.read_csv(csv)


def table(df: pd.DataFrame) -> str:
    """Mean ± 95% t half-width over critic seeds of the disattenuated turn correlation, per snapshot,
    trunk and values, for the estimators of ``benchmarks/credit_accuracy.py``'s ``SHOWN``."""
    from scipy import stats

    keep = df[df.estimator.isin(ca.SHOWN)]
    out = []
    for key, g in keep.groupby(["snapshot", "trunk", "values", "estimator"], sort=False):
        x = g.turn_corr_dis.to_numpy(dtype=float)
        h = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else float("nan")
        out.append({"snapshot": key[0], "trunk": key[1], "values": key[2], "estimator": key[3],
                    "heldout_ev": g.heldout_ev.mean(), "reliability": g.reliability.mean(),
                    "turn_corr_dis": x.mean(), "ci": h, "turn_slope_dis": g.turn_slope_dis.mean()})
    return pd.DataFrame(out).to_string(index=False, float_format=lambda v: f"{v:.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=learning.REPO / "runs" / "truth-e1")
    ap.add_argument("--quick", action="store_true", help="a smoke run of the pipeline (tiny sizes)")
    ap.add_argument("--q", action="store_true", help="also Q̂ after each recorded turn (doubles the truth's cost)")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    df = pd.read_csv(args.out / "e1.csv") if args.report_only else run(args.out, QUICK if args.quick else FULL, args.q)
    print(table(df))
    return 0


if __name__ == "__main__":
    sys.exit(main())
