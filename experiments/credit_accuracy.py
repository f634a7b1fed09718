"""Credit accuracy: how close does each estimator's credit come to the exact oracle advantages?

Run:  .venv/bin/python -m experiments.credit_accuracy            (3 shipped sets × σ ∈ {0, .05, .1, .2})
      .venv/bin/python -m experiments.credit_accuracy --quick    (σ ∈ {0, .1}; a smoke run)
      .venv/bin/python -m experiments.credit_accuracy --csv out.csv
      .venv/bin/python -m experiments.credit_accuracy --truth mc  (the policy's own truth, below)
      .venv/bin/python -m experiments.credit_accuracy --truth mc-token  (inside turns, below)
      .venv/bin/python -m experiments.credit_accuracy --truth mc-token --policy expert  (its validation)

Data: the shipped expert trajectories (`trajectories/{search,tooluse,automation}.parquet`, 400 each,
noise 0.25, G = 4), whose `oracle_values` are the exact values under the noisy expert; `--envs sokoban
frozenlake` generates 400 episodes of the same expert for those (nothing shipped; seed 0). The critic
every value-based estimator sees is `oracle_values + N(0, σ²)` (one draw per token, or with
`--noise-model turn` one draw per turn shared by its tokens; the same draw for every estimator). The ground truth is
the oracle (mpo_viz.envs.oracle):

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
* `dec_mass_w`  the same for the within-turn part |A_t − mean_k A| (NaN when there is none);
* `tok_slope`, `dec_slope`, `turn_slope`  calibration: the least-squares slope (with intercept) of
                the estimator's credit regressed on the true credit — token advantages on a*_t over
                all action tokens / over decisive tokens, turn advantages on A*_k over turns
                (1 = calibrated, > 1 over-credits; meaningless for whitened or group-normalized
                estimators, which have no absolute scale).

**Calibration with exact values** (`--oracle-critic`): the critic is the oracle itself (σ = 0) on
`--episodes` expert episodes per environment (default 2000 of automation: generated, noise 0.25,
G = 4, seed 1; 400 = the shipped set), and the table gives each estimator's calibration slopes
beside the slope the derivation of docs/concepts.md predicts on the decisive tokens: with exact
values the expected credit of token j of an n-token turn is `(1 + β·c_j)·a*_t`, `c_j = 1 −
(1/n)·Σ_{j'≤j} λ^{j−j'}` for `intra` (0 at the turn's last token) and `local`, `1 − 1/n` for `td`,
0 for `baseline` and for estimators without a centred within-turn part (γ = 1 here); `pred_dec`
is the least-squares slope of `(1 + β·c)·a*_t` on `a*_t` over the decisive tokens.

      .venv/bin/python -m experiments.credit_accuracy --oracle-critic                  # automation, 2000 episodes
      .venv/bin/python -m experiments.credit_accuracy --oracle-critic --envs search tooluse --episodes 400

Nothing is timed against a baseline here; `ms` is the wall time of `compute` per call (400
trajectories, kernels compiled beforehand), for scale.

**Learned critics** (`--critic learned`): real critics are wrong in structured ways (shrunk to the
mean, smooth across turns, noisy inside them), so here the values come from critics *fitted* to
expert sets: per environment and set size (the shipped 400 episodes; `--sizes 2000` generates a
larger set of the same expert, noise 0.25, G = 4, seed 1), per target (`mc`: Monte-Carlo returns;
`oracle`: the oracle values themselves, an upper bound on what a critic can learn), per trunk
(`fresh`: a new tiny Llama; `policy`: the trunk of a trained policy of that environment where one
is shipped — `trajectories/starts/automation`) and per critic seed, one fit of
`mpo_viz.train.critic_fit.fit_values` (lr 1e-3, 16 episodes per step, a fifth of the groups held
out) measured at the step budgets {16, 64, 256, 1024} and at its best held-out explained variance
(`best`, checked every 16 steps). At each, every estimator runs on the **held-out** episodes (whole
groups the critic never saw) with the critic's values, and its credit is scored against the
oracle as above. Rows: means over critic seeds with 95% t-intervals, beside the critic's held-out
EV and the median across/within ratio of its values (and the oracle's). A row whose critic
explains nothing (EV ≈ 0) says nothing about the estimators: read the EV first.

      .venv/bin/python -m experiments.credit_accuracy --critic learned                 # everything
      .venv/bin/python -m experiments.credit_accuracy --critic learned --envs automation --csv a.csv

**The policy's truth** (`--truth mc`): the oracle above is the scripted expert's; for a trained
policy its values are biased. This mode rolls the shipped automation start out (`--episodes`,
G = 4, 3–4 expert turns), computes the start's own Monte-Carlo truth at every turn start
(`mpo-viz truth`, `-M` continuations, and Q̂ after the recorded turn), and scores every estimator's
turn credit against it — raw, disattenuated by the truth's reliability, with Fisher intervals and
the calibration slope — beside its correlation with the expert's credit (critic-based estimators
read the expert's exact values, as the v2 replication's oracle arm did).

**The policy's truth inside turns** (`--truth mc-token`): the same start's own episodes (`--episodes`,
default 64, G = 4, 3–4 expert turns) with the turn-level truth (`-M` continuations, Q̂ after each
turn) and the token truth at the `uncertain` defaults (`mpo_viz.rollout.token_truth.mc_token_truth`:
1 − π > 0.01, at most 4 a turn, 1 control a turn, `--tokens-M` pairs per token, default 16), every
estimator scored at the measured tokens (`credit_accuracy(..., truth="mc-token")`): the token credit
and its within-turn part against `Â_t` (raw and disattenuated), the share of credit on uncertain tokens
beside the truth's, sign agreement and both slopes. Critics read the expert's exact values, as above.

With `--policy expert` it is the path's validation on the scripted expert (no model): per environment
of `--envs`, a 64-episode expert file (noise 0.3, `--episodes` to change), the token truth at the
`uncertain` defaults and at `decisive`, and its agreement with the exact `oracle_token_adv`: the share
of measured decisive tokens with |z| < 3 (z = (Â − a*)/se) and of controls with |Â| ≤ 3·se (an exact 0
with se 0 counts; the pre-registered check of docs/results.md, E5), beside the within-turn table with the
oracle's values as the critic. The controls are filler tokens the expert writes with π = 1, whose true advantage is 0
exactly: the `pi` estimator runs nothing there (`controls_zero`), so the `plain` estimator (Q̂ − V̂)
is run too, where they are a real check.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import pandas as pd

import mpo_viz as mv
from mpo_viz.advantages import compute
from mpo_viz.envs.generate import oracle_columns

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trajectories")
ENVS = ("search", "tooluse", "automation")
#: environments without a shipped set: the σ sweep generates 400 episodes of the same expert (noise 0.25,
#: G = 4, seed 0) instead (exact models of the literature's testbeds, docs/environments.md)
GENERATED = ("sokoban", "frozenlake")


def expert_file(env: str):
    """The shipped 400-episode set of ``env``, or for an environment without one 400 generated episodes
    of the same expert (noise 0.25, G = 4, seed 0)."""
    path = os.path.join(ROOT, f"{env}.parquet")
    if os.path.exists(path):
        return mv.load(path)
    from mpo_viz.envs.generate import GenerateConfig, generate

    return generate(GenerateConfig(env=env, noise=0.25, episodes=400, group_size=4, seed=0))


# (label, registry name, options): every registered estimator at its defaults, plus the variants
# that isolate one choice (turn λ, token λ, the within-turn signal).
ESTIMATORS = [
    ("mpo", "mpo", {}),
    ("mpo local", "mpo", {"within": "local"}),
    ("mpo turn_lam=0", "mpo", {"turn_lam": 0.0}),
    ("mpo lam=0", "mpo", {"lam": 0.0}),
    ("mpo within=td", "mpo", {"within": "td"}),
    ("mpo within=baseline", "mpo", {"within": "baseline"}),
    ("mpo value_at=mean", "mpo", {"value_at": "mean"}),
    ("turn_gae", "turn_gae", {}),
    ("turn_gae turn_lam=0", "turn_gae", {"turn_lam": 0.0}),
    ("gae lam=1", "gae", {}),
    ("gae lam=0.95", "gae", {"lam": 0.95}),
    ("vapo", "vapo", {}),
    ("sao (gae, vapo λ, α=1.5)", "gae", {"lam_rule": "vapo", "alpha": 1.5}),
    ("gae relative λ q=0.5", "gae", {"lam_rule": "relative_position"}),
    ("bilevel_gae", "bilevel_gae", {}),
    ("grpo", "grpo", {}),
    ("drgrpo", "drgrpo", {}),
    ("rloo", "rloo", {}),
    ("reinforce_pp", "reinforce_pp", {}),
    ("reinforce_pp_baseline", "reinforce_pp_baseline", {}),
    ("gigpo", "gigpo", {}),
    ("mt_grpo", "mt_grpo", {}),
    ("mt_grpo index", "mt_grpo", {"turn_baseline": "index"}),
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


def _slope(est: np.ndarray, truth: np.ndarray) -> float:
    """Least-squares slope (with intercept) of ``est`` regressed on ``truth``."""
    if len(est) < 2 or truth.std() < 1e-12:
        return float("nan")
    return float(np.polyfit(truth, est, 1)[0])


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
        "tok_slope": _slope(a, o),
        "dec_slope": _slope(a[d], o[d]),
        "turn_slope": _slope(a_cmp, ref["turn_adv"]),
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
        "rows": rows,
        "cols": cols,
        "inv": inv,
        "counts": counts,
        "turn_adv": turn_adv,
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
    warm = expert_file(envs[0])[:8]
    for _, name, opts in ESTIMATORS:
        compute(warm, name, **opts)
    for env in envs:
        batch = expert_file(env)
        ref = reference(batch)
        # the oracle itself, as a reference row: its token advantages are a*_t, turn means A*_k/n_k
        oracle_adv = np.zeros(ref["values"].shape)
        oracle_adv[ref["rows"], ref["cols"]] = ref["tok"]
        out.append(
            {
                "env": env,
                "sigma": 0.0,
                "estimator": "oracle (a*_t)",
                "ms": 0.0,
                **metrics(oracle_adv, ref, turn_sum=True),
            }
        )
        for i, sigma in enumerate(sigmas):
            rng = np.random.default_rng([seed, i])
            v = ref["values"].numpy().astype(np.float64)
            v = v + critic_noise(v.shape, sigma, rng, batch.turn_ids.numpy(), noise_model)
            b = batch.with_token_fields(values=v.astype(np.float32))
            for label, name, opts in ESTIMATORS:
                t0 = time.perf_counter()
                res = compute(b, name, **opts)
                ms = 1e3 * (time.perf_counter() - t0)
                out.append(
                    {
                        "env": env,
                        "sigma": sigma,
                        "estimator": label,
                        "ms": ms,
                        **metrics(res.advantages.double().numpy(), ref),
                    }
                )
    return pd.DataFrame(out)


# --------------------------------------------------------------------------------------------- calibration

#: (label, registry name, options) of the calibration table: the token- and turn-level baselines and
#: every within-turn choice of MPO (β, λ = λ_T = 1, the signal)
CALIBRATION = [
    ("gae lam=1", "gae", {}),
    ("gae lam=0.95", "gae", {"lam": 0.95}),
    ("turn_gae", "turn_gae", {}),
    ("mpo", "mpo", {}),
    ("mpo beta=0.5", "mpo", {"beta": 0.5}),
    ("mpo lam=turn_lam=1", "mpo", {"lam": 1.0, "turn_lam": 1.0}),
    ("mpo local", "mpo", {"within": "local"}),
    ("mpo within=td", "mpo", {"within": "td"}),
    ("mpo within=baseline", "mpo", {"within": "baseline"}),
]


def positions_in_turn(ref: dict) -> tuple[np.ndarray, np.ndarray]:
    """Each action token's place j in its turn (from 0) and its turn's length n, in ``ref`` order."""
    inv = ref["inv"]
    first = np.r_[True, inv[1:] != inv[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(len(inv)), 0))
    return np.arange(len(inv)) - start, ref["counts"][inv]


def centring_factor(ref: dict, name: str, opts: dict) -> np.ndarray:
    """``c_t`` of the derivation (docs/concepts.md) per action token, at γ = 1: the share of token t's
    own advantage that a centred within-turn signal adds to what ``A^T_k`` already gives it."""
    j, n = positions_in_turn(ref)
    within = opts.get("within", "intra")
    if name != "mpo" or within == "baseline":
        return np.zeros(len(j))
    if within == "td":
        return 1.0 - 1.0 / n
    lam = float(opts.get("lam", 0.95))
    # Σ_{j'≤j} λ^{j−j'} = (1 − λ^{j+1}) / (1 − λ), or j + 1 at λ = 1
    geo = j + 1.0 if lam == 1.0 else (1.0 - lam ** (j + 1)) / (1.0 - lam)
    c = 1.0 - geo / n
    if within == "intra":
        c = np.where(j == n - 1, 0.0, c)  # u = 0 at the last token: its own effect is in A^T_k only
    return c


def run_calibration(envs, episodes: int) -> pd.DataFrame:
    """The exact oracle values as the critic: each CALIBRATION estimator's slopes and the predicted one."""
    out = []
    for env in envs:
        batch = expert_set(env, episodes)
        ref = reference(batch)
        b = batch.with_token_fields(values=ref["values"].numpy().astype(np.float32))
        o, d = ref["tok"], ref["dec"]
        for label, name, opts in CALIBRATION:
            res = compute(b, name, **opts)
            beta = float(opts.get("beta", 1.0))
            pred = (1.0 + beta * centring_factor(ref, name, opts)) * o
            row = metrics(res.advantages.double().numpy(), ref)
            out.append(
                {
                    "env": env,
                    "episodes": len(batch),
                    "decisive": int(d.sum()),
                    "estimator": label,
                    "dec_slope": row["dec_slope"],
                    "pred_dec": _slope(pred[d], o[d]),
                    "tok_slope": row["tok_slope"],
                    "turn_slope": row["turn_slope"],
                    "tok_corr": row["tok_corr"],
                    "turn_corr": row["turn_corr"],
                }
            )
    return pd.DataFrame(out)


