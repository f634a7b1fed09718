"""Does MPO's turn-level credit help? Replication v2: a pre-registered grid of training runs.

    python benchmarks/learning.py --size v2                  # run (or continue) the grid
    python benchmarks/learning.py --size v2 --seeds 0 2 4    # a share of it (e.g. one process per core)
    python benchmarks/learning.py --size v2 --report-only    # records, tables and figures from what ran
    python benchmarks/learning.py --size v2 --status         # which runs are done, partial, missing

Everything is fixed here, before any run: the arms, the cells, the budgets, the seeds and the
statistics. ``docs/results.md`` states them in words and reads the results. (The first grid, v1,
was run by this file at commit 14b590f; its records are in ``docs/results/small/``.)

**Start.** The shipped automation start (``trajectories/starts/automation``: SFT on the noise-0.3
expert), the same policy for every arm and seed. Replication v3's E3 (``--size v3-e3``, 5–6 turns)
starts from ``trajectories/starts/automation-d5-6`` instead: that SFT continued at 5–6 turns
(docs/results.md says why).

**Cells.** ``automation-d3-4`` (3–4 expert turns) first; ``automation-d5-6`` (5–6 turns: MPO's
claim is about long horizons) after it.

**Arms** (G = 4 for every arm, so that all see the same tasks and episodes): ``grpo`` (grpo +
token_ppo), ``ppo`` (gae + token_ppo), ``turn_gae`` (turn_gae + token_ppo), ``mpo_token`` (mpo +
token_ppo), ``mpo`` (mpo + turn_ppo at its default token band 2), ``mpo_bare`` (mpo + turn_ppo,
``token_clip=None``), ``mpo_oracle`` (mpo + turn_ppo with ``critic="expert"``: the exact values of
the noise-0.3 expert).

**Critic warm-up**, once per (cell, seed) and shared by every learned-critic arm of that seed (a
saved model folder, so their critics start equal): 512 episodes of the start, a fifth held out,
fitted to Monte-Carlo returns at lr 1e-3 until the held-out explained variance reaches 0.2 or 256
steps end. During RL the critic gets 4 epochs per iteration at lr 3e-4.

**Critic target**: during RL every learned critic trains on the Monte-Carlo returns
(``--value-target mc``, the default: the trainer's ``value_target="mc"``), so an arm differs from
another only by the estimator or loss it names, not by what its critic learns (turn_gae's own
returns bootstrap on the critic and are flat inside turns; docs/training.md). Every row of the
records says which (``value_target``; null for arms that train no critic). The v2 grid as recorded
in docs/results/ ran with each estimator's own returns (``--value-target estimator`` reproduces it;
there only the turn_gae arm's target differed, the others' own returns being Monte-Carlo).

**Budget**, equal for every arm: 20 iterations × 32 episodes (8 tasks × 4), 2 policy epochs × 4
minibatches (160 policy steps) at lr 1e-4.

**Evaluation**: sampled (T = 1) and greedy success on 128 held-out tasks, fixed by the seed and
the same for every arm of that seed (``eval_seed``), before RL (iteration 0), every 5 iterations
and at the end; pass@k (k = 1…8) of each final policy on the first 64 of those tasks with 8
samples each (the unbiased estimator).

**Seeds**: 6 (0–5). A seed fixes RL sampling, minibatch order, the warm-up pool and the
evaluation tasks.

**Statistics**: primary = final held-out sampled success, paired by seed: the mean difference,
its 95% t-interval, a two-sided paired t-test, Holm-corrected over the 6 comparisons of a cell
(:data:`COMPARISONS`). A verdict names a winner only when the Holm-corrected p < 0.05. Secondary:
pass@k, greedy success, collapses (rollout success < 0.05 at any iteration after the 4th), the
critic's explained variance and across/within ratio over training, per-turn credit correlation
with the oracle.

**Matched step sizes** (``--calibrate-step``; not part of the v2 grid as run). At one learning
rate turn_ppo takes larger steps than token_ppo (its band bounds only a turn's mean log-ratio and
weights each token by ρ_k instead of its own r_j: docs/concepts.md §7.7); in v2 its arms had
1.5–2.3× the per-update ``approx_kl``. The rule, fixed before any calibration run: on the seed's
start (its warm-up folder, policy = the start), run ``mpo_token`` (mpo + token_ppo) and mpo +
turn_ppo with each token band ``token_clip`` of :data:`TOKEN_CLIP_LADDER` in order (loosest first,
the default 2 at its head) for :data:`CALIBRATION_ITERATIONS` iterations of the grid's budget at
the same learning rate; the chosen band is the first whose mean per-update ``approx_kl`` lies
within :data:`KL_BAND` (±20%) of token_ppo's; when none does, the one closest in log ratio, recorded
as not matched. ``OUT/calibration.jsonl`` records every KL measured and the choice, per cell and
seed; a grid that compares turn_ppo with token_ppo at matched steps runs turn_ppo at that band.

**Resume**: every run is a trainer run folder under ``OUT/runs/``; a finished run is skipped, a
partial one continues from its last checkpoint, a warm-up folder is made once. Stop the grid
(Ctrl-C, a kill) and start it again with the same command. Results are rebuilt from the folders.
``--archive DIR`` keeps a finished run's records (config, metrics, pass@k, the seed's warm-up line
and the per-iteration credit accuracy, a few hundred KB, no model) under ``DIR/runs/``: a grid
that spans machines whose run folders do not survive skips the archived runs and rebuilds its
results from the archive where the folder is gone. The first grid run into an archive writes its
``DIR/grid.json``; a grid whose start, budgets, arm specs or value target differ from it is refused
with the differing fields named, so the runs of one grid are never skipped as another's (a share of
the cells, seeds or arms is the same grid).

**Outputs** (``OUT``, default ``runs/learning-SIZE``): ``results.jsonl`` (one row per cell, arm,
seed and iteration), ``final.jsonl`` (one row per run: final success, pass@k, collapse),
``comparisons.jsonl``, ``tables.md``, ``figures/*.png``; ``--export DIR`` copies them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scipy import stats as sps  # noqa: E402

from mpo_viz.advantages import get as get_estimator  # noqa: E402

# --------------------------------------------------------------------------------------------- the grid

START = REPO / "trajectories" / "starts" / "automation"
#: replication v3 E3's start for 5–6 turns: SFT continued from START at that horizon (docs/results.md)
START_D56 = REPO / "trajectories" / "starts" / "automation-d5-6"


@dataclasses.dataclass(frozen=True)
class Arm:
    """One method of the grid: estimator and loss (with options) and where its values come from."""

    estimator: str
    loss: str
    loss_options: tuple = ()  # ((key, value), ...)
    critic: str = "learned"
    estimator_options: tuple = ()  # ((key, value), ...)
    matched_band: bool = False  # turn_ppo at the token band the matched-step rule chose for the seed


ARMS = {
    "grpo": Arm("grpo", "token_ppo"),
    "ppo": Arm("gae", "token_ppo"),
    "turn_gae": Arm("turn_gae", "token_ppo"),
    "mpo_token": Arm("mpo", "token_ppo"),
    "mpo": Arm("mpo", "turn_ppo"),
    "mpo_bare": Arm("mpo", "turn_ppo", (("token_clip", None),)),
    "mpo_oracle": Arm("mpo", "turn_ppo", critic="expert"),
    # replication v3 (docs/results.md): the policy's own Monte-Carlo values as the critic (critic="mc"),
    # the unbiased within-turn baseline, and turn_ppo at the step size of token_ppo
    "turn_gae_mc": Arm("turn_gae", "token_ppo", critic="mc"),
    "mpo_mc": Arm("mpo", "token_ppo", critic="mc"),
    # replication v4 E2' (docs/results.md): turn GAE at λ_T = 0 on the policy's Monte-Carlo values, so
    # a turn's credit is its one-step residual R_k + V(s_{k+1}) − V(s_k) and later turns' luck stays out
    "turn_gae_mc0": Arm("turn_gae", "token_ppo", critic="mc", estimator_options=(("turn_lam", 0.0),)),
    "mpo_baseline": Arm("mpo", "token_ppo", estimator_options=(("within", "baseline"),)),
    "mpo_matched": Arm("mpo", "turn_ppo", matched_band=True),
    # SAO as its paper runs it: token GAE with VAPO's length-adaptive λ = 1 − 1/(1.5·ℓ), the sao loss
    "sao": Arm("gae", "sao", estimator_options=(("lam_rule", "vapo"), ("alpha", 1.5))),
}

#: the comparisons stated in advance: (label, arm a, arm b); Holm over all of them, per cell
COMPARISONS = [
    ("MPO vs GRPO", "mpo", "grpo"),
    ("MPO vs PPO", "mpo", "ppo"),
    ("MPO vs turn GAE", "mpo", "turn_gae"),
    ("MPO vs MPO-token (turn_ppo vs token_ppo)", "mpo", "mpo_token"),
    ("MPO vs MPO bare (token band vs none)", "mpo", "mpo_bare"),
    ("MPO-oracle vs MPO (exact vs learned critic)", "mpo_oracle", "mpo"),
]

#: v3 E2, headroom: can near-true turn credit beat GRPO and PPO here at all? (primaries, Holm over both)
E2_COMPARISONS = [
    ("turn GAE + MC values vs PPO", "turn_gae_mc", "ppo"),
    ("turn GAE + MC values vs GRPO", "turn_gae_mc", "grpo"),
]
#: v4 E2', real headroom: turn credit nearer the truth (λ_T = 0 on MC values) against E2's ppo and grpo runs
E2P_COMPARISONS = [
    ("turn GAE λ_T=0 + MC values vs PPO", "turn_gae_mc0", "ppo"),
    ("turn GAE λ_T=0 + MC values vs GRPO", "turn_gae_mc0", "grpo"),
]
#: v3 E3, the long horizon one factor at a time (primaries, Holm over the four)
E3_COMPARISONS = [
    ("MPO-token vs PPO (the estimator)", "mpo_token", "ppo"),
    ("MPO-token vs turn GAE (the within-turn signal)", "mpo_token", "turn_gae"),
    ("MPO matched vs MPO-token (turn_ppo vs token_ppo at matched steps)", "mpo_matched", "mpo_token"),
    ("MPO baseline vs MPO-token (within='baseline' vs intra)", "mpo_baseline", "mpo_token"),
]

#: cell name -> expert turns per task
CELLS = {"automation-d3-4": [3, 4], "automation-d5-6": [5, 6]}

#: the noise rate of the expert the start imitated: the oracle values are this expert's
ORACLE_NOISE = 0.3

SIZES = {
    # a smoke run of the whole pipeline (a minute): nothing here learns
    "tiny": dict(cells=("automation-d3-4",), arms=("grpo", "mpo", "mpo_oracle"), seeds=(0,), iterations=2,
                 episodes=8, epochs=1, minibatches=2, critic_epochs=1, eval_episodes=8, eval_interval=1,
                 warmup_episodes=20, warmup_steps=2, pass_tasks=4, pass_samples=2, max_turn_tokens=48),
    # the pre-registered grid (docs/results.md): 2 cells × 7 arms × 6 seeds
    "v2": dict(cells=tuple(CELLS), arms=("grpo", "ppo", "turn_gae", "mpo_token", "mpo", "mpo_bare", "mpo_oracle"),
               seeds=tuple(range(6)), iterations=20, episodes=32, epochs=2,
               minibatches=4, critic_epochs=4, eval_episodes=128, eval_interval=5, warmup_episodes=512,
               warmup_steps=256, pass_tasks=64, pass_samples=8, max_turn_tokens=48),
}
# v3 (docs/results.md, "Replication v3"): the v2 budget, one experiment a size
SIZES["v3-e2"] = dict(SIZES["v2"], cells=("automation-d3-4",),
                      arms=("grpo", "ppo", "turn_gae", "turn_gae_mc", "mpo_mc"), comparisons=E2_COMPARISONS,
                      # the recorded deviation (docs/results.md, E2): mpo_mc is turn_gae_mc by construction
                      # (MC values are constant inside a turn), shown on seeds 0 and 1; the other seeds skip it
                      arm_seeds={"mpo_mc": (0, 1)})
SIZES["v3-e3"] = dict(SIZES["v2"], cells=("automation-d5-6",), seeds=tuple(range(8)),
                      arms=("grpo", "ppo", "turn_gae", "mpo_token", "mpo_matched", "mpo_baseline"),
                      comparisons=E3_COMPARISONS, start=START_D56)
# v4 E2' (docs/results.md, "Replication v4"): E2's cell, budget, start and seeds; its ppo and grpo runs
# are E2's archived ones (docs/results/v4/e2p/runs holds copies of them), only turn_gae_mc0 runs anew
SIZES["v4-e2p"] = dict(SIZES["v2"], cells=("automation-d3-4",), arms=("grpo", "ppo", "turn_gae_mc0"),
                       comparisons=E2P_COMPARISONS)
#: continuations per turn start of the critic="mc" arms
MC_SAMPLES = 8


def comparisons_of(size: str) -> list[tuple[str, str, str]]:
    """The comparisons a size states in advance (v1/v2: :data:`COMPARISONS`)."""
    return SIZES[size].get("comparisons", COMPARISONS)
GROUP_SIZE = 4
COLLAPSE_LEVEL, COLLAPSE_AFTER = 0.05, 4


def plan(size: str, cells=None, seeds=None, arms=None) -> list[tuple[str, int, str]]:
    """``(cell, seed, arm)`` in the order they run: cell by cell, seed by seed, arm by arm (a
    partial grid has whole seeds of its first cell); ``cells``, ``seeds`` and ``arms`` filter, and a
    size's ``arm_seeds`` keeps an arm to the seeds it names."""
    s = SIZES[size]
    only = s.get("arm_seeds", {})  # arm -> the only seeds it runs on (a recorded deviation)
    return [(c, seed, a) for c in s["cells"] if not cells or c in cells
            for seed in s["seeds"] if seeds is None or seed in seeds
            for a in s["arms"] if (not arms or a in arms) and seed in only.get(a, (seed,))]


