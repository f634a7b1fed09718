"""Benchmark: `mpo_viz.rollout.rollout` against plain `model.generate` on the same model and batch.

Run:  .venv/bin/python benchmarks/rollout.py            (every environment, batch 16 and 64)
      .venv/bin/python benchmarks/rollout.py --quick    (search only, batch 16; a smoke run)
      .venv/bin/python benchmarks/rollout.py --repeats 3   (each row the median of 3 pairs)
      .venv/bin/python benchmarks/rollout.py --model-config smollm2-135m      (batch 8 and 16)
      .venv/bin/python benchmarks/rollout.py --model-config path/to/hf_config_folder
      .venv/bin/python benchmarks/rollout.py --model models/smollm2-135m --envs tooluse --sizes 8 \
          --threads 2 --critic none

`--model-config NAME|DIR` runs the same table on a randomly initialised model of a real small LM's
shape instead of the tiny one, so the rollout's overhead at real vocabulary and depth is known.
Nothing is downloaded: NAME is one of `MODEL_CONFIGS` below (`smollm2-135m`: the Llama of
HuggingFaceTB/SmolLM2-135M's config.json — hidden 576, 30 layers, 9 heads, 3 key/value heads, MLP
1536, vocabulary 49,152, tied embeddings, RoPE θ 100,000; 134.5 M parameters), DIR a local Hugging
Face folder with a `config.json` (any causal-LM architecture transformers knows; weights, if any,
are not read). The model needs a tokenizer that covers the environment's words *and* its
vocabulary: the environment's word-level tokenizer (`build_tokenizer`) over the environment's
words followed by filler words `<fill-N>`, up to the model's `vocab_size`, so every id the model
can sample decodes to a word (the environment reads a filler word as any unknown word). Sampling,
log-softmax and the LM head then run over the full vocabulary, as with the real model. A random
model rarely samples the end-of-turn token, so turns mostly run to `max_turn_tokens`.

`--model DIR` plays a local model folder with its weights instead (a plain Hugging Face folder, e.g.
SmolLM2-135M-Instruct from `mpo-viz get-model smollm2-135m --out DIR`, or one written by mpo_viz),
through its own tokenizer and chat template; `reward` is then its mean reward at T = 1 (zero-shot for
a pretrained model). `--critic none` times the policy alone (`w/o critic` then equals `ratio`).

For each environment and batch size B: one rollout of B episodes (B tasks, one sample each) with the
"1m" tiny Llama and a critic sharing nothing with it (`init="policy"`: a copy of the trunk), default
sampling (T = 1, top-p 1), `max_turn_tokens` 48. Then, in the same process, `model.generate` on the
same model with the same B prompts (each episode's first prompt, left padded), KV cache on,
`do_sample=True`, and `min_new_tokens = max_new_tokens = N` where N × B is the rollout's number of
action tokens, so both sides produce the same number of new tokens. `w/o critic` is the same ratio
with the critic's time taken out of the rollout's time (generate has no critic): the cost of being
multi-turn alone. On a machine with a core beyond torch's threads the rollout runs the critic's
forwards in a second thread while the policy decodes (`rollout(critic_thread=...)`); the critic's
time is then only what the rollout waited for it after its last episode, and `cpu ratio` (which
counts both threads) shows what the critic costs in compute.

`--repeats N` runs N (rollout, generate) pairs per row, one after the other, and prints the median
of each column over the pairs (each ratio taken within its pair): on a shared machine a single pair
moves by ±0.2 with the load of the minute it ran in. On an idle 2-core machine, within an hour, the
1M model's `search` cell at 16 episodes had a median of 0.75 over three pairs, then 0.88 and 1.08
over nine: judge the 0.8 target on `--repeats 9` or more.

Speed is *action tokens/s*: sampled tokens per second of wall time. The rollout's time is the whole
call (prefill of every observation, every decode step, environments, oracle, critic, building the
batch); generate's is the call alone. `ratio` = rollout / generate (target >= 0.8: the cost of being
multi-turn). `cpu ratio`: the same ratio on the process's CPU time (`time.process_time`) instead of
wall time: the two calls run one after the other, and on a shared machine the load can change
between them (minutes apart for a real-sized model); CPU time moves much less with it (with one
torch thread it equals the wall time of an idle machine). Shares: the fraction of rollout time in the environments,
tokenization (chat layout,
decoding) plus the oracle, and the critic (the wait for it). Peak memory: the process's resident set size,
sampled every 5 ms during each call, minus the size before it.

Threads: one torch thread by default (`--threads`): a 1M-parameter model is overhead-bound, and on a
shared machine OpenMP spin-waits of a second thread cost far more than they give.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mpo_viz import models  # noqa: E402
from mpo_viz.envs import build_tokenizer, make_env  # noqa: E402
from mpo_viz.rollout import rollout  # noqa: E402

#: shapes of real small LMs, as in their published config.json (nothing is downloaded)
MODEL_CONFIGS: dict[str, dict] = {
    # HuggingFaceTB/SmolLM2-135M (LlamaForCausalLM); head_dim 576 / 9 = 64
    "smollm2-135m": {
        "model_type": "llama",
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "hidden_act": "silu",
        "initializer_range": 0.041666666666666664,
    },
}


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


def model_config(spec: str):
    """The transformers config of ``spec``: a name of :data:`MODEL_CONFIGS` or a local folder."""
    from transformers import AutoConfig, LlamaConfig

    if spec in MODEL_CONFIGS:
        kw = dict(MODEL_CONFIGS[spec])
        kw.pop("model_type")
        return LlamaConfig(**kw)
    path = Path(spec)
    if not (path / "config.json").is_file():
        raise SystemExit(
            f"--model-config: expected one of {sorted(MODEL_CONFIGS)} or a folder with a config.json, found {spec!r}"
        )
    return AutoConfig.from_pretrained(str(path), local_files_only=True)


def config_policy(env, spec: str, seed: int = 0) -> models.Policy:
    """A randomly initialised causal LM of ``spec``'s shape over the environment's words padded with
    filler words ``<fill-N>`` to the model's vocabulary (module docstring)."""
    from transformers import AutoModelForCausalLM

    cfg = model_config(spec)
    words = list(env.vocabulary())
    n_base = len(build_tokenizer(words))
    if cfg.vocab_size < n_base:
        raise SystemExit(
            f"--model-config {spec}: expected a vocabulary of at least {n_base} tokens (the "
            f"{env.name!r} environment's), found vocab_size {cfg.vocab_size}"
        )
    tok = build_tokenizer(words + [f"<fill-{i}>" for i in range(cfg.vocab_size - n_base)])
    assert len(tok) == cfg.vocab_size, (len(tok), cfg.vocab_size)
    cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id = tok.pad_token_id, tok.eos_token_id, None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    return models.Policy(model.eval(), tok, name=f"random {type(model).__name__} of {spec}'s shape (seed {seed})")


