"""Verdicts that know when to stay silent: too little data, correlations that are not positive, and
critic-based estimators whose values are noise."""

import math

import pandas as pd
import pytest

import mpo_viz as mv
from mpo_viz.analysis import accuracy_reading, batch_shortfall, data_shortfall, values_are_noise


def table(rows):
    """An accuracy table with the columns the reading uses (the others do not matter to it)."""
    return pd.DataFrame(rows, columns=["estimator", "tok_corr", "dec_mass", "turn_corr", "turn_sign"])


@pytest.mark.parametrize(
    "n,scores,turns,want",
    [
        (16, [0.0, 1.0] * 8, 2, None),
        (15, [0.0, 1.0] * 7 + [1.0], 3, "15 trajectories (a verdict needs at least 16)"),
        (20, [0.0] * 20, 4, "no reward variance (every trajectory scores 0)"),
        (20, {1.0: 12, 0.0: 8}, 1, "no trajectory has 2 turns or more (nothing to compare across turns)"),
        (20, [math.nan] * 20, 2, "no reward variance (every trajectory scores nothing: no reward)"),
        # the case: 4 episodes, all reward 0
        (
            4,
            [0.0] * 4,
            3,
            "4 trajectories (a verdict needs at least 16); no reward variance (every trajectory scores 0)",
        ),
    ],
)
def test_the_minimum_of_data_for_a_verdict(n, scores, turns, want):
    assert data_shortfall(n, scores, turns) == want


def test_batch_shortfall_counts_scores_and_turns():
    b = mv.synthetic.make_batch(16, seed=0, turn_len=(2, 4), obs_len=(1, 2))
    assert batch_shortfall(b) == data_shortfall(16, b.token_rewards.sum(1).double().numpy(), int(b.num_turns.max()))
    assert batch_shortfall(b[:3]).startswith("3 trajectories")


GOOD = table([("mpo", 0.6, 0.5, 0.7, 0.8), ("gae", 0.4, 0.3, 0.5, 0.7), ("grpo", 0.1, 0.2, 0.2, 0.6)])


def test_a_verdict_on_enough_data_names_the_best_and_the_farthest():
    assert accuracy_reading(GOOD) == (
        "Token credit closest to the oracle: mpo (correlation 0.60, 50% of its |A| on "
        "decisive tokens); farthest: grpo (0.10). mpo is also best across turns (turn "
        "correlation 0.70)."
    )


def test_too_little_data_ranks_nothing():
    why = data_shortfall(4, [0.0] * 4, 3)
    assert accuracy_reading(GOOD, shortfall=why) == (
        f"Too little data for a verdict: {why}. The table is descriptive only."
    )


def test_no_estimator_is_best_on_a_negative_or_undefined_correlation():
    # the headline: "mpo is also best across turns (turn correlation -0.34)"
    neg = table([("mpo", -0.2, 0.1, -0.34, 0.4), ("grpo", math.nan, 0.0, -0.5, 0.3)])
    text = accuracy_reading(neg)
    assert "best" not in text and "closest to the oracle:" not in text
    assert text == (
        "No estimator's token credit correlates positively with the oracle (the highest: mpo, -0.20), so "
        "none is closest. Across turns no estimator correlates positively with the oracle (the highest: "
        "mpo, -0.34)."
    )
    zero = table([("mpo", 0.0, 0.1, math.nan, math.nan)])
    assert accuracy_reading(zero).startswith("No estimator's token credit correlates positively")


def test_critic_based_estimators_on_noise_values_are_not_ranked():
    noise = "values from an untrained critic (its value head as initialized): no estimate of the return"
    text = accuracy_reading(GOOD, noise=noise, unranked=["mpo", "gae"])
    assert text.startswith("Token credit closest to the oracle: grpo (correlation 0.10")
    assert "mpo is" not in text and f"Not ranked: mpo, gae ({noise};" in text
    # without a reason the list is ignored: nothing is left out silently either way
    assert accuracy_reading(GOOD, unranked=["mpo", "gae"]) == accuracy_reading(GOOD)


@pytest.mark.parametrize(
    "meta,want",
    [
        ({"values_source": "critic"}, None),
        # a training run's critic, scored on each saved iteration's returns before its update on them
        ({"values_source": "critic", "critic_explained_var": 0.3}, None),
        (
            {"values_source": "critic", "critic_explained_var": -0.959},
            "run's critic, which explained -0.96 of this iteration's returns (≤ 0.05",
        ),
        ({"values_source": "mc", "critic_explained_var": -0.959}, None),  # the policy's own Monte-Carlo values
        ({"values_source": "untrained_critic"}, "untrained critic"),
        ({"values_source": "fitted_critic", "critic_fit": {"heldout_explained_variance": 0.3}}, None),
        (
            {"values_source": "fitted_critic", "critic_fit": {"heldout_explained_variance": 0.05}},
            "held-out explained variance 0.05 (≤ 0.05)",
        ),
        (
            {"values_source": "fitted_critic", "critic_fit": {"heldout_explained_variance": -0.539}},
            "variance -0.54 (≤ 0.05)",
        ),
        ({"values_source": "fitted_critic", "critic_fit": {"heldout_explained_variance": math.nan}}, "not recorded"),
        ({"values_source": "fitted_critic", "critic_fit": {}}, "not recorded"),
    ],
)
def test_values_are_noise(meta, want):
    got = values_are_noise(mv.synthetic.make_batch(2, seed=0).with_meta(**meta))
    assert got is None if want is None else want in got
