"""Benchmark: what `whiten=True` costs in `gae` and `mae`, and against verl's whitened GAE.

Run:  .venv/bin/python benchmarks/whiten.py                    (B = 128 and 512, L = 8192)
      .venv/bin/python benchmarks/whiten.py --quick            (B = 32, 128; a smoke run)
      make venv-verl && .venv-verl/bin/python benchmarks/whiten.py
                                                               (adds the verl column)

The verl column times verl 0.9.1's `compute_gae_advantage_return` (`verl.trainer.ppo.core_algos`),
which always whitens (`verl_F.masked_whiten`), on the same tensors. It runs only where `verl`
imports: `make venv-verl` builds `.venv-verl` (verl 0.9.1 and its pins, CPU torch, this checkout
installed editable); elsewhere the table says "verl not importable".

Batches come from `mpo_viz.data.synthetic.make_batch` shaped like agent rollouts (as
`benchmarks/advantages.py`): assistant spans 20–200 tokens, tool spans 20–300, 4–40 turns cut at
L tokens, float32 `rewards`, `values`, `mask`, `turn_ids`.

Columns, per estimator and batch size (all in this one process, on the same inputs):
* `plain ms`: the public call with `whiten=False`, the median over the rounds; `white ms`: with
  `whiten=True` (the kernel writes per-row moments on the way, and gae its runs of action tokens;
  one parallel pass rewrites those runs, or mae's rows whole), the median; `ratio` — **the verdict** (target ≤ 1.2) —
  the median over the rounds of white / plain within a round (the two calls back to back, so under
  the same load: A B A B A B, the order alternating pair by pair, the fastest of each side in the
  round): what a user meets; `best
  ratio`: best against best (the floor, on a quiet moment); `cpu ratio`: the paired median on the
  process's CPU time (`time.process_time`, all threads), which a busy machine disturbs less than the
  wall time (with `--threads 1` it is the single thread's time).
* `numpy ms` (best): `whiten=False` followed by the numpy whitening the estimators used before
  (`_inputs.whiten_reference` on a copy): what `whiten=True` cost before the fusion.
* `verl ms`: verl's GAE with its whitening (gae only); `verl/white` = verl ms / white ms; and
  `max|Δ|`, the largest difference between verl's and our whitened advantages on action tokens
  (verl's `masked_whiten` leaves the other positions non-zero; we write 0 there).

Timing: N rounds (`--reps`, default 21; the verl loop `--verl-reps`), the variants interleaved
within each round (plain and whitened as pairs, `--inner` 3 of them, their order alternating, the
fastest of each side kept) so that each round sees one machine: load drifting between rounds moves
both sides of a pair, not their ratio, and one preempted call does not decide a round. Timing each side
in a block of its own instead puts that drift into the ratio (1.09x, 1.84x and 7.92x for the same
code under ordinary load). The verdict is the median of the rounds' paired ratios, the best-of
columns beside it; the load average is printed before and after, and on each verdict line. Numba
compiles each kernel on its first call; that happens on a tiny batch before anything is timed.
`--threads N` sets numba's and torch's threads (default: theirs, one per CPU). On a shared machine
one thread gives the steadier numbers: a parallel kernel waits for its slowest thread, and with
`whiten=True` there are two parallel passes to wait for.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from functools import partial

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mpo_viz.advantages as A  # noqa: E402
from mpo_viz.advantages._inputs import whiten_reference  # noqa: E402
from mpo_viz.data.synthetic import make_batch  # noqa: E402

try:  # only in the verl environment (make venv-verl)
    import verl  # noqa: E402
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return  # noqa: E402
except Exception as exc:  # any import failure means: no verl column
    verl = None
    compute_gae_advantage_return = None
    VERL_MISSING = f"verl not importable ({type(exc).__name__}); run with .venv-verl/bin/python (make venv-verl)"
else:
    VERL_MISSING = ""

GAMMA, LAM = 1.0, 0.95
#: the verdict's target: whiten=True within this factor of whiten=False at the median
TARGET = 1.2


def best_of(fns, reps, inner=1):
    """Interleaved best-of-``reps`` wall seconds and process CPU seconds of each callable, each
    one's last output, and every round's wall and CPU seconds (for the paired medians):
    ``(wall, cpu, outs, rounds, cpu_rounds)``.

    A round runs the callables one after the other ``inner`` times (A B A B … for two), their order
    alternating each time (A B, then B A), and keeps each one's fastest: the first two form a pair
    timed under the same load, neither always second (on a warmer cache, or right after the
    other's allocations), and a call the OS preempted (milliseconds on a busy machine, against
    calls of 3–15 ms) does not decide its round."""
    wall = [float("inf")] * len(fns)
    cpu = [float("inf")] * len(fns)
    outs = [None] * len(fns)
    rounds, cpu_rounds = [], []
    k = 0
    for _ in range(reps):
        row, crow = [float("inf")] * len(fns), [float("inf")] * len(fns)
        for _ in range(inner):
            order = list(range(len(fns)))
            if k % 2 and len(fns) >= 2:
                order[0], order[1] = 1, 0
            k += 1
            for j in order:
                fn = fns[j]
                c0, t0 = time.process_time(), time.perf_counter()
                outs[j] = fn()
                row[j] = min(row[j], time.perf_counter() - t0)
                crow[j] = min(crow[j], time.process_time() - c0)
        for j in range(len(fns)):
            wall[j] = min(wall[j], row[j])
            cpu[j] = min(cpu[j], crow[j])
        rounds.append(row)
        cpu_rounds.append(crow)
    return wall, cpu, outs, rounds, cpu_rounds


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def make(B, L):
    b = make_batch(B, seed=B, turns=(4, 40), turn_len=(20, 200), obs_len=(20, 300), max_len=L)
    R, V, M, T = b.token_rewards, b.values, b.mask, b.turn_ids
    if R.shape[1] < L:  # every row shorter than L: pad to the nominal length
        pad = L - R.shape[1]
        R, V, M = (torch.nn.functional.pad(x, (0, pad)) for x in (R, V, M))
        T = torch.cat([T, T[:, -1:].expand(-1, pad)], dim=1)
    return R, V, M, T


def numpy_whitened(call, M):
    """The path before the fusion: the plain estimator, then numpy whitening of a copy."""
    adv, _ = call(False)
    return whiten_reference(adv.numpy().copy(), M.numpy())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small batches only (smoke run)")
    ap.add_argument("--sizes", type=int, nargs="*", default=None, help="batch sizes (default 128 512)")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=21, help="paired rounds of the fast calls (the verdict: their median)")
    ap.add_argument("--inner", type=int, default=3, help="A B pairs within a round, the fastest of each side kept")
    ap.add_argument("--verl-reps", type=int, default=2, help="rounds of verl's per-position loop")
    ap.add_argument("--threads", type=int, default=0, help="numba and torch threads (default 0: leave theirs)")
    args = ap.parse_args(argv)
    sizes = args.sizes or ([32, 128] if args.quick else [128, 512])
    L = args.length

    import numba

    if args.threads:
        numba.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    print(
        f"# whitening benchmark — {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), numba {numba.__version__} "
        f"({numba.get_num_threads()} threads); verl {verl.__version__ if verl else '—'}"
    )
    print(
        f"# gae γ={GAMMA} λ={LAM}; mae defaults (γ=1 λ=0.95 γ_T=1 λ_T=0.9 β=1); float32; L={L}; "
        f"{args.reps} rounds: the verdict is the median paired ratio (verl best of {args.verl_reps})"
    )
    tiny = make_batch(4, seed=0, turns=(2, 3), turn_len=(2, 5), obs_len=(1, 3), prompt_len=(2, 3))
    for w in (False, True):  # numba compiles here, untimed
        A.gae(tiny.token_rewards, tiny.values, tiny.mask, whiten=w)
        A.mae(tiny.token_rewards, tiny.values, tiny.mask, turn_ids=tiny.turn_ids, whiten=w)
    print(f"# before: {load()}")
    header = (
        f"{'B':>5} {'L':>5} {'estimator':<9} {'plain ms':>9} {'white ms':>9} {'ratio':>6} {'best ratio':>10} "
        f"{'cpu ratio':>9} "
        f"{'numpy ms':>9} {'ratio':>6} {'verl ms':>9} {'verl/white':>10} {'max|Δ|':>9}"
    )
    print(header)
    print("-" * len(header))
    for B in sizes:
        run_size(B, L, args)
    print(f"# after: {load()}")
    if VERL_MISSING:
        print(f"verl column: {VERL_MISSING}")
    return 0


def run_size(B, L, args):
    """One batch of B rows: the table's gae and mae lines."""
    R, V, M, T = make(B, L)
    act = M.numpy() != 0

    def gae(w):
        return A.gae(R, V, M, gamma=GAMMA, lam=LAM, whiten=w)

    def mae(w):
        return A.mae(R, V, M, turn_ids=T, whiten=w)

    verdicts = []
    for name, call in (("gae", gae), ("mae", mae)):
        (t0, t1, tn), _, (_, white, old), rounds, cpu_rounds = best_of(
            [partial(call, False), partial(call, True), partial(numpy_whitened, call, M)], args.reps, args.inner
        )
        paired = statistics.median(r[1] / r[0] for r in rounds)
        cpu_paired = statistics.median(r[1] / r[0] for r in cpu_rounds)
        med0, med1 = (statistics.median(r[j] for r in rounds) for j in (0, 1))
        verdicts.append(f"{name} {paired:.2f}x ({'met' if paired <= TARGET else 'NOT met'})")
        assert np.allclose(white[0].numpy(), old, rtol=2e-5, atol=2e-5)  # the same numbers as before
        verl_cols = f"{'—':>9} {'—':>10} {'—':>9}"
        if name == "gae" and compute_gae_advantage_return is not None:
            (tv,), _, ((va, _),), _, _ = best_of(
                [partial(compute_gae_advantage_return, R, V, M, GAMMA, LAM)], args.verl_reps
            )
            d = float(np.abs(va.numpy()[act] - white[0].numpy()[act]).max())
            verl_cols = f"{tv * 1e3:>9.0f} {tv / t1:>9.0f}x {d:>9.1e}"
        print(
            f"{B:>5} {L:>5} {name:<9} {med0 * 1e3:>9.1f} {med1 * 1e3:>9.1f} {paired:>5.2f}x {t1 / t0:>9.2f}x "
            f"{cpu_paired:>8.2f}x "
            f"{tn * 1e3:>9.1f} {tn / t0:>5.2f}x {verl_cols}",
            flush=True,
        )
    print(f"{'':>5} ({act.mean():.0%} of the {B * L:,} positions are action tokens)")
    print(
        f"{'':>5} verdict at B = {B}, median of {args.reps} paired rounds (target <= {TARGET:g}x): "
        f"{', '.join(verdicts)}; {load()}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
