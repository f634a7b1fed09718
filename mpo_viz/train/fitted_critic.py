"""Values for logged trajectories that carry none: ``fit_critic`` fits a small critic to a batch's
own returns and writes its values into the batch (``mpo-viz fit-critic``; the values the report,
the views and every critic-based estimator then read).

Why here, beside :mod:`mpo_viz.train.critic_fit`: the fit is that module's loop
(:func:`~mpo_viz.train.critic_fit.fit_values`), run on logs instead of the trainer's warm-up pool;
what this module adds is the annotation — the critic built for the logs' ids
(:func:`mpo_viz.models.critic.compact_critic`, or a pretrained trunk:
:func:`mpo_viz.models.store.trunk_critic`), the targets (:func:`fit_targets`), the values and
bootstrap values written into the batch and the ``critic_fit`` record that
:func:`mpo_viz.analysis.fitted_critic` reads back.

Invariant: the batch that comes back is the input with ``values`` (and ``bootstrap_value`` on
truncated rows) from the fitted critic's kept weights, aligned as the rollout's (the output before
each response token), and metadata ``values_source="fitted_critic"`` with the ``critic_fit``
record of that fit; nothing else of the input changes. Deterministic for a seed on CPU.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from mpo_viz.advantages import mc_returns, turn_gae
from mpo_viz.analysis import value_variance, variance_summary
from mpo_viz.checks import OptionError
from mpo_viz.data.io import check_destination, merge_parts, release_memory, save, scan
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.models.critic import compact_critic, used_ids
from mpo_viz.models.store import trunk_critic
from mpo_viz.models.tiny import MAX_POSITIONS
from mpo_viz.models.tiny import SIZES as TINY_SIZES
from mpo_viz.train.critic_fit import FIT_WINDOW, CriticFit, check_window, critic_outputs, fit_values
from mpo_viz.train.runtime import threads
from mpo_viz.train.update import rows_of

__all__ = [
    "CRITIC_TARGETS",
    "FittedCritic",
    "MIN_GROUPS_FOR_GROUP_SPLIT",
    "with_critic_values",
    "fit_critic",
    "fit_critic_file",
    "fit_sample",
    "fit_targets",
]

#: fewer groups than this: the held-out split is by trajectory, not by group
MIN_GROUPS_FOR_GROUP_SPLIT = 5

#: what a critic fitted to logs can learn: Monte-Carlo returns per token, or the return from the
#: start of each turn broadcast over the turn (a target flat inside turns)
CRITIC_TARGETS = ("mc", "turn")


@dataclass
class FittedCritic:
    """The result of :func:`fit_critic`: ``batch`` (the input with ``values`` from the fitted
    critic, ``bootstrap_value`` on truncated rows, and metadata ``values_source="fitted_critic"``
    and ``critic_fit``), the ``critic`` module, the :class:`CriticFit` and ``info`` (what the
    metadata records)."""

    batch: TrajectoryBatch
    critic: torch.nn.Module
    fit: CriticFit
    info: dict


def fit_targets(
    batch: TrajectoryBatch, target: str = "mc", *, gamma: float = 1.0, turn_gamma: float | None = None
) -> torch.Tensor:
    """``(B, L)`` float64 targets: ``"mc"`` — :func:`mpo_viz.advantages.mc_returns`; ``"turn"`` — the
    Monte-Carlo return from the first action token of each turn, on every token of the turn (turn GAE
    with λ_T = 1 and zero values: ``G^T_k = Σ_{k' ≥ k} Γ·R_{k'}``). ``turn_gamma`` left out is
    ``gamma``, as in :func:`~mpo_viz.advantages.mc_returns`."""
    if target == "mc":
        return mc_returns(batch, gamma=gamma, turn_gamma=turn_gamma)
    if target != "turn":
        raise OptionError("target", f"expected one of {', '.join(CRITIC_TARGETS)}, found {target!r}")
    zeros = torch.zeros(batch.mask.shape, dtype=torch.float64)
    _, ret = turn_gae(
        batch.padded("rewards", torch.float64),
        zeros,
        batch.mask,
        turn_ids=batch.turn_ids,
        gamma=gamma,
        turn_gamma=gamma if turn_gamma is None else turn_gamma,
        turn_lam=1.0,
        bootstrap_value=batch.bootstrap_value,
    )
    return ret


def _check_fit_input(batch: TrajectoryBatch, targets: torch.Tensor, holdout: float, source: str) -> None:
    """Refuse what no critic can be fitted to: no rewards, returns without variance, too few rows."""
    if len(batch) == 0:
        raise ValueError(f"{source}: no trajectories to fit a critic to")

    def carried(name):
        return np.array([x is not None for x in batch.field(name)]) if batch.has(name) else np.zeros(len(batch), bool)

    no_reward = np.isnan(batch.outcome_reward) & ~carried("token_rewards") & ~carried("turn_rewards")
    if no_reward.all():
        raise ValueError(
            f"{source}: no trajectory carries a reward (every 'reward' is missing or NaN, and there are "
            f"no token_rewards or turn_rewards), so there are no returns to fit a critic to"
        )
    n_held = max(1, int(round(holdout * len(batch))))
    if n_held < 2 or len(batch) - n_held < 2:
        raise ValueError(
            f"{source}: a held-out split of {holdout:g} leaves {len(batch) - n_held} training and "
            f"{n_held} held-out trajectories of {len(batch)}; expected at least 2 of each "
            f"(fit on more trajectories, or change --holdout)"
        )
    g = targets[batch.mask.bool()]
    if g.numel() == 0 or float(g.var(unbiased=False)) == 0.0:
        raise ValueError(
            f"{source}: every return is the same ({float(g[0]) if g.numel() else 'no action token'}), "
            f"so there is nothing for a critic to learn (explained variance is undefined)"
        )


def _last_outputs(critic: torch.nn.Module, batch: TrajectoryBatch, rows) -> dict[int, float]:
    """The critic's output after the whole response (position ``P + L − 1``) of each row in ``rows``."""
    out = {}
    with torch.no_grad():
        for i in rows:
            seq = np.concatenate([batch.field("prompt_ids")[i], batch.field("response_ids")[i]]).astype(np.int64)
            dev = next(critic.parameters()).device
            out[int(i)] = float(critic(torch.from_numpy(seq)[None].to(dev))[0, -1])
    return out