def main_calibration(args) -> int:
    t0 = time.perf_counter()
    df = run_calibration(args.envs, args.episodes or 2000)
    for env, g in df.groupby("env", sort=False):
        first = g.iloc[0]
        print(
            f"\n== {env}: {first['episodes']} expert episodes (noise 0.25), the exact oracle values as the critic; "
            f"slopes of the estimator's credit on the true credit ({first['decisive']} decisive tokens)"
        )
        cols = ["estimator", "dec_slope", "pred_dec", "tok_slope", "turn_slope", "tok_corr", "turn_corr"]
        print(g[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}", na_rep="-"))
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"\nwrote {args.csv}")
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    return 0


# --------------------------------------------------------------------------------------------- learned critics

START_DIRS = {"automation": os.path.join(ROOT, "starts", "automation")}
#: estimators whose credit the learned-critic tables print (the CSV has every one)
SHOWN = ("mpo", "turn_gae", "gae lam=1", "vapo", "grpo")


def expert_set(env: str, size: int):
    """The shipped 400 episodes, or ``size`` new episodes of the same expert (noise 0.25, G = 4, seed 1)."""
    from mpo_viz.envs.generate import GenerateConfig, generate

    if size == 400:
        return mv.load(os.path.join(ROOT, f"{env}.parquet"))
    return generate(GenerateConfig(env=env, noise=0.25, episodes=size, group_size=4, seed=1))


