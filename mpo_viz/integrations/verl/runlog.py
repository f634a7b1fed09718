"""Live run-folder logging from inside verl: each training step's batch appended to an mpo_viz run
folder that ``TrainingDashboard`` and ``TrajectoryExplorer`` open while the run goes on.

Switched on by ``algorithm.mpo_viz.run_dir`` or ``MPO_VIZ_RUN_DIR`` (settings: :data:`.options.LOG_KEYS`).
Per logged step ``N`` (``data.meta_info["global_steps"]`` when verl sets it, else the next number
after the folder's last logged iteration, so a resumed run appends):

* ``trajectories/iter=00000N.parquet`` — ``mpo_viz.trajectory/v1`` rows converted by the verl
  adapter (:func:`mpo_viz.adapters.verl.from_verl`: tokens, ``loss_mask``, token rewards with
  observation rewards moved onto action tokens, ``values``, ``old_logprobs``, rollout / reference
  log-probs when present, the trained ``advantages`` and ``returns`` as verl holds them, ``step``;
  rows the adapter refuses are counted in ``log/rows_rejected``). At most
  ``max_rows`` rows (whole uid groups, seeded by ``seed`` and the step); none once ``trajectories/``
  holds ``max_mb`` MB. Needs ``prompts``/``responses``/``attention_mask`` in the batch (the v1
  trainer's advantage step fetches only a few fields: then only metrics are written, and
  ``log/trajectories_skipped`` says why).
* one line of ``metrics.jsonl``: ``iteration``, ``phase`` ("train"), ``time_s``, ``estimator``,
  ``reward/mean``/``std``, ``values/across``/``within``/``median_ratio``/``share_across_gt_within``
  (the across/within split of the critic values over turns), and per estimator ``E`` of ``compare``
  (default mpo, gae, grpo — computed side by side on this batch with mpo_viz's code: mpo with the
  run's ``algorithm.mpo.*`` options, gae with verl's ``algorithm.gamma``/``lam`` unwhitened, grpo
  with ``algorithm.norm_adv_by_std_in_grpo``) and for ``trained`` (the advantages verl will train on):
  ``adv/E/mean``, ``std``, ``abs_mean``, ``across``, ``within`` and ``corr_trained`` (Pearson
  correlation with the trained advantages over action tokens); ``timings/mpo_viz_log_s``.
* ``config.json`` once: the estimator, its options, the logging settings and verl's algorithm config.

Writes are atomic (Parquet and config to a temporary name, then renamed; one ``write`` per metrics
line), so readers never see half a file. Logging errors are raised: a misconfigured run stops at
the first step rather than training without the log it asked for.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from mpo_viz.advantages import registry as adv_registry
from mpo_viz.analysis import variance_split, variance_summary
from mpo_viz.integrations.verl.batch import Inputs, read_inputs
from mpo_viz.integrations.verl.options import ESTIMATORS, estimator_options, log_settings, plain

__all__ = ["RunLogger", "maybe_log", "logger_for"]

_LOGGERS: dict[str, RunLogger] = {}
_COMPARABLE_NEEDS = {"values", "groups", "turns"}


def maybe_log(data, estimator: str, config) -> dict | None:
    """Log the step when a run folder is configured; returns the metrics record (None when off)."""
    settings = log_settings(config)
    if not settings["run_dir"]:
        return None
    return logger_for(settings).log(data, estimator, config)


def logger_for(settings: dict) -> RunLogger:
    """The process-wide logger of ``settings['run_dir']`` (one per folder, so step numbers persist)."""
    key = os.path.abspath(settings["run_dir"])
    lg = _LOGGERS.get(key)
    if lg is None or lg.settings != settings:
        lg = _LOGGERS[key] = RunLogger(settings)
    return lg


def _finite(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _last_iteration(path: Path) -> int | None:
    if not path.exists():
        return None
    last = None
    with open(path, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break
            try:
                it = json.loads(line).get("iteration")
            except (json.JSONDecodeError, AttributeError):
                continue
            if isinstance(it, int):
                last = it if last is None else max(last, it)
    return last


def _verl_settings(config, name: str) -> dict:
    """verl's own settings of the estimators it shares with us: ``gae`` with ``algorithm.gamma``/
    ``lam`` (unwhitened: whitening would set every std to 1), ``grpo`` with
    ``algorithm.norm_adv_by_std_in_grpo``. Others run with mpo_viz's defaults."""
    keys = {"gae": {"gamma": "gamma", "lam": "lam"}, "grpo": {"norm_by_std": "norm_adv_by_std_in_grpo"}}
    out = {}
    for ours, theirs in keys.get(name, {}).items():
        v = None if config is None else config.get(theirs, None)
        if v is not None:
            out[ours] = bool(v) if ours == "norm_by_std" else float(v)
    return out


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunLogger:
    """Appends verl steps to one run folder (see the module docstring)."""

    def __init__(self, settings: dict):
        self.settings = dict(settings)
        self.run_dir = Path(settings["run_dir"])
        (self.run_dir / "trajectories").mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        last = _last_iteration(self.metrics_path)
        self.next_step = 0 if last is None else last + 1
        self.calls = 0
        self.t0 = time.perf_counter()
        bad = [e for e in settings["compare"] if not set(adv_registry.get_estimator(e).needs) <= _COMPARABLE_NEEDS]
        if bad:
            raise ValueError(
                f"algorithm.mpo_viz.compare: estimator {bad[0]!r} needs "
                f"{', '.join(adv_registry.get_estimator(bad[0]).needs)}, which a verl batch does not carry; "
                f"expected estimators needing only {', '.join(sorted(_COMPARABLE_NEEDS))}"
            )

    # ------------------------------------------------------------------------------------------
    def log(self, data, estimator: str, config) -> dict | None:
        """Log one step (every ``every``-th call); returns the metrics record or None if skipped."""
        call = self.calls
        self.calls += 1
        step = data.meta_info.get("global_steps") if data.meta_info else None
        step = int(step) if isinstance(step, (int, np.integer)) else self.next_step
        self.next_step = max(self.next_step, step + 1)
        if call % self.settings["every"]:
            return None
        t = time.perf_counter()
        inp = read_inputs(data)
        rec = {"iteration": step, "phase": "train", "time_s": round(t - self.t0, 3), "estimator": estimator}
        rec.update(self._stats(data, inp, config))
        rec.update(self._trajectories(data, inp, step))
        rec["log/moved_to_action"] = inp.moved
        rec["log/dropped"] = inp.dropped
        rec["timings/mpo_viz_log_s"] = round(time.perf_counter() - t, 4)
        if not (self.run_dir / "config.json").exists():
            self._write_config(estimator, config)
        line = json.dumps({k: (_finite(v) if isinstance(v, (float, np.floating)) else v) for k, v in rec.items()})
        with open(self.metrics_path, "a") as fh:
            fh.write(line + "\n")
        return rec

    # ------------------------------------------------------------------------------------------
    def _stats(self, data, inp: Inputs, config) -> dict:
        m = inp.mask.detach().cpu().double().numpy()
        r = inp.rewards.detach().cpu().double().numpy()
        score = (r * m).sum(axis=1)
        act = m != 0
        out = {
            "n_traj": int(m.shape[0]),
            "tokens/action_mean": float(act.sum(1).mean()) if act.size else 0.0,
            "reward/mean": float(score.mean()) if score.size else math.nan,
            "reward/std": float(score.std()) if score.size else math.nan,
        }
        if inp.values is not None:
            split = variance_split(inp.values.detach().cpu().double().numpy(), m)
            out["turns/mean"] = float(split["n_turns"].mean()) if m.shape[0] else 0.0
            summ = variance_summary(pd.DataFrame(split))
            for k in ("across", "within", "across_w", "within_w"):
                out[f"values/{k}"] = summ[f"mean_{k}"]
            out["values/median_ratio"] = summ["median_ratio"]
            out["values/share_across_gt_within"] = summ["share_across_gt_within"]
        trained = (
            data.batch["advantages"].detach().cpu().double().numpy() if "advantages" in data.batch.keys() else None
        )
        advs = {}
        for name in self.settings["compare"]:
            adv = self._side_by_side(name, inp, config)
            if adv is not None:
                advs[name] = adv
        if trained is not None:
            advs["trained"] = trained
        for name, a in advs.items():
            out.update(self._adv_stats(name, a, m, trained))
        return out

    def _side_by_side(self, name: str, inp: Inputs, config):
        est = adv_registry.get_estimator(name)
        if "values" in est.needs and inp.values is None:
            return None
        if "groups" in est.needs and inp.uid is None:
            return None
        opts = estimator_options(config, name) if name in ESTIMATORS else _verl_settings(config, name)
        r, m = inp.rewards.detach().cpu(), inp.mask.detach().cpu()
        args: tuple
        if "values" in est.needs:
            assert inp.values is not None  # checked above
            args = (r, inp.values.detach().cpu().to(r.dtype), m)
        elif "groups" in est.needs:
            assert inp.uid is not None  # checked above
            args = (r, m, [str(u) for u in inp.uid])
        else:
            args = (r, m)
        adv, _ = est.fn(*args, **opts)
        return adv.double().numpy()

    @staticmethod
    def _adv_stats(name: str, a: np.ndarray, m: np.ndarray, trained) -> dict:
        act = m != 0
        x = a[act]
        split = variance_summary(pd.DataFrame(variance_split(a, m)))
        out = {
            f"adv/{name}/mean": float(x.mean()) if x.size else math.nan,
            f"adv/{name}/std": float(x.std()) if x.size else math.nan,
            f"adv/{name}/abs_mean": float(np.abs(x).mean()) if x.size else math.nan,
            f"adv/{name}/across": split["mean_across"],
            f"adv/{name}/within": split["mean_within"],
        }
        if trained is not None and name != "trained":
            y = trained[act]
            ok = x.size > 1 and x.std() > 0 and y.std() > 0
            out[f"adv/{name}/corr_trained"] = float(np.corrcoef(x, y)[0, 1]) if ok else math.nan
        return out

    # ------------------------------------------------------------------------------------------
    def _trajectories(self, data, inp: Inputs, step: int) -> dict:
        from mpo_viz.adapters.verl import from_verl
        from mpo_viz.data.io import save

        missing = [k for k in ("prompts", "responses", "attention_mask") if k not in data.batch.keys()]
        if missing:
            return {"log/trajectories_skipped": f"batch lacks {', '.join(missing)}", "log/rows_saved": 0}
        cap = self.settings["max_mb"]
        if cap and self._traj_mb() >= cap:
            return {"log/trajectories_skipped": f"max_mb={cap:g} reached", "log/rows_saved": 0}
        rows = self._subsample(inp, step)
        idx = torch.as_tensor(rows, dtype=torch.long)
        flat = {k: v[idx] for k, v in data.batch.items()}
        flat.update({k: np.asarray(v)[rows] for k, v in (data.non_tensor_batch or {}).items()})
        flat["meta_info"] = {"global_steps": step}
        batch, report = from_verl(flat, errors="collect", source=f"verl step {step}")
        path = self.run_dir / "trajectories" / f"iter={step:06d}.parquet"
        if len(batch):
            save(batch, path)
        return {
            "log/rows_saved": len(batch),
            "log/rows_rejected": len(report.rejected),
            "log/trajectory_file": path.name if len(batch) else None,
        }

    def _traj_mb(self) -> float:
        d = self.run_dir / "trajectories"
        return sum(p.stat().st_size for p in d.iterdir() if p.is_file()) / 2**20

    def _subsample(self, inp: Inputs, step: int) -> list[int]:
        """Row indices to save: all, or whole uid groups in a seeded random order up to ``max_rows``."""
        B = int(inp.mask.shape[0])
        k = self.settings["max_rows"]
        if not k or B <= k:
            return list(range(B))
        groups: dict = {}
        for i, u in enumerate(inp.uid if inp.uid is not None else range(B)):
            groups.setdefault(u, []).append(i)
        order = list(groups.values())
        rng = np.random.default_rng([self.settings["seed"], step])
        chosen: list[int] = []
        for j in rng.permutation(len(order)):
            g = order[j]
            if chosen and len(chosen) + len(g) > k:
                continue
            chosen.extend(g[: k - len(chosen)])
            if len(chosen) >= k:
                break
        return sorted(chosen)

    def _write_config(self, estimator: str, config) -> None:
        algo = {}
        if config is not None:
            try:
                algo = plain(config)
            except Exception as exc:  # a config that does not convert: record why
                algo = {"unreadable": repr(exc)}
        opts = estimator_options(config, estimator) if estimator in ESTIMATORS else {}
        doc = {
            "framework": "verl",
            "estimator": estimator,
            "estimator_options": {
                **(adv_registry.get_estimator(ESTIMATORS[estimator]).options if estimator in ESTIMATORS else {}),
                **opts,
            },
            "mpo_viz_log": self.settings,
            "algorithm": algo,
        }
        _atomic_write(self.run_dir / "config.json", json.dumps(doc, indent=1, default=str))