def _truncated(batch: TrajectoryBatch) -> list[int]:
    return [i for i, t in enumerate(batch.field("truncated") if batch.has("truncated") else []) if t]


def _with_bootstrap(critic: torch.nn.Module, batch: TrajectoryBatch, out: TrajectoryBatch) -> TrajectoryBatch:
    """``out`` (``batch`` with its values) with the critic's ``bootstrap_value`` on truncated rows."""
    cut = _truncated(batch)
    if not cut:
        return out
    last = _last_outputs(critic, batch, cut)
    old = batch.bootstrap_value.tolist()
    return out.with_scalars(bootstrap_value=[last.get(i, old[i]) for i in range(len(batch))])


def with_critic_values(
    critic: torch.nn.Module, batch: TrajectoryBatch, *, device="cpu", micro_batch_tokens: int = 8192
) -> TrajectoryBatch:
    """``batch`` with ``values`` ``(B, L)`` from ``critic`` (its output before each response token,
    the rollout's alignment) and ``bootstrap_value`` on truncated rows (its output after the
    response). A row's values depend on that row alone, so a file's rows can get them chunk by chunk."""
    r = rows_of(batch, fields=False)
    v = critic_outputs(critic, r, np.arange(len(batch)), pad_id=0, device=device, micro_batch_tokens=micro_batch_tokens)
    return _with_bootstrap(critic, batch, batch.with_token_fields(values=v))


