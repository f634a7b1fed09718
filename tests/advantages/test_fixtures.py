"""gigpo, mt_grpo, bilevel_gae and the λ rules against their authors' code.

gigpo_verl_agent.json, mt_grpo_source.json and ragen_bilevel_gae.json hold the outputs of the
original public functions (verl-agent's compute_gigpo_outcome_advantage and its helpers, MT-GRPO's
_assign_advantages, RAGEN's compute_bi_level_gae_advantage_return), run once with their bodies
unmodified by a script outside this repository; each file's ``provenance`` names repository,
commit, path, functions and how the inputs were laid out. areal_lambda_rules.json comes from
numpy transcriptions of AReaL's functions (fixtures/make_fixtures.py).

EMPG has no public repository (its project page shows pseudocode for part of it): it is tested
against hand-derived values in test_turn_credit.py instead.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import mpo_viz.advantages as A
from mpo_viz.advantages import reference as ref
from mpo_viz.advantages.token import lambda_per_row

FIX = Path(__file__).parent / "fixtures"
GIGPO = json.loads((FIX / "gigpo_verl_agent.json").read_text(encoding="utf-8"))
MT_GRPO = json.loads((FIX / "mt_grpo_source.json").read_text(encoding="utf-8"))
RAGEN = json.loads((FIX / "ragen_bilevel_gae.json").read_text(encoding="utf-8"))
AREAL = json.loads((FIX / "areal_lambda_rules.json").read_text(encoding="utf-8"))
TOL = 1e-6


def _arrays(inputs, *names):
    return [np.asarray(inputs[n], dtype=np.float64) for n in names]


def _name(c):
    return c["name"]


@pytest.mark.parametrize("fixture", [GIGPO, MT_GRPO, RAGEN, AREAL], ids=["gigpo", "mt_grpo", "ragen", "areal"])
def test_fixture_says_where_it_came_from(fixture):
    p = fixture["provenance"]
    assert "/" in p["repository"] and len(p["commit"]) == 40
    assert all(".py:" in v or ".yaml:" in v or "verl." in v for v in p["functions"].values())
    assert p["how"]


@pytest.mark.parametrize("fixture", [GIGPO, MT_GRPO, RAGEN], ids=["gigpo", "mt_grpo", "ragen"])
def test_fixture_ran_the_original_function(fixture):
    p = fixture["provenance"]
    assert p["path"].endswith(".py") and p["path"] in " ".join(p["functions"].values())
    assert "bodies unmodified" in p["how"] and "outside this repository" in p["how"]


# ----------------------------------------------------------------------------- GiGPO (verl-agent)


def _gigpo(mod, case):
    x = GIGPO["inputs"][case["inputs"]]
    mask, rewards, tid = _arrays(x, "mask", "rewards", "turn_ids")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # groups of one (test_warnings.py)
        adv, ret = mod.gigpo(
            rewards,
            mask,
            x["group_ids"],
            prompt_ids=x["prompt_ids"],
            response_ids=x["response_ids"],
            turn_ids=tid,
            **case["options"],
        )
    return np.asarray(adv), np.asarray(ret), mask


@pytest.mark.parametrize("case", GIGPO["cases"], ids=_name)
def test_gigpo_matches_verl_agent(case):
    adv, ret, mask = _gigpo(A, case)
    on = mask == 1
    np.testing.assert_allclose(adv[on], np.asarray(case["advantages"])[on], rtol=0, atol=TOL)
    assert (adv[~on] == 0).all()
    np.testing.assert_array_equal(ret, adv)
    ref_adv, _, _ = _gigpo(ref, case)  # the reference loop reads the same thing
    np.testing.assert_allclose(ref_adv[on], np.asarray(case["advantages"])[on], rtol=0, atol=TOL)


def test_gigpo_issue_minimal_case_in_numbers():
    # one group: trajectories of 1 and 3 turns, scores 1 and 0 (verl-agent per step row, issue 53)
    want = {
        ("mean_std_norm", "steps"): [2.2071, -1.2071, -0.5, -0.5],
        ("mean_norm", "steps"): [1.25, -0.75, -0.25, -0.25],
        ("mean_std_norm", "trajectories"): [1.4142, -1.4142, -0.7071, -0.7071],
        ("mean_norm", "trajectories"): [1.0, -1.0, -0.5, -0.5],
    }
    for case in GIGPO["cases"]:
        if case["inputs"] == "issue_minimal":
            key = (case["options"]["norm"], case["options"]["episode_stats"])
            np.testing.assert_allclose(case["per_step_row"], want[key], atol=1e-4)
            adv, _, _ = _gigpo(A, case)
            np.testing.assert_allclose([adv[0, 0], adv[1, 0], adv[1, 2], adv[1, 4]], want[key], atol=1e-4)


def test_gigpo_defaults_are_verl_agents_mean_std_norm():
    case = next(c for c in GIGPO["cases"] if c["name"].startswith("mixed/mean_std_norm/steps/omega=1.0/gamma=0.95"))
    x = GIGPO["inputs"]["mixed"]
    mask, rewards, tid = _arrays(x, "mask", "rewards", "turn_ids")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adv, _ = A.gigpo(
            rewards, mask, x["group_ids"], prompt_ids=x["prompt_ids"], response_ids=x["response_ids"], turn_ids=tid
        )
    on = mask == 1
    np.testing.assert_allclose(adv.numpy()[on], np.asarray(case["advantages"])[on], rtol=0, atol=TOL)


# ----------------------------------------------------------------------------- MT-GRPO


def _mt(mod, case, turn_baseline):
    x = MT_GRPO["inputs"][case["inputs"]]
    mask, rewards = _arrays(x, "mask", "rewards")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adv, ret = mod.mt_grpo(
            rewards, mask, x["group_ids"], turn_baseline=turn_baseline, eps=1e-4, turn_coef=case["options"]["turn_coef"]
        )
    return np.asarray(adv), np.asarray(ret), mask


def _source(case):
    return np.array([[np.nan if v is None else v for v in row] for row in case["advantages"]])


@pytest.mark.parametrize("case", [c for c in MT_GRPO["cases"] if c["inputs"] != "group_of_one"], ids=_name)
def test_mt_grpo_index_matches_the_source(case):
    adv, ret, mask = _mt(A, case, "index")
    on = mask == 1
    np.testing.assert_allclose(adv[on], _source(case)[on], rtol=0, atol=TOL)
    assert (adv[~on] == 0).all()
    np.testing.assert_array_equal(ret, adv)
    ref_adv, _, _ = _mt(ref, case, "index")
    np.testing.assert_allclose(ref_adv[on], _source(case)[on], rtol=0, atol=TOL)


@pytest.mark.parametrize("case", [c for c in MT_GRPO["cases"] if c["inputs"] != "group_of_one"], ids=_name)
def test_mt_grpo_index_present_is_the_source_only_when_every_rollout_calls_a_tool(case):
    adv, _, mask = _mt(A, case, "index_present")
    on = mask == 1
    diff = np.abs(adv - _source(case))[on].max()
    if case["inputs"] == "all_tool":
        assert diff < TOL
    else:  # a rollout without a tool call gets the outcome advantage, not the source's combined one
        assert diff > 0.1


def test_mt_grpo_issue_minimal_case_in_numbers():
    case = next(c for c in MT_GRPO["cases"] if c["inputs"] == "issue_minimal")
    np.testing.assert_allclose(_source(case), [[1.414, 0.707, 0.707], [-0.707, -0.707, -0.707]], atol=1e-3)
    adv, _, _ = _mt(A, case, "index")
    np.testing.assert_allclose(adv, [[1.414, 0, 0.707], [-0.707, 0, 0]], atol=1e-3)


def test_mt_grpo_group_of_one_differs_by_design():
    # num_generations = 1: torch's std of one value is NaN, and so is every advantage of the source;
    # mpo_viz gives O/(1 + ε) (GRPO's group-of-one rule) and no turn part
    case = next(c for c in MT_GRPO["cases"] if c["inputs"] == "group_of_one")
    assert np.isnan(_source(case)).all()
    adv, _, mask = _mt(A, case, "index")
    outcome = np.array(MT_GRPO["inputs"]["group_of_one"]["outcome_rewards"])
    on = mask == 1
    np.testing.assert_allclose(adv[on], np.broadcast_to((outcome / (1 + 1e-4))[:, None], adv.shape)[on], atol=1e-12)


# ----------------------------------------------------------------------------- RAGEN bi-level GAE


def _bilevel(mod, case, turn_ends):
    x = RAGEN["inputs"][case["inputs"]]
    mask, rewards, values = _arrays(x, "mask", "rewards", "values")
    tid = np.asarray(x["turn_ids"])
    adv, ret = mod.bilevel_gae(rewards, values, mask, turn_ids=tid, turn_ends=turn_ends, **case["options"])
    return np.asarray(adv), np.asarray(ret), mask


@pytest.mark.parametrize("case", RAGEN["cases"], ids=_name)
def test_bilevel_gae_rewards_rule_matches_ragen(case):
    for mod in (A, ref):
        adv, ret, mask = _bilevel(mod, case, "rewards")
        on = mask == 1
        np.testing.assert_allclose(adv[on], np.asarray(case["advantages"])[on], rtol=0, atol=TOL)
        np.testing.assert_allclose(ret[on], np.asarray(case["returns"])[on], rtol=0, atol=TOL)
        assert (adv[~on] == 0).all() and (ret[~on] == 0).all()


@pytest.mark.parametrize("case", RAGEN["cases"], ids=_name)
def test_bilevel_gae_turns_rule_matches_ragen_when_every_turn_ends_on_a_reward(case):
    adv, ret, mask = _bilevel(A, case, "turns")
    on = mask == 1
    diff = max(np.abs(adv - case["advantages"])[on].max(), np.abs(ret - case["returns"])[on].max())
    if case["inputs"] == "turn_end_rewards":
        assert diff < TOL
    else:  # turns without a reward at their end: mpo_viz's turns are not RAGEN's
        assert diff > 1e-3


def test_bilevel_gae_shipped_setting_is_token_gae():
    # RAGEN's shipped setting, the score on the last token only: one turn per row, γ_H unused — three
    # turns, reward 1 at the end, V = 0: RAGEN's returns are 1 everywhere, the turn rule's 0.95² at turn 0
    case = next(c for c in RAGEN["cases"] if c["name"] == "three_turns_v0/gamma=1.0/lam=1.0/hg=0.95")
    mask = np.asarray(RAGEN["inputs"]["three_turns_v0"]["mask"])
    on = mask == 1
    np.testing.assert_allclose(np.asarray(case["returns"])[on], 1.0, atol=1e-7)
    _, ret, _ = _bilevel(A, case, "turns")
    np.testing.assert_allclose(ret[on], [0.9025, 0.9025, 0.95, 0.95, 1.0, 1.0], atol=1e-12)
    for c in RAGEN["cases"]:
        if c["inputs"] == "last_token_score":
            x = RAGEN["inputs"]["last_token_score"]
            mask, rewards, values = _arrays(x, "mask", "rewards", "values")
            o = c["options"]
            gae, _ = A.gae(rewards, values, mask, gamma=o["gamma"], lam=o["lam"], whiten=True)
            np.testing.assert_allclose(gae.numpy()[mask == 1], np.asarray(c["advantages"])[mask == 1], atol=TOL)


def test_bilevel_gae_rewards_rule_where_ragen_raises():
    # RAGEN raises IndexError when a row's last action token has reward 0; mpo_viz ends the row's last
    # turn there (reward 0): the turn rule with those turns spelled out
    na = RAGEN["not_accepted"]
    assert na["raised"].startswith("IndexError")
    mask, rewards, values = _arrays(na["inputs"], "mask", "rewards", "values")
    tid = np.array([[0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0]])  # row 0: a turn ends at the reward 1.0
    assert mask[0].tolist() == [1, 1, 0, 1, 1, 0, 0] and rewards[0, 1] == 1.0 and rewards[0, 4] == 0
    a1, g1 = A.bilevel_gae(rewards, values, mask, turn_ends="rewards")
    a2, g2 = A.bilevel_gae(rewards, values, mask, turn_ids=tid)
    np.testing.assert_allclose(a1.numpy(), a2.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(g1.numpy(), g2.numpy(), rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- AReaL λ rules


@pytest.mark.parametrize("case", AREAL["lambda_cases"], ids=lambda c: f"{c['rule']}-{c.get('alpha', c.get('q'))}")
def test_lambda_rules_match_areal(case):
    lam = lambda_per_row(case["rule"], 1.0, np.asarray(case["lengths"]), case.get("alpha", 0.05), case.get("q", 0.5))
    np.testing.assert_allclose(lam, case["lam"], rtol=0, atol=TOL)


@pytest.mark.parametrize("case", AREAL["gae_cases"], ids=lambda c: f"{c['estimator']}-{c['lam_rule']}")
def test_gae_with_lambda_rules_matches_areal(case):
    mask, rewards, values = _arrays(AREAL["inputs"], "mask", "rewards", "values")
    tid = np.asarray(AREAL["inputs"]["turn_ids"])
    kw = {k: case[k] for k in ("alpha", "q") if k in case}
    if case["estimator"] == "gae":
        adv, _ = A.gae(rewards, values, mask, gamma=case["discount"], lam_rule=case["lam_rule"], **kw)
    else:
        adv, _ = A.turn_gae(
            rewards, values, mask, turn_ids=tid, gamma=1.0, turn_gamma=case["discount"], lam_rule=case["lam_rule"], **kw
        )
    np.testing.assert_allclose(adv.numpy(), np.asarray(case["advantages"]) * mask, rtol=0, atol=TOL)
