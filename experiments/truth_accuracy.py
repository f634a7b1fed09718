"""Replication v3, E1 and E4: which estimator's credit is right for the policy being trained, and
does a critic fitted at turn starts only give better turn credit?

    python -m experiments.truth_accuracy                      # run (or continue) E1 and E4
    python -m experiments.truth_accuracy --archive experiments/records/v3/e1-e4   # ... keeping what lasts there
    python -m experiments.truth_accuracy --snapshots start ppo@10 ppo@20   # a share of it (one machine)
    python -m experiments.truth_accuracy --quick              # a smoke run of the pipeline (a few minutes)
    python -m experiments.truth_accuracy --report-only        # the tables and the figure from the CSVs so far

What is compared is fixed in docs/results.md ("Replication v3", E1 and E4) before any run:

* **Snapshots**: the shipped automation start, and iterations 10 and 20 of one ``ppo`` and one
  ``mpo`` run (``experiments/replication.py``'s v2 budget, cell ``automation-d3-4``, seed 0, the
  critic's value target Monte-Carlo), saved as model folders when the run passes them.
* **Episodes**: per snapshot 256 (64 tasks × G = 4, seed 0) with the scripted expert's values
  recorded beside them, and the snapshot's own Monte-Carlo truth at every turn start
  (``mpo_viz.rollout.truth.mc_truth``, M = 16, split halves; ``--q`` adds Q̂ after each turn).
* **Critics**: fitted as in the learned-critic study (a fresh tiny trunk, or the snapshot's policy
  trunk; Monte-Carlo targets; 256 AdamW steps at lr 1e-3, 16 episodes a step; a fifth of the
  groups held out), 3 critic seeds each. E4: each of these fits twice, with ``fit_values``'
  ``positions="all"`` (the default: every action token; E1's critic) and ``positions="turn_start"``
  (each turn's first action token only), same steps, lr, episodes and held-out split.
* **Scored (E1)**: every estimator and variant of ``experiments/credit_accuracy.py``
  (``within="baseline"`` and λ_T = 0 among them) on the held-out episodes, with each default
  critic's values, with the expert's values as a "critic", and with *flattened* critic values
  (each turn's start value broadcast over the turn: is the critic's within-turn variation signal
  or noise?), per turn against the snapshot's truth: correlation raw and disattenuated,
  calibration slope (``mpo_viz.analysis.mc_accuracy``), with the truth's reliability.
* **Measured (E4)**, per fit of either positions: the held-out explained variance over every action
  token (``heldout_ev``) and at turn starts only (``heldout_ev_turn_start``), the across/within
  ratio of its values (``values_ratio``: the median over held-out episodes, the statistic the
  trainer records as ``values_across_within_ratio``) and the per-turn accuracy of MPO, turn GAE and
  GAE (:data:`E4_ESTIMATORS`) with its values.

Outputs: ``OUT/e1.csv``, one row per (snapshot, critic fit, values, estimator), and ``OUT/e4.csv``,
one row per (snapshot, critic fit [trunk, seed, positions], estimator). A fit whose rows are in them
is skipped (the default fit gives E1's and E4's rows at once); a snapshot's episodes and truth are
made once (``OUT/snapshots/NAME/truth.parquet``). ``--report-only`` prints the means over critic
seeds with 95% t-intervals and draws ``OUT/figures/accuracy_vs_ev.png`` (credit accuracy against the
critic's held-out EV, per estimator); ``--export DIR`` copies the CSVs and the figure.

**Across machines** (``--archive DIR``, e.g. ``experiments/records/v3/e1-e4``): the archive keeps what is
expensive and small — each snapshot's episodes with their truth (``snapshots/NAME/truth.parquet``
and ``snapshot.json``, a few hundred KB) and each finished fit's rows (``e1/NAME/TRUNK-seedS.csv``,
``e4/NAME/TRUNK-seedS-POSITIONS.csv``: one file per fit, so archives from several machines merge
without conflicts) — and never a model. On a machine whose ``OUT`` is empty, the archived rows are
copied into ``OUT``'s CSVs (their fits are skipped), the truth is read from the archive instead of
being measured again, and a policy snapshot that a remaining fit (or a missing truth) needs is made
again by retraining: on CPU with one thread the training is deterministic, and the retrained
weights are checked against the digest ``snapshot.json`` recorded beside the truth. Run one process
per ``OUT``; processes on several machines (``--snapshots`` splits the work) share the archive.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from experiments import credit_accuracy as ca
from experiments import grids, runner, stats
from mpo_viz.analysis.truth import renamed_columns

CELL = "automation-d3-4"
SNAPSHOTS = ("start", "ppo@10", "ppo@20", "mpo@10", "mpo@20")
FULL = dict(
    episodes=256, m=16, steps=256, seeds=(0, 1, 2), trunks=("fresh", "policy"), train_size="v2", snapshots=SNAPSHOTS
)
QUICK = dict(
    episodes=16,
    m=2,
    steps=4,
    seeds=(0,),
    trunks=("fresh", "policy"),
    train_size="tiny",
    snapshots=("start", "ppo@1", "mpo@2"),
)
#: E4's two fits of each critic (``fit_values``' ``positions``): E1's default, and turn starts only
POSITIONS = ("all", "turn_start")
#: E4's estimators: MPO, turn GAE and GAE at their defaults (labels of ``credit_accuracy.ESTIMATORS``)
E4_ESTIMATORS = ("mpo", "turn_gae", "gae lam=1")
#: the columns naming one critic fit in each CSV
KEYS = {"e1": ("snapshot", "trunk", "seed"), "e4": ("snapshot", "trunk", "seed", "positions")}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def snapshot_dir(out: Path, name: str) -> Path:
    return out / "snapshots" / name.replace("@", "_it")


# --------------------------------------------------------------------------------------------- snapshots


def weights_sha256(folder: Path) -> str:
    """SHA-256 of the tensors (name, dtype, shape, bytes; sorted by file and name) of every
    ``*.safetensors`` under ``folder``: equal for bit-identical weights, whatever the file headers."""
    import torch
    from safetensors import safe_open

    h = hashlib.sha256()
    files = sorted(folder.rglob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: expected model weights (*.safetensors), found none")
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in sorted(st.keys()):
                t = st.get_tensor(key).contiguous()
                h.update(f"{f.relative_to(folder)}:{key}:{t.dtype}:{tuple(t.shape)}".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def policy_folder(out: Path, name: str) -> Path:
    """The model folder of snapshot ``name`` (``policy/`` inside it)."""
    return grids.START if name == "start" else snapshot_dir(out, name)


def check_policy(out: Path, name: str) -> None:
    """Refuse a snapshot's policy (re-made, or found in ``out``) whose weights differ from those its
    truth was measured with (``snapshot.json``'s ``policy_sha256``)."""
    meta = snapshot_dir(out, name) / "snapshot.json"
    if not meta.is_file():
        return
    want = json.loads(meta.read_text()).get("policy_sha256")
    found = weights_sha256(policy_folder(out, name) / "policy")
    if want is not None and want != found:
        raise RuntimeError(
            f"snapshot {name}: the retrained policy's weights differ from those the archived truth "
            f"was measured with ({meta}: policy_sha256 {want[:12]}…, found {found[:12]}…); the "
            "training is not reproducible here (another torch version or thread count?): restore "
            "the snapshot's model folder instead, or measure its truth again in a new archive"
        )


def make_snapshots(out: Path, arm: str, iterations: tuple[int, ...], size: str, need=None) -> None:
    """Train ``arm`` (seed 0, ``max(iterations)`` iterations) from the start and save its policy at
    each iteration of ``need`` (default ``iterations``) that ``out`` lacks, stopping after the last
    (a run interrupted before it starts again, from scratch); a snapshot whose truth is already
    there must come out bit-identical (:func:`check_policy`)."""
    from mpo_viz import models
    from mpo_viz.train import Trainer

    todo = [
        it
        for it in (iterations if need is None else need)
        if not (snapshot_dir(out, f"{arm}@{it}") / "policy").is_dir()
    ]
    if not todo:
        return
    warm = runner.make_warmup(size, CELL, 0, out)
    cfg = runner.run_config(size, CELL, arm, 0, warm).replace(
        iterations=max(iterations), eval_interval=0, save_trajectories_every=0
    )
    shutil.rmtree(out / "train" / arm, ignore_errors=True)
    tr = Trainer(cfg, out / "train" / arm, quiet=True)
    for rec in tr.iterate(max(todo)):
        if rec["iteration"] in todo:
            name = f"{arm}@{rec['iteration']}"
            models.save(snapshot_dir(out, name), tr.policy, None)
            check_policy(out, name)
            log(f"snapshot {name} saved")


def snapshot_policy(out: Path, name: str):
    from mpo_viz import models

    return models.load(policy_folder(out, name))[0]


def has_truth(out: Path, name: str, archive: Path | None) -> bool:
    """Whether the snapshot's episodes and truth are in ``out`` or in the archive."""
    return any((snapshot_dir(d, name) / "truth.parquet").is_file() for d in (out, archive) if d is not None)


def copy_truth(src: Path, dest: Path, name: str) -> None:
    """Copy a snapshot's ``truth.parquet`` and ``snapshot.json`` from the folder ``src`` to ``dest``
    (under temporary names, then renamed: a reader never sees half a file)."""
    a, b = snapshot_dir(src, name), snapshot_dir(dest, name)
    b.mkdir(parents=True, exist_ok=True)
    for f in ("snapshot.json", "truth.parquet"):  # the parquet last: its presence means both are there
        if (a / f).is_file():
            tmp = b / f".{f}.{os.getpid()}.tmp"
            shutil.copy(a / f, tmp)
            tmp.replace(b / f)


def restore_truth(out: Path, archive: Path | None, name: str) -> None:
    """Copy the snapshot's archived episodes and truth into ``out`` when it lacks them (a policy
    already in ``out`` must then be the one they were measured with: :func:`check_policy`)."""
    if archive is None or (snapshot_dir(out, name) / "truth.parquet").is_file() or not has_truth(archive, name, None):
        return
    copy_truth(archive, out, name)
    log(f"{name}: episodes and truth restored from {archive}")
    if (policy_folder(out, name) / "policy").is_dir():
        check_policy(out, name)


def snapshot_truth(out: Path, name: str, episodes: int, m: int, q: bool, archive: Path | None = None):
    """The snapshot's episodes with its Monte-Carlo truth: ``OUT/snapshots/NAME/truth.parquet``,
    else the archive's copy, else measured once (and then archived)."""
    import mpo_viz as mv
    from mpo_viz.envs import NoisyExpert, make_env
    from mpo_viz.rollout import rollout
    from mpo_viz.rollout.truth import mc_truth

    path = snapshot_dir(out, name) / "truth.parquet"
    restore_truth(out, archive, name)
    if path.is_file():
        batch = mv.load(path)
        if len(batch) != episodes:
            raise ValueError(
                f"{path}: expected {episodes} episodes of snapshot {name}, found {len(batch)} (a run "
                "of another size: use another OUT or archive)"
            )
        return batch
    policy = snapshot_policy(out, name)
    env = make_env("automation", difficulty=tuple(grids.CELLS[CELL]))
    batch = rollout(
        policy, env, episodes, group_size=4, seed=0, oracle=NoisyExpert(noise=grids.ORACLE_NOISE), progress=False
    )
    t0 = time.perf_counter()
    batch = mc_truth(batch, policy, m=m, seed=0, q=q, progress=False)
    seconds = time.perf_counter() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "snapshot": name,
        "episodes": len(batch),
        "m": m,
        "q": q,
        "success": float(np.mean(batch.outcome_reward)),
        "truth_seconds": seconds,
        "policy_sha256": weights_sha256(policy_folder(out, name) / "policy"),
    }
    (path.parent / "snapshot.json").write_text(json.dumps(meta) + "\n")
    mv.save(batch, path)
    if archive is not None:
        copy_truth(out, archive, name)
    log(f"{name}: {len(batch)} episodes (success {meta['success']:.2f}), truth at M = {m} in {seconds:.0f} s")
    return batch


