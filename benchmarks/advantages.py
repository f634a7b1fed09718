"""Benchmark: fast `gae` and `mae` against per-position torch loops written the way verl writes GAE.

Run:  .venv/bin/python benchmarks/advantages.py            (full: B = 128 … 1024, L = 8192)
      .venv/bin/python benchmarks/advantages.py --quick    (B = 64, 128; a smoke run)

Batches come from `mpo_viz.data.synthetic.make_batch` shaped like agent rollouts: assistant spans 20–200
tokens, tool spans 20–300, 4–40 turns cut at 8192 tokens, right padding, float32 tensors from the
TrajectoryBatch (`rewards`, `values`, `mask`, `turn_ids`).

Baselines (same process, same inputs, float32, torch on CPU):
* `gae_loop_verl`: verl's `compute_gae_advantage_return` loop (observation tokens skipped with the
  mask, as recent verl does), without its final whitening (our `gae` does not whiten by default).
* `mae_loop_torch`: the same per-position style for MAE: one backward loop over positions computing
  the intra signal, turn sums, turn GAE at each turn's first token and Monte-Carlo returns, then a
  forward loop broadcasting the turn advantage and centering the intra signal.

Timed: the whole public call (`mpo_viz.advantages.gae` / `mae`): input conversion, validation of
every token, the numba kernel, the torch outputs. Numba compiles each kernel on its first call; that
one-off cost is measured separately (warm-up on a tiny batch) and kept out of the timed region.
Speed is *positions/s*: B × L padded positions per second, the work both sides walk over.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mpo_viz.advantages as A  # noqa: E402
from mpo_viz.data.synthetic import make_batch  # noqa: E402

GAMMA, LAM, TURN_GAMMA, TURN_LAM, BETA = 1.0, 0.95, 1.0, 0.9, 1.0


# ----------------------------------------------------------------------------- baselines


@torch.no_grad()
def gae_loop_verl(token_level_rewards, values, response_mask, gamma=GAMMA, lam=LAM):
    """verl's compute_gae_advantage_return (multi-turn form), minus the final masked_whiten."""
    nextvalues = 0
    lastgaelam = 0
    advantages_reversed = []
    gen_len = token_level_rewards.shape[-1]
    for t in reversed(range(gen_len)):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        # skip values and TD-error on observation tokens
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages, returns


