"""Episodes and turns ranked by a score, on a hand-built batch whose every number is read off the
rows below."""

import numpy as np
import pytest

from mpo_viz.analysis.ranking import RANKINGS, available, episode_scores, rank_episodes, rank_turns
from mpo_viz.data.trajectory import TrajectoryBatch

# three episodes; masks: action tokens 1, observation 0 (turn 0 = first run of 1s, turn 1 = second)
MASKS = [[1, 1, 0, 1], [1, 0, 1, 1], [1, 1, 1, 0]]
ADV = [[0.5, -2.0, 9.0, 1.0], [0.1, 0.0, 0.3, -0.4], [-1.0, -1.0, -1.0, 7.0]]
OLD = [[-0.1, -0.2, 0.0, -3.0], [-1.0, 0.0, -2.0, -0.5], [-0.05, -0.05, -0.2, 0.0]]
ROLLOUT = [[-0.1, -0.2, 0.0, -1.0], [-1.0, 0.0, -2.0, -0.5], [-0.05, -0.05, -0.2, 0.0]]
RATIO = [[1.0, 1.5, 1.0, 30.0], [2.0, 1.0, 0.5, 1.0], [1.0, 4.0, 1.0, 1.0]]
REWARD = [1.0, 0.0, 0.0]


def _batch(**drop):
    rows = []
    for i in range(3):
        r = {
            "traj_id": f"e{i}",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [5, 6, 7, 8],
            "loss_mask": MASKS[i],
            "reward": REWARD[i],
            "advantages": ADV[i],
            "old_logprobs": OLD[i],
            "rollout_logprobs": ROLLOUT[i],
            "ratio": RATIO[i],
        }
        rows.append({k: v for k, v in r.items() if k not in drop})
    return TrajectoryBatch.from_rows(rows)


def test_largest_abs_advantage_reads_action_tokens_only():
    b = _batch()
    # e0: |0.5|, |-2| and |1| on actions (9.0 sits on an observation); e1: 0.1, 0.3, 0.4; e2: 1, 1, 1 (7 is obs)
    assert episode_scores(b, "abs_advantage").tolist() == pytest.approx([2.0, 0.4, 1.0])
    t = rank_episodes(b, "abs_advantage")
    assert t["traj_id"].tolist() == ["e0", "e2", "e1"] and t["rank"].tolist() == [1, 2, 3]
    turns = rank_turns(b, "abs_advantage", top=2)
    # turns: e0 t0 {0.5, 2} -> 2, e0 t1 {1} -> 1, e1 t0 {0.1}, e1 t1 {0.3, 0.4} -> 0.4, e2 t0 -> 1
    assert list(zip(turns["traj_id"], turns["turn"], turns["score"])) == [("e0", 0, 2.0), ("e0", 1, 1.0)]


def test_lowest_reward_ties_keep_batch_order_and_turns_by_most_negative_mean_advantage():
    b = _batch()
    t = rank_episodes(b, "reward")
    assert t["traj_id"].tolist() == ["e1", "e2", "e0"] and t["score"].tolist() == [0.0, 0.0, 1.0]
    turns = rank_turns(b, "reward")
    # means: e0 t0 (0.5-2)/2 = -0.75, e0 t1 1.0, e1 t0 0.1, e1 t1 (0.3-0.4)/2 = -0.05, e2 t0 -1.0
    assert list(zip(turns["traj_id"], turns["turn"])) == [("e2", 0), ("e0", 0), ("e1", 1), ("e1", 0), ("e0", 1)]
    assert turns["score"].tolist() == pytest.approx([-1.0, -0.75, -0.05, 0.1, 1.0])
    assert turns["n_tokens"].tolist() == [3, 2, 2, 1, 1]


def test_ratio_gap_and_surprisal():
    b = _batch()
    assert episode_scores(b, "ratio").tolist() == pytest.approx([30.0, 2.0, 4.0])
    assert rank_episodes(b, "logprob_gap", top=1)["traj_id"].tolist() == ["e0"]  # |-3 - -1| = 2 on e0's token 3
    assert episode_scores(b, "logprob_gap").tolist() == pytest.approx([2.0, 0.0, 0.0])
    # surprisal: mean -old over actions: e0 (0.1+0.2+3)/3 = 1.1, e1 (1+2+0.5)/3 = 7/6, e2 (0.05+0.05+0.2)/3 = 0.1
    assert episode_scores(b, "surprisal").tolist() == pytest.approx([1.1, 7 / 6, 0.1])
    assert rank_episodes(b, "surprisal")["traj_id"].tolist() == ["e2", "e0", "e1"]


def test_available_rankings_follow_the_fields_and_a_missing_field_is_named():
    assert available(_batch()) == ["abs_advantage", "reward", "ratio", "logprob_gap", "surprisal"]
    b = _batch(ratio=True, rollout_logprobs=True)
    assert available(b) == ["abs_advantage", "reward", "surprisal"]
    with pytest.raises(ValueError, match="'ratio' needs the per-token field ratio; the batch carries"):
        episode_scores(b, "ratio")
    with pytest.raises(ValueError, match="by: expected one of abs_advantage, reward"):
        rank_episodes(b, "nope")
    assert set(RANKINGS) == {"abs_advantage", "reward", "ratio", "logprob_gap", "entropy", "surprisal"}
    assert np.isfinite(episode_scores(_batch(old_logprobs=True), "surprisal")).all()  # the rollout's log-probs
