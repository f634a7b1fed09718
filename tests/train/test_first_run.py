"""A first run a newcomer can follow: how long SFT will take and why, a missed SFT target in one
line, the SFT start kept as RUN/start (reusable with --model-dir, never pruned), and a summary that
says whether sampled and greedy success moved and, when not, what to look at."""

import json

import pytest
import torch

from mpo_viz.cli import main
from mpo_viz.train import Config, Trainer
from mpo_viz.train.summary import (
    DOCS_NOT_LEARNING,
    hints,
    phase_line,
    phase_seconds,
    success_moves,
    summary_lines,
)
from tests.train.train_helpers import TINY


def _eval(it, sampled, greedy, n=128):
    return {
        "iteration": it,
        "phase": "eval",
        "eval_sampled_success": sampled,
        "eval_success": greedy,
        "n_eval_tasks": n,
    }


def _rl(it, **m):
    return {"iteration": it, "phase": "rl", **m}


def test_success_moves_by_hand():
    stream = [_eval(0, 0.36, 0.62), _rl(1, success=0.4), _rl(2, success=0.5), _eval(2, 0.55, 0.64)]
    sampled, greedy = success_moves(stream)
    se = (0.36 * 0.64 / 128 + 0.55 * 0.45 / 128) ** 0.5
    assert (sampled.kind, sampled.start, sampled.end, sampled.n) == ("sampled", 0.36, 0.55, 128)
    assert sampled.se == pytest.approx(se) and sampled.verdict == "rose"  # 0.19 > 2 x 0.061
    assert greedy.verdict == "did not move"  # 0.02 < 2 x 0.060
    assert greedy.text() == ("greedy success 0.620 -> 0.640 (+0.020, standard error 0.060 on 128 tasks): did not move")
    lines = summary_lines(stream)
    assert len(lines) == 2 and "what to look at" not in " ".join(lines)  # one rose: nothing to diagnose
    assert success_moves([_eval(0, 0.3, 0.6)]) == [] and success_moves(stream[1:]) == []
    assert summary_lines(stream[:2])[0].startswith("no evaluation before and after RL")


def test_when_nothing_rose_the_summary_says_what_to_look_at():
    stream = [
        {
            "iteration": 0,
            "phase": "critic_warmup",
            "warmup_passed": False,
            "warmup_explained_var": 0.05,
            "warmup_gate": 0.2,
        },
        _eval(0, 0.02, 0.0),
        _rl(1, success=0.0, approx_kl=1e-7, critic_explained_var=0.01),
        _rl(2, success=0.03, approx_kl=3e-7, critic_explained_var=0.03, collapse=["success"]),
        _eval(2, 0.0, 0.0),
    ]
    found = hints(stream)
    assert [h.split(" ")[0:3] for h in found] == [
        ["collapse", "signatures", "were"],
        ["the", "critic", "warm-up"],
        ["almost", "no", "rollout"],
        ["the", "policy", "barely"],
        ["the", "critic", "explains"],
        ["only", "2", "iterations:"],
    ]
    assert "approx_kl 2.0e-07" in found[3] and "critic_explained_var 0.020" in found[4]
    last = summary_lines(stream)[-1]
    assert last.startswith("what to look at: collapse signatures were flagged (success)") and DOCS_NOT_LEARNING in last


def test_a_warmup_with_nothing_to_learn_is_named_first_among_the_warmup_hints():
    stream = [
        {
            "iteration": 0,
            "phase": "critic_warmup",
            "warmup_passed": False,
            "warmup_stop": "constant",
            "warmup_constant": 0.0,
            "warmup_explained_var": float("nan"),
            "warmup_gate": 0.2,
        },
        _eval(0, 0.0, 0.0),
        _rl(1, success=0.0),
        _eval(1, 0.0, 0.0),
    ]
    found = hints(stream)
    assert found[0].startswith("the critic warm-up had nothing to learn (warmup_stop constant")
    assert "set the critic to the constant 0" in found[0] and not any("missed its gate" in h for h in found)


def test_phase_seconds_add_up_the_timings_of_every_record_by_hand():
    stream = [
        {"phase": "sft", "seconds": {"sft": 10.0, "eval": 3.0}},
        {"phase": "critic_warmup", "seconds": {"warmup_pool": 4.0, "warmup_fit": 0.5}},
        {"phase": "eval", "seconds": {"eval": 6.0}},
        _rl(
            1,
            timings={
                "rollout": 2.0,
                "rollout_oracle": 0.5,
                "values": 0.25,
                "advantages": 0.125,
                "update": 3.0,
                "eval": 0.0,
                "write": 0.5,
                "total": 99.0,
                "checkpoint": 0.25,
            },
        ),
        _rl(
            2,
            timings={
                "rollout": 1.0,
                "values": 0.25,
                "advantages": 0.125,
                "update": 2.0,
                "eval": 6.0,
                "write": 0.5,
                "total": 99.0,
            },
        ),
        _eval(2, 0.1, 0.1),
    ]
    assert phase_seconds(stream) == {
        "sft": 10.0,
        "warm-up pool": 4.0,
        "warm-up fit": 0.5,
        "rollout": 3.0,
        "values": 0.5,
        "advantages": 0.25,
        "update": 5.0,
        "eval": 15.0,
        "write": 1.25,
    }
    assert phase_line(stream, wall=42.0) == (
        "seconds per phase: sft 10.0, warm-up pool 4.0, warm-up fit 0.5, "
        "rollout 3.0, values 0.5, advantages 0.2, update 5.0, eval 15.0, "
        "write 1.2 (sum 39.5 s of 42.0 s wall)"
    )
    assert phase_line([_eval(0, 0.1, 0.1)]) == "seconds per phase: none recorded"


