"""Replication v4, E5: is MPO's within-turn credit right? Token credit against the token-level truth.

    python -m experiments.within_turn --validate                  # the path's check on the expert first
    python -m experiments.within_turn --snapshots start           # the first snapshot (cost and power)
    python -m experiments.within_turn                             # the rest (resumed from the archive)
    python -m experiments.within_turn --report-only               # tables and comparisons from the archive
    python -m experiments.within_turn --quick --out /tmp/e5q --archive /tmp/e5q/records   # a smoke run

What is compared is fixed in docs/results.md ("Fixed in advance: E5") before any run:

* **Snapshots**: the five of v3's E1 (the shipped automation start, iterations 10 and 20 of one
  ``ppo`` and one ``mpo`` run), their policies rebuilt by :mod:`experiments.truth_accuracy` and
  checked against the sha256 digests beside v3's archived truth.
* **Scoring set**: in each snapshot's 256 archived episodes (64 task groups of 4), the episodes of the
  last 16 groups (order of first appearance) — 64 episodes shared by every fit; critics are fitted on
  the other 192 (``fit_values``' own held-out fifth of those groups watches its EV; no gate).
* **Truth**: the scoring set's token truth (``mc_token_truth`` at the ``uncertain`` defaults, M = 16,
  seed 0) beside v3's archived turn truth of the same episodes (M = 16), which centres the truth's
  within-turn part (neighbouring values).
* **Fits**: fresh and policy trunk × critic seeds 0–2, Monte-Carlo targets, 256 steps at lr 1e-3,
  16 episodes a step. Scored: :data:`ESTIMATORS`, each with the critic's values and with them
  flattened (each turn's start value over the turn), by ``credit_accuracy(..., truth="mc-token")``.
* **Unit**: (snapshot, critic seed), the mean of its two trunks; the primary comparisons are
  :data:`PRIMARY` on ``tok_corr_dis``, paired t over the units, Holm over both.

Records (``--archive``, default ``experiments/records/v4/e5``): ``validation.csv`` and
``validation_table.csv`` (the expert path), per snapshot ``snapshots/NAME/truth_tokens.parquet`` and
``truth_tokens.json`` (its cost, the policy's digest), per fit ``fits/NAME/TRUNK-seedS.csv`` (one row
per values and estimator), and the report's ``e5.csv``, ``comparisons.jsonl``, ``tables.md`` and
``figures/within_turn.png``, rebuilt from the rest by ``--report-only``. Model folders stay in
``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import mpo_viz as mv
from experiments import credit_accuracy as ca
from experiments import grids, stats
from experiments import truth_accuracy as ta
from mpo_viz import models
from mpo_viz.advantages import compute, mc_returns
from mpo_viz.analysis import credit_accuracy, explained_variance
from mpo_viz.envs import NoisyExpert, make_env
from mpo_viz.rollout import rollout
from mpo_viz.rollout.token_truth import mc_token_truth
from mpo_viz.rollout.truth import mc_truth
from mpo_viz.train.critic_fit import critic_outputs, fit_values
from mpo_viz.train.update import rows_of

ARCHIVE = grids.REPO / "experiments" / "records" / "v4" / "e5"
#: v3's E1 archive: the snapshots' episodes, their turn truth and the policies' digests
V3 = grids.REPO / "experiments" / "records" / "v3" / "e1-e4"

#: the estimators scored (label, registry name, options), fixed in the pre-registration
ESTIMATORS: list[tuple[str, str, dict]] = [
    ("mpo", "mpo", {}),
    ("mpo_baseline", "mpo", {"within": "baseline"}),
    ("turn_gae", "turn_gae", {}),
    ("gae 0.95", "gae", {"lam": 0.95}),
    ("gae 1", "gae", {}),
    ("vapo", "vapo", {}),
    ("bilevel_gae", "bilevel_gae", {}),
]
#: the primary comparisons (a − b on ``tok_corr_dis`` with the critic's values), Holm over both
PRIMARY = (("mpo", "turn_gae"), ("mpo", "mpo_baseline"))
MEASURE = "tok_corr_dis"
#: the measure when a snapshot's token truth is below the reliability floor (``tok_corr_dis`` withheld):
#: ``tok_corr`` divided by √ρ without the floor (fixed before the first snapshot was measured)
MEASURE_UNFLOORED = "tok_corr_dis_unfloored"

FULL = dict(groups=16, m=16, steps=256, seeds=(0, 1, 2), trunks=("fresh", "policy"), snapshots=ta.SNAPSHOTS)
QUICK = dict(groups=2, m=2, steps=4, seeds=(0,), trunks=("fresh", "policy"), snapshots=("start",))
SIZES = {"full": FULL, "quick": QUICK}
KEPT = (
    "values",
    "estimator",
    "tok_corr",
    "tok_corr_dis",
    "within_corr",
    "within_corr_dis",
    "unc_share",
    "unc_share_truth",
    "sign_agreement",
    "n_sign",
    "slope_credit_on_truth",
    "slope_credit_on_truth_dis",
    "slope_truth_on_credit",
    "reliability",
    "within_reliability",
    "n_tokens",
    "n_turns",
    "note",
)

log = ta.log


# --------------------------------------------------------------------------------------------- the expert path


def validate(archive: Path, episodes: int = 64, m: int = 16) -> pd.DataFrame:
    """The path's check before any snapshot (``experiments.credit_accuracy.expert_token_validation`` on
    ``automation``): ``archive/validation.csv`` (agreement with the exact oracle per positions rule) and
    ``validation_table.csv`` (the within-turn table with the oracle's values); kept once written."""
    path = archive / "validation.csv"
    if path.is_file():
        return pd.read_csv(path)
    t0 = time.perf_counter()
    rows, table = ca.expert_token_validation("automation", episodes=episodes, m=m)
    archive.mkdir(parents=True, exist_ok=True)
    table.to_csv(archive / "validation_table.csv", index=False)
    rows.to_csv(path, index=False)
    log(f"expert path validated in {time.perf_counter() - t0:.0f} s:\n{rows.to_string(index=False)}")
    return rows


def validation_passed(rows: pd.DataFrame) -> bool:
    """|z| < 3 on ≥ 95% of the measured decisive tokens and |Â| ≤ 3·se at ≥ 95% of the controls, at
    the ``uncertain`` defaults and at ``decisive`` (the ``pi`` estimator)."""
    pi = rows[rows.estimator == "pi"]
    return bool(len(pi) == 2 and (pi.z_lt_3 >= 0.95).all() and (pi.controls_lt_3se >= 0.95).all())


# --------------------------------------------------------------------------------------------- the scoring set


def scoring_split(batch, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """``(fit, scoring)`` row indices: the scoring set is every episode of the last ``groups`` task
    groups in order of first appearance, the fit set the rest (both sorted)."""
    labels = [str(g) for g in batch.field("group_id")]
    order = list(dict.fromkeys(labels))
    if len(order) <= groups:
        raise ValueError(f"expected more than {groups} task groups to hold {groups} out, found {len(order)}")
    last = set(order[-groups:])
    scoring = np.array([i for i, g in enumerate(labels) if g in last])
    fit = np.array([i for i, g in enumerate(labels) if g not in last])
    return fit, scoring


def v3_digest(name: str) -> str | None:
    """The policy digest v3's archive recorded beside the snapshot's truth (None when absent)."""
    meta = ta.snapshot_dir(V3, name) / "snapshot.json"
    return json.loads(meta.read_text()).get("policy_sha256") if meta.is_file() else None


def own_episodes(out: Path, name: str) -> bool:
    """Whether the snapshot's episodes are E5's own (the recorded deviation): its retrained policy
    differs from the one v3's archived truth was measured with, so that truth is not this policy's."""
    if name == "start":
        return False
    ensure_policy(out, name)
    return ta.weights_sha256(ta.policy_folder(out, name) / "policy") != v3_digest(name)


def snapshot_batch(out: Path, archive: Path, name: str):
    """The snapshot's 256 episodes: v3's archived ones with their turn truth when the policy is v3's
    (bit-identical weights), else E5's own rollout of the rebuilt policy with v3's seeds and expert
    values (``archive/snapshots/NAME/episodes.parquet``, made once; no turn truth in it)."""

    if not own_episodes(out, name):
        ta.restore_truth(out, V3, name)
        path = ta.snapshot_dir(out, name) / "truth.parquet"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: expected v3's archived episodes of snapshot {name} (from {V3})")
        return mv.load(path)
    path = ta.snapshot_dir(archive, name) / "episodes.parquet"
    if path.is_file():
        return mv.load(path)
    policy = ta.snapshot_policy(out, name)
    env = make_env("automation", difficulty=tuple(grids.CELLS[ta.CELL]))
    batch = rollout(
        policy, env, 256, group_size=4, seed=0, oracle=NoisyExpert(noise=grids.ORACLE_NOISE), progress=False
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    mv.save(batch, path)
    log(f"{name}: 256 episodes of the rebuilt policy (success {float(np.mean(batch.outcome_reward)):.3f})")
    return batch


def ensure_policy(out: Path, name: str, size: str = "v2") -> None:
    """Make the snapshot's policy folder in ``out`` when it lacks it (retrained as v3 did: ppo or mpo,
    seed 0, the v2 budget, saved at iterations 10 and 20)."""
    if name == "start" or (ta.policy_folder(out, name) / "policy").is_dir():
        return
    arm = name.split("@")[0]
    its = tuple(int(n.split("@")[1]) for n in ta.SNAPSHOTS if n.startswith(f"{arm}@"))
    need = tuple(i for i in its if not (ta.policy_folder(out, f"{arm}@{i}") / "policy").is_dir())
    ta.make_snapshots(out, arm, its, size, need=need)


def token_truth(out: Path, archive: Path, name: str, spec: dict):
    """The scoring set's token truth: ``archive/snapshots/NAME/truth_tokens.parquet``, else measured once."""

    path = ta.snapshot_dir(archive, name) / "truth_tokens.parquet"
    if path.is_file():
        return mv.load(path)
    batch = snapshot_batch(out, archive, name)
    _, scoring = scoring_split(batch, spec["groups"])
    own = own_episodes(out, name)
    policy = ta.snapshot_policy(out, name)
    t0, tm = time.perf_counter(), {}
    sub = batch[scoring]
    if own:  # the turn truth that centres the truth's within-turn part, as v3 measured it (M = 16)
        sub = mc_truth(sub, policy, m=16, seed=0, q=False, progress=True)
    turn_seconds = time.perf_counter() - t0
    tok = mc_token_truth(sub, policy, m=spec["m"], seed=0, progress=True, timings=tm)
    seconds = time.perf_counter() - t0 - turn_seconds
    meta = tok.meta["mc_truth"]["tokens"]
    info = {
        "snapshot": name,
        "episodes": len(tok),
        "m": spec["m"],
        "measured": int(meta["measured"]),
        "controls": int(meta["measured_controls"]),
        "seconds": seconds,
        "turn_truth_seconds": turn_seconds,
        "episodes_from": "E5's rollout of the rebuilt policy" if own else "v3's archive",
        "load": os.getloadavg()[0],
        "policy_sha256": ta.weights_sha256(ta.policy_folder(out, name) / "policy"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "truth_tokens.json").write_text(json.dumps(info) + "\n")
    mv.save(tok, path)
    log(f"{name}: token truth of {len(tok)} episodes, {info['measured']} tokens, in {seconds:.0f} s")
    return tok


# --------------------------------------------------------------------------------------------- one fit


def credit(scoring, values: np.ndarray) -> dict[str, np.ndarray]:
    """Each of :data:`ESTIMATORS`' (B, L) credit on ``scoring`` read with ``values`` (B, L)."""

    b = scoring.with_token_fields(values=np.asarray(values, dtype=np.float32))
    return {label: compute(b, est, **opts).advantages.double().numpy() for label, est, opts in ESTIMATORS}


def scored(scoring, values: np.ndarray) -> list[dict]:
    """The within-turn table rows (``credit_accuracy(..., truth="mc-token")``) with the critic's values
    and with them flattened, plus :data:`MEASURE_UNFLOORED`."""

    rows = []
    for kind, v in (("critic", values), ("flattened", ta.flattened(scoring, values))):
        b = scoring.with_token_fields(values=np.asarray(v, dtype=np.float32))
        table = credit_accuracy(b, credit(scoring, v), truth="mc-token")
        for r in table.to_dict("records"):
            rel = r["reliability"]
            unfloored = r["tok_corr"] / math.sqrt(rel) if rel > 0 else math.nan
            row = {k: r.get(k) for k in KEPT if k not in ("values",)}
            rows.append({"values": kind, **row, MEASURE_UNFLOORED: float(np.clip(unfloored, -1, 1))})
    return rows


def fit_one(out: Path, name: str, batch, tok, spec: dict, trunk: str, seed: int) -> pd.DataFrame:
    """One critic on the fit set (``trunk``, ``seed``), scored on the scoring set: one row per values
    and estimator, with the fit's explained variance on the scoring set."""

    fit_idx, _ = scoring_split(batch, spec["groups"])
    train = batch[fit_idx]
    critic = (
        models.make_critic(ta.snapshot_policy(out, name), init="policy", seed=seed)
        if trunk == "policy"
        else ca.make_critic("automation", "fresh", train, seed)
    )
    t0 = time.perf_counter()
    fit = fit_values(
        critic,
        train,
        mc_returns(train),
        steps=spec["steps"],
        lr=1e-3,
        batch_episodes=16,
        holdout=0.2,
        gate=None,
        seed=seed,
        pad_id=0,
        groups=train.field("group_id"),
    )
    values = critic_outputs(critic, rows_of(tok), np.arange(len(tok)), pad_id=0, device="cpu").numpy()
    values = values[:, : tok.mask.shape[1]]
    ev = explained_variance(mc_returns(tok), torch.as_tensor(values, dtype=torch.float64), tok.mask)
    base = {
        "snapshot": name,
        "trunk": trunk,
        "seed": seed,
        "steps": spec["steps"],
        "fit_episodes": len(train),
        "fit_heldout_ev": fit.heldout_ev,
        "scoring_ev": float(ev),
        "fit_seconds": time.perf_counter() - t0,
    }
    return pd.DataFrame([{**base, **r} for r in scored(tok, values)])


def fit_path(archive: Path, name: str, trunk: str, seed: int) -> Path:
    return archive / "fits" / name.replace("@", "_it") / f"{trunk}-seed{seed}.csv"


def run_snapshot(out: Path, archive: Path, name: str, spec: dict) -> None:
    """The snapshot's token truth and every fit missing from the archive."""
    tok = token_truth(out, archive, name, spec)
    batch = None
    for trunk in spec["trunks"]:
        for seed in spec["seeds"]:
            path = fit_path(archive, name, trunk, seed)
            if path.is_file():
                continue
            if batch is None:
                batch = snapshot_batch(out, archive, name)
            rows = fit_one(out, name, batch, tok, spec, trunk, seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            rows.to_csv(tmp, index=False)
            tmp.replace(path)
            mpo = rows[(rows["values"] == "critic") & (rows.estimator == "mpo")].iloc[0]
            log(
                f"{name} {trunk} seed {seed}: scoring EV {mpo.scoring_ev:.3f}, mpo tok_corr {mpo.tok_corr:.3f} "
                f"({mpo.fit_seconds:.0f} s)"
            )


# --------------------------------------------------------------------------------------------- report


def read_fits(archive: Path) -> pd.DataFrame:
    files = sorted((archive / "fits").glob("*/*.csv"))
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True) if files else pd.DataFrame()


def measure_of(df: pd.DataFrame) -> str:
    """:data:`MEASURE`, or :data:`MEASURE_UNFLOORED` when it is withheld (NaN) anywhere for the critic's
    values of the primary estimators (a snapshot's truth below the reliability floor)."""
    sel = df[(df["values"] == "critic") & df.estimator.isin({e for pair in PRIMARY for e in pair})]
    return MEASURE if sel[MEASURE].notna().all() else MEASURE_UNFLOORED


def units(df: pd.DataFrame, measure: str, values: str = "critic") -> pd.DataFrame:
    """One row per (snapshot, critic seed) and estimator: ``measure`` averaged over the two trunks. A unit
    with only one trunk's fit so far (a run stopped part way) is left out until its other fit exists."""
    sel = df[df["values"] == values]
    trunks = sel.groupby(["snapshot", "seed"]).trunk.transform("nunique")
    sel = sel[trunks == df.trunk.nunique()]
    return sel.groupby(["snapshot", "seed", "estimator"], as_index=False)[measure].mean()


def comparisons(df: pd.DataFrame) -> list[dict]:
    """The primary comparisons over the units (Holm over both) and, beside each, the same over the
    snapshot means; the secondary within-part test of MPO against 0."""
    measure = measure_of(df)
    u = units(df, measure).pivot_table(index=["snapshot", "seed"], columns="estimator", values=measure)
    out = []
    for a, b in PRIMARY:
        d = (u[a] - u[b]).dropna()
        snap = d.groupby(level="snapshot").mean()
        out.append(
            {
                "comparison": f"{a} - {b}",
                "measure": measure,
                "units": len(d),
                **stats.paired_test(d.to_numpy()),
                "snapshots": len(snap),
                **{f"snapshot_{k}": v for k, v in stats.paired_test(snap.to_numpy()).items()},
                "sd_units": float(d.std(ddof=1)) if len(d) > 1 else math.nan,
            }
        )
    for r, p in zip(out, stats.holm([r["p_value"] for r in out])):
        r["p_holm"] = p
        r["reading"] = stats.effect_reading(r)
    w = units(df, "within_corr").pivot_table(index=["snapshot", "seed"], columns="estimator", values="within_corr")
    within = w["mpo"].dropna().to_numpy() if "mpo" in w else np.array([])
    sec = {"comparison": "mpo within_corr - 0 (secondary, uncorrected)", "measure": "within_corr", "units": len(within)}
    sec.update(stats.paired_test(within))
    sec["reading"] = (
        "points the right way" if math.isfinite(sec["ci_low"]) and sec["ci_low"] > 0 else "not shown to point right"
    )
    return [*out, sec]


def first_snapshot(df: pd.DataFrame, archive: Path) -> dict:
    """Cost and spread of the first snapshot (``start``): the pre-registered numbers written before the rest."""
    meta = json.loads((ta.snapshot_dir(archive, "start") / "truth_tokens.json").read_text())
    s = df[df.snapshot == "start"]
    measure = measure_of(df)
    u = units(s, measure).pivot_table(index="seed", columns="estimator", values=measure)
    fit_s = float(s.groupby(["trunk", "seed"]).fit_seconds.first().sum())
    out = {"truth_seconds": meta["seconds"], "truth_load": meta["load"], "fit_seconds": fit_s, "measure": measure}
    for a, b in PRIMARY:
        sd = float((u[a] - u[b]).std(ddof=1))
        out[f"{a} - {b}"] = {"sd": sd, "power_0.05_15_units": stats.power(sd, 15)}
    return out


def table(df: pd.DataFrame) -> str:
    """Per snapshot, values and estimator: the mean over the six fits of the main columns."""
    cols = ["tok_corr", MEASURE, MEASURE_UNFLOORED, "within_corr", "unc_share", "unc_share_truth"]
    cols += ["sign_agreement", "slope_credit_on_truth", "slope_truth_on_credit", "reliability"]
    g = df.groupby(["snapshot", "values", "estimator"], sort=False)[cols].mean().reset_index()
    return g.to_string(index=False, float_format=lambda v: f"{v:.3f}")


def figure(df: pd.DataFrame, path: Path) -> Path:
    """Within-turn correlation (critic values) per estimator and snapshot, mean and range over fits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = df[df["values"] == "critic"]
    labels = [e for e, _, _ in ESTIMATORS]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for ax, col, title in zip(
        axes, ("tok_corr", "within_corr"), ("credit vs Â_t", "within-turn part vs Â_t − Â_k/n_k")
    ):
        for snap in dict.fromkeys(sel.snapshot):
            s = sel[sel.snapshot == snap].groupby("estimator")[col]
            m = s.mean().reindex(labels)
            ax.plot(range(len(labels)), m.to_numpy(), "o-", label=snap, alpha=0.8)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        ax.set_title(title)
    axes[0].set_ylabel("correlation (mean over six fits)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(archive: Path) -> str:
    """Rebuild ``e5.csv``, ``comparisons.jsonl``, ``tables.md`` and the figure from the archive's fits."""
    df = read_fits(archive)
    if df.empty:
        return "E5: no fits yet"
    df.to_csv(archive / "e5.csv", index=False)
    comps = comparisons(df)
    (archive / "comparisons.jsonl").write_text("".join(json.dumps(stats_clean(c)) + "\n" for c in comps))
    lines = ["# E5 tables (rebuilt by `python -m experiments.within_turn --report-only`)", ""]
    if (ta.snapshot_dir(archive, "start") / "truth_tokens.json").is_file() and "start" in set(df.snapshot):
        lines += [
            "## The first snapshot (start): cost and spread",
            "",
            "```",
            json.dumps(first_snapshot(df, archive), indent=1),
            "```",
            "",
        ]
    lines += ["## Comparisons", "", "```"]
    lines += [json.dumps(stats_clean(c)) for c in comps]
    lines += ["```", "", "## Means over fits", "", "```", table(df), "```", ""]
    (archive / "tables.md").write_text("\n".join(lines))
    figure(df, archive / "figures" / "within_turn.png")
    return "\n".join(lines)


def stats_clean(d: dict) -> dict:
    return {k: stats.finite_or_none(v) for k, v in d.items()}


# --------------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=grids.REPO / "runs" / "e5", help="model folders (not archived)")
    ap.add_argument("--archive", type=Path, default=ARCHIVE, help="the records (resumed from)")
    ap.add_argument("--quick", action="store_true", help="a smoke run (2 groups scored, M = 2, 4 fit steps)")
    ap.add_argument("--validate", action="store_true", help="only the expert path's check")
    ap.add_argument("--snapshots", nargs="+", default=None, metavar="NAME", help="only these snapshots")
    ap.add_argument("--report-only", action="store_true", help="the report from the archive")
    args = ap.parse_args(argv)
    spec = QUICK if args.quick else FULL
    bad = [n for n in args.snapshots or () if n not in spec["snapshots"]]
    if bad:
        ap.error(f"--snapshots: {bad} not among {list(spec['snapshots'])}")

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.validate:
        rows = validate(args.archive)
        print(rows.to_string(index=False))
        return 0 if validation_passed(rows) else 1
    if not args.report_only:
        if not args.quick and not validation_passed(validate(args.archive)):
            print("E5: the expert path does not agree with the exact oracle; no snapshot is measured", file=sys.stderr)
            return 1
        for name in args.snapshots or spec["snapshots"]:
            run_snapshot(args.out, args.archive, name, spec)
    print(report(args.archive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
