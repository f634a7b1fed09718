"""Running a grid: each run's trainer config, the shared critic warm-up per seed, the matched-step
calibration, runs resumed from their checkpoints, and the archive of finished runs' records.

Invariant: a run folder or archive entry belongs to exactly one grid (``claim_archive``); a finished
run is never run again, a partial one resumes from its last checkpoint.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import mpo_viz as mv
from experiments.grids import (
    ARMS,
    CALIBRATION_ITERATIONS,
    CELLS,
    GROUP_SIZE,
    KL_BAND,
    MC_SAMPLES,
    ORACLE_NOISE,
    SIZES,
    TOKEN_CLIP_LADDER,
    VALUE_TARGET,
    env_of,
    start_of,
    uses_warmup,
)
from experiments.stats import (
    corr,
    finite_or_none,
)
from mpo_viz import models
from mpo_viz.analysis import turn_table
from mpo_viz.data.runfolder import read_metrics
from mpo_viz.train import Config, Trainer


def base_config(size: str, cell: str, seed: int, **changes):

    s = SIZES[size]
    kw = dict(
        env=env_of(cell),
        difficulty=list(CELLS[cell]),
        model_dir=str(start_of(size)),
        sft_steps=0,
        seed=seed,
        episodes=s["episodes"],
        group_size=GROUP_SIZE,
        iterations=s["iterations"],
        epochs=s["epochs"],
        minibatches=s["minibatches"],
        eval_episodes=s["eval_episodes"],
        eval_interval=s["eval_interval"],
        save_trajectories_every=s["eval_interval"],
        keep_checkpoints=1,
        oracle_noise=ORACLE_NOISE,
        max_turn_tokens=s["max_turn_tokens"],
        num_threads=1,
    )
    kw.update(changes)
    return Config(**kw)


def warmup_config(size: str, cell: str, seed: int):
    """The warm-up's trainer config (gae at λ = 1: its returns are the Monte-Carlo ones)."""
    s = SIZES[size]
    return base_config(
        size,
        cell,
        seed,
        estimator="gae",
        loss="token_ppo",
        iterations=0,
        critic_warmup_episodes=s["warmup_episodes"],
        critic_warmup_steps=s["warmup_steps"],
    )


def run_config(size: str, cell: str, arm: str, seed: int, warm: Path, value_target: str = VALUE_TARGET):
    """An arm's config: learned-critic arms start from the seed's warm-up folder (policy = the start,
    critic = the fitted one), skip the warm-up and train on ``value_target``; the others start from
    the start itself."""
    a = ARMS[arm]
    kw = dict(
        estimator=a.estimator,
        loss=a.loss,
        loss_options=dict(a.loss_options),
        critic=a.critic,
        estimator_options=dict(a.estimator_options),
    )
    if a.critic == "mc":
        kw["mc_samples"] = MC_SAMPLES
    if a.matched_band:  # the seed's matched-step record (made once, calibrate_step)
        out = warm.parents[3]  # warm = OUT/warmups/CELL/seed=S/model
        kw["loss_options"] = {
            **kw["loss_options"],
            "token_clip": calibrate_step(size, cell, seed, out, value_target)["token_clip"],
        }
    if uses_warmup(arm):
        kw.update(
            model_dir=str(warm),
            critic_warmup_steps=0,
            critic_epochs=SIZES[size]["critic_epochs"],
            value_target=value_target,
        )
    return base_config(size, cell, seed, **kw)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def warm_dir(out: Path, cell: str, seed: int) -> Path:
    return out / "warmups" / cell / f"seed={seed}"


def warmup_done(d: Path) -> bool:
    return (d / "model" / "critic").is_dir() and (d / "warmup.json").is_file()


#: seconds between two looks at a warm-up another process is making
WARMUP_POLL_S = 10.0


def _lock_of(d: Path) -> Path:
    """The lock file beside warm-up folder ``d`` (:func:`claim_warmup`)."""
    return d.parent / f"{d.name}.lock"


