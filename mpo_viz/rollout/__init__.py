"""Batched multi-turn rollout of a policy in a text environment: token in, token out, honest log-probs.

``rollout(policy, env, n_episodes, group_size=G, critic=critic, seed=0)`` plays ``n_episodes``
episodes (``n_episodes / G`` tasks, G samples each) and returns a trajectory/v1
:class:`~mpo_viz.data.trajectory.TrajectoryBatch`.

**One batch turn.** Up to ``batch_size`` live episodes share one key/value cache (rows = episodes,
columns = cache slots; a 0/1 ``attention_mask`` marks the slots each row really uses, and
``position_ids`` carry each row's own positions, so a padded row computes what it would alone):

1. *feed* — every row's pending tokens (a new episode's prompt; otherwise the last sampled token
   of its previous turn and the observation after it) go through the model in one forward,
   left-padded to the longest; only the last position's logits are kept;
2. *decode* — all rows sample their next token at once from those logits, then one-token forwards
   with the cache follow; a row whose turn ended (the stop token, ``max_turn_tokens``, or the
   ``max_total_tokens`` budget) feeds padding until every row is done;
3. *step* — each environment reads the decoded text of its turn (the ids stay exactly as sampled),
   its observation is laid out by the policy's chat layout (``loss_mask`` 0) and becomes the row's
   pending tokens; finished episodes leave, the cache is compacted, queued episodes join.

Earlier turns are never recomputed (see ``benchmarks/rollout.py`` for the cost against
``model.generate``). Once an episode ended, the critic runs once over its ``prompt + response`` (on
the CPU one unpadded sequence at a time: see ``critic_values``), in a second thread while the
policy decodes the other episodes when a core is free (``critic_thread``), else after the last.

**Log-probs and entropy per action token.** ``old_logprobs``: ``log softmax(logits)[token]`` (temperature 1, no
top-p: the policy's own log-prob, what the losses use as π_old). ``rollout_logprobs``: the log-prob
under the distribution actually sampled from — ``softmax(logits / T)`` restricted to the top-p
nucleus and renormalized; at T = 1, top-p = 1 both are the same numbers; at ``temperature=0``
(greedy) the sampled distribution is a point mass and ``rollout_logprobs`` are 0.
``entropy``: ``H = −Σ_v p_v log p_v`` of the policy's own distribution ``p = softmax(logits)`` at the
position each action token was sampled from (temperature 1, no top-p, whatever the sampling options;
``0·log 0 = 0``), what ``empg`` reads. Observation tokens carry 0 in all three.

**Episode ends.** ``stop_reason``: ``"terminated"`` (the task ended), ``"turn_limit"`` (the
environment's turn limit — part of the environment, whose values are 0 there; not bootstrapped),
``"max_total_tokens"`` (the rollout's token budget cut the episode: ``truncated`` and
``bootstrap_value`` = the critic's output at the last position). A turn cut by ``max_turn_tokens`` is
given to the environment as written; a turn cut by the total budget is not (the episode ends).
An observation is always appended whole, so a row may exceed ``max_total_tokens`` by one
observation.

**Determinism.** Every episode draws its sampling noise from its own stream (seeded by the rollout
seed, its task and sample), and each token is sampled by inversion of the CDF with one uniform
number, so the same seed gives the same tokens whatever ``batch_size`` (float log-probs agree to
rounding: batch composition changes summation order by ~1e-7).

**Layout.** ``plan`` (options, tasks and seeds), ``engine`` (sampling, the shared cache,
attention), ``episodes`` (an episode's state and its environment steps), ``play`` (:func:`rollout`:
the batch turns), ``critic`` (values of finished episodes), ``batch`` (episodes to trajectory/v1),
``replay`` (turn states rebuilt from a file) and ``branch`` / ``truth`` (Monte-Carlo values of a
policy by branch rollouts from those states: :func:`mc_truth`), ``positions`` / ``inturn`` /
``token_truth`` (the true advantages of chosen tokens inside turns, by branching at token prefixes:
:func:`mc_token_truth`).
"""

from __future__ import annotations

from mpo_viz.rollout.critic import critic_values
from mpo_viz.rollout.engine import (
    SDPA_GROUPED,
    sample_tokens,
    side_pool,
    spare_cores,
    usable_cores,
    uses_sliding_window,
)
from mpo_viz.rollout.plan import (
    DEFAULT_ORACLE,
    ORACLE_TOKEN_FIELDS,
    STOP_REASONS,
    RolloutConfig,
    task_seeds,
)
from mpo_viz.rollout.play import rollout
from mpo_viz.rollout.token_truth import mc_token_truth
from mpo_viz.rollout.truth import mc_truth

__all__ = [
    "rollout",
    "RolloutConfig",
    "task_seeds",
    "STOP_REASONS",
    "ORACLE_TOKEN_FIELDS",
    "DEFAULT_ORACLE",
    "sample_tokens",
    "side_pool",
    "spare_cores",
    "usable_cores",
    "uses_sliding_window",
    "SDPA_GROUPED",
    "critic_values",
    "mc_truth",
    "mc_token_truth",
]
