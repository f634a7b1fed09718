"""Benchmark: `mpo_viz.rollout.rollout` against plain `model.generate` on the same model and batch.

Run:  .venv/bin/python benchmarks/rollout.py            (every environment, batch 16 and 64)
      .venv/bin/python benchmarks/rollout.py --quick    (search only, batch 16; a smoke run)

For each environment and batch size B: one rollout of B episodes (B tasks, one sample each) with the
"1m" tiny Llama and a critic sharing nothing with it (`init="policy"`: a copy of the trunk), default
sampling (T = 1, top-p 1), `max_turn_tokens` 48. Then, in the same process, `model.generate` on the
same model with the same B prompts (each episode's first prompt, left padded), KV cache on,
`do_sample=True`, and `min_new_tokens = max_new_tokens = N` where N × B is the rollout's number of
action tokens, so both sides produce the same number of new tokens. `w/o critic` is the same ratio
with the critic's forward taken out of the rollout's time (generate has no critic): the cost of
being multi-turn alone.

Speed is *action tokens/s*: sampled tokens per second of wall time. The rollout's time is the whole
call (prefill of every observation, every decode step, environments, oracle, critic, building the
batch); generate's is the call alone. `ratio` = rollout / generate (target >= 0.8: the cost of being
multi-turn). Shares: the fraction of rollout time in the environments, tokenization (chat layout,
decoding) plus the oracle, and the critic forward. Peak memory: the process's resident set size,
sampled every 5 ms during each call, minus the size before it.

Threads: one torch thread by default (`--threads`): a 1M-parameter model is overhead-bound, and on a
shared machine OpenMP spin-waits of a second thread cost far more than they give.

A real model: `--model DIR` plays a local Hugging Face folder instead (e.g. SmolLM2-135M-Instruct
from `mpo-viz get-model smollm2-135m --out DIR`), with `--env`, `--batch` and `--critic none` to
time the policy alone; `reward` is then its zero-shot mean reward at T = 1, e.g.

      .venv/bin/python benchmarks/rollout.py --model models/smollm2-135m --env tooluse --batch 8 --threads 2 --critic none
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mpo_viz import models  # noqa: E402
from mpo_viz.envs import build_tokenizer, make_env  # noqa: E402
from mpo_viz.rollout import rollout  # noqa: E402


class PeakRSS:
    """Peak resident memory above the starting point while the block runs (a 5 ms sampler thread)."""

    def __enter__(self):
        import psutil

        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self.stop:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)
        self.mib = (self.peak - self.base) / 2**20


def bench(env_name: str, batch: int, seed: int = 0, model_dir: str | None = None, critic_init: str = "policy") -> dict:
    env = make_env(env_name)
    if model_dir:
        policy, _ = models.load(model_dir)
    else:
        policy = models.tiny_policy(build_tokenizer(env), "1m", seed=seed)
    critic = None if critic_init == "none" else models.make_critic(policy, critic_init, seed=seed)
    # warm-up (first-call allocations, lazy imports)
    rollout(policy, env, 2, critic=critic, seed=seed + 1, batch_size=2, max_turn_tokens=8)
    tm: dict = {}
    with PeakRSS() as mem_r:
        t0 = time.perf_counter()
        out = rollout(policy, env, batch, critic=critic, seed=seed, batch_size=batch, timings=tm)
        t_roll = time.perf_counter() - t0
    n_act = int(out.mask.sum())
    # generate: the same prompts, the same number of new tokens per row on average
    prompts = [list(p) for p in out.field("prompt_ids")]
    width = max(map(len, prompts))
    pad = policy.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    new = max(1, round(n_act / batch))
    torch.manual_seed(seed)
    with PeakRSS() as mem_g, torch.no_grad():
        t0 = time.perf_counter()
        policy.model.generate(ids, attention_mask=att, do_sample=True, max_new_tokens=new, min_new_tokens=new,
                              top_k=0, top_p=1.0, temperature=1.0, use_cache=True, pad_token_id=pad)
        t_gen = time.perf_counter() - t0
    total = tm["total"]
    return {
        "env": env_name, "B": batch, "tokens": n_act, "roll_tps": n_act / t_roll, "gen_tps": new * batch / t_gen,
        "roll_tps_nc": n_act / (t_roll - tm.get("critic", 0.0)),
        "env_share": tm.get("env", 0.0) / total,
        "tok_share": (tm.get("tokenize", 0.0) + tm.get("oracle", 0.0)) / total,
        "critic_share": tm.get("critic", 0.0) / total, "mem_r": mem_r.mib, "mem_g": mem_g.mib,
        "turns": float(out.num_turns.mean()), "reward": float(out.reward.mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="search only, batch 16")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--model", metavar="DIR", default=None, help="a local Hugging Face (or mpo_viz) model folder "
                                                                  "instead of the tiny '1m' Llama")
    ap.add_argument("--env", action="append", default=None, help="environment(s) to play (repeatable)")
    ap.add_argument("--batch", type=int, action="append", default=None, help="batch size(s) (repeatable)")
    ap.add_argument("--critic", choices=("policy", "shared", "fresh", "none"), default="policy",
                    help="the critic beside the policy (default policy: a copy of its trunk; none: the policy alone)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    envs = args.env or (["search"] if args.quick else ["search", "tooluse", "automation"])
    sizes = args.batch or ([16] if args.quick else [16, 64])
    what = f"model {args.model}" if args.model else "tiny Llama '1m'"
    print(f"# rollout vs model.generate — {what}, critic {args.critic}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} thread(s); load average "
          f"{os.getloadavg()[0]:.1f} at start")
    head = (f"{'env':<11}{'B':>4}{'tokens':>8}{'turns':>6}{'rollout tok/s':>15}{'generate tok/s':>16}{'ratio':>7}"
            f"{'w/o critic':>11}{'env %':>7}{'tok+oracle %':>14}{'critic %':>10}{'peak MiB r/g':>14}{'reward':>8}")
    print(head)
    print("-" * len(head))
    for name in envs:
        for b in sizes:
            r = bench(name, b, model_dir=args.model, critic_init=args.critic)
            dec = 0 if r["roll_tps"] >= 100 else 2  # a 135M model on a busy CPU makes a few tokens/s
            print(f"{r['env']:<11}{r['B']:>4}{r['tokens']:>8}{r['turns']:>6.1f}{r['roll_tps']:>15.{dec}f}"
                  f"{r['gen_tps']:>16.{dec}f}{r['roll_tps'] / r['gen_tps']:>7.2f}"
                  f"{r['roll_tps_nc'] / r['gen_tps']:>11.2f}{100 * r['env_share']:>7.1f}"
                  f"{100 * r['tok_share']:>14.1f}{100 * r['critic_share']:>10.1f}"
                  f"{r['mem_r']:>8.0f}/{r['mem_g']:<5.0f}{r['reward']:>8.3f}", flush=True)
    print(f"# load average {os.getloadavg()[0]:.1f} at the end (the machine is shared: absolute numbers move "
          "with it; the ratio is measured side by side)")


if __name__ == "__main__":
    main()
