"""Numba kernels behind the fast estimators: one trajectory per row, rows in parallel (``prange``).

Every kernel reads float32 or float64 token arrays of shape ``(B, L)`` (rewards, values and mask in
one dtype), accumulates in float64 scalars, and writes **every** output position (masked positions
get 0), so the callers allocate outputs with ``np.empty``. Each kernel is compiled lazily, once per
dtype, on first use (a few seconds), and cached on disk (``cache=True``: numba keys the cache on
this file's modification time, so an edited kernel recompiles; every kernel lives in this one file,
so no cached kernel can depend on stale code elsewhere). Later processes load the compiled code
instead of compiling again, which is what keeps each ``mpo-viz`` command quick. The readable specification of each
kernel is the matching loop in
:mod:`mpo_viz.advantages.reference`; tests check them equal.

Integer "enum" arguments (kept as ints so every call has the same numba signature):

* ``within``: 0 intra, 1 local, 2 global, 3 td, 4 baseline (not centred)  (:func:`mpo_viz.advantages.mae`)
* ``value_at``: 0 first, 1 last, 2 mean         (:func:`mpo_viz.advantages.turn_gae`)
* ``ret_mode``: 0 Monte-Carlo returns, 1 turn returns ``G^T_k`` broadcast  (``critic_target``)

Whitening (``whiten=True``) is fused: with ``wh = 1`` an estimator kernel also writes, per row, the
count, mean and sum of squared deviations of the advantages it computes on the action tokens, and
1 + the row's last action position: ``wst[i] = (n_i, mean_i, M2_i, end_i)`` (float64 ``(B, 4)``),
from the plain sums ``Σx`` and ``Σx²`` collected on the way (two additions a token; shifted or
two-pass forms cost the kernel more).
Where ``M2_i = Σx² − (Σx)²/n_i`` would cancel (a near-constant row, a single token, values far
from 0) the kernel writes ``M2_i = −1`` and the caller recomputes that row exactly with
:func:`moments_kernel` (shifted sums, exact for a constant row). The caller merges the rows
(:func:`mpo_viz.advantages._inputs.merge_moments`) and rewrites the action tokens in place with
:func:`whiten_apply_kernel`: one extra pass over the batch instead of numpy's gather, copy, two
reductions and scatter. :func:`gae_kernel` also writes, per row, the maximal runs of action
tokens, ``wsp[i, j] = (start, end)`` for ``j < wsn[i]``, at most ``wsp.shape[1]`` of them (more:
``wsn[i] = −1``, and the row is rewritten whole; :func:`mae_kernel` always writes −1): the rewrite
then touches only those runs, every position of which is an action token, with no test at all —
not the observation tokens between them (three quarters of an agent rollout's positions), nor the
mask. :func:`moments_kernel` gives the row statistics for any advantage array
(the estimators without a kernel of their own). The readable specification is
:func:`mpo_viz.advantages._inputs.whiten_reference` (and ``_whiten`` in the reference loops).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

WITHIN = {"intra": 0, "local": 1, "global": 2, "td": 3, "baseline": 4}
VALUE_AT = {"first": 0, "last": 1, "mean": 2}
RET_MODE = {"mc": 0, "turn": 1}

# Error codes of ``validate_kernel`` (the Python side turns them into messages).
E_MASK = 1  # mask entry not 0/1
E_TID_NEG = 2  # negative turn id on an action token
E_TID_DEC = 3  # turn ids decrease from one action token to the next
E_TID_FIRST = 4  # first action token not in turn 0
E_TID_SKIP = 5  # consecutive action tokens skip a turn id
E_REWARD_NONFINITE = 6  # NaN/inf reward on an action token
E_VALUE_NONFINITE = 7  # NaN/inf value on an action token
E_REWARD_MASKED = 8  # non-zero (or NaN) reward on a masked token


@njit(parallel=True, cache=True)
def validate_kernel(r, v, m, tid, check_values, check_tids, err_code, err_pos, nturns):
    """Per row: the first problem (``err_code``/``err_pos``, 0/-1 if none) and the turn count K.

    ``tid`` is only read when ``check_tids`` is 1, and then only on action tokens (the ids on
    masked positions are never read: only action tokens define turns); ``v`` only when
    ``check_values`` is 1. On action tokens the ids must be ≥ 0, start at 0, never decrease and
    never skip an id. ``nturns[i]`` = 1 + the largest turn id on an action token (0 without action
    tokens); when turn ids are not checked it is the number of mask runs.
    """
    B, L = m.shape
    for i in prange(B):
        code = 0
        pos = -1
        last_act_tid = -1
        runs = 0
        prev_m = 0.0
        for t in range(L):
            mt = m[i, t]
            if mt != 0.0 and mt != 1.0:
                code = E_MASK
                pos = t
                break
            if check_tids == 1 and mt == 1.0:
                ti = tid[i, t]
                if ti < 0:
                    code = E_TID_NEG
                    pos = t
                    break
                if last_act_tid == -1 and ti != 0:
                    code = E_TID_FIRST
                    pos = t
                    break
                if ti < last_act_tid:
                    code = E_TID_DEC
                    pos = t
                    break
                if ti > last_act_tid + 1:
                    code = E_TID_SKIP
                    pos = t
                    break
                last_act_tid = ti
            rt = r[i, t]
            if mt == 1.0:
                if not math.isfinite(rt):
                    code = E_REWARD_NONFINITE
                    pos = t
                    break
                if check_values == 1 and not math.isfinite(v[i, t]):
                    code = E_VALUE_NONFINITE
                    pos = t
                    break
                if prev_m == 0.0:
                    runs += 1
            elif rt != 0.0:  # also catches NaN
                code = E_REWARD_MASKED
                pos = t
                break
            prev_m = mt
        err_code[i] = code
        err_pos[i] = pos
        nturns[i] = last_act_tid + 1 if check_tids == 1 else runs


#: a row's ``M2 = Σx² − (Σx)²/n`` from plain sums is kept when it is more than this share of ``Σx²``
#: (then its relative rounding error is below ~1e-12); otherwise it is recomputed exactly
M2_KEEP = 1e-3


@njit(cache=True)
def _put_sums(wst, i, n, s1, s2, end):
    """Row i's ``(n, mean, M2, end)`` from the plain sums ``s1 = Σx``, ``s2 = Σx²`` of an estimator
    kernel; ``M2 = −1`` asks for an exact recomputation (:func:`moments_kernel`) when the
    subtraction cancels (``M2 ≤ M2_KEEP·s2``: a near-constant row, one token, values far from 0)."""
    wst[i, 0] = n
    wst[i, 3] = end
    if n == 0:
        wst[i, 1] = 0.0
        wst[i, 2] = 0.0
        return
    mean = s1 / n
    m2 = s2 - s1 * mean
    wst[i, 1] = mean
    wst[i, 2] = m2 if m2 > M2_KEEP * s2 else -1.0


@njit(cache=True)
def _put_span(wsp, i, ns, start, end):
    """Record row i's span ``[start, end)`` as its ``ns``-th (dropped past the capacity, still
    counted); returns the new count."""
    if ns < wsp.shape[1]:
        wsp[i, ns, 0] = start
        wsp[i, ns, 1] = end
    return ns + 1


@njit(cache=True)
def _put_moments(wst, i, n, shift, s1, s2, end):
    """Row i's ``(n, mean, M2, end)`` from shifted sums ``s1 = Σ(x − shift)``, ``s2 = Σ(x − shift)²``."""
    wst[i, 0] = n
    wst[i, 3] = end
    if n == 0:
        wst[i, 1] = 0.0
        wst[i, 2] = 0.0
    else:
        wst[i, 1] = shift + s1 / n
        wst[i, 2] = max(s2 - s1 * s1 / n, 0.0)


