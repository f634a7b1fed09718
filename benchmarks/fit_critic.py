"""fit_critic speed: 400 trajectories, 256 steps, against a bare training loop and the 2-minute target.

Run:  .venv/bin/python benchmarks/fit_critic.py                 (the shipped search set, 400 episodes)
      .venv/bin/python benchmarks/fit_critic.py --threads 1 --steps 64
      .venv/bin/python benchmarks/fit_critic.py --vocab 49152        (the same set over a 49k-id vocabulary)

What is timed, side by side in one process on the same set and critic size:

* ``fit_critic``: the library call (`mpo_viz.train.fitted_critic.fit_critic` / `mpo-viz fit-critic`) — the Monte-Carlo
  targets, the held-out split by group, ``steps`` AdamW steps of 16 episodes, the held-out
  explained variance every 16 steps, then the values of every row written into the batch;
* ``bare loop``: the least any fit of the same size can cost — ``steps`` AdamW steps of 16 random
  training rows (right-padded prompt + response, masked squared error to the return on the
  response tokens) with nothing else: no evaluation, no values written.

``--vocab N`` spreads the set's ids over ``0 .. N − 1`` (id·7919 mod N, one-to-one), as a 49k-token
byte-level tokenizer's logs have them: the same sequences, a vocabulary of N ids. The bare loop
then embeds all N ids (what a critic over the whole vocabulary costs); fit_critic gives its critic
embedding rows for the ids the logs use only (:func:`mpo_viz.models.critic.compact_critic`);
``--full-vocab`` turns that off (fit_critic as it was before: every id of the vocabulary embedded).
``--ab-steps N`` adds a second table: N training steps of fit_critic's own step (the same 16 rows
for all, interleaved step by step in one process, so that a shared machine's load hits them alike):
the baseline — the critic over the whole vocabulary with the padding mask given to the attention
(fit_critic before :func:`mpo_viz.train.critic_fit.causal_values`) — then the same critic without
the mask, and the compact critic without the mask (what fit_critic runs now).

The ratio column is fit_critic / bare loop (what the evaluation, the split and the writing cost on
top); the last column says whether fit_critic met the 2-minute target. Wall and CPU seconds are
both printed (on a shared machine the CPU time is the steadier number) with the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mpo_viz as mv  # noqa: E402
from mpo_viz.models import critic as model_critic  # noqa: E402
from mpo_viz.models.critic import vocab_critic  # noqa: E402
from mpo_viz.train import critic_fit  # noqa: E402
from mpo_viz.train.fitted_critic import fit_critic, fit_targets  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trajectories")
TARGET_S = 120.0


def spread(batch, vocab: int):
    """``batch`` with its ids spread over ``0 .. vocab − 1`` (id·7919 mod vocab; one-to-one for the
    shipped sets and vocabularies not divisible by 7919)."""
    rows = []
    for r in batch.rows():
        r = {k: v for k, v in r.items() if k != "response_tokens"}
        for f in ("prompt_ids", "response_ids"):
            r[f] = [int(i) * 7919 % vocab for i in r[f]]
        rows.append(r)
    return mv.TrajectoryBatch.from_rows(rows, dict(batch.meta))


def bare_loop(batch, steps: int, seed: int, size: str = "1m", batch_episodes: int = 16) -> None:
    """``steps`` AdamW steps of a fresh critic on random rows' Monte-Carlo returns (response tokens)."""
    prompts, resps = batch.field("prompt_ids"), batch.field("response_ids")
    vocab = 1 + max(int(x.max()) for f in (prompts, resps) for x in f if len(x))
    critic = vocab_critic(vocab, size=size, seed=seed)
    opt = torch.optim.AdamW(critic.parameters(), lr=1e-3, weight_decay=0.0)
    targets = fit_targets(batch, "mc").float()
    mask = batch.mask.float()
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        rows = rng.choice(len(batch), size=batch_episodes, replace=False)
        seqs = [np.concatenate([prompts[i], resps[i]]) for i in rows]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attn = torch.zeros(len(rows), width, dtype=torch.long)
        for j, s in enumerate(seqs):
            ids[j, : len(s)] = torch.from_numpy(s.astype(np.int64))
            attn[j, : len(s)] = 1
        v = critic(input_ids=ids, attention_mask=attn)
        loss = 0.0
        n = 0.0
        for j, i in enumerate(rows):
            p, r = len(prompts[i]), len(resps[i])
            m = mask[i, :r]
            # the value before response token t is the output at position p + t - 1
            loss = loss + (((v[j, p - 1 : p - 1 + r] - targets[i, :r]) ** 2) * m).sum()
            n += float(m.sum())
        opt.zero_grad()
        (loss / max(n, 1.0)).backward()
        opt.step()


AB_BASELINE = "whole vocabulary, padding mask (before)"