@torch.no_grad()
def mae_loop_torch(
    rewards, values, mask, turn_ids, gamma=GAMMA, lam=LAM, turn_gamma=TURN_GAMMA, turn_lam=TURN_LAM, beta=BETA
):
    """MAE (within="intra", value_at="first", critic_target="mc") in verl's per-position style.

    One SMDP clock, as the fast kernel: γ between tokens of a turn, γ_T across a boundary; the turn
    reward is ``Σ_j γ^j r_{k,j}`` and the turn discount ``γ^{n_k−1}·γ_T`` (at γ = 1 the plain sum, γ_T).
    """
    B, L = rewards.shape
    m_bool = mask > 0
    # first action token of each turn: an action token whose turn id exceeds every earlier action id
    key = torch.where(m_bool, turn_ids, torch.full_like(turn_ids, -1))
    prev_max = torch.cummax(torch.nn.functional.pad(key[:, :-1], (1, 0), value=-1), dim=1).values
    is_start = (m_bool & (turn_ids > prev_max)).to(rewards.dtype)

    zeros = torch.zeros(B, dtype=rewards.dtype)
    nextvalues = zeros.clone()  # value at the next action token
    next_tid = torch.full((B,), -1, dtype=turn_ids.dtype)
    u = zeros.clone()  # intra signal
    usum, n, rsum = zeros.clone(), zeros.clone(), zeros.clone()  # running sums over the current turn
    pw = torch.ones(B, dtype=rewards.dtype)  # γ^(action tokens after this one in the turn)
    vt_next, at_next = zeros.clone(), zeros.clone()  # V(s_{k+1}), A^T_{k+1}
    g = zeros.clone()  # Monte-Carlo return
    u_rev, g_rev, at_rev, um_rev = [], [], [], []
    for t in reversed(range(L)):
        mt = mask[:, t]
        vt, rt, tt, st = values[:, t], rewards[:, t], turn_ids[:, t], is_start[:, t]
        same = (tt == next_tid).to(rewards.dtype)  # next action token is in this turn
        u_ = same * (gamma * nextvalues - vt + gamma * lam * u)
        usum_ = same * usum + u_
        n_ = same * n + 1
        rsum_ = same * gamma * rsum + rt
        pw_ = same * gamma * pw + (1 - same)
        g_ = rt + (same * gamma + (1 - same) * turn_gamma) * g
        # skip observation tokens (verl's mask handling)
        u = u_ * mt + (1 - mt) * u
        usum = usum_ * mt + (1 - mt) * usum
        n = n_ * mt + (1 - mt) * n
        rsum = rsum_ * mt + (1 - mt) * rsum
        pw = pw_ * mt + (1 - mt) * pw
        g = g_ * mt + (1 - mt) * g
        nextvalues = vt * mt + (1 - mt) * nextvalues
        next_tid = torch.where(mt > 0, tt, next_tid)
        # at a turn's first token: turn GAE
        big_g = pw * turn_gamma
        at = rsum + big_g * vt_next - vt + big_g * turn_lam * at_next
        vt_next = vt * st + (1 - st) * vt_next
        at_next = at * st + (1 - st) * at_next
        u_rev.append(u)
        g_rev.append(g)
        at_rev.append(at * st)
        um_rev.append(usum / torch.clamp(n, min=1) * st)
    us = torch.stack(u_rev[::-1], dim=1)
    returns = torch.stack(g_rev[::-1], dim=1) * mask
    at_s = torch.stack(at_rev[::-1], dim=1)
    um_s = torch.stack(um_rev[::-1], dim=1)
    # forward: broadcast A^T_k and mean u from each turn's first token
    at_cur, um_cur = zeros.clone(), zeros.clone()
    adv = []
    for t in range(L):
        st = is_start[:, t]
        at_cur = at_s[:, t] * st + (1 - st) * at_cur
        um_cur = um_s[:, t] * st + (1 - st) * um_cur
        adv.append((at_cur + beta * (us[:, t] - um_cur)) * mask[:, t])
    return torch.stack(adv, dim=1), returns


# ----------------------------------------------------------------------------- harness


def timeit(fn, reps):
    times = []
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), out


def max_diff(a, b, mask):
    sel = mask > 0
    return float((a[sel].double() - b[sel].double()).abs().max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small batches only (smoke run)")
    ap.add_argument("--sizes", type=int, nargs="*", default=None, help="batch sizes (default 128 256 512 1024)")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=7, help="repetitions of the fast calls (median reported)")
    ap.add_argument("--loop-reps", type=int, default=2, help="repetitions of the torch loops")
    args = ap.parse_args(argv)
    sizes = args.sizes or ([64, 128] if args.quick else [128, 256, 512, 1024])
    L = args.length

    import numba

    print(
        f"# advantages benchmark — {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), numba {numba.__version__} "
        f"({numba.get_num_threads()} threads)"
    )
    print(f"# γ={GAMMA} λ={LAM} γ_T={TURN_GAMMA} λ_T={TURN_LAM} β={BETA}; float32; L={L}")

    # one-off JIT compile, out of the timed region
    tiny = make_batch(4, seed=0, turns=(2, 3), turn_len=(2, 5), obs_len=(1, 3), prompt_len=(2, 3))
    t0 = time.perf_counter()
    A.gae(tiny.token_rewards, tiny.values, tiny.mask)
    t_gae_c = time.perf_counter() - t0
    t0 = time.perf_counter()
    A.mae(tiny.token_rewards, tiny.values, tiny.mask, turn_ids=tiny.turn_ids)
    t_mae_c = time.perf_counter() - t0
    print(
        f"# numba first-call compile (float32 signatures): gae {t_gae_c:.2f} s (incl. the validation kernel), "
        f"mae {t_mae_c:.2f} s more — paid once per process\n"
    )

    rows = []
    header = (
        f"{'B':>5} {'L':>5} {'estimator':<10} {'fast ms':>9} {'loop ms':>9} {'fast Mpos/s':>12} "
        f"{'loop Mpos/s':>12} {'speedup':>8} {'max|Δadv|':>10} {'max|Δret|':>10}"
    )
    print(header)
    print("-" * len(header))
    for B in sizes:
        run_size(B, L, args, rows)

    print("\nmae* = mae with turn_ids=None (derived from mask runs on every call); loop column repeats mae's.")
    print("Scaling with batch size (fast ms per 1M positions):")
    for est in ("gae", "mae"):
        per = [f"B={B}: {ms * 1e3 / (B * L / 1e6):.2f}" for (B, e, ms, _, _, _) in rows if e == est]
        print(f"  {est}: " + ", ".join(per))
    return 0


