"""The numbers the README headline and docs/results.md's summaries quote, computed from the archived
records (``experiments/records/``), so that a test can hold the text to them.

    python -m experiments.readings          # prints the E1 table of docs/results.md and the headline numbers

Slopes are named by their direction: ``slope_credit_on_truth`` regresses an estimator's turn credit
on the true turn advantage (1 = the credit neither shrinks nor inflates the true signal; the
truth's noise attenuates it, so it is divided by the truth's reliability), ``slope_truth_on_credit``
regresses the truth on the credit (1 = calibrated as a forecast: a credit of x means a true
advantage of x on average; noise in the truth does not bias it).
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from scipy import optimize, stats

from experiments.grids import REPO
from experiments.stats import effect_reading, power, ranking_reading
from mpo_viz.analysis.truth import renamed_columns

RECORDS = REPO / "experiments" / "records"
E1_CSV = RECORDS / "v3" / "e1-e4" / "e1.csv"
FIT = ["snapshot", "trunk", "seed"]

#: E1's rows as docs/results.md shows them: label -> the e1.csv estimator names it stands for
E1_ROWS = {
    "`gae` λ = 0.95": ["gae lam=0.95"],
    "`vapo`": ["vapo"],
    "`gae` relative λ (q = 0.5)": ["gae relative λ q=0.5"],
    "`sao`": ["sao (gae, vapo λ, α=1.5)"],
    '`mpo` `value_at="mean"`': ["mpo value_at=mean"],
    '`mpo` `within="baseline"`': ["mpo within=baseline"],
    '`mpo`, `turn_gae` (and `mpo` local, λ = 0, `within="td"`)': [
        "mpo",
        "turn_gae",
        "mpo local",
        "mpo lam=0",
        "mpo within=td",
    ],
    "`mpo`, `turn_gae` with λ_T = 0": ["mpo turn_lam=0", "turn_gae turn_lam=0"],
    "`bilevel_gae`": ["bilevel_gae"],
    "`gae` λ = 1": ["gae lam=1"],
    "`gigpo`": ["gigpo"],
    "`grpo`, `drgrpo`, `rloo`, `mt_grpo`, `reinforce_pp_baseline`": [
        "grpo",
        "drgrpo",
        "rloo",
        "mt_grpo",
        "reinforce_pp_baseline",
    ],
    "`reinforce_pp`": ["reinforce_pp"],
}
CRITIC_FREE = ("grpo", "drgrpo", "rloo", "mt_grpo", "mt_grpo index", "reinforce_pp", "reinforce_pp_baseline", "gigpo")


def minus(text: str) -> str:
    """Text with the typographic minus sign the docs use."""
    return text.replace("-", "−")


def half_width(x) -> float:
    """Half-width of the 95% t-interval of the mean of ``x``."""
    x = np.asarray(x, float)
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))


def e1_fits() -> pd.DataFrame:
    """E1's rows with ``slope_credit_on_truth`` (noise-corrected) and ``slope_truth_on_credit`` per fit."""
    # the archive keeps the old column names (turn_slope, turn_slope_dis); renamed_columns reads them and adds
    # slope_truth_on_credit = turn_corr² / turn_slope (cov / Var(credit))
    d = renamed_columns(pd.read_csv(E1_CSV), warn=False)
    d["slope_credit_on_truth"] = d.slope_credit_on_truth_dis  # quoted noise-corrected
    return d


def over_snapshots(rows: pd.DataFrame, col: str) -> tuple[float, float]:
    """Mean over the 5 snapshots (each the mean of its fits) and the 95% half-width over snapshots."""
    per = rows.groupby("snapshot")[col].mean()
    return float(per.mean()), half_width(per)