def make_critic(env: str, trunk: str, batch, seed: int):
    """A critic over the set's ids: a fresh tiny Llama trunk, or the trunk of the shipped policy."""
    from mpo_viz import models
    from mpo_viz.models.critic import vocab_critic

    if trunk == "policy":
        policy, _ = models.load(START_DIRS[env])
        return models.make_critic(policy, init="policy", seed=seed)
    vocab = 1 + max(int(x.max()) for f in ("prompt_ids", "response_ids") for x in batch.field(f) if len(x))
    return vocab_critic(vocab, size="1m", seed=seed)


def score_heldout(batch, values, held) -> list[dict]:
    """Every estimator on the held-out rows with ``values``: the accuracy columns per estimator."""
    sub = batch[held].with_token_fields(values=values[held])
    ref = reference(sub)
    out = []
    for label, name, opts in ESTIMATORS:
        res = compute(sub, name, **opts)
        out.append({"estimator": label, **metrics(res.advantages.double().numpy(), ref)})
    return out


def fit_and_score(env: str, size: int, target: str, trunk: str, seed: int, budgets, batch, log) -> list[dict]:
    """One critic fit, scored at each budget and at its best held-out EV."""
    import copy

    import torch

    from mpo_viz.advantages import mc_returns
    from mpo_viz.analysis import value_variance, variance_summary
    from mpo_viz.train.critic_fit import critic_outputs, fit_values, holdout_split
    from mpo_viz.train.update import rows_of

    targets = mc_returns(batch) if target == "mc" else batch.padded("oracle_values", torch.float64)
    critic = make_critic(env, trunk, batch, seed)
    groups = batch.field("group_id")
    _, held = holdout_split(len(batch), 0.2, seed, groups)
    r = rows_of(batch)
    oracle_ratio = variance_summary(value_variance(batch[held], batch[held].padded("oracle_values")))["median_ratio"]
    snaps, best = {}, {"ev": -math.inf, "state": None, "step": 0}

    def on_eval(step, ev, c):
        if step in budgets:
            snaps[step] = (ev, copy.deepcopy(c.state_dict()))
        if ev > best["ev"]:
            best.update(ev=ev, state=copy.deepcopy(c.state_dict()), step=step)

    t0 = time.perf_counter()
    every = min(16, math.gcd(*budgets))  # the budgets must be among the checked steps
    fit_values(
        critic,
        batch,
        targets,
        steps=max(budgets),
        lr=1e-3,
        batch_episodes=16,
        holdout=0.2,
        gate=None,
        eval_every=every,
        seed=seed,
        pad_id=0,
        groups=groups,
        on_eval=on_eval,
    )
    snaps["best"] = (best["ev"], best["state"])
    rows = []
    for budget, (ev, state) in snaps.items():
        critic.load_state_dict(state)
        values = critic_outputs(critic, r, np.arange(len(batch)), pad_id=0, device="cpu")
        sub = batch[held]
        ratio = variance_summary(value_variance(sub, values[held][:, : sub.mask.shape[1]]))["median_ratio"]
        for row in score_heldout(batch, values, held):
            rows.append(
                {
                    "env": env,
                    "size": size,
                    "target": target,
                    "trunk": trunk,
                    "seed": seed,
                    "budget": str(budget),
                    "best_step": best["step"] if budget == "best" else budget,
                    "heldout_ev": ev,
                    "values_ratio": ratio,
                    "oracle_ratio": oracle_ratio,
                    **row,
                }
            )
    log(
        f"{env} n={size} target={target} trunk={trunk} seed={seed}: held-out EV "
        + ", ".join(f"{b}: {snaps[b][0]:.3f}" for b in budgets)
        + f", best {best['ev']:.3f} at step {best['step']} "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    return rows


def summarize_learned(df: pd.DataFrame) -> pd.DataFrame:
    """Means over critic seeds with the half-width of the 95% t-interval (``*_ci``)."""
    from scipy import stats as sps

    keys = ["env", "size", "target", "trunk", "budget", "estimator"]
    cols = [
        "heldout_ev",
        "values_ratio",
        "oracle_ratio",
        "best_step",
        "turn_corr",
        "turn_sign",
        "tok_corr",
        "within_corr",
        "dec_sign",
        "dec_mass",
        "tok_slope",
        "dec_slope",
        "turn_slope",
    ]
    cols = [c for c in cols if c in df]  # a CSV written before the slopes existed has none
    out = []
    for k, g in df.groupby(keys, sort=False):
        row = dict(zip(keys, k))
        row["seeds"] = len(g)
        for c in cols:
            v = g[c].to_numpy(dtype=float)
            v = v[np.isfinite(v)]
            row[c] = float(v.mean()) if len(v) else math.nan
            row[f"{c}_ci"] = (
                float(sps.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
            )
        out.append(row)
    return pd.DataFrame(out)


def learned_tables(summary: pd.DataFrame) -> str:
    """One table per environment: a line per critic (size, target, trunk, budget) with its EV and
    the turn- and token-level correlation of the shown estimators."""

    def f(x, ci):
        return "–" if not np.isfinite(x) else (f"{x:.2f}" + (f"±{ci:.2f}" if np.isfinite(ci) else ""))

    lines = []
    for env, e in summary.groupby("env", sort=False):
        lines += [
            f"\n== {env}: a critic fitted to expert episodes; credit scored on held-out groups "
            f"(turn_corr / tok_corr, mean ± 95% CI over critic seeds)",
            "",
            "| n | target | trunk | steps | held-out EV | across/within (oracle) | " + " | ".join(SHOWN) + " |",
            "|---" * (6 + len(SHOWN)) + "|",
        ]
        for k, g in e.groupby(["size", "target", "trunk", "budget"], sort=False):
            first = g.iloc[0]
            steps = k[3] if k[3] != "best" else f"best ({first['best_step']:.0f})"
            cells = []
            for name in SHOWN:
                r = g[g.estimator == name]
                if r.empty:
                    cells.append("–")
                    continue
                r = r.iloc[0]
                cells.append(f"{f(r['turn_corr'], r['turn_corr_ci'])} / {f(r['tok_corr'], r['tok_corr_ci'])}")
            lines.append(
                f"| {k[0]} | {k[1]} | {k[2]} | {steps} | {f(first['heldout_ev'], first['heldout_ev_ci'])} | "
                f"{first['values_ratio']:.2g} ({first['oracle_ratio']:.2g}) | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


FIT_KEYS = ["env", "size", "target", "trunk", "seed"]


def run_learned(envs, sizes, targets, trunks, seeds, budgets, log=print, done=frozenset(), on_fit=None) -> pd.DataFrame:
    """Every fit of the grid envs × sizes × targets × trunks × seeds, skipping those in ``done``
    (tuples of :data:`FIT_KEYS`); ``on_fit(rows)`` after each fit (e.g. to append them to a CSV)."""
    rows = []
    for env in envs:
        for size in sizes:
            batch = None
            for target in targets:
                for trunk in trunks:
                    if trunk == "policy" and env not in START_DIRS:
                        continue  # no trained policy of this environment is shipped
                    for seed in seeds:
                        if (env, size, target, trunk, seed) in done:
                            continue
                        batch = expert_set(env, size) if batch is None else batch
                        fit = fit_and_score(env, size, target, trunk, seed, budgets, batch, log)
                        rows += fit
                        if on_fit is not None:
                            on_fit(fit)
    return pd.DataFrame(rows)


def _csv_fits(path: str) -> tuple[pd.DataFrame, set]:
    """The rows already in ``path`` (a run that stopped part-way) and the fits they cover."""
    if not os.path.exists(path):
        return pd.DataFrame(), set()
    df = pd.read_csv(path, dtype={"budget": str})
    return df, {tuple(k) for k in df[FIT_KEYS].itertuples(index=False)}


def main_learned(args) -> int:
    """The learned-critic grid; with ``--csv`` every fit's rows are appended as it ends, and fits
    already in the file are kept and skipped (a stopped run resumes)."""
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    old, done = _csv_fits(args.csv) if args.csv else (pd.DataFrame(), set())
    if done:
        print(f"{args.csv}: {len(done)} fits already there, kept and skipped")

    def append(rows):
        if args.csv:
            pd.DataFrame(rows).to_csv(args.csv, mode="a", index=False, header=not os.path.exists(args.csv))

    new = run_learned(
        args.envs, args.sizes, args.targets, args.trunks, args.seeds, args.budgets, done=done, on_fit=append
    )
    df = pd.concat([old, new], ignore_index=True)
    keep = (
        df.env.isin(args.envs)
        & df["size"].isin(args.sizes)
        & df.target.isin(args.targets)
        & df.trunk.isin(args.trunks)
        & df.seed.isin(args.seeds)
    )
    summary = summarize_learned(df[keep])
    print(learned_tables(summary))
    if args.csv:
        summary.to_csv(args.csv.replace(".csv", "") + "_summary.csv", index=False)
        print(f"\nwrote {args.csv} (every fit, budget and estimator) and its _summary.csv")
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    return 0


# --------------------------------------------------------------------------------------------- the policy's truth


def policy_truth(
    episodes: int = 64,
    group: int = 4,
    m: int = 8,
    seed: int = 0,
    q: bool = True,
    expert_noise: float = 0.3,
    difficulty=(3, 4),
) -> tuple[pd.DataFrame, dict]:
    """``--truth mc``: the shipped automation start's own episodes, the policy's Monte-Carlo truth at
    every turn start (``mpo_viz.rollout.truth.mc_truth``, ``m`` continuations, with Q̂ after the
    recorded turn), and every estimator scored per turn against it (raw, disattenuated, slope) and
    against the scripted expert's credit, the critic-based ones reading the expert's values (the
    v2 replication's oracle arm). Returns the table and the value comparison at turn starts."""
    import json

    import torch

    from mpo_viz import models
    from mpo_viz.analysis import credit_accuracy, mc_accuracy
    from mpo_viz.envs import NoisyExpert, make_env
    from mpo_viz.rollout import rollout
    from mpo_viz.rollout.truth import mc_truth

    torch.set_num_threads(1)
    policy, _ = models.load(START_DIRS["automation"])
    env = make_env("automation", difficulty=tuple(difficulty))
    batch = rollout(
        policy, env, episodes, group_size=group, seed=seed, oracle=NoisyExpert(noise=expert_noise), progress=False
    )
    t0 = time.perf_counter()
    batch = mc_truth(batch, policy, m=m, seed=seed, q=q, progress=True)
    truth_s = time.perf_counter() - t0
    b = batch.with_token_fields(values=batch.padded("oracle_values"))
    advs = {label: compute(b, name, **opts).advantages.double().numpy() for label, name, opts in ESTIMATORS}
    mc = mc_accuracy(batch, advs).set_index("estimator")
    ex = credit_accuracy(b, advs).set_index("estimator")
    table = mc.join(ex[["turn_corr"]].rename(columns={"turn_corr": "expert_turn_corr"}))
    v_pol = np.concatenate(batch.field("mc_value"))
    v_exp = np.concatenate([json.loads(x)["oracle"]["turn_v"] for x in batch.field("extra_json")])
    info = {
        "episodes": episodes,
        "turns": len(v_pol),
        "m": m,
        "truth_s": truth_s,
        "success": float(np.mean(batch.outcome_reward)),
        "v_policy": float(v_pol.mean()),
        "v_expert": float(v_exp.mean()),
        "v_corr": float(np.corrcoef(v_pol, v_exp)[0, 1]),
        "reliability": float(table.reliability.iloc[0]),
        "truth": str(table.truth.iloc[0]),
    }
    return table.reset_index(), info


TOKEN_COLUMNS = [
    "estimator",
    "tok_corr",
    "tok_corr_dis",
    "within_corr",
    "within_corr_dis",
    "unc_share",
    "unc_share_truth",
    "sign_agreement",
    "slope_credit_on_truth_dis",
    "slope_truth_on_credit",
]


def policy_token_truth(
    episodes: int = 64,
    group: int = 4,
    m: int = 8,
    m_tokens: int = 16,
    seed: int = 0,
    expert_noise: float = 0.3,
    difficulty=(3, 4),
) -> tuple[pd.DataFrame, dict]:
    """``--truth mc-token``: the shipped automation start's own episodes, the turn-level truth (``m``,
    with Q̂) and the token truth at the uncertain defaults (``m_tokens`` pairs), and every estimator's
    credit scored at the measured tokens, the critic-based ones reading the expert's values."""
    import torch

    from mpo_viz import models
    from mpo_viz.analysis import credit_accuracy
    from mpo_viz.envs import NoisyExpert, make_env
    from mpo_viz.rollout import rollout
    from mpo_viz.rollout.token_truth import mc_token_truth
    from mpo_viz.rollout.truth import mc_truth

    torch.set_num_threads(1)
    policy, _ = models.load(START_DIRS["automation"])
    env = make_env("automation", difficulty=tuple(difficulty))
    batch = rollout(
        policy, env, episodes, group_size=group, seed=seed, oracle=NoisyExpert(noise=expert_noise), progress=False
    )
    t0 = time.perf_counter()
    batch = mc_truth(batch, policy, m=m, seed=seed, q=True, progress=True)
    batch = mc_token_truth(batch, policy, m=m_tokens, seed=seed, progress=True)
    truth_s = time.perf_counter() - t0
    b = batch.with_token_fields(values=batch.padded("oracle_values"))
    advs = {label: compute(b, name, **opts).advantages.double().numpy() for label, name, opts in ESTIMATORS}
    table = credit_accuracy(b, advs, truth="mc-token")
    meta = batch.meta["mc_truth"]["tokens"]
    info = {
        "episodes": episodes,
        "measured": meta["measured"],
        "controls": meta["measured_controls"],
        "m_tokens": m_tokens,
        "truth_s": truth_s,
        "reliability": float(table.reliability.iloc[0]),
        "within_reliability": float(table.within_reliability.iloc[0]),
    }
    return table, info


def expert_token_validation(env: str, episodes: int = 64, m: int = 16, seed: int = 0, noise: float = 0.3) -> tuple:
    """``--truth mc-token --policy expert``: on ``episodes`` expert episodes of ``env`` (noise ``noise``), the
    token truth at the uncertain defaults and at ``decisive``; per rule the agreement with the exact oracle
    (share of measured decisive tokens with |z| < 3, of controls with |Â| < 3·se, the mean error), and the
    within-turn table at the uncertain defaults with the oracle's values as the critic (the turn-level truth,
    M = ``m`` with Q̂, centres the truth's within-turn part)."""
    from mpo_viz.analysis import credit_accuracy
    from mpo_viz.envs import NoisyExpert
    from mpo_viz.envs.generate import GenerateConfig, generate
    from mpo_viz.rollout.token_truth import mc_token_truth
    from mpo_viz.rollout.truth import mc_truth

    batch = generate(GenerateConfig(env=env, episodes=episodes, group_size=4, seed=seed, noise=noise))
    batch = mc_truth(batch, NoisyExpert(noise=noise), m=m, seed=seed, q=True, progress=False)  # Â_k, to centre by
    rows, out = [], None
    for rule, est in (("uncertain", "pi"), ("decisive", "pi"), ("uncertain", "plain")):
        t0 = time.perf_counter()
        res = mc_token_truth(
            batch, NoisyExpert(noise=noise), m=m, seed=seed, positions=rule, estimator=est, progress=False
        )
        secs = time.perf_counter() - t0

        def cat(name, res=res):
            return np.concatenate([np.asarray(x, dtype=np.float64) for x in res.field(name)])

        meas, ctl = cat("mc_tok_measured") == 1, cat("mc_tok_control") == 1
        adv, se, orc, dec = cat("mc_tok_adv"), cat("mc_tok_adv_se"), cat("oracle_token_adv"), cat("decisive") > 0.5
        diff = adv - orc
        z = np.where(np.abs(diff) < 1e-6, 0.0, diff / np.where(se > 0, se, 1e-300))  # the oracle is float32
        d, c = meas & dec & ~ctl, meas & ctl
        rows.append(
            {
                "env": env,
                "positions": rule,
                "estimator": est,
                "measured": int(meas.sum()),
                "decisive": int(d.sum()),
                "z_lt_3": float(np.mean(np.abs(z[d]) < 3)) if d.any() else math.nan,
                "mean_err": float(diff[d].mean()) if d.any() else math.nan,
                "controls": int(c.sum()),
                "controls_zero": float(np.mean(adv[c] == 0)) if c.any() else math.nan,
                "controls_lt_3se": float(np.mean(np.abs(adv[c]) <= 3 * se[c])) if c.any() else math.nan,
                "mean_se": float(se[meas].mean()),
                "seconds": secs,
            }
        )
        if rule == "uncertain" and est == "pi":
            out = res
    b = out.with_token_fields(values=out.padded("oracle_values"))
    advs = {label: compute(b, name, **opts).advantages.double().numpy() for label, name, opts in ESTIMATORS}
    advs["oracle (a*_t)"] = b.padded("oracle_token_adv").double().numpy()
    return pd.DataFrame(rows), credit_accuracy(b, advs, truth="mc-token")


def main_token_truth(args) -> int:
    fmt = {"float_format": lambda x: f"{x:.3f}", "na_rep": "-", "index": False}
    if args.policy == "expert":
        checks, tables = [], []
        for env in args.envs:
            check, table = expert_token_validation(env, episodes=args.episodes or 64, m=args.m_tokens, seed=args.seed)
            checks.append(check)
            tables.append(table.assign(env=env))
            print(
                f"\n== {env}: the scripted expert (noise 0.3) as the policy, {args.episodes or 64} episodes, "
                f"M = {args.m_tokens}: the token truth against the exact oracle"
            )
            print(check.drop(columns=["env"]).to_string(**fmt))
            print("within-turn credit at the uncertain defaults (critic: the oracle's values)")
            print(table[TOKEN_COLUMNS].to_string(**fmt))
        if args.csv:
            pd.concat(checks).to_csv(args.csv, index=False)
            pd.concat(tables).to_csv(args.csv.replace(".csv", "") + "_within.csv", index=False)
            print(f"\nwrote {args.csv} and its _within.csv")
        return 0
    table, info = policy_token_truth(episodes=args.episodes or 64, m=args.m, m_tokens=args.m_tokens, seed=args.seed)
    print(
        f"\n== the shipped automation start (3-4 expert turns): {info['episodes']} episodes, {info['measured']} tokens "
        f"measured ({info['controls']} controls), M = {info['m_tokens']} pairs ({info['truth_s']:.0f} s); "
        f"reliability of the token truth {info['reliability']:.2f}, of its within-turn part "
        f"{info['within_reliability']:.2f}"
    )
    print("credit at the measured tokens against the policy's token truth; critics read the expert's values")
    print(table[TOKEN_COLUMNS + ["within_note"]].to_string(**fmt))
    if args.csv:
        table.to_csv(args.csv, index=False)
        print(f"\nwrote {args.csv}")
    return 0


def main_truth(args) -> int:
    table, info = policy_truth(episodes=args.episodes or 64, m=args.m, seed=args.seed)
    print(
        f"\n== the shipped automation start (3-4 expert turns): {info['episodes']} episodes (sampled success "
        f"{info['success']:.2f}), {info['turns']} turn starts, M = {info['m']} ({info['truth_s']:.0f} s)"
    )
    print(
        f"V at turn starts: the policy's own (Monte-Carlo) {info['v_policy']:.3f}, the expert's {info['v_expert']:.3f}"
        f" (correlation {info['v_corr']:.2f}); truth {info['truth']!r}, reliability {info['reliability']:.2f}"
    )
    cols = [
        "estimator",
        "turn_corr",
        "turn_corr_lo",
        "turn_corr_hi",
        "turn_corr_dis",
        "slope_credit_on_truth_dis",
        "slope_truth_on_credit",
        "turn_sign",
        "expert_turn_corr",
    ]
    print(
        "turn credit against the policy's truth (raw [95%], disattenuated, both slopes: the credit on the truth / ρ, "
        "the truth on the credit) and against the expert's credit; critics read the expert's values"
    )
    print(table[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}", na_rep="-"))
    if args.csv:
        table.to_csv(args.csv, index=False)
        print(f"\nwrote {args.csv}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--truth",
        choices=("expert", "mc", "mc-token"),
        default="expert",
        help="expert: the scripted expert's oracle on its own sets (default); mc: the shipped "
        "automation start's own episodes against its Monte-Carlo truth; mc-token: the same "
        "inside turns, against its token truth",
    )
    ap.add_argument(
        "--policy",
        choices=("start", "expert"),
        default="start",
        help="mc-token: the shipped start (default), or the scripted expert (the path's validation "
        "against the exact oracle)",
    )
    ap.add_argument("--tokens-M", dest="m_tokens", type=int, default=16, help="mc-token: continuation pairs per token")
    ap.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="mc: episodes of the start (G = 4; default 64); oracle-critic: expert episodes per "
        "environment (default 2000; 400 = the shipped set)",
    )
    ap.add_argument("-M", dest="m", type=int, default=8, help="mc: continuations per turn start")
    ap.add_argument("--seed", type=int, default=0, help="mc: rollout and continuation seed")
    ap.add_argument(
        "--critic",
        choices=("noise", "learned"),
        default="noise",
        help="noise: the oracle plus Gaussian noise (default); learned: critics fitted to the sets",
    )
    ap.add_argument(
        "--sizes",
        type=int,
        nargs="*",
        default=[400, 2000],
        help="learned: set sizes (400 = the shipped set; others are generated)",
    )
    ap.add_argument(
        "--targets",
        nargs="*",
        default=["mc", "oracle"],
        choices=["mc", "oracle"],
        help="learned: what the critic is fitted to",
    )
    ap.add_argument(
        "--trunks",
        nargs="*",
        default=["fresh", "policy"],
        choices=["fresh", "policy"],
        help="learned: a fresh trunk, or a shipped trained policy's (automation)",
    )
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="learned: critic seeds")
    ap.add_argument("--budgets", type=int, nargs="*", default=[16, 64, 256, 1024], help="learned: step budgets")
    ap.add_argument("--threads", type=int, default=1, help="learned: torch CPU threads")
    ap.add_argument(
        "--oracle-critic",
        action="store_true",
        help="calibration: the exact oracle values as the critic, slopes beside the derivation's",
    )
    ap.add_argument("--quick", action="store_true", help="sigma in {0, 0.1} only")
    ap.add_argument("--sigmas", type=float, nargs="*", default=None, help="critic noise levels")
    ap.add_argument("--envs", nargs="*", default=list(ENVS), choices=ENVS + GENERATED)
    ap.add_argument(
        "--noise-model",
        default="token",
        choices=["token", "turn"],
        help="critic noise: i.i.d. per token (default) or one draw per turn",
    )
    ap.add_argument("--csv", default=None, help="also write the table as CSV")
    args = ap.parse_args(argv)
    if args.truth == "mc":
        return main_truth(args)
    if args.truth == "mc-token":
        return main_token_truth(args)
    if args.critic == "learned":
        return main_learned(args)
    if args.oracle_critic:
        if "--envs" not in (argv if argv is not None else sys.argv[1:]):
            args.envs = ["automation"]
        return main_calibration(args)
    sigmas = args.sigmas if args.sigmas is not None else ([0.0, 0.1] if args.quick else [0.0, 0.05, 0.1, 0.2])
    t0 = time.perf_counter()
    df = run(args.envs, sigmas, noise_model=args.noise_model)
    pd.set_option("display.width", 200)
    cols = [
        "estimator",
        "turn_corr",
        "turn_sign",
        "tok_corr",
        "within_corr",
        "dec_sign",
        "dec_mass",
        "dec_mass_w",
        "dec_slope",
        "turn_slope",
        "ms",
    ]
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
