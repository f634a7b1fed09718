"""Benchmark: the Monte-Carlo truth's branch rollouts, seconds per base episode at M = 8.

Run:  .venv/bin/python benchmarks/truth.py                 (both cells, 3 alternating repeats)
      .venv/bin/python benchmarks/truth.py --repeats 5 --episodes 8

On the shipped automation start (`trajectories/starts/automation`), for base episodes at 3–4 and at
5–6 expert turns, every turn state of every base episode is continued M times
(`mpo_viz.rollout.branch.branch_returns`), three ways, side by side in one process:

* (a) **shared**: each boundary's prefix fed once, its cache rows duplicated M times (the default);
* (b) **re-fed**: every continuation feeds its own copy of the prefix (`share_prefix=False`);
* (c) **floor**: a plain `rollout` of fresh episodes (the same batch size), timed and scaled to the
  number of continuation action tokens (a) decoded — what decoding those tokens costs at all.

Columns: seconds per base episode for each, `(a)/(c)` (target ≤ 1.3) and `(a)/(b)`, the
continuations and their action tokens, and the load (1-minute average) before and after. Each cell
is the median over `--repeats` rounds of (a), (b), (c) in turn; one torch thread. Both (a) and (b)
give the same returns bit for bit (tested in tests/rollout/test_truth.py).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mpo_viz import models  # noqa: E402
from mpo_viz.envs import make_env  # noqa: E402
from mpo_viz.rollout import rollout  # noqa: E402
from mpo_viz.rollout.branch import branch_returns  # noqa: E402
from mpo_viz.rollout.plan import RolloutConfig  # noqa: E402
from mpo_viz.rollout.replay import replay  # noqa: E402

START = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trajectories", "starts", "automation")
CELLS = {"3-4 turns": (3, 4), "5-6 turns": (5, 6)}


def _load() -> float:
    return os.getloadavg()[0]


def one_cell(policy, difficulty, episodes: int, m: int, batch_size: int, repeats: int, seed: int) -> dict:
    env = make_env("automation", difficulty=difficulty)
    base = rollout(policy, env, episodes, group_size=1, seed=seed, progress=False)
    states = [s for r in replay(base, policy.layout) for s in r]
    gen = base.meta["generator"]
    cfg = RolloutConfig(
        batch_size=batch_size, max_turn_tokens=gen["max_turn_tokens"], max_total_tokens=gen["max_total_tokens"]
    )
    act_per_ep = float(base.mask.sum()) / len(base)
    times: dict[str, list] = {"a": [], "b": [], "c": []}
    tokens = 0
    for r in range(repeats):
        for share, key in ((True, "a"), (False, "b")):
            tm: dict = {}
            t0 = time.perf_counter()
            branch_returns(policy, states, m, seed=seed + r, cfg=cfg, share_prefix=share, timings=tm)
            times[key].append(time.perf_counter() - t0)
            tokens = tm["tokens"]
        n_floor = max(batch_size, math.ceil(tokens / act_per_ep))
        t0 = time.perf_counter()
        fl = rollout(policy, env, n_floor, seed=1000 + r, batch_size=batch_size, progress=False, oracle=None)
        dt = time.perf_counter() - t0
        times["c"].append(dt * tokens / float(fl.mask.sum()))
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {
        "boundaries": len(states),
        "continuations": len(states) * m,
        "tokens": tokens,
        **{f"{k}_s_per_ep": v / episodes for k, v in med.items()},
        "a_over_c": med["a"] / med["c"],
        "a_over_b": med["a"] / med["b"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=8, help="base episodes per cell")
    ap.add_argument("-M", dest="m", type=int, default=8, help="continuations per turn state")
    ap.add_argument("--batch-size", type=int, default=64, help="continuation rows decoded together")
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds per cell (the median is reported)")
    ap.add_argument("--cells", nargs="*", default=list(CELLS), choices=list(CELLS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a few seconds' smoke run (make bench): 2 base episodes, 1 round, the first cell",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.episodes, args.repeats, args.cells = 2, 1, args.cells[:1]
    torch.set_num_threads(1)
    policy, _ = models.load(START)
    print(
        f"branch rollouts on the shipped automation start, M = {args.m}, {args.episodes} base episodes per cell, "
        f"batch {args.batch_size}, median of {args.repeats} rounds, one torch thread"
    )
    print(
        "| cell | turn states | continuations | cont. tokens | (a) shared s/ep | (b) re-fed s/ep | (c) floor s/ep "
        "| (a)/(c) | (a)/(b) | load before → after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.cells:
        before = _load()
        r = one_cell(policy, CELLS[name], args.episodes, args.m, args.batch_size, args.repeats, args.seed)
        print(
            f"| {name} | {r['boundaries']} | {r['continuations']} | {r['tokens']} | {r['a_s_per_ep']:.2f} | "
            f"{r['b_s_per_ep']:.2f} | {r['c_s_per_ep']:.2f} | **{r['a_over_c']:.2f}** | {r['a_over_b']:.2f} | "
            f"{before:.1f} → {_load():.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