# --------------------------------------------------------------------------------------------- one fit


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


def score(sub, values: np.ndarray, labels=None) -> list[dict]:
    """The estimators of ``experiments/credit_accuracy.py`` (those labelled ``labels``; None: all) on
    ``sub`` with ``values`` (B, L), against the truth: one ``mc_accuracy`` row each."""
    from mpo_viz.advantages import compute
    from mpo_viz.analysis import mc_accuracy

    b = sub.with_token_fields(values=np.asarray(values, dtype=np.float32))
    ests = cast(list[tuple[str, str, dict]], ca.ESTIMATORS)
    advs = {
        name: compute(b, est, **opts).advantages.double().numpy()
        for name, est, opts in ests
        if labels is None or name in labels
    }
    return mc_accuracy(b, advs).to_dict("records")


def heldout_evs(sub, values: np.ndarray) -> dict:
    """Explained variance of ``values`` (B, L) against ``sub``'s Monte-Carlo returns over every
    action token (``heldout_ev``) and at each turn's first action token (``heldout_ev_turn_start``)."""
    import torch

    from mpo_viz.advantages import mc_returns
    from mpo_viz.analysis import explained_variance
    from mpo_viz.train.critic_fit import fit_positions

    g, v = mc_returns(sub), torch.as_tensor(values, dtype=torch.float64)
    return {
        "heldout_ev": explained_variance(g, v, sub.mask),
        "heldout_ev_turn_start": explained_variance(g, v, fit_positions(sub, "turn_start")),
    }