def fit_critic(
    batch: TrajectoryBatch,
    *,
    target: str = "mc",
    size: str = "1m",
    steps: int = 256,
    lr: float = 1e-3,
    batch_episodes: int = 16,
    holdout: float = 0.2,
    seed: int = 0,
    gate: float | None = None,
    eval_every: int = 16,
    gamma: float = 1.0,
    turn_gamma: float | None = None,
    critic: torch.nn.Module | None = None,
    trunk=None,
    patience: int | None = None,
    keep_best: bool = True,
    device="cpu",
    micro_batch_tokens: int = 8192,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    source: str = "batch",
    num_threads: int | None = 1,
    serve: tuple[np.ndarray, int] | None = None,
    window: int | None = FIT_WINDOW,
) -> FittedCritic:
    """Fit a small critic to a batch's own returns and write its values into the batch.

    The critic (a fresh tiny Llama trunk of ``size`` over the batch's ids; ``trunk`` — a Hugging
    Face folder whose pretrained trunk is copied, :func:`~mpo_viz.models.store.trunk_critic`; or ``critic`` — e.g. a
    trained policy's trunk via :func:`mpo_viz.models.make_critic`) is fitted by
    :func:`~mpo_viz.train.critic_fit.fit_values`
    to ``target`` (:func:`fit_targets`: ``"mc"`` Monte-Carlo returns, or ``"turn"``) on all but a
    ``holdout`` share of the trajectories, ``steps`` AdamW steps of ``batch_episodes`` episodes at
    ``lr`` (``gate`` = a held-out EV that ends it early; None = the whole budget); whole groups are
    held out when the batch has at least 5 of them (no task on both sides), else trajectories;
    ``patience`` evaluations without a better held-out EV stop it early, and (``keep_best``, the
    default) the weights of the evaluation with the best held-out EV are the ones kept. Then every row
    gets ``values`` from the fitted critic (the output before each response token), truncated rows
    a ``bootstrap_value`` (the output after the response), and the metadata records
    ``values_source="fitted_critic"`` and ``critic_fit`` (target, size, steps, held-out and training
    explained variance, the across/within split of the new values, ...). Deterministic for a seed.

    ``num_threads``: torch CPU threads during the fit (the process's count is given back after;
    None keeps it). The default 1 is the trainer's (``Config.num_threads``): where other work shares
    the cores (a background run, a second kernel, another terminal's job), torch's threads wait on
    each other at every operation (measured in docs/adapters.md).

    ``window``: rows longer than this many tokens (prompt + response; default 1,024) train that
    many tokens at a time, the earlier windows' keys and values held without gradient
    (:func:`~mpo_viz.train.critic_fit.windowed_step`): the same loss and values, a truncated
    gradient, and a step's memory set by the window, not the longest row (a whole 11,000-token row
    keeps about 80 kB of activations a token). None: every row trains whole (exact gradient).
    The optimizer is AdamW's fused kernel (``fused`` of :func:`~mpo_viz.train.critic_fit.fit_values`:
    0.15 GB less at each step for a critic embedding 151k ids).

    ``serve``: ``(ids, longest)`` — the token ids and the longest prompt + response the fresh critic
    must serve besides the batch's own (:func:`fit_critic_file` fits on a sample of a file and then
    gives every row of the file its values).

    Errors (``ValueError`` naming ``source``): no rewards, returns all equal, too few trajectories
    for a held-out split (at least 2 on each side).
    """
    window = check_window(window)
    if critic is None and size not in TINY_SIZES:
        raise OptionError("size", f"expected one of {', '.join(TINY_SIZES)}, found {size!r}")
    for name, value, ok, want in (
        ("steps", steps, steps >= 0, "an integer >= 0"),
        ("lr", lr, lr > 0, "a number > 0"),
        ("holdout", holdout, 0 < holdout < 1, "a share in (0, 1)"),
        ("batch_episodes", batch_episodes, batch_episodes >= 1, "an integer >= 1"),
    ):
        if not ok:
            raise OptionError(name, f"expected {want}, found {value!r}")
    targets = fit_targets(batch, target, gamma=gamma, turn_gamma=turn_gamma)
    _check_fit_input(batch, targets, holdout, source)
    # the G samples of one task share its start: hold out whole groups, so that no task is on both
    # sides, when there are enough of them to approach the share (else rows)
    ids = batch.field("group_id")
    groups = ids if len(set(ids)) >= MIN_GROUPS_FOR_GROUP_SPLIT else None
    if trunk is not None and critic is not None:
        raise OptionError("trunk", "expected either a trunk folder or a critic module, found both")
    fresh = critic is None and trunk is None
    if trunk is not None:
        extra = None if serve is None else serve[0]  # the file's ids beyond the sample: checked before the fit
        critic = trunk_critic(trunk, batch, seed=seed, device=device, source=source, extra_ids=extra)
    if critic is None:
        longest = int(max(len(p) + len(r) for p, r in zip(batch.field("prompt_ids"), batch.field("response_ids"))))
        used = None
        if serve is not None:
            used, longest = np.union1d(used_ids(batch), serve[0]), max(longest, int(serve[1]))
        critic = compact_critic(batch, size=size, seed=seed, max_positions=max(MAX_POSITIONS, longest + 1), used=used)
    critic.to(device)
    with threads(num_threads):
        fit = fit_values(
            critic,
            batch,
            targets,
            steps=steps,
            lr=lr,
            batch_episodes=batch_episodes,
            holdout=holdout,
            gate=gate,
            eval_every=eval_every,
            seed=seed,
            pad_id=0,
            device=device,
            micro_batch_tokens=micro_batch_tokens,
            progress=progress,
            log=log,
            groups=groups,
            patience=patience,
            keep_best=keep_best,
            all_values=True,
            window=window,
            fused=True,
        )
    out = _with_bootstrap(critic, batch, batch.with_token_fields(values=fit.values))
    cut = _truncated(batch)
    split = variance_summary(value_variance(out))
    info = {
        "target": target,
        "size": size if fresh else ("trunk" if trunk is not None else "given"),
        "trunk": None if trunk is None else str(trunk),
        "kept_step": fit.kept_step,
        "best_step": fit.best_step,
        "patience": patience,
        "steps": fit.steps,
        "lr": lr,
        "batch_episodes": batch_episodes,
        "holdout": holdout,
        "seed": seed,
        "stop": fit.stop,
        "heldout_explained_variance": fit.heldout_ev,
        "best_heldout_explained_variance": fit.best_ev,
        "train_explained_variance": fit.train_ev,
        "n_train": fit.n_train,
        "n_heldout": fit.n_heldout,
        "values_mean_across": split["mean_across"],
        "values_mean_within": split["mean_within"],
        "values_median_across_within_ratio": split["median_ratio"],
        "truncated_bootstrapped": len(cut),
        "holdout_by": "row" if groups is None else "group",
        "window": window,
        "fused_optimizer": True,
        "num_threads": num_threads,
    }
    out = out.with_meta(values_source="fitted_critic", critic_fit=info)
    return FittedCritic(batch=out, critic=critic, fit=fit, info=info)


