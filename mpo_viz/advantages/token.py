"""Critic-based estimators: token GAE (with per-row λ rules), VAPO, turn GAE, MAE (the MPO estimator), bi-level GAE.

All take ``(B, L)`` rewards, values and mask (torch or numpy), keyword-only options, and return
``(advantages, returns)`` as torch tensors of shape ``(B, L)``, float64 when rewards or values are
float64 else float32, zero on masked positions. Recurrences run over action tokens only
(``mask == 1``); observation tokens neither advance the clock nor carry values. The value after a
row's last action token is 0 (terminal) unless ``bootstrap_value[i]`` (shape ``(B,)``) is finite.
``docs/concepts.md`` explains the estimators; :mod:`mpo_viz.advantages.reference` holds the readable
loops these are tested against.

Discounting: :func:`gae` and :func:`vapo` discount by γ between any two consecutive action tokens
(verl). :func:`turn_gae` and :func:`mae` run on one SMDP clock instead — γ between two action tokens
of the same turn, γ_T from a turn's last action token to the next turn's first — for the turn
level, the within-turn signals and the Monte-Carlo critic target alike, so a converged critic is a
fixed point. At γ = γ_T = 1 (the defaults) the two conventions agree.
"""

from __future__ import annotations

import numpy as np
import torch

from mpo_viz.advantages import kernels as K
from mpo_viz.advantages._inputs import (
    ThreadClock,
    prepare,
    rewrite_in_parallel,
    scalar_check,
    to_torch,
    whiten_,
    whiten_buffers,
)
from mpo_viz.checks import TensorLike, warn_once

__all__ = [
    "gae",
    "vapo",
    "turn_gae",
    "mae",
    "mae_with_turns",
    "bilevel_gae",
    "LAM_RULES",
    "TURN_ENDS",
    "lambda_per_row",
    "reward_turn_ids",
]