@njit(parallel=True, cache=True)
def moments_kernel(a, m, wst):
    """Per row over the action tokens (``m != 0``) of ``a``: ``wst[i] = (n_i, mean_i, M2_i, end_i)``,
    float64, from sums shifted by the row's first action value (a constant row: ``M2_i = 0``);
    ``end_i`` = 1 + the row's last action position (0 without one)."""
    B, L = m.shape
    for i in prange(B):
        n = 0
        end = 0
        shift = 0.0
        s1 = 0.0
        s2 = 0.0
        for t in range(L):
            if m[i, t] != 0.0:
                x = np.float64(a[i, t])
                if n == 0:
                    shift = x
                d = x - shift
                s1 += d
                s2 += d * d
                n += 1
                end = t + 1
        _put_moments(wst, i, n, shift, s1, s2, end)


#: spans of action tokens ahead whose first entry the rewrite reads early (:func:`_whiten_row`)
WHITEN_AHEAD = 2


@njit(cache=True)
def _whiten_row(a, m, mean, inv_std, wst, masked_zero, wsp, wsn, i):
    """Row i of :func:`whiten_apply_kernel`; returns a sum of entries read early (see below), for
    the caller to keep (so that the compiler keeps those reads)."""
    n = int(wst[i, 0])
    if n == 0:
        return 0.0
    row = a[i]
    k = wsn[i]
    if k >= 0:
        # The entries were written by the estimator kernel long before (its whole batch has gone
        # through the cache since): each run starts with a cache miss. Reading the first entry of
        # the run WHITEN_AHEAD places on while this one is rewritten lets those misses overlap.
        early = 0.0
        for j in range(min(WHITEN_AHEAD, k)):
            early += row[wsp[i, j, 0]]
        for j in range(k):
            if j + WHITEN_AHEAD < k:
                early += row[wsp[i, j + WHITEN_AHEAD, 0]]
            seg = row[wsp[i, j, 0] : wsp[i, j, 1]]
            for t in range(seg.shape[0]):
                seg[t] = (np.float64(seg[t]) - mean) * inv_std
        return early
    end = int(wst[i, 3])
    nz = 0
    if masked_zero == 1:
        for t in range(end):
            nz += row[t] != 0.0
    if masked_zero == 1 and nz == n:
        for t in range(end):
            x = row[t]
            row[t] = (np.float64(x) - mean) * inv_std if x != 0.0 else x
    else:
        mrow = m[i]
        for t in range(end):
            x = row[t]
            row[t] = (np.float64(x) - mean) * inv_std if mrow[t] != 0.0 else x
    return 0.0