def bench(
    env_name: str,
    batch: int,
    seed: int = 0,
    model_spec: str | None = None,
    model_dir: str | None = None,
    critic_init: str = "policy",
    repeats: int = 1,
    critic_thread: bool | None = None,
) -> dict:
    """One table row: ``repeats`` pairs of (rollout, generate) one after the other, each column the
    median over the pairs (each ratio taken within its pair)."""
    env = make_env(env_name)
    if model_dir is not None:
        policy, _ = models.load(model_dir)
    elif model_spec is None:
        policy = models.tiny_policy(build_tokenizer(env), "1m", seed=seed)
    else:
        policy = config_policy(env, model_spec, seed=seed)
    critic = None if critic_init == "none" else models.make_critic(policy, critic_init, seed=seed)
    # warm-up (first-call allocations, lazy imports)
    rollout(policy, env, 2, critic=critic, seed=seed + 1, batch_size=2, max_turn_tokens=8)
    pairs = [_pair(policy, env, critic, batch, seed, critic_thread) for _ in range(repeats)]
    med = {k: float(np.median([p[k] for p in pairs])) for k in pairs[0] if k != "out"}
    out = pairs[0]["out"]
    return {
        "env": env_name,
        "B": batch,
        "tokens": int(out.mask.sum()),
        **med,
        "turns": float(out.num_turns.mean()),
        "params": policy.num_parameters(),
        "reward": float(out.outcome_reward.mean()),
    }