def grid_meta(size: str, value_target: str | None = None) -> dict:
    """``OUT/grid.json``: the size's spec with its start (:func:`start_of`, as its path in the
    repository), the arms, the comparisons, the value target and the machine."""
    spec = {**SIZES[size], "start": start_of(size)}  # a size's own start, else the shipped one
    grid = {k: str(v.relative_to(REPO)) if isinstance(v, Path) else v for k, v in spec.items()}
    return {"size": size, "grid": grid, "arms": {k: dataclasses.asdict(v) for k, v in ARMS.items()},
            "comparisons": comparisons_of(size), "value_target": value_target or VALUE_TARGET, "python": sys.version.split()[0],
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "runs": len(plan(size))}


def start_of(size: str) -> Path:
    """The SFT start every arm and warm-up of ``size`` begins from (a size's ``start``, else :data:`START`)."""
    return SIZES[size].get("start", START)


def uses_warmup(arm: str) -> bool:
    """Whether the arm starts from the seed's critic warm-up (a learned critic that its estimator reads)."""
    a = ARMS[arm]
    return "values" in get_estimator(a.estimator).needs and a.critic == "learned"


def base_config(size: str, cell: str, seed: int, **changes):
    from mpo_viz.train import Config

    s = SIZES[size]
    kw = dict(env="automation", difficulty=list(CELLS[cell]), model_dir=str(start_of(size)), sft_steps=0, seed=seed,
              episodes=s["episodes"], group_size=GROUP_SIZE, iterations=s["iterations"], epochs=s["epochs"],
              minibatches=s["minibatches"], eval_episodes=s["eval_episodes"], eval_interval=s["eval_interval"],
              save_trajectories_every=s["eval_interval"], keep_checkpoints=1, oracle_noise=ORACLE_NOISE,
              max_turn_tokens=s["max_turn_tokens"], num_threads=1)
    kw.update(changes)
    return Config(**kw)


