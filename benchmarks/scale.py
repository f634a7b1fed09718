"""Benchmark: each command's wall time and peak memory as the input grows (a whole run's logs on one machine).

Run:  .venv/bin/python benchmarks/scale.py            (5.6 M and 22.5 M tokens: 88 and 352 MB of Parquet, ~10 min)
      .venv/bin/python benchmarks/scale.py --full     (adds ~80 M tokens, ~1.3 GB of Parquet, ~35 min more)
      .venv/bin/python benchmarks/scale.py --quick    (two tiny sizes: a smoke run, no verdict)
      --rounds N   run every (size, command) N times, rounds interleaved, and report the median wall time
      --threads N  fit-critic's torch threads (default 1, the command's; 2 alone on 2 cores: ~1.7x faster)
      --dir DIR    write the logs there and keep them (a later run reuses them; default: a temporary
                   folder under /tmp, deleted at the end)

The log is synthetic and shaped like a 4B agent's verl dumps: 4–12 assistant turns of 100–800 tokens,
observations of 100–2,000 tokens between them, token ids from a 151k vocabulary, critic values and
three log-prob fields, groups of 8 samples per task (about 11,000 response tokens a trajectory).
Each size is one Parquet file, generated and written part by part (flat memory) and merged row group
by row group.

Each command runs in its own process (``python -m mpo_viz.cli ...``, output discarded), one at a time,
under ``/usr/bin/time`` (wall seconds and the peak resident set size, ``%M``); where that program is
missing, a psutil poll of the child's resident memory every 20 ms (its peak; a short spike between
polls can be missed). The load average (1, 5, 15 min) is printed beside every reading. The commands:
``info``, ``validate``, ``doctor``, ``advantages -e mpo,gae,grpo -o OUT.parquet`` and ``report -o
OUT.html`` (and ``info --metadata``, which reads only the Parquet metadata); ``--commands
fit-critic`` adds ``fit-critic -o OUT.parquet --steps 2`` (not by default: its values pass runs a
critic over every token, about half an hour at 512 trajectories and 75 minutes at 2,048); ``--sizes N
...`` other trajectory counts.

Verdicts (not with --quick), per command, the largest size against the smallest: memory is flat —
peak within 1.2x, and at most 1.5 GB at 22.5 M tokens (2 GB at the --full size); time is linear —
``(t_large / t_small) / (tokens_large / tokens_small)`` at most 1.3 (each process pays ~2–3 s of
imports, so small sizes read slower per token: a ratio below 1 is that fixed cost, not a speed-up).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: the log's shape (make_rows options) and trajectories per size
SHAPE = dict(turns=(4, 12), turn_len=(100, 800), obs_len=(100, 2000), vocab_size=151_000, group_size=8)
SIZES = {"default": (512, 2048), "full": (512, 2048, 7300), "quick": (4, 16)}
PART_ROWS = 32  # trajectories per part written while generating
COMMANDS = ("info --metadata", "info", "validate", "doctor", "advantages", "report")
#: commands measured only when named in --commands: fit-critic's values pass runs the critic over every
#: token (a 1m critic over 11,000-token rows: about 2 s a row on one core here); convert
#: reads the log written as one verl step's batch (write_verl_batch: padded, 5.6x the Parquet's size)
EXTRA_COMMANDS = ("fit-critic", "convert")
#: the verdicts' bounds: peak memory at the largest / at the smallest, GB at 22.5 M and at 80 M tokens,
#: and time per token at the largest / at the smallest
MEM_RATIO, MEM_GB_DEFAULT, MEM_GB_FULL, TIME_RATIO = 1.2, 1.5, 2.0, 1.3


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def write_log(path: Path, n_traj: int, seed: int = 0) -> int:
    """The synthetic log of ``n_traj`` trajectories as one Parquet file (parts merged); its tokens."""
    import mpo_viz as mv
    from mpo_viz.data.io import merge_parts
    from mpo_viz.data.synthetic import make_rows

    parts = Path(tempfile.mkdtemp(prefix="parts-", dir=path.parent))
    tokens = 0
    try:
        for k, start in enumerate(range(0, n_traj, PART_ROWS)):
            n = min(PART_ROWS, n_traj - start)
            # a seed per part: ids "s<seed>-t..." stay unique; groups of 8 never straddle parts (32 = 4 x 8)
            b = mv.TrajectoryBatch.from_rows(
                make_rows(n, seed=seed * 100_000 + k, **SHAPE),
                {"source_framework": "benchmarks/scale.py", "gamma": 1.0},
            )
            tokens += b.num_tokens
            mv.save(b, parts / f"part-{k:05d}.parquet")
        merge_parts(parts, path)
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    return tokens


def verl_batch_path(path: Path) -> Path:
    """Where the verl step batch of log ``path`` is written (:func:`write_verl_batch`)."""
    return path.with_suffix(".verl.pt")


def write_verl_batch(path: Path, out: Path) -> None:
    """Log ``path`` as **one** verl step's batch, what ``convert --from verl`` reads: a ``torch.save``d
    dict of padded tensors as verl's ``DataProto.batch`` holds them — ``prompts`` (B, P) left-padded,
    ``responses`` (B, R) right-padded, ``attention_mask`` (B, P + R), ``response_mask`` (B, R), the
    reward on the last action token (``token_level_rewards``), ``values``, ``old_log_probs``,
    ``ref_log_prob``, ``rollout_log_probs`` — and the non-tensor ``uid`` (the group) and
    ``request_id`` (the trajectory). Read a row group at a time into arrays allocated once, so the
    writer holds the whole padded batch: B × the longest response × 52 bytes (0.5 GB on disk and in
    memory at 512 trajectories, 2.0 GB at 2,048, about 7 GB at the ``--full`` size)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import torch

    f = pq.ParquetFile(path)
    B, P, R = f.metadata.num_rows, 0, 0
    for g in range(f.num_row_groups):
        t = f.read_row_group(g, columns=["prompt_ids", "response_ids"])
        P = max(P, pc.max(pc.list_value_length(t["prompt_ids"])).as_py())
        R = max(R, pc.max(pc.list_value_length(t["response_ids"])).as_py())
    fields = {"values": "values", "old_log_probs": "old_logprobs", "ref_log_prob": "ref_logprobs"}
    fields["rollout_log_probs"] = "rollout_logprobs"
    d = {
        "prompts": torch.zeros((B, P), dtype=torch.int64),
        "responses": torch.zeros((B, R), dtype=torch.int64),
        "attention_mask": torch.zeros((B, P + R), dtype=torch.int64),
        "response_mask": torch.zeros((B, R), dtype=torch.int64),
        "token_level_rewards": torch.zeros((B, R), dtype=torch.float32),
        **{k: torch.zeros((B, R), dtype=torch.float32) for k in fields},
    }
    uid, req, i = [], [], 0
    for g in range(f.num_row_groups):
        for row in f.read_row_group(g).to_pylist():
            p, r = row["prompt_ids"], row["response_ids"]
            d["prompts"][i, P - len(p) :] = torch.tensor(p)
            d["responses"][i, : len(r)] = torch.tensor(r)
            d["attention_mask"][i, P - len(p) : P + len(r)] = 1
            m = torch.tensor(row["loss_mask"], dtype=torch.int64)
            d["response_mask"][i, : len(r)] = m
            if bool(m.any()):  # the outcome on the last action token (a row without one has no reward to place)
                d["token_level_rewards"][i, int(torch.nonzero(m)[-1])] = row["reward"]
            for k, v1 in fields.items():
                d[k][i, : len(r)] = torch.tensor(row[v1]) * m
            uid.append(row["group_id"])
            req.append(row["traj_id"])
            i += 1
    part = out.with_name(out.name + ".part")  # renamed when whole: an interrupted write is never reused
    batch = {"batch": d, "non_tensor_batch": {"uid": uid, "request_id": req}, "meta_info": {"global_steps": 1}}
    torch.save(batch, part)
    part.replace(out)