@njit(parallel=True, cache=True)
def whiten_apply_kernel(a, m, mean, inv_std, wst, masked_zero, wsp, wsn):
    """In place: ``a ← (a − mean)·inv_std`` on the action tokens (``m != 0``); other positions unchanged.

    ``inv_std = 1/sqrt(var_unbiased + 1e-8)`` (:func:`mpo_viz.advantages._inputs.merge_moments`):
    a multiplication, not a division (a float64 division per element made the pass 1.5x slower);
    the two differ by at most one float64 rounding. Arithmetic in float64, stored in ``a``'s dtype.

    A row with recorded runs (``wsn[i] ≥ 0``, module docstring) is rewritten run by run, every
    position of a run being an action token: a test-free loop on a 1-D view that the compiler
    vectorises, reading neither the mask nor the observation tokens. Any other row (``wsn[i] < 0``)
    up to ``end_i`` (``wst[i]`` = ``(n_i, ·, ·, end_i)``: its number of action tokens and 1 + its
    last action position; right padding is never read): with ``masked_zero`` 1 (estimator outputs:
    every masked position holds 0) a row whose number of non-zero entries equals ``n_i`` has its
    action tokens exactly at its non-zero entries, so the rewrite selects on the entries themselves
    and never reads the mask; otherwise it selects on the mask. Rows in parallel;
    :func:`whiten_apply_serial` is the same pass in the calling thread (the same numbers).
    """
    early = 0.0
    for i in prange(a.shape[0]):
        early += _whiten_row(a, m, mean, inv_std, wst, masked_zero, wsp, wsn, i)
    return early


@njit(cache=True)
def whiten_apply_serial(a, m, mean, inv_std, wst, masked_zero, wsp, wsn):
    """:func:`whiten_apply_kernel` in the calling thread, row after row (same arguments, same numbers)."""
    early = 0.0
    for i in range(a.shape[0]):
        early += _whiten_row(a, m, mean, inv_std, wst, masked_zero, wsp, wsn, i)
    return early