def warmup_config(size: str, cell: str, seed: int):
    """The warm-up's trainer config (gae at λ = 1: its returns are the Monte-Carlo ones)."""
    s = SIZES[size]
    return base_config(size, cell, seed, estimator="gae", loss="token_ppo", iterations=0,
                       critic_warmup_episodes=s["warmup_episodes"], critic_warmup_steps=s["warmup_steps"])


#: what every learned critic trains on during RL (``Config.value_target``; ``--value-target``)
VALUE_TARGET = "mc"


def run_config(size: str, cell: str, arm: str, seed: int, warm: Path, value_target: str = VALUE_TARGET):
    """An arm's config: learned-critic arms start from the seed's warm-up folder (policy = the start,
    critic = the fitted one), skip the warm-up and train on ``value_target``; the others start from
    the start itself."""
    a = ARMS[arm]
    kw = dict(estimator=a.estimator, loss=a.loss, loss_options=dict(a.loss_options), critic=a.critic,
              estimator_options=dict(a.estimator_options))
    if a.critic == "mc":
        kw["mc_samples"] = MC_SAMPLES
    if a.matched_band:  # the seed's matched-step record (made once, calibrate_step)
        out = warm.parents[3]  # warm = OUT/warmups/CELL/seed=S/model
        kw["loss_options"] = {**kw["loss_options"], "token_clip": calibrate_step(size, cell, seed, out,
                                                                                  value_target)["token_clip"]}
    if uses_warmup(arm):
        kw.update(model_dir=str(warm), critic_warmup_steps=0, critic_epochs=SIZES[size]["critic_epochs"],
                  value_target=value_target)
    return base_config(size, cell, seed, **kw)


# --------------------------------------------------------------------------------------------- running


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def warm_dir(out: Path, cell: str, seed: int) -> Path:
    return out / "warmups" / cell / f"seed={seed}"


def make_warmup(size: str, cell: str, seed: int, out: Path) -> Path:
    """The seed's critic warm-up, made once: ``warm_dir/model`` (policy/ = the start, critic/ =
    fitted) and ``warm_dir/warmup.json`` (the warm-up's metrics line)."""
    from mpo_viz import models
    from mpo_viz.train import Trainer

    d = warm_dir(out, cell, seed)
    if (d / "model" / "critic").is_dir() and (d / "warmup.json").is_file():
        return d / "model"
    if d.exists():
        shutil.rmtree(d)  # an interrupted warm-up is redone whole
    cfg = warmup_config(size, cell, seed)
    t0 = time.perf_counter()
    tr = Trainer(cfg, d / "run", quiet=True)
    rec = tr.warmup_critic()
    if tr.interrupted:
        raise KeyboardInterrupt
    models.save(d / "tmp_model", tr.policy, tr.critic)
    (d / "tmp_model").rename(d / "model")
    rec = {**rec, "seconds": time.perf_counter() - t0, "config_hash": cfg.hash()}
    (d / "warmup.json").write_text(json.dumps(rec, default=float) + "\n")
    log(f"{cell} warm-up seed {seed}: {rec['warmup_steps']} steps, held-out EV {rec['warmup_explained_var']:.3f} "
        f"(stopped by the {rec['warmup_stop']}; {rec['seconds']:.0f} s)")
    return d / "model"


def run_dir(out: Path, cell: str, arm: str, seed: int) -> Path:
    return out / "runs" / cell / arm / f"seed={seed}"


def run_state(d: Path, iterations: int) -> str:
    """``done`` (final evaluation and pass@k written), ``partial`` or ``missing``."""
    from mpo_viz.data.runfolder import read_metrics_file

    if not (d / "checkpoints" / "latest").exists():
        return "missing"
    recs = read_metrics_file(d / "metrics.jsonl")
    fin = any(r.get("iteration") == iterations and "eval_sampled_success" in r for r in recs)
    return "done" if fin and (d / "pass_at_k.json").is_file() else "partial"


#: a finished run's records the archive keeps (with ``warmup.json`` and ``credit.jsonl``)
ARCHIVED = ("config.json", "metrics.jsonl", "pass_at_k.json")


def archived(a: Path | None) -> bool:
    """Whether the archive folder ``a`` holds a finished run's records."""
    return a is not None and all((a / name).is_file() for name in ARCHIVED)