# a whole file, chunk by chunk


@dataclass
class _Survey:
    """What a first pass over a file keeps: each row's group id and response length, the token ids
    used anywhere and the longest prompt + response (a few bytes a row; the critic must serve every row)."""

    groups: list
    lengths: np.ndarray
    ids: np.ndarray
    longest: int


def _survey(path, max_tokens: int) -> _Survey:
    groups: list = []
    lengths = []
    ids = np.zeros(0, dtype=np.int64)
    longest = 0
    for chunk in scan(path, max_tokens=max_tokens):
        response = np.diff(chunk.columns.offsets).astype(np.int64)
        groups.extend(chunk.field("group_id"))
        lengths.append(response)
        ids = np.union1d(ids, used_ids(chunk))
        longest = max(longest, int((np.diff(chunk.columns.prompt[1]) + response).max()))
    return _Survey(groups, np.concatenate(lengths) if lengths else np.zeros(0, np.int64), ids, longest)


def fit_sample(
    groups: list, fit_rows: int, seed: int, lengths: np.ndarray | None = None, fit_tokens: int | None = None
) -> np.ndarray:
    """The rows (ascending indices) the critic is fitted on: every row when there are at most
    ``fit_rows`` of them holding at most ``fit_tokens`` response tokens (``lengths``: each row's);
    else whole groups in a seeded random order until either bound is reached. A group is never cut
    (the held-out split keeps a task on one side), so the sample can pass a bound by the rows of its
    last group; the first group is always taken, however large."""
    n = len(groups)
    lengths = np.zeros(n, dtype=np.int64) if lengths is None else np.asarray(lengths, dtype=np.int64)
    budget = math.inf if fit_tokens is None else fit_tokens
    if n <= fit_rows and lengths.sum() <= budget:
        return np.arange(n)
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    order = list(members)
    np.random.default_rng(seed).shuffle(order)
    chosen: list[int] = []
    tokens = 0
    for g in order:
        if chosen and (len(chosen) >= fit_rows or tokens >= budget):
            break
        chosen.extend(members[g])
        tokens += int(lengths[members[g]].sum())
    return np.sort(np.asarray(chosen, dtype=np.int64))


def _gather(path, rows: np.ndarray, max_tokens: int) -> TrajectoryBatch:
    """The rows ``rows`` (global indices, ascending) of ``path``, in file order, read chunk by chunk."""
    kept, start = [], 0
    for chunk in scan(path, max_tokens=max_tokens):
        lo, hi = np.searchsorted(rows, [start, start + len(chunk)])
        if hi > lo:
            kept.append(chunk[rows[lo:hi] - start] if hi - lo < len(chunk) else chunk)
        start += len(chunk)
    return TrajectoryBatch.concat(kept)