@njit(parallel=True, cache=True)
def gae_kernel(r, v, m, boot, gamma, lam, ret_lam, adv, ret, bad, wh, wst, wsp, wsn):
    """Token GAE over action tokens (verl semantics: γ between any two action tokens), per-row ``lam`` (B,).

    ``A_t = δ_t + γ·λ_i·A_{t+1}``, ``δ_t = r_t + γ·V_{t+1} − V_t`` (V after the last action token =
    ``boot[i]`` if finite else 0); ``ret = A' + V`` where ``A'`` uses ``ret_lam`` instead of λ_i
    when ``ret_lam`` is finite (VAPO's λ = 1 critic), else ``ret = A + V``.

    Checks the input on the way (fused, so the data is read once): ``bad[i]`` counts positions of
    row i with a mask entry not 0/1, a non-finite reward or value on an action token, or a non-zero
    reward on a masked token. Outputs are meaningless where ``bad[i] > 0``; the caller then runs
    :func:`validate_kernel` for the message. With ``wh = 1`` also the row statistics of the stored
    advantages, ``wst[i] = (n_i, mean_i, M2_i, end_i)``, and the runs of action tokens,
    ``wsp``/``wsn`` (module docstring).
    """
    B, L = m.shape
    sep = math.isfinite(ret_lam)
    for i in prange(B):
        nv = boot[i] if math.isfinite(boot[i]) else 0.0
        a = 0.0
        a2 = 0.0
        gl = gamma * lam[i]
        gl2 = gamma * ret_lam if sep else 0.0
        nb = 0
        wn = 0
        wend = 0  # 1 + the row's last action position
        s1 = 0.0
        s2 = 0.0
        ns = 0  # runs of action tokens recorded
        run_end = -1  # 1 + the last position of the run being walked; -1: outside a run
        for t in range(L - 1, -1, -1):
            mt = m[i, t]
            rt = np.float64(r[i, t])
            nb += (mt != 0.0) & (mt != 1.0)
            if mt != 0.0:
                vt = np.float64(v[i, t])
                nb += not ((vt - vt) == 0.0)  # NaN or inf
                nb += not ((rt - rt) == 0.0)
                delta = rt + gamma * nv - vt
                a = delta + gl * a
                adv[i, t] = a
                if wh == 1:
                    s1 += a
                    s2 += a * a
                    wn += 1
                    if run_end < 0:
                        run_end = t + 1
                        wend = max(wend, run_end)
                if sep:
                    a2 = delta + gl2 * a2
                    ret[i, t] = a2 + vt
                else:
                    ret[i, t] = a + vt
                nv = vt
            else:
                nb += rt != 0.0  # also NaN
                adv[i, t] = 0.0
                ret[i, t] = 0.0
                if run_end >= 0:  # (only with wh = 1; a `wh == 1 and` here made the plain kernel 35% slower)
                    ns = _put_span(wsp, i, ns, t + 1, run_end)
                    run_end = -1
        bad[i] = nb
        if wh == 1:
            if run_end >= 0:
                ns = _put_span(wsp, i, ns, 0, run_end)
            wsn[i] = ns if ns <= wsp.shape[1] else -1
            _put_sums(wst, i, wn, s1, s2, wend)


@njit(parallel=True, cache=True)
def discounted_kernel(r, m, gamma, out, bad, wh, wst):
    """``G_t = r_t + γ·G_{t'}`` over action tokens (t' = next action token; 0 after the last).

    Observation tokens are skipped, the return carried over them; masked outputs are 0.
    ``bad[i]`` counts invalid positions of row i (mask not 0/1, non-finite reward on an action
    token, non-zero reward on a masked one), as in :func:`gae_kernel`; ``wh``/``wst``: the row
    statistics of the stored ``G`` (module docstring).
    """
    B, L = m.shape
    for i in prange(B):
        g = 0.0
        nb = 0
        wn = 0
        wend = 0  # 1 + the row's last action position
        s1 = 0.0
        s2 = 0.0
        for t in range(L - 1, -1, -1):
            mt = m[i, t]
            rt = np.float64(r[i, t])
            nb += (mt != 0.0) & (mt != 1.0)
            if mt != 0.0:
                nb += not ((rt - rt) == 0.0)
                g = rt + gamma * g
                out[i, t] = g
                if wh == 1:
                    s1 += g
                    s2 += g * g
                    wn += 1
                    wend = max(wend, t + 1)
            else:
                nb += rt != 0.0
                out[i, t] = 0.0
        bad[i] = nb
        if wh == 1:
            _put_sums(wst, i, wn, s1, s2, wend)