def values_ratio(sub, values: np.ndarray) -> float:
    """The median over episodes of the across/within ratio of ``values`` (the trainer's
    ``values_across_within_ratio``)."""
    from mpo_viz.analysis import value_variance, variance_summary

    return variance_summary(value_variance(sub, values))["median_ratio"]


def e4_rows(sub, values: np.ndarray) -> list[dict]:
    """E4's rows of one fit on the held-out episodes ``sub``: its EVs (:func:`heldout_evs`), its
    values' ratio and the turn accuracy of :data:`E4_ESTIMATORS` with its ``values``."""
    base = {**heldout_evs(sub, values), "values_ratio": values_ratio(sub, values)}
    return [{**base, **r} for r in score(sub, values, E4_ESTIMATORS)]


def e1_rows(sub, values: np.ndarray, with_expert: bool) -> list[dict]:
    """E1's rows of one default fit: every estimator with the critic's ``values``, with them
    flattened and (``with_expert``) with the expert's values."""
    rows = [{"values": "critic", **r} for r in score(sub, values)]
    rows += [{"values": "flattened", **r} for r in score(sub, flattened(sub, values))]
    if with_expert:
        rows += [{"values": "expert", **r} for r in score(sub, sub.padded("oracle_values").numpy())]
    return rows


def fit_one(out: Path, name: str, batch, trunk: str, seed: int, steps: int, positions: str = "all") -> dict:
    """One critic fit on the snapshot's episodes (``positions``: the action tokens its loss reads),
    scored on the held-out groups: ``{"e4": rows, "e1": rows}`` (E1's only for the default fit;
    the expert's values once per snapshot, with the fresh trunk's seed 0)."""
    from mpo_viz import models
    from mpo_viz.advantages import mc_returns
    from mpo_viz.train.critic_fit import critic_outputs, fit_values, holdout_split
    from mpo_viz.train.update import rows_of

    groups = batch.field("group_id")
    _, held = holdout_split(len(batch), 0.2, seed, groups)
    critic = (
        models.make_critic(snapshot_policy(out, name), init="policy", seed=seed)
        if trunk == "policy"
        else ca.make_critic("automation", "fresh", batch, seed)
    )
    fit = fit_values(
        critic,
        batch,
        mc_returns(batch),
        steps=steps,
        lr=1e-3,
        batch_episodes=16,
        holdout=0.2,
        gate=None,
        seed=seed,
        pad_id=0,
        groups=groups,
        positions=positions,
    )
    values = critic_outputs(critic, rows_of(batch), np.arange(len(batch)), pad_id=0, device="cpu").numpy()
    sub = batch[held]
    v_held = values[held][:, : sub.mask.shape[1]]
    key = {"snapshot": name, "trunk": trunk, "seed": seed}
    size = {"steps": steps, "held_episodes": int(len(held))}
    rows = {"e4": [{**key, "positions": positions, **size, **r} for r in e4_rows(sub, v_held)], "e1": []}
    if positions == "all":
        base = {**key, **size, "heldout_ev": fit.heldout_ev, "values_ratio": rows["e4"][0]["values_ratio"]}
        rows["e1"] = [{**base, **r} for r in e1_rows(sub, v_held, seed == 0 and trunk == "fresh")]
    return rows