@contextmanager
def claim_warmup(d: Path, poll: float = WARMUP_POLL_S) -> Iterator[bool]:
    """Hold the warm-up folder ``d`` for this process while the block runs: an exclusive
    ``flock`` on ``d.lock`` (which keeps the holder's pid, for the waiting message). Yields True when
    this process must make the warm-up, False when it is made (already, or by the process this one
    waited for). Two grid processes that share a seed (arms split between them) must not make it
    twice: the second would delete the first's folder half-way and both would write into it. The
    kernel releases the lock of a process that dies, so a killed run's warm-up is redone by the next
    process that needs it; a process that waits says so once."""
    lock = _lock_of(d)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as f:
        said = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:
                    f.seek(0)
                    holder = f.read().strip() or "?"
                    log(f"waiting for the warm-up that process {holder} is making in {d}")
                    said = True
                time.sleep(poll)
        try:
            f.seek(0)
            f.truncate()
            f.write(str(os.getpid()))
            f.flush()
            yield not warmup_done(d)  # looked at under the lock: a warm-up finished meanwhile is not redone
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def make_warmup(size: str, cell: str, seed: int, out: Path) -> Path:
    """The seed's critic warm-up, made once: ``warm_dir/model`` (policy/ = the start, critic/ =
    fitted) and ``warm_dir/warmup.json`` (the warm-up's metrics line). One process makes it at a
    time (:func:`claim_warmup`); another that needs it waits for it."""

    d = warm_dir(out, cell, seed)
    with claim_warmup(d) as mine:
        return _make_warmup(size, cell, seed, d) if mine else d / "model"


def _make_warmup(size: str, cell: str, seed: int, d: Path) -> Path:
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
    log(
        f"{cell} warm-up seed {seed}: {rec['warmup_steps']} steps, held-out EV {rec['warmup_explained_var']:.3f} "
        f"(stopped by the {rec['warmup_stop']}; {rec['seconds']:.0f} s)"
    )
    return d / "model"


def run_dir(out: Path, cell: str, arm: str, seed: int) -> Path:
    return out / "runs" / cell / arm / f"seed={seed}"


def run_state(d: Path, iterations: int) -> str:
    """``done`` (final evaluation and pass@k written), ``partial`` or ``missing``."""

    if not (d / "checkpoints" / "latest").exists():
        return "missing"
    recs = read_metrics(d / "metrics.jsonl").records
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
        acc = {k: finite_or_none(v) for k, v in credit_accuracy(traj).items()}
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
        raise ValueError(
            f"--archive {archive}: its runs were made by another grid than --size {meta['size']} "
            f"({path}): " + "; ".join(bad) + ". Use another archive folder for this grid."
        )


def run_one(
    size: str, cell: str, arm: str, seed: int, out: Path, value_target: str = VALUE_TARGET, archive: Path | None = None
) -> None:

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
    log(
        f"{cell} {arm:10s} seed {seed}: held-out sampled {ev[0]['eval_sampled_success']:.3f} -> "
        f"{ev[-1]['eval_sampled_success']:.3f}, greedy {ev[0]['eval_success']:.3f} -> {ev[-1]['eval_success']:.3f}, "
        f"{top} {pk[top]:.3f} ({time.perf_counter() - t0:.0f} s, "
        f"config {cfg.hash()})"
    )
    if archive is not None:
        archive_run(out, archive, cell, arm, seed)


def measure_start(size: str, cell: str, seed: int, out: Path) -> dict:
    """The size's start on the seed's held-out tasks (the ``eval_episodes`` every arm of the seed is
    evaluated on before RL): greedy and sampled success, made once (``OUT/start/CELL/seed=S.json``)."""

    path = out / "start" / cell / f"seed={seed}.json"
    if path.is_file():
        return json.loads(path.read_text())
    cfg = base_config(size, cell, seed, estimator="grpo", iterations=0)
    d = out / "start" / cell / f".seed={seed}.run"
    if d.exists():
        shutil.rmtree(d)
    t0 = time.perf_counter()
    ev = Trainer(cfg, d, quiet=True).evaluate()
    rec = {
        "cell": cell,
        "seed": seed,
        "start": Path(cfg.model_dir).name,
        "eval_seed": ev["eval_seed"],
        "n_eval_tasks": ev["n_eval_tasks"],
        "greedy_success": ev["eval_success"],
        "sampled_success": ev["eval_sampled_success"],
        "seconds": time.perf_counter() - t0,
    }
    shutil.rmtree(d)
    path.write_text(json.dumps(rec) + "\n")
    log(
        f"{cell} start {rec['start']} seed {seed}: greedy {rec['greedy_success']:.3f}, sampled "
        f"{rec['sampled_success']:.3f} on {rec['n_eval_tasks']} tasks ({rec['seconds']:.0f} s)"
    )
    return rec


