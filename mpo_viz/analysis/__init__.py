"""Analysis: the across/within variance split, per-turn tables, estimator comparison, critic quality,
accuracy against the oracle, and reading them in words.

Pandas out; tensors (torch or numpy, ``(B, L)``) or a :class:`~mpo_viz.data.trajectory.TrajectoryBatch`
in. Every statistic is computed over **action tokens** (``mask == 1``) only: observation and padding
tokens carry no value and no credit (docs/concepts.md §1–2). Turns are the ids of
``batch.turn_ids`` (given, or derived from mask runs by :func:`mpo_viz.data.turns.turn_ids_from_mask` —
the one definition shared with estimators and losses).

One job per module, each statistic in one place:

* :mod:`~mpo_viz.analysis.variance` — the across/within split (:func:`variance_split`,
  :func:`value_variance`, :func:`variance_summary`);
* :mod:`~mpo_viz.analysis.tables` — estimators run on a batch, the per-turn table, the TD error;
* :mod:`~mpo_viz.analysis.comparison` — pairwise agreement, sign flips, disagreement, each
  estimator's advantage statistics;
* :mod:`~mpo_viz.analysis.critic` — explained variance and the critic's error;
* :mod:`~mpo_viz.analysis.accuracy` — accuracy against the oracle;
* :mod:`~mpo_viz.analysis.truth` / :mod:`~mpo_viz.analysis.token_truth` — accuracy against the policy's
  own Monte-Carlo truth, per turn and inside turns;
* :mod:`~mpo_viz.analysis.success` — pass@k;
* :mod:`~mpo_viz.analysis.ranking` — episodes and turns ranked by a score (largest |advantage|,
  lowest reward, token ratio, surprisal, ...), for the explorer's sort and collapse forensics;
* :mod:`~mpo_viz.analysis.reading` — the tables in words;
* :mod:`~mpo_viz.analysis.arrays` — tensors in, turns indexed (shared by the others).

Streamed data (the report reads a file chunk by chunk) use the mergeable form of each statistic:
``*_stats(batch, ...)`` of one chunk, ``merge_*`` of two, ``finish_*`` at the end (and
:class:`~mpo_viz.data.moments.ExplainedVariance` ``.of / .merge / .value``), equal to the numbers of the
whole. Each vectorized function has a plain-Python reference loop beside it (``*_reference``); the
tests check them against each other on edge cases.
"""

from mpo_viz.analysis.accuracy import (
    ACCURACY_COLUMNS,
    ORACLE_FIELDS,
    accuracy_stats,
    credit_accuracy,
    finish_accuracy,
    has_oracle,
    merge_accuracy_stats,
)
from mpo_viz.analysis.arrays import to_numpy
from mpo_viz.analysis.comparison import (
    ADVANTAGE_COLUMNS,
    Disagreement,
    advantage_stats,
    compare_estimators,
    compare_stats,
    disagreement,
    finish_advantages,
    finish_compare,
    merge_advantage_stats,
    merge_compare_stats,
    sign_flips,
)
from mpo_viz.analysis.critic import (
    NOISE_EV,
    CriticQuality,
    ExplainedVariance,
    critic_based,
    critic_quality,
    explained_variance,
    fitted_critic,
    fitted_critic_label,
    values_are_noise,
    values_source,
)
from mpo_viz.analysis.reading import (
    MIN_TRAJECTORIES,
    NO_ORACLE_TEXT,
    accuracy_reading,
    batch_shortfall,
    data_shortfall,
    mc_accuracy_reading,
    ranked_column,
)
from mpo_viz.analysis.success import pass_at_k
from mpo_viz.analysis.tables import compute_advantages, td_error, turn_table, turn_table_reference
from mpo_viz.analysis.token_truth import (
    FLAT_NOTE,
    MC_TOKEN_COLUMNS,
    NO_TURN_NOTE,
    finish_mc_token_accuracy,
    has_mc_token_truth,
    mc_token_accuracy,
    mc_token_accuracy_parts,
    mc_token_accuracy_reference,
    token_truth_table,
    token_truth_text,
)
from mpo_viz.analysis.truth import (
    MC_ACCURACY_COLUMNS,
    MIN_RELIABILITY,
    finish_mc_accuracy,
    has_mc_truth,
    mc_accuracy,
    mc_accuracy_parts,
    mc_turn_truth,
    renamed_columns,
)
from mpo_viz.analysis.variance import (
    advantage_variance,
    merge_variance,
    value_variance,
    variance_split,
    variance_split_reference,
    variance_summary,
)

__all__ = [
    "variance_split",
    "variance_split_reference",
    "explained_variance",
    "ExplainedVariance",
    "pass_at_k",
    "value_variance",
    "advantage_variance",
    "variance_summary",
    "merge_variance",
    "turn_table",
    "turn_table_reference",
    "compute_advantages",
    "to_numpy",
    "td_error",
    "compare_estimators",
    "compare_stats",
    "merge_compare_stats",
    "finish_compare",
    "advantage_stats",
    "merge_advantage_stats",
    "finish_advantages",
    "ADVANTAGE_COLUMNS",
    "sign_flips",
    "disagreement",
    "Disagreement",
    "critic_quality",
    "CriticQuality",
    "has_oracle",
    "ORACLE_FIELDS",
    "accuracy_stats",
    "merge_accuracy_stats",
    "finish_accuracy",
    "credit_accuracy",
    "accuracy_reading",
    "mc_accuracy_reading",
    "ranked_column",
    "data_shortfall",
    "batch_shortfall",
    "MIN_TRAJECTORIES",
    "values_are_noise",
    "critic_based",
    "NOISE_EV",
    "NO_ORACLE_TEXT",
    "ACCURACY_COLUMNS",
    "MC_ACCURACY_COLUMNS",
    "has_mc_truth",
    "mc_accuracy",
    "mc_turn_truth",
    "mc_accuracy_parts",
    "finish_mc_accuracy",
    "MC_TOKEN_COLUMNS",
    "has_mc_token_truth",
    "mc_token_accuracy",
    "mc_token_accuracy_parts",
    "finish_mc_token_accuracy",
    "mc_token_accuracy_reference",
    "token_truth_text",
    "token_truth_table",
    "NO_TURN_NOTE",
    "FLAT_NOTE",
    "MIN_RELIABILITY",
    "renamed_columns",
    "values_source",
    "fitted_critic",
    "fitted_critic_label",
]
