"""Which tokens the token truth measures (:func:`mpo_viz.rollout.token_truth.mc_token_truth`).

A token's true advantage is bounded by the policy's own uncertainty about it: with returns in
``[0, 1]``, ``A(h_t, a_t) = Q(h_t, a_t) − V(h_t) = (1 − π(a_t|h_t))·(Q(h_t, a_t) − Q(h_t, ≠a_t))``, so
``|A(h_t, a_t)| ≤ 1 − π(a_t|h_t)``. A token the policy writes with π > 0.99 can carry at most 0.01 of
credit; only the few uncertain tokens of a turn (the plan word, the action words) can carry more. The
rules (:data:`RULES`):

* ``"uncertain"`` — per turn, the tokens with ``1 − π(a_t|h_t) > threshold``, at most
  ``max_per_turn`` of them (the most uncertain first; ties: the earlier token), plus ``controls``
  tokens drawn at random among the turn's others with ``1 − π ≤ threshold`` (a check that the truth
  is ~0 there). ``π`` comes from the file's recorded log-probs (``old_logprobs``, else
  ``rollout_logprobs``), or is given (``uncertainty=``: the scripted expert's own, exactly);
* ``"decisive"`` — per turn, every token the oracle flags ``decisive`` (the file's column), plus
  ``controls`` random non-decisive tokens;
* ``"all"`` — every action token (for small files), no controls.

The controls of turn ``k`` of trajectory ``traj_id`` are drawn from a stream seeded by ``(seed,
traj_id, k)``: the same file and seed always measure the same tokens.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from mpo_viz.checks import OptionError
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = ["RULES", "TokenPosition", "choose_positions", "file_uncertainty", "NO_LOGPROBS"]

#: the positions rules (module docstring)
RULES = ("uncertain", "decisive", "all")

NO_LOGPROBS = (
    "positions='uncertain' needs the policy's recorded log-probs (old_logprobs or rollout_logprobs), "
    "and this file has none: measure positions='decisive' (the oracle's decisive tokens, in files of "
    "mpo-viz generate) or positions='all' (every action token; small files)"
)


@dataclass(frozen=True)
class TokenPosition:
    """One measured token: response position ``col`` of row ``row``, token ``t`` (from 0) of its turn
    ``turn``; ``control``: drawn at random among the turn's low-uncertainty tokens (not by the rule)."""

    row: int
    turn: int
    t: int
    col: int
    control: bool


def file_uncertainty(batch: TrajectoryBatch) -> tuple[list[np.ndarray], str]:
    """Per row ``1 − π(a_t|h_t)`` over its response (``1 − exp(logprob)``; NaN off the action tokens) from
    the file's ``old_logprobs`` (else ``rollout_logprobs``), and the field's name. ``OptionError``
    (:data:`NO_LOGPROBS`) when the file has neither."""
    name = next((f for f in ("old_logprobs", "rollout_logprobs") if batch.has(f)), None)
    if name is None:
        raise OptionError("positions", NO_LOGPROBS)
    out = []
    for i, (lp, mask) in enumerate(zip(batch.field(name), batch.field("loss_mask"))):
        if lp is None:
            raise OptionError(
                "positions",
                f"trajectory {batch.traj_ids[i]!r}: no {name} on this row; "
                + NO_LOGPROBS.split(", and this file has none: ", 1)[1],
            )
        u = 1.0 - np.exp(np.asarray(lp, dtype=np.float64))
        out.append(np.where(np.asarray(mask) != 0, u, np.nan))
    return out, name


def _control_rng(seed: int, traj_id: str, turn: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(traj_id.encode()), int(turn), 0x43544C])


def _controls(cands: list[int], n: int, rng: np.random.Generator) -> list[int]:
    """``n`` of ``cands`` (turn-local indices) drawn without replacement, in turn order."""
    if n <= 0 or not cands:
        return []
    pick = rng.choice(len(cands), size=min(n, len(cands)), replace=False)
    return sorted(cands[int(i)] for i in pick)


