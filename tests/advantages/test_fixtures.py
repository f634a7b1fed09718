"""mt_grpo, bilevel_gae and the λ rules against their authors' code: fixtures/*.json hold vectors
computed once by fixtures/make_fixtures.py from numpy transcriptions of MT-GRPO's, RAGEN's and
AReaL's functions (repository, file, lines and commit in each file's ``provenance``).

EMPG has no public repository (its project page shows pseudocode for part of it): it is tested
against hand-derived values in test_adv_turn_credit.py instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mpo_viz.advantages as A
from mpo_viz.advantages.token import lambda_per_row

FIX = Path(__file__).parent / "fixtures"
MT_GRPO = json.loads((FIX / "mt_grpo_source.json").read_text(encoding="utf-8"))
RAGEN = json.loads((FIX / "ragen_bilevel_gae.json").read_text(encoding="utf-8"))
AREAL = json.loads((FIX / "areal_lambda_rules.json").read_text(encoding="utf-8"))
TOL = 1e-6


def _arrays(inputs, *names):
    return [np.asarray(inputs[n], dtype=np.float64) for n in names]


@pytest.mark.parametrize("fixture", [MT_GRPO, RAGEN, AREAL], ids=["mt_grpo", "ragen", "areal"])
def test_fixture_says_where_it_came_from(fixture):
    p = fixture["provenance"]
    assert "/" in p["repository"] and len(p["commit"]) == 40
    assert all(".py:" in v or ".yaml:" in v or "verl." in v for v in p["functions"].values())
    assert p["how"]


@pytest.mark.parametrize("case", MT_GRPO["cases"], ids=lambda c: f"coef={c['turn_coef']}")
def test_mt_grpo_index_matches_the_source(case):
    mask, rewards = _arrays(MT_GRPO["inputs"], "mask", "rewards")
    adv, ret = A.mt_grpo(rewards, mask, MT_GRPO["inputs"]["group_ids"], turn_baseline="index", eps=1e-4,
                         turn_coef=case["turn_coef"])
    on = mask == 1
    np.testing.assert_allclose(adv.numpy()[on], np.asarray(case["advantages"])[on], rtol=0, atol=TOL)
    assert (adv.numpy()[~on] == 0).all()
    np.testing.assert_array_equal(ret.numpy(), adv.numpy())


@pytest.mark.parametrize("case", RAGEN["cases"], ids=lambda c: "-".join(map(str, c["options"].values())))
def test_bilevel_gae_matches_ragen(case):
    mask, rewards, values = _arrays(RAGEN["inputs"], "mask", "rewards", "values")
    tid = np.asarray(RAGEN["inputs"]["turn_ids"])
    adv, ret = A.bilevel_gae(rewards, values, mask, turn_ids=tid, **case["options"])
    on = mask == 1
    np.testing.assert_allclose(adv.numpy()[on], np.asarray(case["advantages"])[on], rtol=0, atol=TOL)
    np.testing.assert_allclose(ret.numpy()[on], np.asarray(case["returns"])[on], rtol=0, atol=TOL)


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
        adv, _ = A.turn_gae(rewards, values, mask, turn_ids=tid, gamma=1.0, turn_gamma=case["discount"],
                            lam_rule=case["lam_rule"], **kw)
    np.testing.assert_allclose(adv.numpy(), np.asarray(case["advantages"]) * mask, rtol=0, atol=TOL)