def e1_table() -> str:
    """docs/results.md's E1 table, from e1.csv."""
    d = e1_fits()
    crit, flat, expert = (d[d["values"] == v] for v in ("critic", "flattened", "expert"))
    head = (
        "| estimator | raw correlation | disattenuated (learned critic) | flattened critic | expert's values "
        "| critic − flattened | slope credit on truth | slope truth on credit | ρ(EV, accuracy) |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]

    def cell(rows, col, nd=3, sign=""):
        m, h = over_snapshots(rows, col)
        return minus(f"{m:{sign}.{nd}f} ± {h:.{nd}f}")

    def slopes(names, col):
        if len(names) == 1:
            return cell(crit[crit.estimator == names[0]], col, 2)
        means = [over_snapshots(crit[crit.estimator == n], col)[0] for n in names]
        return (
            f"{min(means):.2f}–{max(means):.2f}"
            if max(means) - min(means) >= 0.005
            else cell(crit[crit.estimator == names[0]], col, 2)
        )

    for label, names in E1_ROWS.items():
        name = names[0]  # the rows of a label give the same turn credit up to each turn's scale: one correlation
        c = crit[crit.estimator == name]
        free = name in CRITIC_FREE
        paired = c.set_index(FIT).turn_corr_dis - flat[flat.estimator == name].set_index(FIT).turn_corr_dis
        diff = "0" if paired.abs().max() < 1e-6 else cell(paired.reset_index(), "turn_corr_dis", sign="+")
        rho = stats.spearmanr(c.heldout_ev, c.turn_corr_dis).statistic
        bold = "**" if name == "gae lam=0.95" else ""
        lines.append(
            f"| {label} | {cell(c, 'turn_corr')} | {bold}{cell(c, 'turn_corr_dis')}{bold} | "
            + (
                "(no critic) | | | "
                if free
                else f"{cell(flat[flat.estimator == name], 'turn_corr_dis')} | "
                f"{cell(expert[expert.estimator == name], 'turn_corr_dis')} | {diff} | "
            )
            + f"{slopes(names, 'slope_credit_on_truth')} | {slopes(names, 'slope_truth_on_credit')} | "
            + ("" if free else minus(f"{rho:+.2f}"))
            + " |"
        )
    return "\n".join(lines)


def ev_confound() -> dict:
    """ρ(EV, accuracy) of a critic-free estimator (the scored episodes' difficulty moving with the fit's
    seed) and ρ(EV, accuracy relative to GRPO on the same turns) for GAE λ = 1, over the 30 fits."""
    c = e1_fits().query("values == 'critic'").set_index(FIT)
    grpo = c[c.estimator == "grpo"]
    gae1 = c[c.estimator == "gae lam=1"]
    rel = stats.spearmanr(gae1.heldout_ev, gae1.turn_corr_dis - grpo.turn_corr_dis)
    free = [
        stats.spearmanr(c[c.estimator == n].heldout_ev, c[c.estimator == n].turn_corr_dis).statistic
        for n in CRITIC_FREE
    ]
    return {
        "rho_gae1_minus_grpo": float(rel.statistic),
        "p_gae1_minus_grpo": float(rel.pvalue),
        "rho_critic_free_min": float(min(free)),
        "rho_critic_free_max": float(max(free)),
    }


def e1_numbers() -> dict:
    """The E1 numbers the README quotes."""
    d = e1_fits()
    c = d[d["values"] == "critic"]
    mean = c.groupby("estimator")[["turn_corr_dis", "slope_credit_on_truth", "slope_truth_on_credit"]].mean()
    based = mean.drop(index=[n for n in CRITIC_FREE if n in mean.index])
    free = mean.loc[[n for n in CRITIC_FREE if n in mean.index]]
    ci = c.set_index(FIT)
    diff = ci[ci.estimator == "gae lam=0.95"].turn_corr_dis - ci[ci.estimator == "mpo"].turn_corr_dis
    return {
        "critic_based_lo": based.turn_corr_dis.min(),
        "critic_based_hi": based.turn_corr_dis.max(),
        "group_lo": free.turn_corr_dis.min(),
        "group_hi": free.turn_corr_dis.max(),
        "gae95_corr": mean.loc["gae lam=0.95", "turn_corr_dis"],
        "gae95_truth_on_credit": mean.loc["gae lam=0.95", "slope_truth_on_credit"],
        "gae95_credit_on_truth": mean.loc["gae lam=0.95", "slope_credit_on_truth"],
        "mpo_corr": mean.loc["mpo", "turn_corr_dis"],
        "mpo_truth_on_credit": mean.loc["mpo", "slope_truth_on_credit"],
        "mpo_credit_on_truth": mean.loc["mpo", "slope_credit_on_truth"],
        "gae95_beats_mpo": int((diff > 0).sum()),
        "fits": len(diff),
        "gae95_minus_mpo_mean": float(diff.mean()),
        "gae95_minus_mpo_min": float(diff.min()),
        "turns_lo": int(d.n_turns.min()),
        "turns_hi": int(d.n_turns.max()),
    }


def read_jsonl(path) -> list[dict]:
    return pd.read_json(path, lines=True).to_dict("records")


def comparison(folder: str, a: str, b: str) -> dict:
    """A primary comparison of a grid's archived records (``comparisons.jsonl``)."""
    (row,) = [r for r in read_jsonl(RECORDS / folder / "comparisons.jsonl") if (r["a"], r["b"]) == (a, b)]
    return row


def summary(folder: str) -> pd.DataFrame:
    return pd.DataFrame(read_jsonl(RECORDS / folder / "summary.jsonl")).set_index("method")


def e3_numbers() -> dict:
    s, f = summary("v3/e3"), pd.DataFrame(read_jsonl(RECORDS / "v3" / "e3" / "final.jsonl"))
    warm = f.dropna(subset=["warmup_explained_var"]).drop_duplicates("seed")
    return {
        "mpo_ppo": comparison("v3/e3", "mpo_token", "ppo"),
        "baseline": comparison("v3/e3", "mpo_baseline", "mpo_token"),
        "start": float(s.start_sampled.iloc[0]),
        "final_lo": float(s.final_sampled.min()),
        "final_hi": float(s.final_sampled.max()),
        "greedy_start": float(s.start_greedy.iloc[0]),
        "greedy_lo": float(s.final_greedy.min()),
        "greedy_hi": float(s.final_greedy.max()),
        "greedy_fell_everywhere": bool((s.final_greedy < s.start_greedy).all()),
        "warmup_ev_mean": float(warm.warmup_explained_var.mean()),
        "warmup_ev_max": float(warm.warmup_explained_var.max()),
        "warmups_all_at_budget": bool((warm.warmup_stop == "budget").all()) and len(warm) == f.seed.nunique(),
        "seeds": int(f.seed.nunique()),
    }


def paired_power(diffs, d: float = 0.05, alpha: float = 0.025) -> float:
    """:func:`experiments.stats.power` with the spread of the paired differences ``diffs`` observed."""
    return power(float(np.std(diffs, ddof=1)), len(diffs), d, alpha)


def paired_detectable(diffs, target: float = 0.8, alpha: float = 0.025) -> float:
    """The true difference a paired t-test at ``alpha`` sees with power ``target``, at the spread of
    the paired differences ``diffs`` observed (the inverse of :func:`paired_power` in the difference)."""
    sd = float(np.std(diffs, ddof=1))
    return float(optimize.brentq(lambda d: power(sd, len(diffs), d, alpha) - target, 1e-9, 100 * sd))


def e2_numbers() -> dict:
    acc = pd.read_csv(RECORDS / "v4" / "e2p" / "accuracy.csv")
    by = acc.groupby("turn_lam").corr_dis
    return {
        "mc_ppo": comparison("v3/e2", "turn_gae_mc", "ppo"),
        "mc_grpo": comparison("v3/e2", "turn_gae_mc", "grpo"),
        "mc0_ppo": comparison("v4/e2p", "turn_gae_mc0", "ppo"),
        "mc0_grpo": comparison("v4/e2p", "turn_gae_mc0", "grpo"),
        "critic_corr": e1_numbers()["mpo_corr"],
        "lam09_lo": float(by.min()[0.9]),
        "lam09_hi": float(by.max()[0.9]),
        "lam0_lo": float(by.min()[0.0]),
        "lam0_hi": float(by.max()[0.0]),
    }


def e5_numbers() -> dict:
    """E5 (within-turn credit against the token truth): the primary comparisons and the secondary as
    archived, and per estimator the mean over every fit (critic values) of the token-level and
    within-turn correlations with the truth."""
    folder = RECORDS / "v4" / "e5"
    comps = {c["comparison"]: c for c in read_jsonl(folder / "comparisons.jsonl")}
    df = pd.read_csv(folder / "e5.csv")
    critic = df[df["values"] == "critic"]
    measure = comps["mpo - turn_gae"]["measure"]
    means = critic.groupby("estimator")[[measure, "tok_corr", "within_corr"]].mean()
    return {
        "mpo_turn_gae": comps["mpo - turn_gae"],
        "mpo_baseline": comps["mpo - mpo_baseline"],
        "within": comps["mpo within_corr - 0 (secondary, uncorrected)"],
        "measure": measure,
        "corr": means[measure].to_dict(),
        "within_corr": means["within_corr"].to_dict(),
        "snapshots": int(df.snapshot.nunique()),
        "fits": int(df.groupby(["snapshot", "trunk", "seed"]).ngroups),
        "reliability_lo": float(df.reliability.min()),
        "reliability_hi": float(df.reliability.max()),
    }


#: RAGEN's reported Sokoban gain of bi-level GAE over PPO (21% -> 23.4% success)
RAGEN_GAIN = 0.024


def e6_numbers() -> dict:
    """E6 (the literature's Sokoban ranking): the two primaries with their readings by the rule fixed
    in advance, the arms' summaries and the critic warm-ups' held-out explained variance."""
    bl = comparison("v4/e6", "bilevel_gae", "ppo")
    mp = comparison("v4/e6", "mpo_token", "ppo")
    f = pd.DataFrame(read_jsonl(RECORDS / "v4" / "e6" / "final.jsonl"))
    warm = f.dropna(subset=["warmup_explained_var"]).drop_duplicates("seed")
    return {
        "bilevel_ppo": {
            **bl,
            "reading": ranking_reading(bl),
            "contains_ragen": bl["ci_low"] <= RAGEN_GAIN <= bl["ci_high"] if np.isfinite(bl["ci_low"]) else None,
        },
        "mpo_ppo": {**mp, "reading": effect_reading(mp)},
        "summary": summary("v4/e6"),
        "seeds": int(f.seed.nunique()),
        "runs": len(f),
        "warmup_ev_lo": float(warm.warmup_explained_var.min()),
        "warmup_ev_hi": float(warm.warmup_explained_var.max()),
    }


def e6_seed_table() -> str:
    """docs/results.md's E6 table: final held-out sampled success per seed and arm (start: the
    shipped start on that seed's 128 rooms, the same for every arm of a seed)."""
    f = pd.DataFrame(read_jsonl(RECORDS / "v4" / "e6" / "final.jsonl"))
    arms = ["grpo", "ppo", "bilevel_gae", "mpo_token"]
    wide = f.pivot_table(index="seed", columns="method", values="final_sampled")
    start = f.groupby("seed").start_sampled.first()
    lines = ["| seed | start | " + " | ".join(arms) + " |", "|---" * (len(arms) + 2) + "|"]
    for seed in wide.index:
        cells = [f"{wide.loc[seed, a]:.3f}" if a in wide and np.isfinite(wide.loc[seed, a]) else "–" for a in arms]
        lines.append(f"| {seed} | {start[seed]:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    print(e1_table())
    for k, v in {**e1_numbers(), **ev_confound()}.items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
