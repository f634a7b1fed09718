"""The analysis in words: one line that reads a table, and what to look at when a measure is missing."""

from __future__ import annotations

import pandas as pd

__all__ = ["accuracy_reading", "NO_ORACLE_TEXT"]

NO_ORACLE_TEXT = (
    "No oracle columns (oracle_token_adv, decisive: written by mpo-viz generate for its environments), so how "
    "right each estimator is cannot be measured here, only how they agree. What would tell: the explained "
    "variance of the values against the returns (a critic near 0 gives value-based estimators little to work "
    "with), and the across/within split of the values (a critic flat inside turns gives MPO's within-turn "
    "signal nothing to redistribute). To measure accuracy, compute your policy's own Monte-Carlo truth on a "
    "file the toolkit wrote (mpo-viz truth FILE -o OUT --model DIR), generate trajectories with an oracle "
    "(mpo-viz generate), or see benchmarks/credit_accuracy.py.")


def accuracy_reading(df: pd.DataFrame, values: str = "critic") -> str:
    """One line that reads an accuracy table: which estimator's token credit is closest to the
    oracle and which is farthest, with the turn-level picture when it differs."""
    d = df.dropna(subset=["tok_corr"])
    if d.empty:
        return "No estimator's token credit varies enough to correlate with the oracle."
    best = d.loc[d["tok_corr"].idxmax()]
    worst = d.loc[d["tok_corr"].idxmin()]
    text = (f"Token credit closest to the oracle: {best['estimator']} (correlation {best['tok_corr']:.2f}, "
            f"{best['dec_mass']:.0%} of its |A| on decisive tokens)")
    if worst["estimator"] != best["estimator"]:
        text += f"; farthest: {worst['estimator']} ({worst['tok_corr']:.2f})"
    dt = df.dropna(subset=["turn_corr"])
    if len(dt):
        bt = dt.loc[dt["turn_corr"].idxmax()]
        text += (f". Across turns {bt['estimator']} is best (turn correlation {bt['turn_corr']:.2f}, "
                 f"{bt['turn_sign']:.0%} of turn signs right)" if bt["estimator"] != best["estimator"] else
                 f". {best['estimator']} is also best across turns (turn correlation {bt['turn_corr']:.2f})")
    if values == "oracle":
        text += ". Values here are the oracle's own (values_source: oracle), so this is the best case for value-based estimators"
    return text + "."
