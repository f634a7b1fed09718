"""Credit accuracy: how close does each estimator's credit come to the exact oracle advantages?

Run:  .venv/bin/python benchmarks/credit_accuracy.py            (3 shipped sets × σ ∈ {0, .05, .1, .2})
      .venv/bin/python benchmarks/credit_accuracy.py --quick    (σ ∈ {0, .1}; a smoke run)
      .venv/bin/python benchmarks/credit_accuracy.py --csv out.csv

Data: the shipped expert trajectories (`trajectories/{search,tooluse,automation}.parquet`, 400 each,
noise 0.25, G = 4), whose `oracle_values` are the exact values under the noisy expert. The critic
every value-based estimator sees is `oracle_values + N(0, σ²)` (one draw per token, or with
`--noise-model turn` one draw per turn shared by its tokens; the same draw for every estimator). The ground truth is the oracle (mpo_viz.envs.oracle):

* turn level: `A*_k = Q(s_k, a_k) − V(s_k)`, the exact advantage of the command taken in turn k;
* token level: `a*_t = V(after t) − V(before t)` (partial-turn values), nonzero only on the
  *decisive* tokens (the command's verb and argument, which rule out other valid actions); filler
  (the expert's short thought, the end-of-turn token) gets exactly 0. Σ_t∈k a*_t = A*_k.

Columns (over all turns / action tokens of the set):
* `turn_corr`   Pearson correlation of the estimator's turn advantage (mean over the turn's
                tokens) with A*_k;
* `turn_sign`   share of turns with A*_k ≠ 0 whose sign the estimator gets right;
* `tok_corr`    Pearson correlation of token advantages with a*_t;
* `within_corr` the same after centering both inside each turn (the micro scale only; NaN for
                estimators constant within a turn);
* `dec_sign`    sign agreement on decisive tokens with a*_t ≠ 0;
* `dec_mass`    share of Σ|A_t| that lands on decisive tokens (the oracle: 1; a turn-constant
                estimator: the share of decisive tokens, about 1/8);
* `dec_mass_w`  the same for the within-turn part |A_t − mean_k A| (NaN when there is none).

Nothing is timed against a baseline here; `ms` is the wall time of `compute` per call (400
trajectories, kernels compiled beforehand), for scale.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mpo_viz as mv  # noqa: E402
from mpo_viz.advantages import compute  # noqa: E402
from mpo_viz.envs.generate import oracle_columns  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trajectories")
ENVS = ("search", "tooluse", "automation")

# (label, registry name, options): every registered estimator at its defaults, plus the variants
# that isolate one choice (turn λ, token λ, the within-turn signal).
ESTIMATORS = [
    ("mpo", "mpo", {}),
    ("mpo local", "mpo", {"within": "local"}),
    ("mpo turn_lam=0", "mpo", {"turn_lam": 0.0}),
    ("mpo lam=0", "mpo", {"lam": 0.0}),
    ("mpo within=td", "mpo", {"within": "td"}),
    ("mpo value_at=mean", "mpo", {"value_at": "mean"}),
    ("turn_gae", "turn_gae", {}),
    ("turn_gae turn_lam=0", "turn_gae", {"turn_lam": 0.0}),
    ("gae lam=1", "gae", {}),
    ("gae lam=0.95", "gae", {"lam": 0.95}),
    ("vapo", "vapo", {}),
    ("grpo", "grpo", {}),
    ("drgrpo", "drgrpo", {}),
    ("rloo", "rloo", {}),
    ("reinforce_pp", "reinforce_pp", {}),
    ("reinforce_pp_baseline", "reinforce_pp_baseline", {}),
    ("gigpo", "gigpo", {}),
]


def _corr(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2 or x.std() < 1e-12 or y.std() < 1e-12:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def _sign(est: np.ndarray, ref: np.ndarray, eps: float = 1e-6) -> float:
    keep = np.abs(ref) > eps
    if not keep.any():
        return float("nan")
    return float(np.mean(np.sign(est[keep]) == np.sign(ref[keep])))


def _turn_means(x: np.ndarray, inv: np.ndarray, counts: np.ndarray) -> np.ndarray:
    return np.bincount(inv, weights=x) / counts


def metrics(adv: np.ndarray, ref: dict, *, turn_sum: bool = False) -> dict:
    """Compare a (B, L) advantage array with the oracle (see the module docstring). The turn
    advantage is the mean over the turn's tokens (``turn_sum=True``: the sum, for the oracle row)."""
    a = adv[ref["rows"], ref["cols"]].astype(np.float64)
    o, d, inv, counts = ref["tok"], ref["dec"], ref["inv"], ref["counts"]
    a_turn = _turn_means(a, inv, counts)
    a_cmp = a_turn * counts if turn_sum else a_turn
    ac = a - a_turn[inv]
    oc = o - _turn_means(o, inv, counts)[inv]
    total, total_w = np.abs(a).sum(), np.abs(ac).sum()
    return {
        "turn_corr": _corr(a_cmp, ref["turn_adv"]),
        "turn_sign": _sign(a_cmp, ref["turn_adv"]),
        "tok_corr": _corr(a, o),
        "within_corr": _corr(ac, oc) if np.abs(ac).max() > 1e-9 else float("nan"),
        "dec_sign": _sign(a[d], o[d]),
        "dec_mass": float(np.abs(a[d]).sum() / total) if total > 0 else float("nan"),
        "dec_mass_w": float(np.abs(ac[d]).sum() / total_w) if total_w > 1e-9 else float("nan"),
    }