# --------------------------------------------------------------------------------------------- rows and archive


def read_rows(csv: Path) -> pd.DataFrame:
    """A CSV of rows, with the accuracy columns' names of this release (the archive's rows carry the old
    ``turn_slope`` / ``turn_slope_dis``: :func:`mpo_viz.analysis.renamed_columns`)."""
    return renamed_columns(pd.read_csv(csv), warn=False) if csv.is_file() else pd.DataFrame()


def fit_key(kind: str, row) -> tuple:
    """The fit a row belongs to, as a tuple of :data:`KEYS` (the seed an int)."""
    return tuple(int(row[k]) if k == "seed" else str(row[k]) for k in KEYS[kind])


def finished(out: Path, kind: str) -> set:
    """The fits whose rows ``OUT/KIND.csv`` holds."""
    df = read_rows(out / f"{kind}.csv")
    return {fit_key(kind, r) for r in df[list(KEYS[kind])].to_dict("records")} if len(df) else set()


def append_rows(csv: Path, rows: pd.DataFrame) -> None:
    """Append ``rows`` to ``csv`` in its columns' order (rewritten whole when the columns differ)."""
    if not csv.is_file():
        rows.to_csv(csv, index=False)
        return
    cols = list(pd.read_csv(csv, nrows=0).columns)
    if set(cols) == set(rows.columns):
        rows[cols].to_csv(csv, mode="a", header=False, index=False)
        return
    both = pd.concat([read_rows(csv), renamed_columns(rows, warn=False)], ignore_index=True)
    tmp = csv.with_name(f".{csv.name}.{os.getpid()}.tmp")
    both.to_csv(tmp, index=False)
    tmp.replace(csv)