def step_ab(batch, steps: int, seed: int) -> dict[str, tuple[float, float]]:
    """Mean (wall, CPU) seconds of one training step of fit_critic's loop (``_fit_step``) in each
    variant of the module docstring, the same rows for all, interleaved."""
    from mpo_viz.train.update import forward_critic, rows_of

    r = rows_of(batch)
    g32 = fit_targets(batch, "mc").float()
    vocab = 1 + max(int(x.max()) for f in ("prompt_ids", "response_ids") for x in batch.field(f) if len(x))
    variants = {
        AB_BASELINE: (vocab_critic(vocab, seed=seed), forward_critic),
        "whole vocabulary": (vocab_critic(vocab, seed=seed), critic_fit.causal_values),
        "compact (fit_critic now)": (model_critic.compact_critic(batch, seed=seed), critic_fit.causal_values),
    }
    opts = {k: torch.optim.AdamW(list(c.parameters()), lr=1e-3) for k, (c, _) in variants.items()}
    rng = np.random.default_rng(seed)
    spent = {k: [0.0, 0.0] for k in variants}
    now = critic_fit.causal_values
    try:
        for _ in range(steps):
            rows = np.sort(rng.choice(len(batch), size=16, replace=False))
            for k, (c, fwd) in variants.items():
                critic_fit.causal_values = fwd  # the baseline's step gives the attention the padding mask
                c.train()
                w, cpu = timed(
                    lambda c=c, k=k, rows=rows: critic_fit._fit_step(
                        c,
                        r,
                        rows,
                        g32,
                        opts[k],
                        list(c.parameters()),
                        1.0,
                        pad_id=0,
                        device="cpu",
                        micro_batch_tokens=8192,
                    )
                )
                spent[k][0] += w
                spent[k][1] += cpu
    finally:
        critic_fit.causal_values = now
    return {k: (w / steps, cpu / steps) for k, (w, cpu) in spent.items()}


def timed(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="search", choices=("search", "tooluse", "automation"))
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=None, help="spread the ids over a vocabulary of this many ids")
    ap.add_argument("--full-vocab", action="store_true", help="fit_critic's critic embeds every id of the vocabulary")
    ap.add_argument("--ab-steps", type=int, default=0, help="also time this many steps, whole vocabulary vs compact")
    ap.add_argument(
        "--quick", action="store_true", help="a few seconds' smoke run (make bench): 32 steps; not a speed verdict"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.steps = 32
    if args.full_vocab:
        model_critic.COMPACT_MIN_VOCAB = 1 << 62
    torch.set_num_threads(args.threads)
    batch = mv.load(os.path.join(ROOT, f"{args.env}.parquet"))
    if args.vocab:
        batch = spread(batch, args.vocab)
    vocab = 1 + max(int(x.max()) for f in ("prompt_ids", "response_ids") for x in batch.field(f) if len(x))
    tokens = float(batch.lengths.float().mean()) + float(np.mean([len(p) for p in batch.field("prompt_ids")]))
    load0 = os.getloadavg()[0]
    holder = {}
    fit = timed(lambda: holder.update(r=fit_critic(batch, steps=args.steps, seed=args.seed, progress=False)))
    bare = timed(lambda: bare_loop(batch, args.steps, args.seed))
    load1 = os.getloadavg()[0]
    ev = holder["r"].info["heldout_explained_variance"]
    print(
        f"\n{args.env}: {len(batch)} trajectories, {tokens:.0f} tokens each on average (prompt + response), "
        f"{args.steps} steps of 16 episodes, {args.threads} threads, a vocabulary of {vocab} ids"
        f"{' (fit_critic embedding all of them)' if args.full_vocab else ''}; load average "
        f"{load0:.1f} -> {load1:.1f}\n"
    )
    print("| run | wall s | CPU s | ratio to bare loop (wall) | within 2 min |")
    print("|---|---|---|---|---|")
    print(f"| bare loop | {bare[0]:.1f} | {bare[1]:.1f} | 1.00 | {'yes' if bare[0] <= TARGET_S else 'no'} |")
    print(
        f"| fit_critic | {fit[0]:.1f} | {fit[1]:.1f} | {fit[0] / bare[0]:.2f} | "
        f"{'yes' if fit[0] <= TARGET_S else 'no'} |"
    )
    print(f"\nfit_critic's held-out explained variance: {ev:.3f}")
    if args.ab_steps:
        ab = step_ab(batch, args.ab_steps, args.seed)
        base = ab[AB_BASELINE]
        print(
            f"\none training step (16 episodes), mean of {args.ab_steps}, interleaved; load average "
            f"{os.getloadavg()[0]:.1f}\n"
        )
        print("| critic | ms per step (wall) | CPU ms per step | ratio to the baseline (CPU) |")
        print("|---|---|---|---|")
        for k, (w, c) in ab.items():
            print(f"| {k} | {w * 1000:.0f} | {c * 1000:.0f} | {c / base[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