def test_sft_says_how_long_misses_its_target_in_one_line_and_keeps_its_start(tmp_path, capsys):
    cfg = {k: v for k, v in TINY.items() if k not in ("sft_steps",)}
    cfg.update(
        estimator="mpo",
        critic_warmup_episodes=10,
        critic_warmup_steps=1,
        keep_checkpoints=1,
        sft_steps=4,
        sft_eval_interval=2,
        sft_target_success=1.0,
        iterations=2,
        eval_interval=0,
    )
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    run = tmp_path / "run"
    rc = main(["train", "--config", str(tmp_path / "c.json"), "--run-dir", str(run)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    est = next(x for x in cap.err.splitlines() if x.startswith("sft: up to"))
    assert (
        "4 steps x" in est and "s per step (measured on the first 3" in est and "2 greedy evaluations of 2 tasks" in est
    )
    missed = [x for x in cap.out.splitlines() if "MISSED" in x]
    assert len(missed) == 1 and missed[0].startswith("sft: 4 steps, greedy success 0.000")
    assert "MISSED the target 1 (the budget of 4 steps ended first)" in missed[0]
    assert f"start kept in {run / 'start'}" in missed[0]
    # the start survives keep_checkpoints=1, with the warmed-up critic beside the policy
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter=000002", "latest"]
    assert (run / "start" / "policy").is_dir() and (run / "start" / "critic").is_dir()
    info = json.loads((run / "start" / "start.json").read_text())
    assert info["sft"]["sft_steps"] == 4 and "critic" in info
    # where the time went: every phase of the run, from SFT to the last evaluation
    phases = next(x for x in cap.out.splitlines() if x.startswith("seconds per phase: "))
    names = [x.rsplit(" ", 1)[0] for x in phases.removeprefix("seconds per phase: ").split(" (sum")[0].split(", ")]
    assert names == ["sft", "warm-up pool", "warm-up fit", "rollout", "values", "advantages", "update", "eval", "write"]
    assert phases.endswith(" s wall)")
    # the summary: start vs end, moved or not
    tail = cap.out.splitlines()[-4:]
    assert tail[0].startswith("sampled success ") and tail[1].startswith("greedy success ")
    assert tail[2] == "the critic trained on the estimator's own returns (value_target 'estimator')"
    assert "what to look at:" in tail[3]


def test_a_kept_start_is_reused_and_a_start_at_its_target_takes_no_sft(tmp_path):
    a = Trainer(
        Config(
            **{
                **TINY,
                "estimator": "grpo",
                "loss": "token_ppo",
                "group_size": 2,
                "sft_steps": 2,
                "sft_eval_interval": 1,
                "sft_target_success": 1.0,
                "iterations": 0,
            }
        ),
        tmp_path / "a",
        quiet=True,
    )
    a.run_all()
    start = tmp_path / "a" / "start"
    b = Trainer(
        Config(
            **{
                **TINY,
                "estimator": "grpo",
                "loss": "token_ppo",
                "group_size": 2,
                "model_dir": str(start),
                "sft_steps": 50,
                "sft_target_success": 0.0,
                "iterations": 0,
            }
        ),
        tmp_path / "b",
        quiet=True,
    )
    for k, v in a.policy.model.state_dict().items():
        assert torch.equal(v, b.policy.model.state_dict()[k]), k
    rec = b.sft()
    assert rec["sft_steps"] == 0  # the start already met the target: evaluated first, no step taken
    assert not (tmp_path / "b" / "start").exists()  # no SFT made here: the start is the folder given


def test_monte_carlo_values_that_explain_little_get_their_own_hint():
    """critic="mc" trains no critic: a low critic_explained_var there is the noise of M continuations,
    so the hint names --mc-samples, not a longer warm-up."""
    mc = [
        _eval(0, 0.3, 0.3),
        {**_rl(1, success=0.3, critic_explained_var=-32.0), "timings": {"mc": 24.0}},
        _eval(1, 0.3, 0.3),
    ]
    found = hints(mc)
    assert any(
        h.startswith("the policy's Monte-Carlo values explain little")
        and "critic_explained_var -32.000" in h
        and "--mc-samples" in h
        for h in found
    )
    assert not any("longer warm-up" in h for h in found)
    learned = [mc[0], _rl(1, success=0.3, critic_explained_var=-32.0), mc[2]]
    assert any(h.startswith("the critic explains little") and "longer warm-up" in h for h in hints(learned))