def _pair(policy, env, critic, batch: int, seed: int, critic_thread: bool | None = None) -> dict:
    """One rollout, then ``model.generate`` on its prompts for as many new tokens (module docstring)."""
    tm: dict = {}
    with PeakRSS() as mem_r:
        c0, t0 = time.process_time(), time.perf_counter()
        kw = {} if critic_thread is None else {"critic_thread": critic_thread}
        out = rollout(policy, env, batch, critic=critic, seed=seed, batch_size=batch, timings=tm, **kw)
        t_roll, c_roll = time.perf_counter() - t0, time.process_time() - c0
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
        c0, t0 = time.process_time(), time.perf_counter()
        policy.model.generate(
            ids,
            attention_mask=att,
            do_sample=True,
            max_new_tokens=new,
            min_new_tokens=new,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            use_cache=True,
            pad_token_id=pad,
        )
        t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0
    total = tm["total"]
    roll_tps, gen_tps = n_act / t_roll, new * batch / t_gen
    return {
        "out": out,
        "roll_tps": roll_tps,
        "gen_tps": gen_tps,
        "ratio": roll_tps / gen_tps,
        "ratio_nc": n_act / (t_roll - tm.get("critic", 0.0)) / gen_tps,
        "cpu_ratio": (n_act / c_roll) / (new * batch / c_gen),
        "env_share": tm.get("env", 0.0) / total,
        "tok_share": (tm.get("tokenize", 0.0) + tm.get("oracle", 0.0)) / total,
        "critic_share": tm.get("critic", 0.0) / total,
        "mem_r": mem_r.mib,
        "mem_g": mem_g.mib,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="search only, batch 16")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="(rollout, generate) pairs per row; each column is the median over them (default 1)",
    )
    ap.add_argument(
        "--model-config",
        metavar="NAME|DIR",
        default=None,
        help=f"a random model of this shape instead of the tiny one: {', '.join(MODEL_CONFIGS)} or a "
        "local Hugging Face config folder (batch 8 and 16)",
    )
    ap.add_argument(
        "--model",
        metavar="DIR",
        default=None,
        help="a local model folder with its weights (plain Hugging Face or mpo_viz) instead of the tiny "
        "one (batch 8 and 16)",
    )
    ap.add_argument(
        "--critic",
        choices=("policy", "shared", "fresh", "none"),
        default="policy",
        help="the critic beside the policy (default policy: a copy of its trunk; none: the policy alone)",
    )
    ap.add_argument(
        "--critic-thread",
        choices=("auto", "on", "off"),
        default="auto",
        help="the critic's forwards in a second thread while the policy decodes (rollout's "
        "critic_thread; auto: when a core is free)",
    )
    ap.add_argument("--envs", nargs="*", default=None, help="environments (default: all three; --quick: search)")
    ap.add_argument(
        "--sizes", type=int, nargs="*", default=None, help="batch sizes (default 16 64; with --model-config 8 16)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    envs = args.envs or (["search"] if args.quick else ["search", "tooluse", "automation"])
    if args.sizes:
        sizes = args.sizes
    elif args.model_config or args.model:
        sizes = [8] if args.quick else [8, 16]
    else:
        sizes = [16] if args.quick else [16, 64]
    if args.model_config and args.model:
        raise SystemExit("--model-config and --model: expected one of them, found both")
    if args.model:
        what = f"model {args.model}"
    elif args.model_config:
        c = model_config(args.model_config)
        what = (
            f"random {c.model_type} of {args.model_config}'s shape (hidden {c.hidden_size}, "
            f"{c.num_hidden_layers} layers, vocabulary {c.vocab_size})"
        )
    else:
        what = "tiny Llama '1m'"
    print(
        f"# rollout vs model.generate — {what}, critic {args.critic}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats} "
        f"pair(s) per row, critic thread {args.critic_thread}; load average "
        f"{os.getloadavg()[0]:.1f} at start"
    )
    head = (
        f"{'env':<11}{'B':>4}{'tokens':>8}{'turns':>6}{'rollout tok/s':>15}{'generate tok/s':>16}{'ratio':>7}"
        f"{'w/o critic':>11}{'cpu ratio':>10}{'env %':>7}{'tok+oracle %':>14}{'critic %':>10}{'peak MiB r/g':>14}"
        f"{'reward':>8}"
    )
    print(head)
    print("-" * len(head))
    for name in envs:
        for b in sizes:
            r = bench(
                name,
                b,
                model_spec=args.model_config,
                model_dir=args.model,
                critic_init=args.critic,
                repeats=args.repeats,
                critic_thread={"auto": None, "on": True, "off": False}[args.critic_thread],
            )
            dec = 0 if r["roll_tps"] >= 100 else 2  # a 135M model on a busy CPU makes a few tokens/s
            print(
                f"{r['env']:<11}{r['B']:>4}{r['tokens']:>8}{r['turns']:>6.1f}{r['roll_tps']:>15.{dec}f}"
                f"{r['gen_tps']:>16.{dec}f}{r['ratio']:>7.2f}"
                f"{r['ratio_nc']:>11.2f}{r['cpu_ratio']:>10.2f}{100 * r['env_share']:>7.1f}"
                f"{100 * r['tok_share']:>14.1f}{100 * r['critic_share']:>10.1f}"
                f"{r['mem_r']:>8.0f}/{r['mem_g']:<5.0f}{r['reward']:>8.3f}",
                flush=True,
            )
    print(f"# {r['params'] / 1e6:.1f} M parameters (policy; critic: {args.critic})")
    print(
        f"# load average {os.getloadavg()[0]:.1f} at the end (the machine is shared: absolute numbers move "
        "with it; the ratio is measured side by side)"
    )


if __name__ == "__main__":
    main()