def archive_run(out: Path, archive: Path, cell: str, arm: str, seed: int) -> Path:
    """Copy the finished run's :data:`ARCHIVED` records and the seed's ``warmup.json`` into
    ``archive/runs/CELL/ARM/seed=S`` and write ``credit.jsonl`` (one line per iteration with saved
    episodes: :func:`credit_accuracy`), which is all :func:`collect` reads."""
    d, a = run_dir(out, cell, arm, seed), run_dir(archive, cell, arm, seed)
    tmp = a.with_name(f".{a.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for name in ARCHIVED:
        shutil.copy(d / name, tmp / name)
    warm = warm_dir(out, cell, seed) / "warmup.json"
    if warm.is_file():
        shutil.copy(warm, tmp / "warmup.json")
    cal = out / "calibration" / cell / f"seed={seed}.json"
    if cal.is_file():  # the seed's matched-step record, which a later mpo_matched run reads
        (archive / "calibration" / cell).mkdir(parents=True, exist_ok=True)
        shutil.copy(cal, archive / "calibration" / cell / cal.name)
    lines = []
    for traj in sorted((d / "trajectories").glob("iter=*.parquet")):
        acc = {k: _num(v) for k, v in credit_accuracy(traj).items()}
        lines.append(json.dumps({"iteration": int(traj.stem.split("=")[1]), **acc}) + "\n")
    (tmp / "credit.jsonl").write_text("".join(lines))
    if a.exists():
        shutil.rmtree(a)
    tmp.rename(a)
    return a


def restore_calibration(archive: Path, out: Path) -> None:
    """Copy the archive's matched-step records (``calibration/CELL/seed=S.json``) that ``out`` lacks,
    so a grid on a new machine reuses the seeds' chosen bands instead of measuring them again."""
    for rec in sorted((archive / "calibration").glob("*/seed=*.json")):
        dest = out / "calibration" / rec.parent.name / rec.name
        if not dest.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(rec, dest)


#: grid.json's ``grid`` fields that may differ between two grids sharing one archive (which runs are planned)
GRID_SHARE = ("cells", "arms", "seeds", "comparisons")


def archive_mismatch(archive_meta: dict, meta: dict) -> list[str]:
    """What makes the archive's runs (made under ``archive_meta``, its ``grid.json``) other runs than
    the grid ``meta`` would make: ``"FIELD: archive A, this grid B"`` per differing size, budget or
    start field, value target or spec of an arm both list; empty when the archive's runs are this
    grid's. Cells, seeds and arms may differ (a share of the grid, or more seeds later)."""
    def differs(name, a, b):
        return [] if a == b else [f"{name}: archive {a!r}, this grid {b!r}"]

    out = differs("size", archive_meta.get("size"), meta["size"])
    out += differs("value_target", archive_meta.get("value_target"), meta["value_target"])
    old = archive_meta.get("grid", {})
    for k in sorted((set(old) | set(meta["grid"])) - set(GRID_SHARE)):
        out += differs(k, old.get(k), meta["grid"].get(k))
    for arm in sorted(set(archive_meta.get("arms", {})) & set(meta["grid"]["arms"])):
        out += differs(f"arm {arm}", archive_meta["arms"][arm], meta["arms"][arm])
    return out


def claim_archive(archive: Path, meta: dict) -> None:
    """Mark ``archive`` as the grid ``meta``'s (``archive/grid.json``, written by the first grid run
    into it), or raise ``ValueError`` naming every field where the grid that made its runs differs
    (:func:`archive_mismatch`): those runs would otherwise be skipped as if they were this grid's."""
    path = archive / "grid.json"
    if not path.is_file():
        archive.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(meta, indent=1) + "\n")
        return
    bad = archive_mismatch(json.loads(path.read_text()), json.loads(json.dumps(meta)))  # tuples as JSON lists
    if bad:
        raise ValueError(f"--archive {archive}: its runs were made by another grid than --size {meta['size']} "
                         f"({path}): " + "; ".join(bad) + ". Use another archive folder for this grid.")


def run_one(size: str, cell: str, arm: str, seed: int, out: Path, value_target: str = VALUE_TARGET,
            archive: Path | None = None) -> None:
    from mpo_viz.train import Trainer

    s = SIZES[size]
    d = run_dir(out, cell, arm, seed)
    state = run_state(d, s["iterations"])
    if archive is not None and archived(run_dir(archive, cell, arm, seed)):
        return
    if state == "done":
        if archive is not None:
            archive_run(out, archive, cell, arm, seed)
        return
    # only an arm that reads a learned critic pays for the seed's warm-up (grpo or critic="mc" read none)
    warm = make_warmup(size, cell, seed, out) if uses_warmup(arm) else warm_dir(out, cell, seed) / "model"
    cfg = run_config(size, cell, arm, seed, warm, value_target)
    t0 = time.perf_counter()
    if state == "partial":
        tr = Trainer.resume(d, cfg, quiet=True)
    else:
        if d.exists():
            shutil.rmtree(d)  # a folder without a checkpoint holds nothing to keep
        tr = Trainer(cfg, d, quiet=True)
    tr.run_all(log=lambda line: None)
    if tr.interrupted:
        raise KeyboardInterrupt
    pk = tr.pass_at_k(s["pass_tasks"], s["pass_samples"])
    (d / "pass_at_k.json").write_text(json.dumps(pk) + "\n")
    ev = [r for r in tr.run.metrics() if r.get("eval_sampled_success") is not None]
    top = f"pass@{s['pass_samples']}"
    log(f"{cell} {arm:10s} seed {seed}: held-out sampled {ev[0]['eval_sampled_success']:.3f} -> "
        f"{ev[-1]['eval_sampled_success']:.3f}, greedy {ev[0]['eval_success']:.3f} -> {ev[-1]['eval_success']:.3f}, "
        f"{top} {pk[top]:.3f} ({time.perf_counter() - t0:.0f} s, "
        f"config {cfg.hash()})")
    if archive is not None:
        archive_run(out, archive, cell, arm, seed)


def measure_start(size: str, cell: str, seed: int, out: Path) -> dict:
    """The size's start on the seed's held-out tasks (the ``eval_episodes`` every arm of the seed is
    evaluated on before RL): greedy and sampled success, made once (``OUT/start/CELL/seed=S.json``)."""
    from mpo_viz.train import Trainer

    path = out / "start" / cell / f"seed={seed}.json"
    if path.is_file():
        return json.loads(path.read_text())
    cfg = base_config(size, cell, seed, estimator="grpo", iterations=0)
    d = out / "start" / cell / f".seed={seed}.run"
    if d.exists():
        shutil.rmtree(d)
    t0 = time.perf_counter()
    ev = Trainer(cfg, d, quiet=True).evaluation()
    rec = {"cell": cell, "seed": seed, "start": Path(cfg.model_dir).name, "eval_seed": ev["eval_seed"],
           "n_eval_tasks": ev["n_eval_tasks"], "greedy_success": ev["eval_success"],
           "sampled_success": ev["eval_sampled_success"], "seconds": time.perf_counter() - t0}
    shutil.rmtree(d)
    path.write_text(json.dumps(rec) + "\n")
    log(f"{cell} start {rec['start']} seed {seed}: greedy {rec['greedy_success']:.3f}, sampled "
        f"{rec['sampled_success']:.3f} on {rec['n_eval_tasks']} tasks ({rec['seconds']:.0f} s)")
    return rec


