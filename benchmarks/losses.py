"""Peak memory (and time) of the chunked logprob/entropy helpers vs a plain log_softmax; the speed
of each policy loss (metrics included) vs a plain token-PPO baseline.

    python benchmarks/losses.py            # quick: (2, 1024, 32000), forward and forward+backward
    python benchmarks/losses.py --full     # the (8, 4096, 32000) case of the issue (4.2 GB logits)
    python benchmarks/losses.py --speed    # only the policy-loss timing table

Each variant runs in its own subprocess: the child allocates the logits, resets the kernel's
peak-RSS counter (``/proc/self/clear_refs``), runs the variant once, and reports
``VmHWM − RSS before`` — the peak memory the variant adds on top of the logits, measured by the
kernel (tracemalloc does not see torch's allocations). Linux only.

Memory care: the plain entropy builds ~3 logits-sized temporaries (12.6 GB extra at the full size)
and the plain backward ~3 more; on a shared 24 GB machine the full run therefore measures only
the forward passes of plain logprob and the chunked helpers at full size, and the plain entropy
and all backward passes at a quarter of the batch (2, 4096, 32000), unless ``--all-full``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

VARIANTS = {
    # name: (helper, chunked, backward)
    "plain logprob": ("logprob", False, False),
    "chunked logprob": ("logprob", True, False),
    "plain entropy": ("entropy", False, False),
    "chunked entropy": ("entropy", True, False),
    "plain logprob fwd+bwd": ("logprob", False, True),
    "chunked logprob fwd+bwd": ("logprob", True, True),
    "plain entropy fwd+bwd": ("entropy", False, True),
    "chunked entropy fwd+bwd": ("entropy", True, True),
}


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(variant: str, B: int, L: int, V: int) -> None:
    import time

    import torch

    from mpo_viz.losses import (
        token_entropy,
        token_entropy_reference,
        token_logprobs,
        token_logprobs_reference,
    )

    torch.set_num_threads(2)
    helper, chunked, backward = VARIANTS[variant]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, L, V, generator=g)  # float32
    ids = torch.randint(0, V, (B, L), generator=g)
    if backward:
        logits.requires_grad_(True)
    # warm the allocator/kernels on a tiny slice so one-time costs do not count
    small = logits[:1, :4].detach()
    (token_logprobs(small, ids[:1, :4]) if chunked else token_logprobs_reference(small, ids[:1, :4])).sum()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _rss_kb("VmRSS")
    t0 = time.perf_counter()
    if helper == "logprob":
        out = token_logprobs(logits, ids) if chunked else token_logprobs_reference(logits, ids)
    else:
        out = token_entropy(logits) if chunked else token_entropy_reference(logits)
    if backward:
        out.sum().backward()
    dt = time.perf_counter() - t0
    peak = _rss_kb("VmHWM")
    print(
        json.dumps({"extra_mb": (peak - before) / 1024, "time_s": dt, "checksum": float(out.detach().double().sum())})
    )


def run(variant: str, B: int, L: int, V: int, fixed_mmap: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    if fixed_mmap:
        env["MALLOC_MMAP_THRESHOLD_"] = str(2**20)
    p = subprocess.run(
        [sys.executable, __file__, "--child", variant, str(B), str(L), str(V)],
        capture_output=True,
        text=True,
        env=env,
    )
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def speed(B: int = 64, L: int = 4096, reps: int = 9) -> None:
    """Forward + backward of each policy loss (with its metrics and input checks) vs a plain
    token-PPO written inline as verl does, on float32 (B, L) with turns of 200 action tokens
    separated by 100 observation tokens; median of ``reps`` runs, side by side in this process."""
    import time

    import torch

    from mpo_viz.losses import policy_loss

    torch.set_num_threads(1)  # one thread: stable numbers on a shared 2-core machine
    g = torch.Generator().manual_seed(0)
    pos = torch.arange(L)
    mask = ((pos % 300) < 200).float().expand(B, L).contiguous()
    old = -3 * torch.rand(B, L, generator=g)
    lp0 = old + 0.1 * torch.randn(B, L, generator=g)
    adv = torch.randn(B, L, generator=g)

    def baseline(lp):
        ratio = torch.exp((lp - old).clamp(-20, 20))
        loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
        return (loss * mask).sum() / mask.sum()

    variants = [("plain token PPO (baseline)", baseline)]
    for kind, kw in [
        ("token_ppo", {}),
        ("turn_ppo", {}),
        ("turn_ppo", {"ratio": "product"}),
        ("turn_ppo", {"agg": "turn-mean"}),
        ("gspo", {}),
        ("sao", {"rollout_logp": old}),
    ]:
        label = kind + "".join(f" {k}={v}" for k, v in kw.items() if k != "rollout_logp")
        variants.append((label, lambda lp, kind=kind, kw=kw: policy_loss(kind, lp, old, adv, mask, **kw)[0]))
    times = {}
    for label, fn in variants:
        ts = []
        for _ in range(reps):
            lp = lp0.clone().requires_grad_(True)
            t0 = time.perf_counter()
            fn(lp).backward()
            ts.append(time.perf_counter() - t0)
        times[label] = sorted(ts)[len(ts) // 2]
    base = times["plain token PPO (baseline)"]
    print(f"\npolicy losses, forward+backward, float32 ({B}, {L}), median of {reps}, {torch.get_num_threads()} threads")
    print(f"{'variant':<32} {'ms':>9} {'vs baseline':>12}")
    for label, t in times.items():
        print(f"{label:<32} {1000 * t:>9.1f} {t / base:>12.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the (8, 4096, 32000) case (needs ~9 GB free)")
    ap.add_argument("--all-full", action="store_true", help="every variant at full size (needs ~25 GB free)")
    ap.add_argument("--speed", action="store_true", help="only the policy-loss timing table")
    ap.add_argument("--quick", action="store_true", help="make bench: the policy-loss timing table only (as --speed)")
    ap.add_argument(
        "--fixed-mmap",
        action="store_true",
        help="run children with MALLOC_MMAP_THRESHOLD_=1MiB: freed chunks go back to the OS at once, so the "
        "number is the live peak rather than RSS including glibc's retained (reusable) heap",
    )
    ap.add_argument("--child", nargs=4, metavar=("VARIANT", "B", "L", "V"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], *map(int, a.child[1:]))
        return
    if a.speed or a.quick:
        speed()
        return
    if a.full or a.all_full:
        full, quarter = (8, 4096, 32000), (2, 4096, 32000)
        plan = [
            (full, "plain logprob"),
            (full, "chunked logprob"),
            (full, "chunked entropy"),
        ]
        rest = [v for v in VARIANTS if (full, v) not in plan]
        plan += [(full if a.all_full else quarter, v) for v in rest]
    else:
        small = (2, 1024, 32000)
        plan = [(small, v) for v in VARIANTS]

    rows = []
    for shape, v in plan:
        r = run(v, *shape, fixed_mmap=a.fixed_mmap)
        rows.append((shape, v, r))
        print(f"  measured {v} {shape}: {r}", file=sys.stderr, flush=True)

    # the plain counterpart of each chunked row, same shape, is its baseline
    res = {(s, v): r for s, v, r in rows}
    print(
        f"\n{'shape (B, L, V)':<20} {'variant':<26} {'logits MB':>10} {'peak extra MB':>14} {'vs plain':>9} "
        f"{'time s':>8}"
    )
    for shape, v, r in rows:
        logits_mb = shape[0] * shape[1] * shape[2] * 4 / 2**20
        if "error" in r:
            print(f"{str(shape):<20} {v:<26} {logits_mb:>10.0f} {'failed: ' + r['error']}")
            continue
        base = res.get((shape, v.replace("chunked", "plain")))
        ratio = f"{r['extra_mb'] / base['extra_mb']:.3f}" if base and "error" not in base and base is not r else "1"
        if base is None:
            ratio = "n/a"
        print(f"{str(shape):<20} {v:<26} {logits_mb:>10.0f} {r['extra_mb']:>14.1f} {ratio:>9} {r['time_s']:>8.2f}")
    speed()


if __name__ == "__main__":
    main()
