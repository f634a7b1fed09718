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

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from mpo_viz.advantages import mc_returns, turn_gae
from mpo_viz.analysis import value_variance, variance_summary
from mpo_viz.checks import OptionError
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.models.critic import compact_critic
from mpo_viz.models.store import trunk_critic
from mpo_viz.models.tiny import MAX_POSITIONS
from mpo_viz.models.tiny import SIZES as TINY_SIZES
from mpo_viz.train.critic_fit import CriticFit, fit_values
from mpo_viz.train.runtime import threads

__all__ = ["CRITIC_TARGETS", "FittedCritic", "MIN_GROUPS_FOR_GROUP_SPLIT", "fit_critic", "fit_targets"]

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

    Errors (``ValueError`` naming ``source``): no rewards, returns all equal, too few trajectories
    for a held-out split (at least 2 on each side).
    """
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
        critic = trunk_critic(trunk, batch, seed=seed, device=device, source=source)
    if critic is None:
        longest = int(max(len(p) + len(r) for p, r in zip(batch.field("prompt_ids"), batch.field("response_ids"))))
        critic = compact_critic(batch, size=size, seed=seed, max_positions=max(MAX_POSITIONS, longest + 1))
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
        )
    out = batch.with_token_fields(values=fit.values)
    cut = [i for i, t in enumerate(batch.field("truncated") if batch.has("truncated") else []) if t]
    if cut:
        last = _last_outputs(critic, batch, cut)
        old = batch.bootstrap_value.tolist()
        out = out.with_scalars(bootstrap_value=[last.get(i, old[i]) for i in range(len(batch))])
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
        "num_threads": num_threads,
    }
    out = out.with_meta(values_source="fitted_critic", critic_fit=info)
    return FittedCritic(batch=out, critic=critic, fit=fit, info=info)
