"""Collapse flagged where it happens: the pure detector on synthetic metrics streams, and a forced
collapse (a huge learning rate from the shipped start) warned about in the console and marked in
metrics.jsonl."""

import json
from pathlib import Path

from mpo_viz.train import Config, Trainer
from mpo_viz.train.collapse import DOCS, collapse_flags, new_signals

START = Path(__file__).resolve().parents[2] / "trajectories" / "starts" / "automation"


def _rl(it, **m):
    return {"iteration": it, "phase": "rl", **m}


def _metrics(flags):
    return [[s.metric for s in f] for f in flags]


def test_success_falling_to_zero_from_a_healthy_level_is_flagged_once():
    stream = [
        _rl(1, success=0.1),
        _rl(2, success=0.3),
        _rl(3, success=0.25),
        _rl(4, success=0.04),
        _rl(5, success=0.0),
        _rl(6, success=0.3),
        _rl(7, success=0.05),
    ]
    assert _metrics(collapse_flags(stream)) == [[], [], [], ["success"], ["success"], [], ["success"]]
    s = collapse_flags(stream)[3][0]
    assert (s.value, s.reference) == (0.04, 0.3)
    assert s.message == f"collapse? iteration 4: success fell to 0.040 from 0.300; see {DOCS}"
    # the console warns when a stretch of collapse starts, not on every line of it
    assert [[x.metric for x in new_signals(stream[: i + 1])] for i in range(len(stream))] == [
        [],
        [],
        [],
        ["success"],
        [],
        [],
        ["success"],
    ]


def test_never_healthy_is_not_a_collapse_and_missing_or_null_metrics_are_not_judged():
    stream = [_rl(1, success=0.15), _rl(2, success=0.0), _rl(3, success=None), _rl(4)]
    assert _metrics(collapse_flags(stream)) == [[], [], [], []]


def test_eval_lines_are_judged_per_metric():
    stream = [
        {"iteration": 0, "phase": "eval", "eval_success": 0.625, "eval_sampled_success": 0.375},
        _rl(1, success=0.1),  # no eval metrics on this line
        {"iteration": 1, "phase": "eval", "eval_success": 0.125, "eval_sampled_success": 0.0},
    ]
    flags = collapse_flags(stream)
    assert _metrics(flags) == [[], [], ["eval_sampled_success"]]  # greedy 0.125 is low, not ~0
    assert [x.metric for x in new_signals(stream)] == ["eval_sampled_success"]


def test_entropy_collapsing_without_a_gain_in_success():
    stream = [
        _rl(1, entropy=0.5, success=0.3),
        _rl(2, entropy=0.2, success=0.3),
        _rl(3, entropy=0.049, success=0.25),
        _rl(4, entropy=0.01, success=0.9),
    ]
    # 0.049 < 0.1 x 0.5 with success no higher than at the start; at 0.9 success the sure policy is a good one
    assert _metrics(collapse_flags(stream)) == [[], [], ["entropy"], []]
    assert "entropy fell to 0.0490 from 0.5000" in collapse_flags(stream)[2][0].message


def test_token_ratio_far_outside_the_turn_ratio_in_its_clip():
    stream = [
        _rl(1, ratio_max=3.0, turn_ratio_max=1.1),
        _rl(2, ratio_max=25.0, turn_ratio_max=1.18),
        _rl(3, ratio_max=25.0, turn_ratio_max=2.4),
        _rl(4, ratio_max=12.0),
    ]
    flags = collapse_flags(stream)
    assert _metrics(flags) == [[], ["ratio_max"], [], []]  # a turn ratio out of its clip is the clip acting
    assert "ratio_max 25.0 while turn_ratio_max is 1.18" in flags[1][0].message
    # under a loss that clips each token's own ratio (token_ppo) a large ratio_max is no such sign
    assert _metrics(collapse_flags(stream, span_ratio=False)) == [[], [], [], []]
    assert new_signals(stream[:2], span_ratio=False) == [] and len(new_signals(stream[:2])) == 1


def test_the_ratio_rule_follows_the_loss_registry():
    from mpo_viz.losses import get_loss

    assert get_loss("turn_ppo").span_ratio and get_loss("gspo").span_ratio
    assert not get_loss("token_ppo").span_ratio and not get_loss("sao").span_ratio


def test_thresholds_are_arguments():
    stream = [_rl(1, success=0.5), _rl(2, success=0.2)]
    assert _metrics(collapse_flags(stream)) == [[], []]
    assert _metrics(collapse_flags(stream, floor=0.25)) == [[], ["success"]]


def test_a_forced_collapse_is_warned_in_the_console_and_marked_in_the_metrics(tmp_path, capsys, one_thread):
    """From the shipped start (greedy 0.625 and sampled 0.375 on these 8 tasks), one iteration at
    policy lr 0.05 wrecks the policy: the final evaluation is flagged. (GAE with an untrained critic:
    its advantages are never all 0, so the update happens whatever the four episodes scored.)"""
    cfg = Config(
        env="automation",
        difficulty=[3, 4],
        model_dir=str(START),
        sft_steps=0,
        estimator="gae",
        loss="token_ppo",
        critic_warmup_steps=0,
        episodes=4,
        epochs=2,
        minibatches=2,
        iterations=1,
        eval_episodes=8,
        eval_interval=0,
        policy_lr=0.05,
        rollout_batch_size=8,
        oracle_noise=None,
        save_trajectories_every=0,
    )
    tr = Trainer(cfg, tmp_path / "run")
    tr.run_all(log=print)
    err = capsys.readouterr().err
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    start, end = lines[0], lines[-1]
    assert start["eval_success"] >= 0.2 and "collapse" not in start
    assert end["phase"] == "eval" and end["eval_success"] <= 0.05
    assert "eval_success" in end["collapse"]
    assert (
        f"warning: collapse? iteration 1: eval_success fell to {end['eval_success']:.3f} from "
        f"{start['eval_success']:.3f}; see {DOCS}" in err
    )