def fit_critic_file(
    path,
    out,
    *,
    fit_rows: int = 4096,
    fit_tokens: int = 2_000_000,
    max_tokens: int = 500_000,
    progress: bool = True,
    **fit: Any,
) -> FittedCritic:
    """:func:`fit_critic` on a file or folder of any size, written to ``out`` (.parquet or .jsonl).
    **Streams**: memory is the fitted sample plus one chunk of ``max_tokens`` response tokens.

    Three passes: (1) each row's group id, the token ids used and the longest sequence; (2) the rows
    the critic is fitted on (:func:`fit_sample`: every row when the file has at most ``fit_rows``
    rows and ``fit_tokens`` response tokens — then the fit is the whole-file fit — else whole groups
    drawn by the seed up to either bound: a fit of ``steps`` steps of ``batch_episodes`` episodes
    reads at most ``steps × batch_episodes`` of them anyway, and the bound on tokens keeps the
    sample's memory bounded however long the rows);
    (3) every row's values from the fitted critic (:func:`with_critic_values`), chunk by chunk, written as
    parts and merged. The ``critic_fit`` record gains ``rows`` (the file's) and ``fit_rows`` (the
    sample's); its across/within split is over every row. ``fit``: :func:`fit_critic`'s options.
    Returns the :class:`FittedCritic` of the sample (its ``batch``: the sample with values; ``info``:
    the record written)."""
    if isinstance(fit_rows, bool) or not isinstance(fit_rows, int) or fit_rows < 4:
        raise OptionError("fit_rows", f"expected an integer >= 4 (a held-out split needs rows), found {fit_rows!r}")
    if isinstance(fit_tokens, bool) or not isinstance(fit_tokens, int) or fit_tokens < 1:
        raise OptionError("fit_tokens", f"expected an integer >= 1, found {fit_tokens!r}")
    check_window(fit.get("window"))  # before the passes over the file
    out = Path(out)
    check_destination(out)
    survey = _survey(path, max_tokens)
    release_memory()  # the first pass's high-water mark: not kept through the fit
    if not survey.groups:
        raise ValueError(f"{fit.get('source', path)}: no trajectories to fit a critic to (0 rows)")
    rows = fit_sample(survey.groups, fit_rows, fit.get("seed", 0), survey.lengths, fit_tokens)
    sample = _gather(path, rows, max_tokens)
    release_memory()
    res = fit_critic(sample, serve=(survey.ids, survey.longest), progress=progress, **fit)
    n_fit = len(sample)
    del sample  # its derived arrays (res.batch is a new batch over the same columns)
    release_memory()  # the fit's optimizer state, windows and evaluations, before every row's values
    parts = out.with_name(out.name + ".parts.tmp")
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    tables, meta, cut = [], None, 0
    try:
        bar = tqdm(total=len(survey.groups), unit="traj", desc="values", leave=False, disable=not progress)
        for i, chunk in enumerate(scan(path, max_tokens=max_tokens)):
            with threads(fit.get("num_threads", 1)):
                valued = with_critic_values(
                    res.critic,
                    chunk,
                    device=fit.get("device", "cpu"),
                    micro_batch_tokens=fit.get("micro_batch_tokens", 8192),
                )
            tables.append(value_variance(valued))
            cut += len(_truncated(chunk))
            meta = meta or valued.meta
            name = f"part-{i:06d}.parquet" if out.suffix == ".parquet" else f"part-{i:06d}/rows{out.suffix}"
            save(valued, parts / name)
            bar.update(len(chunk))
        bar.close()
        split = variance_summary(pd.concat(tables, ignore_index=True))
        info = {
            **res.info,
            "rows": len(survey.groups),
            "fit_rows": n_fit,
            "values_mean_across": split["mean_across"],
            "values_mean_within": split["mean_within"],
            "values_median_across_within_ratio": split["median_ratio"],
            "truncated_bootstrapped": cut,
        }
        merge_parts(parts, out, {**(meta or {}), "values_source": "fitted_critic", "critic_fit": info})
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    return FittedCritic(batch=res.batch, critic=res.critic, fit=res.fit, info=info)