def run_size(B, L, args, rows):
    """Build one batch of B rows, time fast vs loop for gae, mae and mae with derived turn ids."""
    t0 = time.perf_counter()
    b = make_batch(B, seed=B, turns=(4, 40), turn_len=(20, 200), obs_len=(20, 300), max_len=L)
    R, V, M, T = b.token_rewards, b.values, b.mask, b.turn_ids
    if R.shape[1] < L:  # every row shorter than L (tiny B): pad to the nominal length
        pad = L - R.shape[1]
        R, V, M = (torch.nn.functional.pad(x, (0, pad)) for x in (R, V, M))
        T = torch.cat([T, T[:, -1:].expand(-1, pad)], dim=1)  # padding carries the last id
    build_s = time.perf_counter() - t0
    pos = B * R.shape[1]
    fill = float(M.sum()) / pos

    ms_fast, _, (a_f, g_f) = timeit(lambda: A.gae(R, V, M, gamma=GAMMA, lam=LAM), args.reps)
    ms_loop, _, (a_l, g_l) = timeit(lambda: gae_loop_verl(R, V, M), args.loop_reps)
    rows.append((B, "gae", ms_fast, ms_loop, max_diff(a_f, a_l, M), max_diff(g_f, g_l, M)))
    _print(rows[-1], L, pos)

    def fast_mae():
        return A.mae(R, V, M, turn_ids=T, gamma=GAMMA, lam=LAM, turn_gamma=TURN_GAMMA, turn_lam=TURN_LAM, beta=BETA)

    ms_fast, _, (a_f, g_f) = timeit(fast_mae, args.reps)
    ms_loop, _, (a_l, g_l) = timeit(lambda: mae_loop_torch(R, V, M, T), args.loop_reps)
    rows.append((B, "mae", ms_fast, ms_loop, max_diff(a_f, a_l, M), max_diff(g_f, g_l, M)))
    _print(rows[-1], L, pos)

    # mae with turn ids derived from the mask (turns.turn_ids_from_mask), for reference
    ms_d, _, (a_d, _) = timeit(
        lambda: A.mae(R, V, M, gamma=GAMMA, lam=LAM, turn_gamma=TURN_GAMMA, turn_lam=TURN_LAM, beta=BETA), args.reps
    )
    rows.append((B, "mae*", ms_d, ms_loop, max_diff(a_d, a_l, M), float("nan")))
    _print(rows[-1], L, pos)
    print(
        f"{'':>5} (batch built in {build_s:.1f} s; {fill:.0%} of positions are action tokens, "
        f"mean {b.num_turns.mean():.1f} turns/row)"
    )


def _print(row, L, pos):
    B, est, ms_fast, ms_loop, da, dg = row
    print(
        f"{B:>5} {L:>5} {est:<10} {ms_fast * 1e3:>9.1f} {ms_loop * 1e3:>9.1f} {pos / ms_fast / 1e6:>12.1f} "
        f"{pos / ms_loop / 1e6:>12.2f} {ms_loop / ms_fast:>7.1f}x {da:>10.2e} {dg:>10.2e}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