def reference(batch) -> dict:
    """The oracle's turn and token advantages, flattened over action tokens in batch order."""
    oc = oracle_columns(batch)
    m = batch.mask.numpy() != 0
    tid = batch.turn_ids.numpy()
    rows, cols = np.nonzero(m)
    key = rows.astype(np.int64) * (int(tid.max()) + 1) + tid[rows, cols]
    _, inv = np.unique(key, return_inverse=True)  # turns in (row, turn) order
    counts = np.bincount(inv).astype(np.float64)
    turn_adv = np.concatenate([np.asarray(t, dtype=np.float64) for t in oc["turn_adv"]])
    if len(turn_adv) != len(counts):
        raise ValueError(f"extra_json: expected {len(counts)} oracle turns, found {len(turn_adv)}")
    return {
        "rows": rows, "cols": cols, "inv": inv, "counts": counts, "turn_adv": turn_adv,
        "tok": oc["token_adv"].numpy()[rows, cols].astype(np.float64),
        "dec": oc["decisive"].numpy()[rows, cols] > 0.5,
        "values": oc["values"],
    }


def critic_noise(shape, sigma: float, rng, turn_ids: np.ndarray, model: str) -> np.ndarray:
    """``token``: one N(0, σ²) draw per token; ``turn``: one draw per (trajectory, turn), shared by
    the turn's tokens and the observation after it (a critic whose error varies across turns, not
    within them — the pattern of paper Fig. 2)."""
    if sigma == 0:
        return np.zeros(shape)
    if model == "token":
        return rng.normal(0.0, sigma, shape)
    per_turn = rng.normal(0.0, sigma, (shape[0], int(turn_ids.max()) + 1))
    return np.take_along_axis(per_turn, turn_ids, axis=1)


def run(envs, sigmas, seed: int = 0, noise_model: str = "token") -> pd.DataFrame:
    out = []
    # numba compiles each kernel on its first call: do that outside the timed region
    warm = mv.load(os.path.join(ROOT, f"{envs[0]}.parquet"))[:8]
    for _, name, opts in ESTIMATORS:
        compute(warm, name, **opts)
    for env in envs:
        batch = mv.load(os.path.join(ROOT, f"{env}.parquet"))
        ref = reference(batch)
        # the oracle itself, as a reference row: its token advantages are a*_t, turn means A*_k/n_k
        oracle_adv = np.zeros(ref["values"].shape)
        oracle_adv[ref["rows"], ref["cols"]] = ref["tok"]
        out.append({"env": env, "sigma": 0.0, "estimator": "oracle (a*_t)", "ms": 0.0, **metrics(oracle_adv, ref, turn_sum=True)})
        for i, sigma in enumerate(sigmas):
            rng = np.random.default_rng([seed, i])
            v = ref["values"].numpy().astype(np.float64)
            v = v + critic_noise(v.shape, sigma, rng, batch.turn_ids.numpy(), noise_model)
            b = batch.with_token_fields(values=v.astype(np.float32))
            for label, name, opts in ESTIMATORS:
                t0 = time.perf_counter()
                res = compute(b, name, **opts)
                ms = 1e3 * (time.perf_counter() - t0)
                out.append({"env": env, "sigma": sigma, "estimator": label, "ms": ms,
                            **metrics(res.advantages.double().numpy(), ref)})
    return pd.DataFrame(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sigma in {0, 0.1} only")
    ap.add_argument("--sigmas", type=float, nargs="*", default=None, help="critic noise levels")
    ap.add_argument("--envs", nargs="*", default=list(ENVS), choices=ENVS)
    ap.add_argument("--noise-model", default="token", choices=["token", "turn"],
                    help="critic noise: i.i.d. per token (default) or one draw per turn")
    ap.add_argument("--csv", default=None, help="also write the table as CSV")
    args = ap.parse_args(argv)
    sigmas = args.sigmas if args.sigmas is not None else ([0.0, 0.1] if args.quick else [0.0, 0.05, 0.1, 0.2])
    t0 = time.perf_counter()
    df = run(args.envs, sigmas, noise_model=args.noise_model)
    pd.set_option("display.width", 200)
    cols = ["estimator", "turn_corr", "turn_sign", "tok_corr", "within_corr", "dec_sign", "dec_mass",
            "dec_mass_w", "ms"]
    for env in args.envs:
        for sigma in sigmas:
            part = df[(df.env == env) & ((df.sigma == sigma) | (df.estimator == "oracle (a*_t)"))]
            if sigma != sigmas[0]:
                part = part[part.estimator != "oracle (a*_t)"]
            print(f"\n== {env}, critic = oracle + N(0, {sigma}^2) per {args.noise_model}")
            print(part[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}", na_rep="-"))
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"\nwrote {args.csv}")
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
