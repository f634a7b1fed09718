"""Every number the README headline quotes equals the archived records (experiments/readings.py), and
docs/results.md's E1 table is the one generated from them: the readings cannot drift again."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from experiments import readings
from experiments.grids import REPO

README = (REPO / "README.md").read_text()
RESULTS = (REPO / "docs" / "results.md").read_text()


def headline() -> str:
    start = README.index("**Does MPO's credit assignment help?**")
    return " ".join(README[start : README.index("See [`docs/results.md`]", start)].split())


def f(x: float, nd: int = 3, sign: bool = False) -> str:
    return readings.minus(f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}")


def rng(lo: float, hi: float, nd: int = 2) -> str:
    return f"{lo:.{nd}f}–{hi:.{nd}f}"


@pytest.fixture(scope="module")
def quoted() -> list[str]:
    """The numbers the headline must quote, each formatted from the records."""
    e1, e2, e3 = readings.e1_numbers(), readings.e2_numbers(), readings.e3_numbers()
    e5, e6 = readings.e5_numbers(), readings.e6_numbers()
    e6b, e6m = e6["bilevel_ppo"], e6["mpo_ppo"]
    assert e6b["contains_ragen"] is False  # "an interval without RAGEN's +0.024"
    assert e6b["reading"] == "cannot be told at this power" and e6m["reading"].startswith("cannot be told")
    mp, bl = e3["mpo_ppo"], e3["baseline"]
    mc_ppo, mc_grpo = e2["mc_ppo"], e2["mc_grpo"]
    assert e3["greedy_fell_everywhere"] and e3["warmups_all_at_budget"] and e3["seeds"] == 8  # "missed its gate"
    return [
        f(mp["mean_diff"]),
        f"CI {f(mp['ci_low'])} to {f(mp['ci_high'], sign=True)}",
        f(bl["mean_diff"], sign=True),
        f"CI {f(bl['ci_low'], sign=True)} to {f(bl['ci_high'], sign=True)}",
        f"Holm p {bl['p_holm']:.2f}",
        f"{e3['start']:.3f} → {rng(e3['final_lo'], e3['final_hi'])}",
        f"{e3['greedy_start']:.3f} → {rng(e3['greedy_lo'], e3['greedy_hi'])}",
        f"explained variance {e3['warmup_ev_mean']:.2f} on average",
        f"{f(mc_ppo['mean_diff'])} ({f(mc_ppo['ci_low'])} to {f(mc_ppo['ci_high'], sign=True)}) from PPO",
        f"{f(mc_grpo['mean_diff'], sign=True)} ({f(mc_grpo['ci_low'])} to {f(mc_grpo['ci_high'], sign=True)}) from "
        "GRPO",
        f"only {rng(e2['lam09_lo'], e2['lam09_hi'])} with the truth",
        f"at λ_T = 0 ({rng(e2['lam0_lo'], e2['lam0_hi'])}; a learned critic's: {e2['critic_corr']:.2f})",
        f"ended {f(e2['mc0_ppo']['mean_diff'])} ({f(e2['mc0_ppo']['ci_low'])} to "
        f"{f(e2['mc0_ppo']['ci_high'], sign=True)}) from PPO",
        f"{f(e2['mc0_grpo']['mean_diff'], sign=True)} ({f(e2['mc0_grpo']['ci_low'])} to "
        f"{f(e2['mc0_grpo']['ci_high'], sign=True)}) from GRPO",
        f"power of only {readings.paired_power(e2['mc0_ppo']['diffs']):.2f}",
        f"(correlation {rng(e1['critic_based_lo'], e1['critic_based_hi'])})",
        f"({rng(e1['group_lo'], e1['group_hi'])})",
        f"closest ({e1['gae95_corr']:.2f})",
        f"has slope {e1['gae95_truth_on_credit']:.2f})",
        f"turn credit ({e1['mpo_corr']:.2f})",
        f"about {1 / e1['mpo_truth_on_credit']:.0f}×",
        f"has slope {e1['mpo_truth_on_credit']:.2f})",
        f"all {e5['mpo_turn_gae']['units']} of its",
        f"({f(e5['mpo_turn_gae']['mean_diff'], sign=True)}, 95% CI {f(e5['mpo_turn_gae']['ci_low'], sign=True)} to "
        f"{f(e5['mpo_turn_gae']['ci_high'], sign=True)})",
        f"({e5['corr']['gae 0.95']:.2f} against {e5['corr']['mpo']:.2f})",
        f"sampled success {e6['summary'].start_sampled.iloc[0]:.3f}",
        f"bi-level GAE ended {f(e6b['mean_diff'])} (95% CI {f(e6b['ci_low'])} to "
        f"{f(e6b['ci_high'], sign=True)}) from PPO",
        f"MPO-token {f(e6m['mean_diff'])} ({f(e6m['ci_low'])} to {f(e6m['ci_high'], sign=True)})",
        f"RAGEN's {f(readings.RAGEN_GAIN, sign=True)}",
    ]


def test_the_headline_quotes_the_records(quoted):
    text = headline()
    missing = [q for q in quoted if q not in text]
    assert not missing, f"README headline differs from the records: {missing}"


def test_the_headline_quotes_no_number_the_records_do_not_give(quoted):
    # every decimal in the headline is one of the checked quotes (design constants aside)
    design = {"0.95", "0.9"}  # λ = 0.95, λ_T = 0.9: the estimators' settings, not results
    checked = " ".join(quoted)
    stray = [x for x in re.findall(r"\d+\.\d+", headline()) if x not in design and x not in checked]
    assert not stray, f"README headline quotes numbers no test checks: {stray}"


def test_the_e1_table_of_results_md_is_the_generated_one():
    assert readings.e1_table() in RESULTS


def test_the_corrected_readings_stand():
    e1, c = readings.e1_numbers(), readings.ev_confound()
    assert e1["gae95_beats_mpo"] == e1["fits"] == 30 and e1["gae95_minus_mpo_min"] > 0
    assert e1["gae95_truth_on_credit"] == pytest.approx(1.05, abs=0.01)  # calibrated as a forecast
    assert e1["mpo_truth_on_credit"] == pytest.approx(0.30, abs=0.01)  # MPO's turn credit overstates ~3x
    assert (e1["turns_lo"], e1["turns_hi"]) == (217, 265)
    assert c["rho_gae1_minus_grpo"] == pytest.approx(0.46, abs=0.01) and c["p_gae1_minus_grpo"] < 0.02
    for text in (
        "0.20–0.29",
        "217–265 turns",
        "(ρ = +0.46, p = 0.010, 30 fits)",
        "30 of 30 critic fits",
        f"by {e1['gae95_minus_mpo_mean']:.3f} on",
        f"at least {e1['gae95_minus_mpo_min']:.3f}",
    ):
        assert text in " ".join(RESULTS.split()), text


def test_e2p_pairs_its_new_arm_with_e2s_runs_by_seed():
    """The integrity check fixed in advance: each turn_gae_mc0 run's held-out evaluation before RL
    equals E2's archived ppo and grpo start evaluation on the same seed (same start, same tasks)."""
    runs = readings.RECORDS / "v4" / "e2p" / "runs" / "automation-d3-4"

    def start(arm, seed):
        for line in (runs / arm / f"seed={seed}" / "metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("eval_sampled_success") is not None:
                return r["eval_sampled_success"], r["eval_success"], r["eval_seed"], r["n_eval_tasks"]

    for seed in range(6):
        assert start("turn_gae_mc0", seed) == start("ppo", seed) == start("grpo", seed)


def test_the_e5_summary_quotes_the_records():
    """docs/results.md's E5 summary (partly run) quotes the archived comparisons and fits."""
    e5 = readings.e5_numbers()
    start = RESULTS.index("* **E5 (MPO's within-turn credit against the token truth): done.**")
    text = " ".join(RESULTS[start : RESULTS.index("* **E6", start)].split())
    tg, bl, w = e5["mpo_turn_gae"], e5["mpo_baseline"], e5["within"]
    for q in (
        f"`tok_corr_dis` {f(tg['mean_diff'], sign=True)}, 95% CI {f(tg['ci_low'], sign=True)} to "
        f"{f(tg['ci_high'], sign=True)} over {tg['units']} units; Holm p {tg['p_holm']:.2f}",
        f"({f(bl['mean_diff'], sign=True)}, {f(bl['ci_low'])} to {f(bl['ci_high'], sign=True)};",
        f"(correlation {f(w['mean_diff'], sign=True)}, {f(w['ci_low'], sign=True)} to {f(w['ci_high'], sign=True)}",
    ):
        assert q in text, q
    assert e5["measure"] == "tok_corr_dis"
    done = e5["fits"] // 6  # complete snapshots: six fits each
    assert e5["snapshots"] == done == 5 and f"{tg['units']} of the 15 units" in text
    assert f"**{tg['reading']}**" in text and f"**{bl['reading']}**" in text  # the rule's words
    corr, within = e5["corr"], e5["within_corr"]
    for q in (
        f"token GAE λ = 0.95 ({corr['gae 0.95']:.2f} disattenuated, mean over the {e5['fits']} fits)",
        f"VAPO ({corr['vapo']:.2f}), against MPO's {corr['mpo']:.2f} and turn GAE's {corr['turn_gae']:.2f}",
        f"correlates {within['gae 0.95']:.2f} and {within['vapo']:.2f} with the truth's (MPO's: {within['mpo']:.2f})",
        f"reliability is {rng(e5['reliability_lo'], e5['reliability_hi'])}",
    ):
        assert q in text, q


def test_the_e6_readings_quote_the_records():
    """docs/results.md's E6 summary and section quote the archived comparisons, by the rule's words,
    and its per-seed table is the one generated from final.jsonl."""
    e6 = readings.e6_numbers()
    assert e6["runs"] == 24 and e6["seeds"] == 6
    assert readings.e6_seed_table() in RESULTS
    text = " ".join(RESULTS.split())
    bl, mp = e6["bilevel_ppo"], e6["mpo_ppo"]
    for c in (bl, mp):
        sd = float(np.std(c["diffs"], ddof=1))
        row = (
            f"| {c['paired_seeds']} | {f(c['mean_diff'], sign=True)} ({f(c['ci_low'], sign=True)} to "
            f"{f(c['ci_high'], sign=True)}) | {c['p_value']:.3f} | {c['p_holm']:.3f} | cannot be told at this power | "
            f"{sd:.3f} | {readings.paired_power(c['diffs']):.2f} | {readings.paired_detectable(c['diffs']):.3f} |"
        )
        assert row in text, row
    for q in (
        f"**cannot be told at this power**: {f(bl['mean_diff'], sign=True)} (95% CI {f(bl['ci_low'], sign=True)} to "
        f"{f(bl['ci_high'], sign=True)}; Holm p {bl['p_holm']:.2f})",
        f"either: {f(mp['mean_diff'], sign=True)} ({f(mp['ci_low'], sign=True)} to {f(mp['ci_high'], sign=True)}; "
        f"Holm p {mp['p_holm']:.2f})",
        f"held-out EV {e6['warmup_ev_lo']:.3f}–{e6['warmup_ev_hi']:.3f}",
    ):
        assert q in text, q