def _finish(
    p, adv: np.ndarray, ret: np.ndarray, whiten: bool, buffers: tuple, got: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whiten (with the row moments and spans the kernel wrote on the way, :func:`whiten_buffers`;
    on numba's threads if the kernel ``got`` them, :func:`rewrite_in_parallel`) and hand out torch tensors."""
    if whiten:
        whiten_(adv, p.mask, buffers[0], buffers[1:], parallel=rewrite_in_parallel(got))
    return to_torch(adv, p.device), to_torch(ret, p.device)


#: how λ is set per trajectory (option ``lam_rule``): ``fixed`` (the given λ), ``vapo``
#: (``1 − 1/(α·ℓ)``), ``relative_position`` (``q^{1/(ℓ−1)}``)
LAM_RULES = ("fixed", "vapo", "relative_position")


def vapo_lambda(n_action_tokens: TensorLike, alpha: float = 0.05) -> np.ndarray:
    """VAPO's length-adaptive λ per row: ``1 − 1/(α·ℓ)`` clamped to ``[0, 1)`` (ℓ = 0 gives 0)."""
    n = np.asarray(n_action_tokens, dtype=np.float64)
    with np.errstate(divide="ignore"):
        lam = 1.0 - 1.0 / (alpha * n)
    return np.where(n > 0, np.clip(lam, 0.0, np.nextafter(1.0, 0.0)), 0.0)


def relative_position_lambda(lengths: TensorLike, q: float = 0.5) -> np.ndarray:
    """AReaL's ``relative_position_gae_lambda`` per row: ``q^{1/(ℓ−1)}`` for ℓ ≥ 2, 1 for ℓ = 1, 0 for ℓ = 0.

    At γ = 1 a terminal reward then keeps ``λ^{ℓ−j} = q^{(ℓ−j)/(ℓ−1)}`` at step j = 1..ℓ: exactly q
    at the first step, whatever the length.
    """
    n = np.asarray(lengths, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = np.exp(np.log(q) / np.maximum(n - 1.0, 1.0))
    return np.where(n > 1, lam, np.where(n == 1, 1.0, 0.0))


def lambda_per_row(rule: str, lam: float, lengths: np.ndarray, alpha: float, q: float) -> np.ndarray:
    """λ per row, float64 ``(B,)``, for ``lam_rule`` ``rule`` (:data:`LAM_RULES`); ``lengths`` ℓ ``(B,)``.

    ``fixed``: ``lam`` everywhere; ``vapo``: :func:`vapo_lambda` (α = ``alpha``);
    ``relative_position``: :func:`relative_position_lambda` (``q``). ``lam`` is unused by the last two.
    """
    if rule not in LAM_RULES:
        raise ValueError(f"lam_rule: expected one of {', '.join(map(repr, LAM_RULES))}, found {rule!r}")
    scalar_check("alpha", alpha, 0.0, None, lo_open=True)
    scalar_check("q", q, 0.0, 1.0, lo_open=True)
    if rule == "vapo":
        return vapo_lambda(lengths, alpha)
    if rule == "relative_position":
        return relative_position_lambda(lengths, q)
    return np.full(np.shape(lengths), float(lam))


def _gae(p, gamma: float, lam_row: np.ndarray, ret_lam: float, whiten: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Token GAE on prepared inputs with λ per row (``ret_lam`` finite: the returns' own λ)."""
    B, L = p.shape
    adv = np.empty((B, L), dtype=p.dtype)
    ret = np.empty((B, L), dtype=p.dtype)
    bad = np.empty(B, dtype=np.int64)
    wb = whiten_buffers(B)
    with ThreadClock() as clock:
        K.gae_kernel(p.rewards, p.values, p.mask, p.bootstrap, gamma, lam_row, ret_lam, adv, ret, bad, int(whiten), *wb)
    p.check_bad(bad)
    return _finish(p, adv, ret, whiten, wb, clock.got)


def gae(
    rewards: TensorLike,
    values: TensorLike,
    mask: TensorLike,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    lam_rule: str = "fixed",
    alpha: float = 0.05,
    q: float = 0.5,
    bootstrap_value: TensorLike | None = None,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE (the PPO baseline, verl semantics).

    Over the action tokens of each row, last to first::

        δ_t = r_t + γ·V_{t+1} − V_t        (V_{t+1}: value at the next action token; after the
        A_t = δ_t + γ·λ_i·A_{t+1}           last one, bootstrap_value or 0)
        G_t = A_t + V_t                     (returns, computed before any whitening)

    λ_i per row (``lam_rule``, ℓ_i = the row's number of action tokens): ``"fixed"`` (default)
    ``λ_i = lam``; ``"vapo"`` ``1 − 1/(α·ℓ_i)`` clamped to ``[0, 1)`` (VAPO; SAO's estimator is this
    with ``alpha=1.5``); ``"relative_position"`` ``q^{1/(ℓ_i−1)}`` (1 at ℓ = 1; AReaL's
    ``relative_position_gae_lambda``). ``lam`` is unused by the last two, ``alpha``/``q`` by the others.

    Shapes: rewards, values, mask ``(B, L)``; bootstrap_value ``(B,)`` or None.
    Returns ``(advantages, returns)``, ``(B, L)``, 0 where ``mask == 0``. ``whiten=True`` maps the
    advantages over the action tokens of the batch to ``(A − mean)/sqrt(var_unbiased + 1e-8)``.
    """
    gamma = scalar_check("gamma", gamma, 0.0, 1.0)
    lam = scalar_check("lam", lam, 0.0, 1.0)
    p = prepare(rewards, mask, values=values, need_values=True, bootstrap_value=bootstrap_value, validate=False)
    lengths = (p.mask != 0).sum(1) if lam_rule != "fixed" else np.zeros(p.shape[0])
    return _gae(p, gamma, lambda_per_row(lam_rule, lam, lengths, alpha, q), np.nan, whiten)


def vapo(
    rewards: TensorLike,
    values: TensorLike,
    mask: TensorLike,
    *,
    gamma: float = 1.0,
    alpha: float = 0.05,
    bootstrap_value: TensorLike | None = None,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """VAPO advantages: :func:`gae` with ``lam_rule="vapo"``, ``λ_i = 1 − 1/(α·ℓ_i)``.

    ``ℓ_i`` = the row's number of action tokens; λ clamped to ``[0, 1)``. The advantages equal
    ``gae(..., lam_rule="vapo", alpha=α)``; the returns use λ = 1 (its decoupled critic):
    ``G_t = Σ_l γ^l r_{t+l} (+ γ^… bootstrap)`` = GAE(λ=1) + V. Shapes as :func:`gae`.
    """
    gamma = scalar_check("gamma", gamma, 0.0, 1.0)
    alpha = scalar_check("alpha", alpha, 0.0, None, lo_open=True)
    p = prepare(rewards, mask, values=values, need_values=True, bootstrap_value=bootstrap_value)
    return _gae(p, gamma, lambda_per_row("vapo", 1.0, (p.mask != 0).sum(1), alpha, 0.5), 1.0, whiten)


def _option(name: str, value, table: dict) -> int:
    if value not in table:
        raise ValueError(f"{name}: expected one of {sorted(table)}, found {value!r}")
    return table[value]


def mae_with_turns(
    rewards: TensorLike,
    values: TensorLike,
    mask: TensorLike,
    *,
    turn_ids: TensorLike | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
    turn_gamma: float = 1.0,
    turn_lam: float = 0.9,
    beta: float = 1.0,
    within: str = "intra",
    value_at: str = "first",
    critic_target: str = "mc",
    lam_rule: str = "fixed",
    alpha: float = 0.05,
    q: float = 0.5,
    bootstrap_value: TensorLike | None = None,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, np.ndarray]]:
    """:func:`mae` plus the per-turn arrays; returns ``(adv, ret, turns)``.

    ``turns`` is a dict of numpy float64 ``(B, Kmax)`` arrays (NaN beyond a row's turn count):
    ``advantage`` (``A^T_k``, before any whitening), ``value`` (``V(s_k)``), ``reward`` (``R_k =
    Σ_j γ^j r_{k,j}``, the plain sum at γ = 1), ``return`` (``G^T_k``), and ``nturns`` int64 ``(B,)``.
    """
    return _mae(
        rewards,
        values,
        mask,
        turn_ids=turn_ids,
        gamma=gamma,
        lam=lam,
        turn_gamma=turn_gamma,
        turn_lam=turn_lam,
        beta=beta,
        within=within,
        value_at=value_at,
        critic_target=critic_target,
        lam_rule=lam_rule,
        alpha=alpha,
        q=q,
        bootstrap_value=bootstrap_value,
        whiten=whiten,
        tables=True,
    )


def _turn_counts(p) -> np.ndarray:
    """K per row, int64 ``(B,)``: 1 + the largest turn id on an action token (0 without one); read
    before the kernel validates the ids (a bad id fails there)."""
    if p.nturns is not None:
        return p.nturns
    act = p.mask != 0
    if p.shape[1] == 0:
        return np.zeros(p.shape[0], dtype=np.int64)
    return np.where(act.any(1), np.where(act, p.turn_ids, -1).max(1) + 1, 0)


def _mae(
    rewards,
    values,
    mask,
    *,
    turn_ids,
    gamma,
    lam,
    turn_gamma,
    turn_lam,
    beta,
    within,
    value_at,
    critic_target,
    bootstrap_value,
    whiten,
    tables,
    lam_rule="fixed",
    alpha=0.05,
    q=0.5,
    warn=True,
):
    gamma = scalar_check("gamma", gamma, 0.0, 1.0)
    lam = scalar_check("lam", lam, 0.0, 1.0)
    turn_gamma = scalar_check("turn_gamma", turn_gamma, 0.0, 1.0)
    turn_lam = scalar_check("turn_lam", turn_lam, 0.0, 1.0)
    beta = scalar_check("beta", beta, 0.0, None)
    w = _option("within", within, K.WITHIN)
    va = _option("value_at", value_at, K.VALUE_AT)
    rm = _option("critic_target", critic_target, K.RET_MODE)
    if warn and critic_target == "turn" and beta > 0:
        warn_once("mae.critic_target=turn", CRITIC_TURN_WARNING)
    # the per-turn tables need K first (a validation pass); plain calls let the kernel check
    p = prepare(
        rewards,
        mask,
        values=values,
        need_values=True,
        turn_ids=turn_ids,
        need_turns=True,
        bootstrap_value=bootstrap_value,
        validate=tables,
    )
    B, L = p.shape
    adv = np.empty((B, L), dtype=p.dtype)
    ret = np.empty((B, L), dtype=p.dtype)
    kmax = int(p.nturns.max()) if (tables and B) else 0
    lengths = _turn_counts(p) if lam_rule != "fixed" else np.zeros(B)
    tlam = lambda_per_row(lam_rule, turn_lam, lengths, alpha, q)
    t_adv, t_val, t_rew, t_ret = (np.full((B, kmax), np.nan) for _ in range(4))
    bad = np.empty(B, dtype=np.int64)
    wb = whiten_buffers(B)
    with ThreadClock() as clock:
        K.mae_kernel(
            p.rewards,
            p.values,
            p.mask,
            p.turn_ids,
            p.bootstrap,
            gamma,
            lam,
            turn_gamma,
            tlam,
            beta,
            w,
            va,
            rm,
            adv,
            ret,
            t_adv,
            t_val,
            t_rew,
            t_ret,
            bad,
            int(whiten),
            *wb,
        )
    p.check_bad(bad)
    a, g = _finish(p, adv, ret, whiten, wb, clock.got)
    if not tables:
        return a, g
    turns = {"advantage": t_adv, "value": t_val, "reward": t_rew, "return": t_ret, "nturns": p.nturns}
    return a, g, turns


#: Shown once per process when ``mae`` runs with ``critic_target="turn"`` (and β > 0).
CRITIC_TURN_WARNING = (
    "critic_target='turn': the critic is then trained on the turn returns G^T_k, which are flat "
    "inside each turn; once it fits them the default within-turn signal u ('intra', value increments "
    "inside the turn) is 0 and MAE reduces to turn GAE: the micro scale switches itself off. Keep "
    "critic_target='mc' (the default) to keep it; pass beta=0 (or use turn_gae) if turn GAE is what "
    "you want."
)


def turn_gae(
    rewards: TensorLike,
    values: TensorLike,
    mask: TensorLike,
    *,
    turn_ids: TensorLike | None = None,
    gamma: float = 1.0,
    turn_gamma: float = 1.0,
    turn_lam: float = 0.9,
    value_at: str = "first",
    lam_rule: str = "fixed",
    alpha: float = 0.05,
    q: float = 0.5,
    bootstrap_value: TensorLike | None = None,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE (the macro scale), broadcast to each turn's action tokens.

    For turns ``k = 0..K−1`` of a row (``turn_ids``; None = maximal runs of ``mask == 1``), turn k
    having ``n_k`` action tokens with rewards ``r_{k,0..n_k−1}``::

        V(s_k) = value at the first action token of turn k   (value_at="first"; "last", "mean")
        R_k    = Σ_j γ^j r_{k,j}                             (the plain sum at γ = 1, the default)
        Γ_k    = γ^{n_k−1}·γ_T                               (γ_T at γ = 1)
        δ^T_k  = R_k + Γ_k·V(s_{k+1}) − V(s_k)               (V(s_K) = bootstrap or 0)
        A^T_k  = δ^T_k + Γ_k·λ_T·A^T_{k+1};   returns G^T_k = A^T_k + V(s_k)

    The discounting is SMDP-consistent: γ between two action tokens of a turn, γ_T from a turn's
    last action token to the next turn's first, the clock of MAE's Monte-Carlo critic target; a
    critic equal to those returns gives ``A^T_k = 0`` (deterministic episode, rewards at turn ends).

    ``lam_rule`` sets λ_T per row from its number of turns ℓ = K (AReaL's turn mode): ``"fixed"``
    (default: ``turn_lam``), ``"vapo"`` ``1 − 1/(α·K)``, ``"relative_position"`` ``q^{1/(K−1)}``
    (:func:`gae` has the same rules over action tokens).

    Shapes: rewards, values, mask, turn_ids ``(B, L)`` (ids read on action tokens only);
    bootstrap_value ``(B,)``. Returns ``(advantages, returns)`` ``(B, L)``, 0 on masked positions.
    Equals ``mae(..., beta=0, critic_target="turn")`` with the same options, whatever ``lam`` and
    ``within`` are.
    """
    return _mae(
        rewards,
        values,
        mask,
        turn_ids=turn_ids,
        gamma=gamma,
        lam=1.0,
        turn_gamma=turn_gamma,
        turn_lam=turn_lam,
        beta=0.0,
        within="intra",
        value_at=value_at,
        critic_target="turn",
        lam_rule=lam_rule,
        alpha=alpha,
        q=q,
        bootstrap_value=bootstrap_value,
        whiten=whiten,
        tables=False,
        warn=False,
    )


def mae(
    rewards: TensorLike,
    values: TensorLike,
    mask: TensorLike,
    *,
    turn_ids: TensorLike | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
    turn_gamma: float = 1.0,
    turn_lam: float = 0.9,
    beta: float = 1.0,
    within: str = "intra",
    value_at: str = "first",
    critic_target: str = "mc",
    lam_rule: str = "fixed",
    alpha: float = 0.05,
    q: float = 0.5,
    bootstrap_value: TensorLike | None = None,
    whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MAE, the multiscale advantage of MPO: turn GAE plus a centered within-turn signal.

    For action token j of turn k (``n_k`` action tokens)::

        A_{k,j} = A^T_k + β·(u_{k,j} − mean_{j'} u_{k,j'})      so mean_j A_{k,j} = A^T_k exactly
                                                                 (within="baseline": A^T_k + β·u_{k,j})

    ``A^T_k`` is :func:`turn_gae` (options ``gamma``, ``turn_gamma``, ``turn_lam``, ``value_at``, and
    ``lam_rule``/``alpha``/``q``, which set the turn λ_T per row from its number of turns; the
    token λ stays ``lam``).

    One clock for every token recurrence: the discount ``d_t`` from action token t to the next
    one is ``γ`` inside a turn and ``γ_T`` from a turn's last action token to the next turn's first
    (and onto the bootstrap value after the last turn); observation tokens are skipped. With
    ``δ_t = r_t + d_t·V_{t'} − V_t`` (t' the next action token), the within-turn signal ``u``
    (``within``), over the turn's action tokens t..end_k:

    * ``"intra"`` (default): ``u_t = Σ_{l≥0} (γλ)^l (γ·V_{t+l+1} − V_{t+l})`` inside the turn, no
      reward, 0 at the turn's last token (recursively ``u_t = γ·V_{t+1} − V_t + γλ·u_{t+1}``; at
      γ = 1 the λ-weighted value increments);
    * ``"local"``: token GAE truncated at the turn end, ``u_t = Σ_{l=0}^{end−t} (γλ)^l δ_{t+l}``,
      the value after the turn's last token being the next turn's first-token value (0 or the
      bootstrap after the last turn), reached with ``γ_T``;
    * ``"global"``: the full-row token GAE on the clock, ``u_t = δ_t + d_t·λ·u_{t'}``;
      ``"td"``: ``δ_t``;
    * ``"baseline"``: ``u_{k,j} = V(s_k) − γ^j·V_{k,j}`` (j counts the turn's action tokens from 0;
      ``V(s_k)`` is the turn value of ``value_at``), **not centred**: ``A_{k,j} = A^T_k + β·u_{k,j}``.
      With exact values (``value_at="first"``) its correction is a function of the state alone, so
      the expected credit of every token is its own advantage (calibrated; the centred signals
      give ``(1 + β·c_t)·A^π``, docs/concepts.md); the price is that the turn mean is no longer
      ``A^T_k``.

    Returns (``critic_target``): ``"mc"`` (default) Monte-Carlo returns ``G_t = r_t + d_t·G_{t'}``
    (the bootstrap value, or 0, after the last action token); ``"turn"``: ``G^T_k`` broadcast —
    flat inside turns, so a critic trained on it makes ``u`` ('intra') vanish and MAE turn GAE
    (a ``UserWarning`` says so once per process). With the "mc" critic converged on deterministic
    episodes whose rewards come at turn ends, every advantage is 0 for any γ, γ_T, λ, λ_T, β,
    ``within`` (``value_at="first"``).

    Shapes: rewards, values, mask, turn_ids ``(B, L)`` (ids read on action tokens only);
    bootstrap_value ``(B,)``. Returns ``(advantages, returns)`` ``(B, L)``, 0 on masked positions,
    float64 if rewards or values are float64 else float32.
    """
    return _mae(
        rewards,
        values,
        mask,
        turn_ids=turn_ids,
        gamma=gamma,
        lam=lam,
        turn_gamma=turn_gamma,
        turn_lam=turn_lam,
        beta=beta,
        within=within,
        value_at=value_at,
        critic_target=critic_target,
        lam_rule=lam_rule,
        alpha=alpha,
        q=q,
        bootstrap_value=bootstrap_value,
        whiten=whiten,
        tables=False,
    )


#: ``turn_ends`` of :func:`bilevel_gae`: the turns' last action tokens (``turn_ids``), or RAGEN's
#: rule, the action tokens with a non-zero reward
TURN_ENDS = ("turns", "rewards")


def reward_turn_ids(rewards: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """RAGEN's turns as turn ids ``(B, L)`` int64: a turn ends at every action token with a non-zero
    reward, and at the row's last action token (so trailing action tokens after the last reward
    form a last turn). The id of an action token is the number of turn ends before it."""
    act = mask != 0
    end = act & (rewards != 0)
    return np.ascontiguousarray(np.cumsum(end, axis=1) - end, dtype=np.int64)


def bilevel_gae(
    rewards: TensorLike,
    values: TensorLike,
    mask: TensorLike,
    *,
    turn_ids: TensorLike | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    turn_gamma: float = 0.95,
    turn_ends: str = "turns",
    bootstrap_value: TensorLike | None = None,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bi-level GAE (RAGEN/StarPO, ``bi_level_gae=True``): turn-level GAE across the turns' last
    tokens, then token-level GAE inside each turn that ends on the turn's return.

    For turns ``k = 0..K−1`` of a row, turn k ending at action token ``e_k``, with γ_H =
    ``turn_gamma`` (RAGEN's ``high_level_gamma``)::

        A^H_k = r_{e_k} + γ_H·V_{e_{k+1}} − V_{e_k} + γ_H·λ·A^H_{k+1}    (V after e_{K−1}: bootstrap or 0)
        A_{e_k} = A^H_k                                               (the turn's return A^H_k + V_{e_k}
        A_t = r_t + γ·V_{t'} − V_t + γ·λ·A_{t'}   for t < e_k in turn k    is the reward at e_k, terminal)
        G_t = A_t + V_t                                               (returns, before whitening)

    t' is the next action token of the same turn; observation tokens are skipped. One λ for both
    levels, as in RAGEN. ``whiten=True`` (default, as RAGEN, which always whitens) maps the
    advantages to ``(A − mean)/sqrt(var_unbiased + 1e-8)`` over the batch's action tokens.

    ``turn_ends`` — what a turn is:

    * ``"turns"`` (default): the turns of ``turn_ids`` (None = maximal runs of ``mask == 1``); a
      turn without reward is still a turn, and γ_H discounts across every turn boundary.
    * ``"rewards"``: RAGEN's rule (``compute_bi_level_gae_advantage_return``, RAGEN @ 5eb79b82): a
      turn ends at each action token with a non-zero reward (``turn_ids`` is not read), and at the
      row's last action token, where RAGEN itself raises IndexError when that token has reward 0.
      In RAGEN's shipped setting (``use_turn_scores=False``, which its train.py requires with
      ``bi_level_gae``) the episode's score is on the last token only: one turn per row, so this
      is plain token GAE (γ, λ) and γ_H is never used.

    The two agree when every turn ends on a non-zero reward and no other action token has one.

    Shapes: rewards, values, mask, turn_ids ``(B, L)``; bootstrap_value ``(B,)``. Returns
    ``(advantages, returns)`` ``(B, L)``, 0 on masked positions.
    """
    gamma = scalar_check("gamma", gamma, 0.0, 1.0)
    lam = scalar_check("lam", lam, 0.0, 1.0)
    turn_gamma = scalar_check("turn_gamma", turn_gamma, 0.0, 1.0)
    if turn_ends not in TURN_ENDS:
        raise ValueError(f"turn_ends: expected one of {', '.join(map(repr, TURN_ENDS))}, found {turn_ends!r}")
    by_turns = turn_ends == "turns"
    p = prepare(
        rewards,
        mask,
        values=values,
        need_values=True,
        turn_ids=turn_ids if by_turns else None,
        need_turns=by_turns,
        bootstrap_value=bootstrap_value,
    )
    B, L = p.shape
    tid = p.turn_ids if by_turns else reward_turn_ids(p.rewards, p.mask)
    adv = np.empty((B, L), dtype=p.dtype)
    ret = np.empty((B, L), dtype=p.dtype)
    K.bilevel_gae_kernel(p.rewards, p.values, p.mask, tid, p.bootstrap, gamma, lam, turn_gamma, adv, ret)
    if whiten:
        whiten_(adv, p.mask)
    return to_torch(adv, p.device), to_torch(ret, p.device)