def fit_file(archive: Path, kind: str, key: tuple) -> Path:
    """``archive/e1/NAME/TRUNK-seedS.csv`` or ``archive/e4/NAME/TRUNK-seedS-POSITIONS.csv``."""
    name, trunk, seed, *rest = key
    return archive / kind / snapshot_dir(Path(), name).name / ("-".join([trunk, f"seed{seed}", *rest]) + ".csv")


def archive_fit(archive: Path, kind: str, rows: pd.DataFrame) -> None:
    """Write one fit's rows to its archive file (under a temporary name, then renamed)."""
    path = fit_file(archive, kind, fit_key(kind, rows.iloc[0]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    rows.to_csv(tmp, index=False)
    tmp.replace(path)


def sync_rows(out: Path, archive: Path) -> None:
    """Make ``OUT``'s CSVs and the archive hold the same fits: the archived fits ``OUT`` lacks are
    appended to its CSVs, ``OUT``'s fits the archive lacks are archived."""
    for kind in KEYS:
        csv = out / f"{kind}.csv"
        local = read_rows(csv)
        have = finished(out, kind)
        for path in sorted((archive / kind).glob("*/*.csv")):
            rows = read_rows(path)
            if len(rows) and fit_key(kind, rows.iloc[0]) not in have:
                append_rows(csv, rows)
        if len(local):
            for _, rows in local.groupby(list(KEYS[kind]), sort=False):
                if not fit_file(archive, kind, fit_key(kind, rows.iloc[0])).is_file():
                    archive_fit(archive, kind, rows)


# --------------------------------------------------------------------------------------------- running


def fits_of(spec: dict) -> list[tuple[str, int, str]]:
    """``(trunk, seed, positions)`` of every fit of a snapshot, in the order they run."""
    return [(trunk, seed, pos) for trunk in spec["trunks"] for seed in spec["seeds"] for pos in POSITIONS]


def wanted(out: Path, name: str, trunk: str, seed: int, positions: str) -> list[str]:
    """The CSVs (``e1``, ``e4``) still lacking this fit's rows."""
    want = ["e4"] if (name, trunk, seed, positions) not in finished(out, "e4") else []
    if positions == "all" and (name, trunk, seed) not in finished(out, "e1"):
        want.append("e1")
    return want


def policy_needed(out: Path, name: str, spec: dict, archive: Path | None) -> bool:
    """Whether the snapshot's policy must exist: its truth is in neither ``OUT`` nor the archive, or
    a fit with its trunk has not finished."""
    if not has_truth(out, name, archive):
        return True
    return any(trunk == "policy" and wanted(out, name, trunk, seed, pos) for trunk, seed, pos in fits_of(spec))


def run_fits(out: Path, name: str, batch, spec: dict, archive: Path | None = None) -> int:
    """Every fit of the snapshot whose rows a CSV lacks (:func:`fit_one`), its rows appended to
    ``OUT/e1.csv`` / ``OUT/e4.csv`` (and archived) as it ends; returns the number of fits run."""
    n = 0
    for trunk, seed, positions in fits_of(spec):
        want = wanted(out, name, trunk, seed, positions)
        if not want:
            continue
        t0 = time.perf_counter()
        rows = fit_one(out, name, batch, trunk, seed, spec["steps"], positions)
        for kind in want:
            df = pd.DataFrame(rows[kind])
            append_rows(out / f"{kind}.csv", df)
            if archive is not None:
                archive_fit(archive, kind, df)
        n += 1
        r = rows["e4"][0]
        log(
            f"{name} {trunk} seed {seed} positions={positions}: held-out EV {r['heldout_ev']:.3f}, at turn starts "
            f"{r['heldout_ev_turn_start']:.3f} ({time.perf_counter() - t0:.0f} s)"
        )
    return n


def run(out: Path, spec: dict, q: bool, archive: Path | None = None, names=None) -> None:
    """E1 and E4 on the snapshots ``names`` (None: all of ``spec``'s), resumed from ``OUT`` and the archive."""
    names = tuple(names or spec["snapshots"])
    if archive is not None:
        sync_rows(out, archive)
        for name in names:
            restore_truth(out, archive, name)
    for arm in ("ppo", "mpo"):
        its = tuple(int(n.split("@")[1]) for n in spec["snapshots"] if n.startswith(f"{arm}@"))
        need = tuple(
            int(n.split("@")[1]) for n in names if n.startswith(f"{arm}@") and policy_needed(out, n, spec, archive)
        )
        if need:
            make_snapshots(out, arm, its, spec["train_size"], need)
    for name in names:
        batch = snapshot_truth(out, name, spec["episodes"], spec["m"], q, archive)
        run_fits(out, name, batch, spec, archive)


# --------------------------------------------------------------------------------------------- report


def mean_ci(g: pd.DataFrame, cols) -> dict:
    """``col`` (mean over the rows, i.e. the critic seeds) and ``col_ci`` (the 95% t half-width)."""
    out: dict[str, float] = {"seeds": len(g)}
    for c in cols:
        x = g[c].to_numpy(dtype=float)
        out[c], out[f"{c}_ci"] = float(np.mean(x)), stats.paired_half(x)
    return out


def _fmt(df: pd.DataFrame) -> str:
    return df.to_string(index=False, float_format=lambda v: f"{v:.3f}") if len(df) else "(no rows yet)"


def table(df: pd.DataFrame) -> str:
    """E1: per snapshot, trunk, values and estimator of ``experiments/credit_accuracy.py``'s ``SHOWN``,
    the mean and 95% t half-width over critic seeds of the disattenuated turn correlation, with the
    held-out EV, the truth's reliability and the noise-corrected slope of the credit on the truth (means)."""
    if not len(df):
        return _fmt(df)
    out = []
    for key, g in df[df.estimator.isin(ca.SHOWN)].groupby(["snapshot", "trunk", "values", "estimator"], sort=False):
        m = mean_ci(g, ["turn_corr_dis"])
        out.append(
            {
                **dict(zip(("snapshot", "trunk", "values", "estimator"), key)),
                "seeds": m["seeds"],
                "heldout_ev": g.heldout_ev.mean(),
                "reliability": g.reliability.mean(),
                "turn_corr_dis": m["turn_corr_dis"],
                "ci": m["turn_corr_dis_ci"],
                "slope_credit_on_truth_dis": g.slope_credit_on_truth_dis.mean(),
            }
        )
    return _fmt(pd.DataFrame(out))


def e4_table(df: pd.DataFrame) -> str:
    """E4: per snapshot, trunk, positions and estimator, means and 95% t half-widths over critic seeds
    of the held-out EV (all action tokens, turn starts), the values' across/within ratio and the
    disattenuated turn correlation, with the truth's reliability."""
    if not len(df):
        return _fmt(df)
    cols = ["heldout_ev", "heldout_ev_turn_start", "values_ratio", "turn_corr_dis"]
    out = []
    for key, g in df.groupby(["snapshot", "trunk", "positions", "estimator"], sort=False):
        out.append(
            {
                **dict(zip(("snapshot", "trunk", "positions", "estimator"), key)),
                **mean_ci(g, cols),
                "slope_credit_on_truth_dis": g.slope_credit_on_truth_dis.mean(),
                "reliability": g.reliability.mean(),
            }
        )
    return _fmt(pd.DataFrame(out))


def figure(e1: pd.DataFrame, e4: pd.DataFrame, fig_dir: Path) -> Path:
    """``accuracy_vs_ev.png``: the disattenuated turn correlation of each fit's credit against its
    held-out EV, a colour per estimator — E1 (critic values, every action token's EV; ● fresh trunk,
    ■ policy trunk) and E4 (EV at turn starts; filled: positions="all", open: "turn_start")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    colours = plt.get_cmap("tab10")
    marker = {"fresh": "o", "policy": "s"}
    if len(e1):
        crit = e1[(e1["values"] == "critic") & e1.estimator.isin(ca.SHOWN)]
        for i, est in enumerate(ca.SHOWN):
            for trunk, g in crit[crit.estimator == est].groupby("trunk"):
                axes[0].scatter(
                    g.heldout_ev,
                    g.turn_corr_dis,
                    color=colours(i),
                    marker=marker.get(trunk, "^"),
                    s=22,
                    alpha=0.8,
                    label=f"{est} ({trunk})",
                )
    if len(e4):
        for i, est in enumerate(E4_ESTIMATORS):
            for pos, g in e4[e4.estimator == est].groupby("positions"):
                axes[1].scatter(
                    g.heldout_ev_turn_start,
                    g.turn_corr_dis,
                    s=22,
                    alpha=0.8,
                    label=f"{est} ({pos})",
                    facecolors=colours(i) if pos == "all" else "none",
                    edgecolors=colours(i),
                )
    for ax, (title, xlabel) in zip(
        axes,
        [
            ("E1: every estimator with the default critic", "held-out EV (action tokens)"),
            ("E4: default vs turn-start critic", "held-out EV at turn starts"),
        ],
    ):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("turn correlation with the truth (disattenuated)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    fig.tight_layout()
    path = fig_dir / "accuracy_vs_ev.png"
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.png")
    fig.savefig(tmp, dpi=80)
    tmp.replace(path)
    plt.close(fig)
    return path


def report(out: Path) -> str:
    """E1's and E4's tables from ``OUT``'s CSVs, and the figure into ``OUT/figures``."""
    e1, e4 = read_rows(out / "e1.csv"), read_rows(out / "e4.csv")
    figure(e1, e4, out / "figures")
    return (
        f"E1: credit against the truth, {len(e1)} rows\n{table(e1)}\n\nE4: default vs turn-start critic, "
        f"{len(e4)} rows\n{e4_table(e4)}"
    )


def export(out: Path, dest: Path) -> None:
    """Copy the CSVs and the figures into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in [out / "e1.csv", out / "e4.csv", *sorted((out / "figures").glob("*.png"))]:
        if p.is_file():
            shutil.copy(p, dest / p.name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=grids.REPO / "runs" / "truth-e1")
    ap.add_argument("--quick", action="store_true", help="a smoke run of the pipeline (tiny sizes)")
    ap.add_argument("--q", action="store_true", help="also Q̂ after each recorded turn (doubles the truth's cost)")
    ap.add_argument("--report-only", action="store_true", help="the tables and the figure from the CSVs")
    ap.add_argument(
        "--archive",
        type=Path,
        default=None,
        help="keep each snapshot's episodes and truth and each finished fit's rows here (no models), "
        "and resume from them: a run that spans machines whose OUT does not survive",
    )
    ap.add_argument(
        "--snapshots",
        nargs="+",
        default=None,
        metavar="NAME",
        help="run only these snapshots (e.g. one share per machine)",
    )
    ap.add_argument("--export", type=Path, default=None, help="copy the CSVs and the figure into this folder")
    args = ap.parse_args(argv)
    spec = QUICK if args.quick else FULL
    names: tuple[str, ...] = tuple(spec["snapshots"])  # type: ignore[arg-type]
    bad = [n for n in args.snapshots or () if n not in names]
    if bad:
        ap.error(f"--snapshots: {bad} not among this size's snapshots {list(names)}")
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        if args.archive is not None:
            sync_rows(args.out, args.archive)
    else:
        run(args.out, spec, args.q, args.archive, args.snapshots)
    print(report(args.out))
    if args.export is not None:
        export(args.out, args.export)
    return 0


if __name__ == "__main__":
    sys.exit(main())