@njit(parallel=True, cache=True)
def mae_kernel(
    r,
    v,
    m,
    tid,
    boot,
    gamma,
    lam,
    tgamma,
    tlam,
    beta,
    within,
    value_at,
    ret_mode,
    adv,
    ret,
    t_adv,
    t_val,
    t_rew,
    t_ret,
    bad,
    wh,
    wst,
    wsp,
    wsn,
):
    """Turn GAE + centered within-turn signal (:func:`mpo_viz.advantages.mae`); ``beta = 0`` is ``turn_gae``.

    ``tlam`` is the turn λ_T per row, float64 ``(B,)`` (a fixed λ_T: every entry the same).

    One clock for every recurrence: the discount from an action token to the next one is ``γ``
    inside a turn and ``γ_T`` from a turn's last action token to the next turn's first (or to the
    bootstrap value after the last turn). Walks each row backwards one turn at a time. Pass 1 over
    turn k's ``n_k`` action tokens (last to first) accumulates the discounted turn reward
    ``R_k = Σ_j γ^j r_{k,j}`` (Horner), ``γ^{n_k−1}``, ``V(s_k)``, the within-turn signal ``u``
    (stored in ``adv`` for now) and the Monte-Carlo return (stored in ``ret``); then, with
    ``Γ_k = γ^{n_k−1}·γ_T``, ``A^T_k = R_k + Γ_k·V(s_{k+1}) − V(s_k) + Γ_k·λ_T·A^T_{k+1}``; pass 2
    writes ``A^T_k + β·(u − mean u)`` and, with ``ret_mode`` 1, ``G^T_k = A^T_k + V(s_k)``. Turn
    arrays ``t_*`` (B, Kcap) get ``A^T_k``, ``V(s_k)``, ``R_k``, ``G^T_k`` for ``k < Kcap`` (pass
    ``Kcap = 0`` arrays to skip). ``within`` 4 (baseline) is not centred: pass 2 writes
    ``A^T_k + β·(V(s_k) − γ^j·V_t)``, j counting the turn's action tokens from 0.

    Turns are defined by the action tokens alone: the ids on masked positions are never read (a
    turn's span runs over masked tokens until an action token with another id). Fused input
    checks, as in :func:`gae_kernel`, plus the turn ids on action tokens: ``bad[i]`` also counts
    negative ids and turns that are not numbered 0..K−1 in order. ``wh``/``wst``: the row statistics
    of the stored advantages (module docstring), accumulated in pass 2. It records no runs
    (``wsn[i] = −1``: the rewrite goes over each row whole): tracking them in its loops made the
    kernel itself 11–24% slower even without whitening (CPU time at 512 × 8192, three variants),
    more than the rewrite would save.
    """
    B, L = m.shape
    kcap = t_adv.shape[1]
    for i in prange(B):
        wn = 0
        wend = 0  # 1 + the row's last action position
        s1 = 0.0
        s2 = 0.0
        bs = boot[i] if math.isfinite(boot[i]) else 0.0
        tl = tlam[i]
        nv_tok = bs  # value at the next action token (crosses turn boundaries)
        vt_next = bs  # V(s_{k+1})
        at_next = 0.0  # A^T_{k+1}
        g_next = bs  # MC return at the next action token
        glob = 0.0  # full-trajectory token GAE on the one clock (within = global)
        nb = 0
        seen = False  # a turn of this row was processed already
        last_k = 0  # turn id of the turn processed before (the next one in the row)
        t = L - 1
        while t >= 0:
            mt = m[i, t]
            if mt == 0.0:
                nb += r[i, t] != 0.0  # also NaN
                adv[i, t] = 0.0
                ret[i, t] = 0.0
                t -= 1
                continue
            k = tid[i, t]
            nb += k < 0
            if seen:
                nb += k != last_k - 1
            seen = True
            last_k = k
            e = t
            rsum = 0.0  # R_k = Σ_j γ^j r_{k,j}, by Horner from the end
            pw = 1.0  # γ^{n−1}
            usum = 0.0
            vsum = 0.0
            n = 0
            u = 0.0
            g = g_next
            s = t
            tt = t
            while tt >= 0:
                mq = m[i, tt]
                rt = np.float64(r[i, tt])
                if mq != 0.0:
                    if tid[i, tt] != k:
                        break
                    nb += mq != 1.0
                    vt = np.float64(v[i, tt])
                    nb += not ((vt - vt) == 0.0)  # NaN or inf
                    nb += not ((rt - rt) == 0.0)
                    if n == 0:
                        d = tgamma  # the turn's last token: the clock crosses the boundary
                    else:
                        d = gamma
                        pw *= gamma
                    rsum = rt + gamma * rsum
                    vsum += vt
                    delta = rt + d * nv_tok - vt
                    glob = delta + d * lam * glob
                    g = rt + d * g
                    if within == 0:
                        u = 0.0 if n == 0 else (gamma * nv_tok - vt) + gamma * lam * u
                    elif within == 1:
                        u = delta if n == 0 else delta + gamma * lam * u
                    elif within == 2:
                        u = glob
                    elif within == 3:
                        u = delta
                    else:  # baseline: keep V_t; pass 2 writes V(s_k) − γ^j·V_t
                        u = vt
                    n += 1
                    usum += u
                    adv[i, tt] = u
                    ret[i, tt] = g
                    nv_tok = vt
                    s = tt
                else:
                    nb += rt != 0.0
                    adv[i, tt] = 0.0
                    ret[i, tt] = 0.0
                tt -= 1
            if value_at == 0:
                vs = np.float64(v[i, s])
            elif value_at == 1:
                vs = np.float64(v[i, e])
            else:
                vs = vsum / n
            big_g = pw * tgamma  # Γ_k = γ^{n_k−1}·γ_T, the discount from V(s_k) to V(s_{k+1})
            at = rsum + big_g * vt_next - vs + big_g * tl * at_next
            gt = at + vs
            umean = usum / n
            pj = 1.0  # γ^j, j = the token's place in its turn (within = baseline)
            for q in range(tt + 1, e + 1):
                if m[i, q] != 0.0:
                    if within == 4:
                        x = at + beta * (vs - pj * adv[i, q])
                        pj *= gamma
                    else:
                        x = at + beta * (adv[i, q] - umean)
                    adv[i, q] = x
                    if ret_mode == 1:
                        ret[i, q] = gt
                    if wh == 1:
                        s1 += x
                        s2 += x * x
                        wn += 1
            wend = max(wend, e + 1)
            if k >= 0 and k < kcap:
                t_adv[i, k] = at
                t_val[i, k] = vs
                t_rew[i, k] = rsum
                t_ret[i, k] = gt
            vt_next = vs
            at_next = at
            g_next = g
            t = tt
        if seen and last_k != 0:  # the first turn of the row must be turn 0
            nb += 1
        bad[i] = nb
        if wh == 1:
            wsn[i] = -1
            _put_sums(wst, i, wn, s1, s2, wend)