def choose_token_clip(reference_kl: float, kls: dict) -> dict:
    """The rule: the first band of :data:`TOKEN_CLIP_LADDER` (among those measured, ``kls``: band ->
    mean per-update approx_kl) whose KL ratio to ``reference_kl`` (token_ppo's) lies in
    :data:`KL_BAND`; when none does, the band whose ratio is closest to 1 in log (``matched`` False)."""
    if not reference_kl > 0 or not any(c in kls for c in TOKEN_CLIP_LADDER):
        raise ValueError(
            f"calibration: expected a positive reference KL and measured bands, found {reference_kl!r}, {kls!r}"
        )
    ratios = {c: kls[c] / reference_kl for c in TOKEN_CLIP_LADDER if c in kls}
    inside = [c for c, r in ratios.items() if KL_BAND[0] <= r <= KL_BAND[1]]
    if inside:
        return {"token_clip": inside[0], "kl_ratio": ratios[inside[0]], "matched": True}
    best = min(ratios, key=lambda c: abs(math.log(ratios[c])) if ratios[c] > 0 else math.inf)
    return {"token_clip": best, "kl_ratio": ratios[best], "matched": False}


def _calibration_kl(cfg, d: Path) -> float:
    """Mean per-update approx_kl of ``cfg`` over :data:`CALIBRATION_ITERATIONS` fresh iterations in ``d``."""

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
        return dataclasses.replace(
            cfg, iterations=CALIBRATION_ITERATIONS, eval_interval=0, save_trajectories_every=0, **changes
        )

    ref = short("mpo_token")
    rec = {
        "cell": cell,
        "seed": seed,
        "reference": "mpo_token",
        "policy_lr": ref.policy_lr,
        "iterations": CALIBRATION_ITERATIONS,
        "ladder": list(TOKEN_CLIP_LADDER),
        "kl_band": list(KL_BAND),
        "value_target": value_target,
        "reference_kl": _calibration_kl(ref, runs / "token_ppo"),
        "kls": {},
    }
    for c in TOKEN_CLIP_LADDER:
        cfg = short("mpo", loss_options={"token_clip": c})
        rec["kls"][str(c)] = _calibration_kl(cfg, runs / f"turn_ppo_c={c}")
        choice = choose_token_clip(rec["reference_kl"], {float(k): v for k, v in rec["kls"].items()})
        if choice["matched"]:
            break
    rec.update(choice)
    log(
        f"{cell} seed {seed}: token_ppo approx_kl {rec['reference_kl']:.2e}; turn_ppo "
        + ", ".join(f"c={k}: {v:.2e}" for k, v in rec["kls"].items())
        + f" -> token_clip {rec['token_clip']} (ratio {rec['kl_ratio']:.2f}, "
        + ("matched)" if rec["matched"] else "NOT matched)")
    )
    done.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(done, json.dumps(rec) + "\n")
    shutil.rmtree(runs, ignore_errors=True)  # the record is what is kept
    return rec


def credit_accuracy(path: Path) -> dict:
    """Correlation of the advantages a run trained on with the oracle's, per token and per turn."""

    b = mv.load(path)
    if not (b.has("advantages") and b.has("oracle_token_adv")):
        return {}
    m = b.mask.bool().numpy()
    out = {"credit_token_corr": corr(b.padded("advantages").numpy()[m], b.padded("oracle_token_adv").numpy()[m])}
    t = turn_table(b, {"adv": b.padded("advantages")})
    try:
        ot = np.concatenate(
            [np.asarray(json.loads(x)["oracle"]["turn_adv"], dtype=float) for x in b.field("extra_json")]
        )
    except (KeyError, TypeError, ValueError):
        return out
    if len(ot) == len(t):
        ok = np.isfinite(ot)
        out["credit_turn_corr"] = corr(t["adv_adv"].to_numpy()[ok], ot[ok])
    return out


def write_atomic(path: Path, text: str) -> None:
    """Write under a temporary name, then rename: two grid processes may report at once."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