def start_table(recs: list[dict]) -> str:
    """Markdown: the start's success per seed and the mean with its 95% t-interval over seeds."""
    lines = ["| cell | start | seed | greedy success | sampled success |", "|---|---|---|---|---|"]
    lines += [f"| {r['cell']} | {r['start']} | {r['seed']} | {r['greedy_success']:.3f} | {r['sampled_success']:.3f} |"
              for r in recs]
    for cell in dict.fromkeys(r["cell"] for r in recs):
        rs = [r for r in recs if r["cell"] == cell]
        g, smp = (paired_test([r[k] for r in rs]) for k in ("greedy_success", "sampled_success"))
        lines.append(f"| {cell} | mean of {len(rs)} (95% CI) | – | {_fmt(g['mean_diff'])} ({_fmt(g['ci_low'])} to "
                     f"{_fmt(g['ci_high'])}) | {_fmt(smp['mean_diff'])} ({_fmt(smp['ci_low'])} to {_fmt(smp['ci_high'])}) |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- matched step sizes

#: turn_ppo's token bands tried, loosest first (2.0 = the default); fixed before any calibration run
TOKEN_CLIP_LADDER = (2.0, 1.5, 1.3, 1.2, 1.1)
#: turn_ppo's per-update approx_kl must lie within this share of token_ppo's to count as matched
KL_BAND = (0.8, 1.2)
#: RL iterations per calibration run (the grid's episodes, epochs and minibatches each)
CALIBRATION_ITERATIONS = 2


def choose_token_clip(reference_kl: float, kls: dict) -> dict:
    """The rule: the first band of :data:`TOKEN_CLIP_LADDER` (among those measured, ``kls``: band ->
    mean per-update approx_kl) whose KL ratio to ``reference_kl`` (token_ppo's) lies in
    :data:`KL_BAND`; when none does, the band whose ratio is closest to 1 in log (``matched`` False)."""
    if not reference_kl > 0 or not any(c in kls for c in TOKEN_CLIP_LADDER):
        raise ValueError(f"calibration: expected a positive reference KL and measured bands, found {reference_kl!r}, "
                         f"{kls!r}")
    ratios = {c: kls[c] / reference_kl for c in TOKEN_CLIP_LADDER if c in kls}
    inside = [c for c, r in ratios.items() if KL_BAND[0] <= r <= KL_BAND[1]]
    if inside:
        return {"token_clip": inside[0], "kl_ratio": ratios[inside[0]], "matched": True}
    best = min(ratios, key=lambda c: abs(math.log(ratios[c])) if ratios[c] > 0 else math.inf)
    return {"token_clip": best, "kl_ratio": ratios[best], "matched": False}


def _calibration_kl(cfg, d: Path) -> float:
    """Mean per-update approx_kl of ``cfg`` over :data:`CALIBRATION_ITERATIONS` fresh iterations in ``d``."""
    from mpo_viz.train import Trainer

    if d.exists():
        shutil.rmtree(d)  # a calibration run is short: an interrupted one is redone whole
    tr = Trainer(cfg, d, quiet=True)
    recs = list(tr.iterate(CALIBRATION_ITERATIONS))
    if tr.interrupted:
        raise KeyboardInterrupt
    return float(np.mean([r["approx_kl"] for r in recs]))


def calibrate_step(size: str, cell: str, seed: int, out: Path, value_target: str = VALUE_TARGET) -> dict:
    """The matched-step rule on the seed's start: token_ppo's KL, turn_ppo's along the ladder until
    one matches (:func:`choose_token_clip`); the record, also kept in ``OUT/calibration/``."""
    done = out / "calibration" / cell / f"seed={seed}.json"
    if done.is_file():
        return json.loads(done.read_text())
    warm = make_warmup(size, cell, seed, out)
    runs = out / "calibration" / cell / f"seed={seed}"

    def short(arm, **changes):
        cfg = run_config(size, cell, arm, seed, warm, value_target)
        return dataclasses.replace(cfg, iterations=CALIBRATION_ITERATIONS, eval_interval=0, save_trajectories_every=0,
                                   **changes)

    ref = short("mpo_token")
    rec = {"cell": cell, "seed": seed, "reference": "mpo_token", "policy_lr": ref.policy_lr,
           "iterations": CALIBRATION_ITERATIONS, "ladder": list(TOKEN_CLIP_LADDER), "kl_band": list(KL_BAND),
           "value_target": value_target, "reference_kl": _calibration_kl(ref, runs / "token_ppo"), "kls": {}}
    for c in TOKEN_CLIP_LADDER:
        cfg = short("mpo", loss_options={"token_clip": c})
        rec["kls"][str(c)] = _calibration_kl(cfg, runs / f"turn_ppo_c={c}")
        choice = choose_token_clip(rec["reference_kl"], {float(k): v for k, v in rec["kls"].items()})
        if choice["matched"]:
            break
    rec.update(choice)
    log(f"{cell} seed {seed}: token_ppo approx_kl {rec['reference_kl']:.2e}; turn_ppo "
        + ", ".join(f"c={k}: {v:.2e}" for k, v in rec["kls"].items())
        + f" -> token_clip {rec['token_clip']} (ratio {rec['kl_ratio']:.2f}, "
        + ("matched)" if rec["matched"] else "NOT matched)"))
    done.parent.mkdir(parents=True, exist_ok=True)
    _write(done, json.dumps(rec) + "\n")
    shutil.rmtree(runs, ignore_errors=True)  # the record is what is kept
    return rec


# --------------------------------------------------------------------------------------------- records


def _corr(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def credit_accuracy(path: Path) -> dict:
    """Correlation of the advantages a run trained on with the oracle's, per token and per turn."""
    import mpo_viz as mv
    from mpo_viz.analysis import turn_table

    b = mv.load(path)
    if not (b.has("advantages") and b.has("oracle_token_adv")):
        return {}
    m = b.mask.bool().numpy()
    out = {"credit_token_corr": _corr(b.padded("advantages").numpy()[m], b.padded("oracle_token_adv").numpy()[m])}
    t = turn_table(b, {"adv": b.padded("advantages")})
    try:
        ot = np.concatenate([np.asarray(json.loads(x)["oracle"]["turn_adv"], dtype=float) for x in b.field("extra_json")])
    except (KeyError, TypeError, ValueError):
        return out
    if len(ot) == len(t):
        ok = np.isfinite(ot)
        out["credit_turn_corr"] = _corr(t["adv_adv"].to_numpy()[ok], ot[ok])
    return out


def collapsed(recs: list[dict]) -> bool:
    """Rollout (sampled) success below :data:`COLLAPSE_LEVEL` at any RL iteration after the 4th."""
    return any(r.get("phase") == "rl" and r["iteration"] > COLLAPSE_AFTER and r.get("success", 1.0) < COLLAPSE_LEVEL
               for r in recs)


def _num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def critic_target(cfg) -> str | None:
    """What the values an arm's estimator reads are fitted to or come from: the learned critic's
    ``value_target`` (``mc`` / ``estimator``), ``policy_mc`` (critic="mc": the policy's own
    Monte-Carlo values, no critic), ``expert`` (the scripted expert's exact values), None (no critic)."""
    if not cfg.uses_critic:
        return None
    if cfg.critic == "learned":
        return cfg.critic_option("value_target")
    return {"mc": "policy_mc", "expert": "expert"}[cfg.critic]


def run_records(out: Path, archive: Path | None, cell: str, arm: str, seed: int, iterations: int):
    """``(folder, state, warmup.json path, credit by iteration or None)`` of one planned run: its
    run folder when that has metrics, else its archive folder (state ``done``), else None."""
    from mpo_viz.data.runfolder import read_metrics_file

    d = run_dir(out, cell, arm, seed)
    if read_metrics_file(d / "metrics.jsonl"):
        return d, run_state(d, iterations), warm_dir(out, cell, seed) / "warmup.json", None
    a = run_dir(archive, cell, arm, seed) if archive is not None else None
    if not archived(a):
        return None
    credit = {}
    if (a / "credit.jsonl").is_file():
        for line in (a / "credit.jsonl").read_text().splitlines():
            r = json.loads(line)
            credit[int(r.pop("iteration"))] = r
    return a, "done", a / "warmup.json", credit


def collect(size: str, out: Path, archive: Path | None = None) -> tuple[list[dict], list[dict]]:
    """``(rows, finals)``: one row per (cell, arm, seed, iteration 0..N) of every run folder (or,
    where the folder is gone, its archived records), and one row per finished run."""
    from mpo_viz.data.runfolder import read_metrics_file
    from mpo_viz.train import Config

    rows, finals = [], []
    iters = SIZES[size]["iterations"]
    for cell, seed, arm in plan(size):
        found = run_records(out, archive, cell, arm, seed, iters)
        if found is None:
            continue
        d, state, warm, credit = found
        recs = read_metrics_file(d / "metrics.jsonl")
        cfg = Config.load(d / "config.json")
        coll = collapsed(recs)
        wrec = json.loads(warm.read_text()) if warm.is_file() and uses_warmup(arm) else {}
        by_it: dict[int, dict] = {}
        for r in recs:
            if r.get("phase") in ("rl", "eval"):
                by_it.setdefault(int(r["iteration"]), {}).update(r)
        for it in sorted(by_it):
            r = by_it[it]
            row = {"cell": cell, "method": arm, "seed": seed, "iteration": it,
                   "sampled_success": _num(r.get("eval_sampled_success")), "greedy_success": _num(r.get("eval_success")),
                   "n_eval_tasks": r.get("n_eval_tasks"), "eval_seed": r.get("eval_seed", cfg.eval_key),
                   "rollout_success": _num(r.get("success")),
                   "critic_explained_var": _num(r.get("critic_explained_var")),
                   "values_across_within_ratio": _num(r.get("values_across_within_ratio")),
                   "oracle_across_within_ratio": _num(r.get("oracle_across_within_ratio")),
                   "approx_kl": _num(r.get("approx_kl")), "ratio_max": _num(r.get("ratio_max")),
                   "turn_ratio_max": _num(r.get("turn_ratio_max")), "clipfrac": _num(r.get("clipfrac")),
                   "entropy": _num(r.get("entropy")), "collapsed": coll, "run_state": state,
                   "value_target": cfg.critic_option("value_target") if cfg.learns_critic else None,
                   "critic_target": critic_target(cfg), "config_hash": cfg.hash()}
            if it == 0 and wrec:  # before RL: the warm-up's held-out fit
                row["critic_explained_var"] = _num(wrec.get("warmup_explained_var"))
                row["values_across_within_ratio"] = _num(wrec.get("warmup_values_across_within_ratio"))
            traj = d / "trajectories" / f"iter={it:06d}.parquet"
            if credit is not None:
                row.update(credit.get(it, {}))
            elif traj.is_file():
                row.update({k: _num(v) for k, v in credit_accuracy(traj).items()})
            rows.append(row)
        pk_path = d / "pass_at_k.json"
        if state == "done":
            ev = [by_it[i] for i in sorted(by_it) if "eval_sampled_success" in by_it[i]]
            finals.append({"cell": cell, "method": arm, "seed": seed, "start_sampled": ev[0]["eval_sampled_success"],
                           "start_greedy": ev[0]["eval_success"], "final_sampled": ev[-1]["eval_sampled_success"],
                           "final_greedy": ev[-1]["eval_success"], "collapsed": coll,
                           "warmup_explained_var": _num(wrec.get("warmup_explained_var")),
                           "warmup_stop": wrec.get("warmup_stop"),
                           "value_target": cfg.critic_option("value_target") if cfg.learns_critic else None,
                           "critic_target": critic_target(cfg),
                           "approx_kl": _num(float(np.nanmean([_num(r.get("approx_kl")) for r in recs
                                                                if r.get("phase") == "rl"] or [math.nan]))),
                           **json.loads(pk_path.read_text())})
    return rows, finals


# --------------------------------------------------------------------------------------------- statistics


def paired_test(diff) -> dict:
    """Mean of the paired differences, its 95% t-interval and the two-sided paired t-test p-value
    (NaN with fewer than 2 pairs; p = 1 when every difference is 0)."""
    d = np.asarray(diff, float)
    n = len(d)
    if n < 2:
        m = float(d.mean()) if n else math.nan
        return {"mean_diff": m, "ci_low": math.nan, "ci_high": math.nan, "p_value": math.nan}
    m, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))
    if se == 0:
        return {"mean_diff": m, "ci_low": m, "ci_high": m, "p_value": 1.0 if m == 0 else 0.0}
    t = m / se
    q = float(sps.t.ppf(0.975, n - 1))
    return {"mean_diff": m, "ci_low": m - q * se, "ci_high": m + q * se,
            "p_value": float(2 * sps.t.sf(abs(t), n - 1))}


