"""Benchmark: the Monte-Carlo truth's branch rollouts, seconds per base episode at M = 8 (turn level),
and with ``--tokens`` seconds per measured token at M = 16 (the token truth inside turns).

Run:  .venv/bin/python benchmarks/truth.py                 (both cells, 3 alternating repeats)
      .venv/bin/python benchmarks/truth.py --repeats 5 --episodes 8
      .venv/bin/python benchmarks/truth.py --tokens         (the token truth: 4 base episodes, M = 16)
      .venv/bin/python benchmarks/truth.py --tokens --snapshot 64   (and one whole 64-episode snapshot, timed)

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

**--tokens.** On the same start (3–4 expert turns), the tokens of `--episodes` base episodes at the
`uncertain` defaults (1 − π > 0.01, at most 4 a turn, 1 control a turn) are each measured with M = 16
continuation pairs (`mpo_viz.rollout.inturn.model_token_returns`, estimator `pi`), three ways,
interleaved: (a) **shared** (each turn fed once, its row cut back to each continuation's prefix), (b)
**re-fed** (every continuation feeds its own prefix), (c) the **floor** (a plain `rollout` timed and
scaled to the continuation tokens (a) decoded). Columns: seconds per measured token for each, `(a)/(c)`
(target ≤ 1.3), `(a)/(b)`, and the projection to a 64-episode snapshot (measured tokens per episode ×
64 × (a)). `--snapshot N` also runs `mc_token_truth` on N fresh episodes once and prints its wall time
(target for 64: ≤ 30 minutes on one core).
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
from mpo_viz.rollout.inturn import model_token_returns  # noqa: E402
from mpo_viz.rollout.plan import RolloutConfig  # noqa: E402
from mpo_viz.rollout.positions import choose_positions  # noqa: E402
from mpo_viz.rollout.replay import replay  # noqa: E402
from mpo_viz.rollout.token_truth import mc_token_truth  # noqa: E402

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


def token_cell(policy, episodes: int, m: int, batch_size: int, repeats: int, seed: int) -> dict:
    """``--tokens``: seconds per measured token, (a) shared, (b) re-fed, (c) the floor (module docstring)."""
    env = make_env("automation", difficulty=(3, 4))
    base = rollout(policy, env, episodes, group_size=1, seed=seed, progress=False)
    rows = replay(base, policy.layout)
    items = [(rows[p.row][p.turn], p.t) for p in choose_positions(base, "uncertain", seed=seed)]
    gen = base.meta["generator"]
    cfg = RolloutConfig(
        batch_size=batch_size, max_turn_tokens=gen["max_turn_tokens"], max_total_tokens=gen["max_total_tokens"]
    )
    act_per_ep = float(base.mask.sum()) / len(base)
    times: dict[str, list] = {"a": [], "b": [], "c": []}
    tokens = 0
    for r in range(repeats):  # the order alternates (a b c, c b a, ...): a load that drifts favours none
        for key in ("a", "b", "c") if r % 2 == 0 else ("c", "b", "a"):
            if key == "c":
                # the floor decodes as many tokens as (a) did (round 0 measures (a) first)
                n_floor = max(batch_size, math.ceil(tokens / act_per_ep))
                t0 = time.perf_counter()
                fl = rollout(policy, env, n_floor, seed=1000 + r, batch_size=batch_size, progress=False, oracle=None)
                times["c"].append((time.perf_counter() - t0) * tokens / float(fl.mask.sum()))
                continue
            tm: dict = {}
            t0 = time.perf_counter()
            model_token_returns(policy, items, m, seed=seed + r, cfg=cfg, share_prefix=key == "a", timings=tm)
            times[key].append(time.perf_counter() - t0)
            if key == "a":
                tokens = tm["tokens"]
    med = {k: float(np.median(v)) for k, v in times.items()}
    n = len(items)
    return {
        "positions": n,
        "per_episode": n / episodes,
        "continuations": 2 * m * n,
        "tokens": tokens,
        **{f"{k}_s_per_token": v / n for k, v in med.items()},
        "a_over_c": med["a"] / med["c"],
        "a_over_b": med["a"] / med["b"],
        "snapshot_min": 64 * n / episodes * med["a"] / n / 60,
    }


def snapshot(policy, episodes: int, m: int, batch_size: int, seed: int) -> dict:
    """``--snapshot N``: ``mc_token_truth`` at the uncertain defaults on N fresh episodes, timed once."""
    base = rollout(policy, make_env("automation", difficulty=(3, 4)), episodes, group_size=4, seed=seed, progress=False)
    tm: dict = {}
    t0 = time.perf_counter()
    out = mc_token_truth(base, policy, m=m, seed=seed, batch_size=batch_size, timings=tm)
    return {
        "episodes": episodes,
        "measured": out.meta["mc_truth"]["tokens"]["measured"],
        "minutes": (time.perf_counter() - t0) / 60,
        "tokens": tm.get("tokens", 0),
    }


def main_tokens(args) -> int:
    torch.set_num_threads(1)
    policy, _ = models.load(START)
    print(
        f"token truth on the shipped automation start (3–4 turns), M = {args.m}, uncertain defaults, "
        f"{args.episodes} base episodes, batch {args.batch_size}, median of {args.repeats} rounds, one torch thread"
    )
    print(
        "| measured tokens (per episode) | continuations | cont. tokens | (a) shared s/token | (b) re-fed s/token "
        "| (c) floor s/token | (a)/(c) | (a)/(b) | 64 episodes (projected) | load before → after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    before = _load()
    r = token_cell(policy, args.episodes, args.m, args.batch_size, args.repeats, args.seed)
    print(
        f"| {r['positions']} ({r['per_episode']:.1f}) | {r['continuations']} | {r['tokens']} | "
        f"{r['a_s_per_token']:.3f} | {r['b_s_per_token']:.3f} | {r['c_s_per_token']:.3f} | **{r['a_over_c']:.2f}** | "
        f"{r['a_over_b']:.2f} | {r['snapshot_min']:.1f} min | {before:.1f} → {_load():.1f} |",
        flush=True,
    )
    if args.snapshot:
        before = _load()
        s = snapshot(policy, args.snapshot, args.m, args.batch_size, args.seed)
        print(
            f"\nmc_token_truth on {s['episodes']} episodes: {s['measured']} tokens measured, "
            f"{s['tokens']} continuation tokens, **{s['minutes']:.1f} minutes** (load {before:.1f} → {_load():.1f})",
            flush=True,
        )
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=8, help="base episodes per cell")
    ap.add_argument(
        "-M",
        dest="m",
        type=int,
        default=None,
        help="continuations per turn state (8), or continuation pairs per token with --tokens (16)",
    )
    ap.add_argument("--tokens", action="store_true", help="the token truth inside turns: seconds per measured token")
    ap.add_argument("--snapshot", type=int, default=0, help="--tokens: also time mc_token_truth on N fresh episodes")
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
    if args.tokens:
        args.m = args.m or 16
        if "--episodes" not in (argv if argv is not None else sys.argv[1:]):
            args.episodes = 4
        if args.quick:
            args.episodes, args.repeats, args.m = 1, 1, 4
        return main_tokens(args)
    args.m = args.m or 8
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