def choose_positions(
    batch: TrajectoryBatch,
    rule: str = "uncertain",
    *,
    threshold: float = 0.01,
    max_per_turn: int = 4,
    controls: int = 1,
    seed: int = 0,
    uncertainty: list | None = None,
) -> list[TokenPosition]:
    """The tokens to measure, row by row and turn by turn (in position order), by ``rule`` (module
    docstring).

    Args:
        batch: the trajectories.
        rule: ``"uncertain"``, ``"decisive"`` or ``"all"``.
        threshold: ``"uncertain"``: a token is uncertain when ``1 − π > threshold``.
        max_per_turn: ``"uncertain"``: at most this many uncertain tokens per turn (the most uncertain).
        controls: ``"uncertain"``/``"decisive"``: random other tokens per turn (0: none).
        seed: seeds the controls' draws (with the trajectory and the turn).
        uncertainty: per row ``1 − π`` over its response (default: :func:`file_uncertainty`).

    Raises:
        OptionError: an unknown rule or bad numbers; ``"uncertain"`` on a file without log-probs
            (:data:`NO_LOGPROBS`), ``"decisive"`` on one without the ``decisive`` column.
    """
    if rule not in RULES:
        raise OptionError("positions", f"expected one of {', '.join(RULES)}, found {rule!r}")
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and 0 <= threshold < 1):
        raise OptionError("threshold", f"expected a number in [0, 1), found {threshold!r}")
    for name, v, low in (("max_per_turn", max_per_turn, 1), ("controls", controls, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise OptionError(name, f"expected an int >= {low}, found {v!r}")
    unc = None
    if rule == "uncertain":
        unc = uncertainty if uncertainty is not None else file_uncertainty(batch)[0]
    if rule == "decisive" and not batch.has("decisive"):
        raise OptionError(
            "positions",
            "positions='decisive' needs the oracle's decisive column (files of mpo-viz "
            "generate, rollouts with an oracle); this file has none: measure "
            "positions='uncertain' or positions='all'",
        )
    dec = batch.field("decisive") if rule == "decisive" else None
    masks, tids = batch.mask.numpy() != 0, batch.turn_ids.numpy()
    out: list[TokenPosition] = []
    for i in range(len(batch)):
        act = np.flatnonzero(masks[i])
        if not len(act):
            continue
        turns = tids[i, act]
        for k in range(int(turns.max()) + 1):
            cols = act[turns == k]  # the turn's action tokens, in order: token t is cols[t]
            where = f"trajectory {batch.traj_ids[i]!r}, turn {k}"
            chosen, others = _by_rule(
                rule,
                cols,
                unc[i] if unc is not None else None,
                dec[i] if dec is not None else None,
                threshold,
                max_per_turn,
                where,
            )
            picked = _controls(others, controls, _control_rng(seed, batch.traj_ids[i], k)) if rule != "all" else []
            for t in sorted(chosen + picked):
                out.append(TokenPosition(row=i, turn=k, t=int(t), col=int(cols[t]), control=t in picked))
    return out


def _by_rule(
    rule: str, cols: np.ndarray, unc, dec, threshold: float, cap: int, where: str
) -> tuple[list[int], list[int]]:
    """The turn-local indices the rule measures, and the candidates for its controls."""
    n = len(cols)
    if rule == "all":
        return list(range(n)), []
    if rule == "decisive":
        flags = np.asarray(dec, dtype=np.float64)[cols] > 0.5
        return [t for t in range(n) if flags[t]], [t for t in range(n) if not flags[t]]
    u = np.asarray(unc, dtype=np.float64)[cols]
    if np.isnan(u).any():
        raise OptionError(
            "positions",
            f"{where}: expected the policy's probability of every action token, found "
            f"none for token {int(np.flatnonzero(np.isnan(u))[0])} of the turn",
        )
    high = [t for t in range(n) if u[t] > threshold]
    high = sorted(high, key=lambda t: (-u[t], t))[:cap]
    return high, [t for t in range(n) if u[t] <= threshold]