def holm(p_values) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and is not counted)."""
    p = np.asarray(p_values, float)
    ok = np.flatnonzero(np.isfinite(p))
    out = np.full(len(p), math.nan)
    m = len(ok)
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def compare(size: str, finals: list[dict]) -> list[dict]:
    """The pre-registered comparisons of final held-out sampled success, paired by seed, per cell."""
    f = {(r["cell"], r["method"], r["seed"]): r for r in finals}
    out = []
    for cell in SIZES[size]["cells"]:
        rows = []
        for label, a, b in comparisons_of(size):
            seeds = [s for s in SIZES[size]["seeds"] if (cell, a, s) in f and (cell, b, s) in f]
            diff = [f[(cell, a, s)]["final_sampled"] - f[(cell, b, s)]["final_sampled"] for s in seeds]
            rows.append({"cell": cell, "comparison": label, "a": a, "b": b, "paired_seeds": len(seeds),
                         "diffs": diff, **paired_test(diff)})
        for r, ph in zip(rows, holm([r["p_value"] for r in rows])):
            r["p_holm"] = ph
            r["comparisons"] = len(comparisons_of(size))
            if r["paired_seeds"] == 0:
                r["verdict"] = "not run"
            elif math.isfinite(ph) and ph < 0.05:
                r["verdict"] = f"{r['a'] if r['mean_diff'] > 0 else r['b']} higher (Holm p < 0.05)"
            else:
                r["verdict"] = "no difference shown (Holm p >= 0.05)"
        out += rows
    return out


def summarize(size: str, finals: list[dict]) -> list[dict]:
    """Per cell and arm: mean and 95% t-interval of the final sampled success over seeds, the start,
    the change, greedy, pass@1 and pass@8, collapses."""
    out = []
    for cell in SIZES[size]["cells"]:
        for arm in SIZES[size]["arms"]:
            rs = [r for r in finals if r["cell"] == cell and r["method"] == arm]
            if not rs:
                continue

            def ms(key, rs=rs):
                v = np.array([r[key] for r in rs if r.get(key) is not None], float)
                if len(v) == 0:
                    return math.nan, math.nan
                half = float(sps.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
                return float(v.mean()), half

            k = SIZES[size]["pass_samples"]
            fs, fh = ms("final_sampled")
            ch, chh = ms_change(rs)
            out.append({"cell": cell, "method": arm, "seeds": len(rs), "start_sampled": ms("start_sampled")[0],
                        "final_sampled": fs, "final_sampled_ci": fh, "change": ch, "change_ci": chh,
                        "final_greedy": ms("final_greedy")[0], "start_greedy": ms("start_greedy")[0],
                        "pass@1": ms("pass@1")[0], f"pass@{k}": ms(f"pass@{k}")[0],
                        "collapsed": sum(bool(r["collapsed"]) for r in rs),
                        "warmup_explained_var": ms("warmup_explained_var")[0]})
    return out


def ms_change(rs: list[dict]) -> tuple[float, float]:
    """Mean change of sampled success (final − start) and the half-width of its 95% t-interval."""
    t = paired_test([r["final_sampled"] - r["start_sampled"] for r in rs])
    return t["mean_diff"], (t["ci_high"] - t["mean_diff"]) if math.isfinite(t["ci_high"]) else math.nan


# --------------------------------------------------------------------------------------------- presentation


def _fmt(x, nd=3) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{nd}f}"


def tables(size: str, summary: list[dict], comps: list[dict], n_done: int, n_planned: int) -> str:
    k = SIZES[size]["pass_samples"]
    lines = [f"Grid `{size}`: {n_done} of {n_planned} runs finished.", "",
             f"| cell | arm | seeds | sampled success: start → final (95% CI) | change (95% CI) | greedy start → final "
             f"| pass@1 | pass@{k} | collapsed | warm-up EV |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(
            f"| {s['cell']} | {s['method']} | {s['seeds']} | {_fmt(s['start_sampled'])} → {_fmt(s['final_sampled'])} "
            f"(± {_fmt(s['final_sampled_ci'])}) | {s['change']:+.3f} (± {_fmt(s['change_ci'])}) | "
            f"{_fmt(s['start_greedy'])} → {_fmt(s['final_greedy'])} | {_fmt(s['pass@1'])} | {_fmt(s[f'pass@{k}'])} | "
            f"{s['collapsed']} of {s['seeds']} | {_fmt(s['warmup_explained_var'], 2)} |")
    lines += ["", "| cell | comparison (a vs b) | paired seeds | mean difference of final sampled success (95% CI) "
              f"| p | p (Holm, {len(comparisons_of(size))}) | verdict |", "|---|---|---|---|---|---|---|"]
    for c in comps:
        lines.append(f"| {c['cell']} | {c['comparison']} | {c['paired_seeds']} | {_fmt(c['mean_diff'])} "
                     f"({_fmt(c['ci_low'])} to {_fmt(c['ci_high'])}) | {_fmt(c['p_value'])} | {_fmt(c['p_holm'])} "
                     f"| {c['verdict']} |")
    return "\n".join(lines) + "\n"


COLOURS = {"grpo": "#2ca02c", "ppo": "#1f77b4", "turn_gae": "#9467bd", "mpo_token": "#ff7f0e", "mpo": "#d62728",
           "mpo_bare": "#7f7f7f", "mpo_oracle": "#8c564b", "turn_gae_mc": "#17becf", "turn_gae_mc0": "#aec7e8", "mpo_mc": "#e377c2",
           "mpo_baseline": "#bcbd22", "mpo_matched": "#8c2d04", "sao": "#393b79"}


def figures(size: str, rows: list[dict], fig_dir: Path) -> list[Path]:
    """One PNG per cell: held-out sampled success and rollout success against iteration, and the
    critic's explained variance against iteration — mean over seeds with a 95% t-band per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    panels = [("sampled_success", "held-out sampled success (128 tasks)"),
              ("rollout_success", "rollout success (32 episodes)"),
              ("critic_explained_var", "explained variance of the values")]
    for cell in SIZES[size]["cells"]:
        cell_rows = [r for r in rows if r["cell"] == cell]
        if not cell_rows:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
        for ax, (key, label) in zip(axes, panels):
            for arm in SIZES[size]["arms"]:
                pts = {}
                for r in cell_rows:
                    if r["method"] == arm and r.get(key) is not None:
                        pts.setdefault(r["iteration"], []).append(r[key])
                if not pts:
                    continue
                its = sorted(pts)
                mean = np.array([np.mean(pts[i]) for i in its])
                half = np.array([paired_half(pts[i]) for i in its])
                n = max(len(v) for v in pts.values())
                ax.plot(its, mean, marker="o", ms=2.5, color=COLOURS[arm], label=f"{arm} ({n})")
                ok = np.isfinite(half)
                ax.fill_between(np.array(its)[ok], (mean - half)[ok], (mean + half)[ok], color=COLOURS[arm],
                                alpha=0.12, linewidth=0)
            ax.set_xlabel("iteration")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].set_ylim(0, 1)
        axes[1].set_ylim(0, 1)
        axes[0].legend(fontsize=7, title="arm (seeds)", title_fontsize=7)
        fig.suptitle(f"{cell} — grid {size}: mean over seeds, 95% t-band", fontsize=10)
        fig.tight_layout()
        p = fig_dir / f"learning_{size}_{cell}.png"
        tmp = p.with_name(f".{p.stem}.{os.getpid()}.png")
        fig.savefig(tmp, dpi=80)
        tmp.replace(p)
        plt.close(fig)
        paths.append(p)
    return paths


