"""I/O benchmark (issue 2): write and load a 1M-token batch as Parquet and as JSONL; peak memory
of ``mv.scan`` over files several times larger than its chunk (it should stay flat in file size).

Run: ``.venv/bin/python benchmarks/io.py`` (about a minute). Prints two tables.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import mpo_viz as mv

TOKENS = 1_000_000


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def make(tokens: int, seed: int):
    # agent-shaped rows: 2-6 turns of 20-200 tokens, 20-300 token tool replies (~930 tokens a row)
    probe = mv.synthetic.make_batch(64, seed=seed)
    n = max(1, round(tokens / (probe.num_tokens / 64)))
    return mv.synthetic.make_batch(n, seed=seed)


SCAN_CHILD = r"""
import sys, time, tracemalloc, psutil
import pyarrow as pa
import mpo_viz as mv
path, max_tokens = sys.argv[1], int(sys.argv[2])
proc = psutil.Process()
base = peak = proc.memory_info().rss
tracemalloc.start()  # numpy and Python objects: the data scan actually holds
t = time.perf_counter(); n = 0
for b in mv.scan(path, max_tokens=max_tokens):
    n += b.num_tokens
    _ = b.mask, b.values, b.token_rewards  # touch the padded views as a consumer would
    peak = max(peak, proc.memory_info().rss)
dt = time.perf_counter() - t
held = tracemalloc.get_traced_memory()[1] + pa.default_memory_pool().max_memory()
print(n, dt, base / 2**20, peak / 2**20, held / 2**20)
"""


def main() -> None:
    quick = "--quick" in sys.argv[1:]  # make bench: a 200k-token batch and scans of 1x and 2x (not a verdict)
    tokens, mults = (200_000, (1, 2)) if quick else (TOKENS, (1, 4, 10))
    tmp = Path(tempfile.mkdtemp(prefix="mpo_viz_bench_io_"))
    batch = make(tokens, 0)
    n_tok = batch.num_tokens
    print(f"batch: {len(batch)} trajectories, {n_tok:,} response tokens, fields: {sorted(batch.token_fields)}\n")
    print(f"{'format':<8} {'op':<6} {'seconds':>8} {'MB':>8} {'MB/s':>8} {'Mtok/s':>8}")
    for suffix in (".parquet", ".jsonl"):
        path = tmp / f"b{suffix}"
        _, tw = timed(partial(mv.save, batch, path))
        mb = os.path.getsize(path) / 1e6
        loaded, tr = timed(partial(mv.load, path))
        assert loaded.num_tokens == n_tok
        for op, t in (("write", tw), ("load", tr)):
            print(f"{suffix[1:]:<8} {op:<6} {t:>8.2f} {mb:>8.1f} {mb / t:>8.1f} {n_tok / t / 1e6:>8.2f}")
    del batch, loaded

    print("\nmv.scan peak memory (child process, max_tokens=250,000):")
    print(
        f"{'file tokens':>12} {'file MB':>8} {'seconds':>8} {'Mtok/s':>8} {'RSS after import MB':>20} "
        f"{'peak RSS MB':>12} {'RSS growth MB':>14} {'peak held MB':>13}"
    )
    for mult in mults:
        path = tmp / f"scan{mult}.parquet"
        parts = [make(tokens, seed) for seed in range(mult)]
        for i, p in enumerate(parts):
            mv.save(p, tmp / f"part{mult}_{i:02d}.parquet")
        del parts
        # one file of mult x 1M tokens, written from the parts (streamed through scan itself)
        big = mv.TrajectoryBatch.concat([mv.load(tmp / f"part{mult}_{i:02d}.parquet") for i in range(mult)])
        mv.save(big, path)
        n_big = big.num_tokens
        del big
        out = subprocess.run(
            [sys.executable, "-c", SCAN_CHILD, str(path), "250000"], capture_output=True, text=True, check=True
        )
        n, dt, base, peak, held = out.stdout.split()
        assert int(n) == n_big
        print(
            f"{n_big:>12,} {os.path.getsize(path) / 1e6:>8.1f} {float(dt):>8.2f} {n_big / float(dt) / 1e6:>8.2f} "
            f"{float(base):>20.0f} {float(peak):>12.0f} {float(peak) - float(base):>14.0f} {float(held):>13.0f}"
        )
    print(
        "\npeak held = peak of numpy/Python allocations (tracemalloc) + Arrow's pool: the data scan keeps"
        "\nalive at once; it should not grow with the file. RSS also counts memory the allocators keep"
        "\ncached after freeing (tracemalloc slows the scan; the seconds column includes that)."
    )


if __name__ == "__main__":
    main()