def command_line(cmd: str, path: Path, out: Path, threads: int = 1) -> list[str]:
    """The child's argv for ``cmd`` on ``path`` (outputs under ``out``; ``threads``: fit-critic's --threads)."""
    base = [sys.executable, "-m", "mpo_viz.cli"]
    if cmd == "advantages":
        return base + ["advantages", str(path), "-e", "mpo,gae,grpo", "-o", str(out / "adv.parquet"), "--no-progress"]
    if cmd == "report":
        return base + ["report", str(path), "-o", str(out / "report.html"), "--no-progress"]
    if cmd == "convert":  # the log as one verl step's batch, converted back to trajectory/v1
        return base + ["convert", str(verl_batch_path(path)), "--from", "verl", "-o", str(out / "conv.parquet")]
    if cmd == "fit-critic":  # 2 fit steps: the survey, the sample, the values of every row are what is measured
        extra = ["--threads", str(threads)] if threads != 1 else []  # 1 is the command's default
        return base + ["fit-critic", str(path), "-o", str(out / "fit.parquet"), "--steps", "2", "-q", *extra]
    return base + cmd.split() + [str(path)]


def measure(argv: list[str]) -> tuple[float, float, int]:
    """``(wall s, peak RSS GB, exit code)`` of one child process."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    if Path("/usr/bin/time").exists():
        r = subprocess.run(
            ["/usr/bin/time", "-f", "@@SCALE %e %M %x", *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = next((ln for ln in r.stderr.splitlines() if ln.startswith("@@SCALE ")), None)
        if line is None or r.returncode not in (0, 1):
            raise RuntimeError(f"{' '.join(argv)} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        wall, kb, code = line.split()[1:4]
        return float(wall), int(kb) / 2**20, int(code)
    import psutil

    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc, peak = psutil.Process(p.pid), 0
    while p.poll() is None:
        try:
            peak = max(peak, proc.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.02)
    err = p.stderr.read() if p.stderr else ""
    if p.wait() not in (0, 1):
        raise RuntimeError(f"{' '.join(argv)} failed (exit {p.returncode}):\n{err[-3000:]}")
    return time.perf_counter() - t0, peak / 2**30, p.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="two tiny sizes (a smoke run, no verdict)")
    mode.add_argument("--full", action="store_true", help="add the ~80 M-token size (~1.3 GB of Parquet)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of every (size, command), interleaved; median wall")
    ap.add_argument(
        "--dir",
        default=None,
        help="where to write the logs (kept, and reused by the next run with "
        "the same --dir); default a temporary folder, deleted",
    )
    ap.add_argument(
        "--commands",
        default=",".join(COMMANDS),
        help=f"comma-separated, from: {', '.join(COMMANDS + EXTRA_COMMANDS)} "
        f"(default: all but {', '.join(EXTRA_COMMANDS)})",
    )
    ap.add_argument("--sizes", type=int, nargs="*", default=None, help="trajectories per size (default: the mode's)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="fit-critic's torch threads (its --threads; default 1, the command's own default; 2 on a quiet "
        "2-core machine ran its values pass 1.8x faster)",
    )
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error(f"--threads: expected an integer >= 1, found {args.threads}")
    sizes = args.sizes or SIZES["quick" if args.quick else "full" if args.full else "default"]
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = [c for c in commands if c not in COMMANDS + EXTRA_COMMANDS]
    if unknown:
        ap.error(f"--commands: expected some of {', '.join(COMMANDS + EXTRA_COMMANDS)}, found {', '.join(unknown)}")
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="mpo_viz_bench_scale_", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"# scale benchmark — {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}; logs in {work}; load average {load_avg()}"
        + (f"; fit-critic on {args.threads} thread(s)" if "fit-critic" in commands else "")
    )
    try:
        logs = []
        for n in sizes:
            path, count = work / f"log-{n}.parquet", work / f"log-{n}.tokens"
            t = time.perf_counter()
            if args.dir and path.exists() and count.exists():  # a kept log of this size: reuse it
                tokens = int(count.read_text())
            else:
                tokens = write_log(path, n)
                count.write_text(str(tokens))
                verl_batch_path(path).unlink(missing_ok=True)  # a batch of the log before
            if "convert" in commands and not verl_batch_path(path).exists():
                write_verl_batch(path, verl_batch_path(path))
            logs.append((n, tokens, path))
            print(
                f"# wrote {path.name}: {n:,} trajectories, {tokens / 1e6:.1f} M response tokens, "
                f"{path.stat().st_size / 1e6:,.0f} MB in {time.perf_counter() - t:.0f}s (load {load_avg()})",
                flush=True,
            )
        results = run_all(logs, commands, args.rounds, work, args.threads)
        verdicts(results, logs, commands, quick=args.quick)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def run_all(logs, commands, rounds: int, work: Path, threads: int = 1) -> dict:
    """Every (size, command) ``rounds`` times, round by round; prints a line per reading, returns
    ``{(n, cmd): (median wall, max peak GB)}``."""
    head = (
        f"{'traj':>6} {'tokens':>9} {'MB':>6}  {'command':<16} {'wall s':>7} {'Mtok/s':>7} {'peak GB':>8}  "
        "load (1, 5, 15 min)"
    )
    print(head)
    print("-" * len(head))
    seen: dict = {}
    for _ in range(rounds):
        for cmd in commands:
            for n, tokens, path in logs:
                out = work / "out"
                out.mkdir(exist_ok=True)
                load = load_avg()
                wall, gb, _ = measure(command_line(cmd, path, out, threads))
                shutil.rmtree(out, ignore_errors=True)
                seen.setdefault((n, cmd), []).append((wall, gb))
                print(
                    f"{n:>6} {tokens / 1e6:>7.2f} M {path.stat().st_size / 1e6:>6.0f}  {cmd:<16} {wall:>7.1f} "
                    f"{tokens / wall / 1e6:>7.2f} {gb:>8.2f}  {load}",
                    flush=True,
                )
    return {k: (statistics.median(w for w, _ in v), max(g for _, g in v)) for k, v in seen.items()}


def verdicts(results: dict, logs, commands, *, quick: bool) -> None:
    (n0, tok0, _), (n1, tok1, _) = logs[0], logs[-1]
    print(
        f"\n# per command, {n1:,} trajectories ({tok1 / 1e6:.1f} M tokens) against {n0:,} ({tok0 / 1e6:.1f} M): "
        f"memory ratio, GB at each size, time per token ratio (load now {load_avg()})"
    )
    mid = next((tok for n, tok, _ in logs if n == 2048), None)
    has_full = any(n > 2048 for n, _, _ in logs)  # the sizes measured say which bound applies
    for cmd in commands:
        w0, g0 = results[(n0, cmd)]
        w1, g1 = results[(n1, cmd)]
        gbs = "  ".join(f"{results[(n, cmd)][1]:.2f}" for n, _, _ in logs)
        mem_ratio = g1 / g0
        time_ratio = (w1 / w0) / (tok1 / tok0)
        line = f"{cmd:<16} memory {mem_ratio:.2f}x ({gbs} GB)  time/token {time_ratio:.2f}x"
        if not quick:
            cap_ok = all(results[(n, cmd)][1] <= (MEM_GB_FULL if n > 2048 else MEM_GB_DEFAULT) for n, _, _ in logs)
            ok = mem_ratio <= MEM_RATIO and cap_ok and time_ratio <= TIME_RATIO
            line += ("  met" if ok else "  NOT met") + (
                f" (memory <= {MEM_RATIO}x and <= {MEM_GB_DEFAULT} GB"
                + (f" / {MEM_GB_FULL} GB above 2,048 trajectories" if has_full else "")
                + f", time <= {TIME_RATIO}x)"
            )
        print(line)
    if mid is None and not quick:
        print("# (no 2,048-trajectory size measured)")
    if len(logs) == 1:
        print("# one size: the ratios compare it with itself; its peak is the reading")
    if quick:
        print("# --quick: tiny sizes, a smoke run; the verdict needs the default or --full sizes")


if __name__ == "__main__":
    sys.exit(main())