def paired_half(values) -> float:
    """Half-width of the 95% t-interval of a mean (NaN below 2 values)."""
    v = np.asarray(values, float)
    if len(v) < 2:
        return math.nan
    return float(sps.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def _write(path: Path, text: str) -> None:
    """Write under a temporary name, then rename: two grid processes may report at once."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def report(size: str, out: Path, archive: Path | None = None) -> str:
    rows, finals = collect(size, out, archive)
    comps = compare(size, finals)
    summary = summarize(size, finals)
    for name, data in (("results.jsonl", rows), ("final.jsonl", finals), ("comparisons.jsonl", comps),
                       ("summary.jsonl", summary)):
        _write(out / name, "".join(json.dumps(r) + "\n" for r in data))
    runs = plan(size)
    n_done = len(finals)
    text = tables(size, summary, comps, n_done, len(runs))
    _write(out / "tables.md", text)
    figures(size, rows, out / "figures")
    return text


def calibration_table(recs: list[dict]) -> str:
    """One line per (cell, seed): token_ppo's per-update KL, turn_ppo's at each band tried, the choice."""
    lines = ["| cell | seed | token_ppo approx_kl | turn_ppo approx_kl by token_clip | chosen | ratio | matched |",
             "|---|---|---|---|---|---|---|"]
    for r in recs:
        tried = ", ".join(f"{k}: {v:.2e}" for k, v in r["kls"].items())
        lines.append(f"| {r['cell']} | {r['seed']} | {r['reference_kl']:.2e} | {tried} | {r['token_clip']} | "
                     f"{r['kl_ratio']:.2f} | {'yes' if r['matched'] else 'no'} |")
    return "\n".join(lines)


def status(size: str, out: Path, archive: Path | None = None) -> str:
    def state(c, a, s):
        if archive is not None and archived(run_dir(archive, c, a, s)):
            return "done (archived)"
        return run_state(run_dir(out, c, a, s), SIZES[size]["iterations"])

    return "\n".join(f"{c:16s} {a:10s} seed {s}: {state(c, a, s)}" for c, s, a in plan(size))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=list(SIZES), default="v2")
    ap.add_argument("--out", type=Path, default=None, help="results and run folders (default runs/learning-SIZE)")
    ap.add_argument("--report-only", action="store_true", help="records, tables and figures from the run folders")
    ap.add_argument("--status", action="store_true", help="list each run as done, partial or missing")
    ap.add_argument("--export", type=Path, default=None, help="copy the records, tables and figures into this folder")
    ap.add_argument("--archive", type=Path, default=None,
                    help="keep each finished run's records here (no models) and skip the runs found here: a grid "
                         "that spans machines whose run folders do not survive (refused when ARCHIVE/grid.json "
                         "names another start, budget, arm spec or value target)")
    ap.add_argument("--cells", nargs="+", default=None, metavar="CELL", help="run only these cells")
    ap.add_argument("--seeds", nargs="+", type=int, default=None, metavar="SEED",
                    help="run only these seeds (e.g. even seeds in one process, odd in another)")
    ap.add_argument("--arms", nargs="+", default=None, metavar="ARM",
                    help="run only these arms (the report still reads every arm found)")
    ap.add_argument("--calibrate-step", action="store_true",
                    help="only apply the matched-step rule (turn_ppo's token band) to the planned cells and seeds, "
                         "writing OUT/calibration.jsonl")
    ap.add_argument("--measure-start", action="store_true",
                    help="only measure the size's start on each planned seed's held-out tasks (greedy and sampled "
                         "success, as before RL), writing OUT/start.jsonl")
    ap.add_argument("--value-target", choices=("mc", "estimator"), default=VALUE_TARGET,
                    help="what every learned critic trains on during RL: Monte-Carlo returns (default) or each "
                         "estimator's own returns (the v2 grid as recorded)")
    args = ap.parse_args(argv)
    bad = [c for c in args.cells or () if c not in SIZES[args.size]["cells"]]
    if bad:
        ap.error(f"--cells: {bad} not in the {args.size} grid's cells {list(SIZES[args.size]['cells'])}")
    bad = [a for a in args.arms or () if a not in SIZES[args.size]["arms"]]
    if bad:
        ap.error(f"--arms: {bad} not in the {args.size} grid's arms {list(SIZES[args.size]['arms'])}")
    out = args.out or REPO / "runs" / f"learning-{args.size}"
    out.mkdir(parents=True, exist_ok=True)
    if args.archive is not None:
        restore_calibration(args.archive, out)
    if args.status:
        print(status(args.size, out, args.archive))
        return 0
    pairs = dict.fromkeys((c, s) for c, s, _ in plan(args.size, args.cells, args.seeds))  # (cell, seed), in order
    if args.measure_start:
        recs = [measure_start(args.size, c, s, out) for c, s in pairs]
        _write(out / "start.jsonl", "".join(json.dumps(r) + "\n" for r in recs))
        print(start_table(recs))
        return 0
    if args.calibrate_step:
        recs = [calibrate_step(args.size, c, s, out, args.value_target) for c, s in pairs]
        _write(out / "calibration.jsonl", "".join(json.dumps(r) + "\n" for r in recs))
        print(calibration_table(recs))
        return 0
    if not args.report_only:
        runs = plan(args.size, args.cells, args.seeds, args.arms)
        meta = grid_meta(args.size, args.value_target)
        if args.archive is not None:
            try:
                claim_archive(args.archive, meta)
            except ValueError as e:
                ap.error(str(e))
        (out / "grid.json").write_text(json.dumps(meta, indent=1) + "\n")
        t0 = time.perf_counter()
        log(f"grid {args.size}: {len(runs)} runs into {out}")
        try:
            for i, (cell, seed, arm) in enumerate(runs):
                run_one(args.size, cell, arm, seed, out, args.value_target, args.archive)
                if (i + 1) % len(SIZES[args.size]["arms"]) == 0:
                    report(args.size, out, args.archive)  # results as they come
        except KeyboardInterrupt:
            log("interrupted: the finished runs stay, a partial one resumes from its last checkpoint")
            print(report(args.size, out, args.archive))
            return 130
        log(f"grid {args.size}: {len(runs)} runs done in {time.perf_counter() - t0:.0f} s")
    print(report(args.size, out, args.archive))
    if args.export:
        args.export.mkdir(parents=True, exist_ok=True)
        for name in ("results.jsonl", "final.jsonl", "comparisons.jsonl", "summary.jsonl", "tables.md", "grid.json"):
            if (out / name).is_file():
                shutil.copy(out / name, args.export / name)
        for p in (out / "figures").glob("*.png"):
            shutil.copy(p, args.export / p.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