@njit(parallel=True, cache=True)
def bilevel_gae_kernel(r, v, m, tid, boot, gamma, lam, hgamma, adv, ret):
    """Bi-level GAE (:func:`mpo_viz.advantages.bilevel_gae`, RAGEN's ``bi_level_gae``), per row.

    Walks the row's turns last to first (turns = runs of action tokens with one turn id; ids on
    masked positions are never read). Turn k ends at action token ``e_k``. High level, over the
    turn ends: ``A^H_k = r_{e_k} + γ_H·V_{e_{k+1}} − V_{e_k} + γ_H·λ·A^H_{k+1}`` (after the last
    turn ``V`` = ``boot[i]`` if finite else 0, ``A^H`` = 0). Low level, inside turn k, last to
    first action token: ``A_{e_k} = A^H_k``; before it ``A_t = r_t + γ·V_{t'} − V_t + γ·λ·A_{t'}``
    (t' the turn's next action token). ``ret = A + V`` on every action token; masked outputs 0.
    Inputs are validated by the caller.
    """
    B, L = m.shape
    for i in prange(B):
        v_end_next = boot[i] if math.isfinite(boot[i]) else 0.0
        a_hi_next = 0.0
        t = L - 1
        while t >= 0:
            if m[i, t] == 0.0:
                adv[i, t] = 0.0
                ret[i, t] = 0.0
                t -= 1
                continue
            k = tid[i, t]
            ve = np.float64(v[i, t])
            a_hi = np.float64(r[i, t]) + hgamma * v_end_next - ve + hgamma * lam * a_hi_next
            adv[i, t] = a_hi
            ret[i, t] = a_hi + ve
            a = a_hi
            nv = ve
            tt = t - 1
            while tt >= 0:
                if m[i, tt] == 0.0:
                    adv[i, tt] = 0.0
                    ret[i, tt] = 0.0
                    tt -= 1
                    continue
                if tid[i, tt] != k:
                    break
                vt = np.float64(v[i, tt])
                a = np.float64(r[i, tt]) + gamma * nv - vt + gamma * lam * a
                adv[i, tt] = a
                ret[i, tt] = a + vt
                nv = vt
                tt -= 1
            v_end_next = ve
            a_hi_next = a_hi
            t = tt
