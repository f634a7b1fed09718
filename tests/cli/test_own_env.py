"""Your own environment from the shell: a protocol-only game (no finite model, no expert) generates, gets
its Monte-Carlo truth and trains; the environment's declared options are train flags; what it cannot
do is refused naming the alternative; an untrained model's first rollout says how long it takes."""

import json

import pytest

import mpo_viz as mv
from mpo_viz.cli import main
from mpo_viz.data.runfolder import RunFolder

pytestmark = pytest.mark.usefixtures("one_thread")

SPEC = "tests.envs.protocol_game:make_game"
SMALL = ["--top", "4", "--max-turns", "2", "--max-turn-tokens", "6"]
TRAIN = [
    "--sft-steps",
    "0",
    "--estimator",
    "grpo",
    "--loss",
    "token_ppo",
    "--group-size",
    "2",
    "--episodes",
    "4",
    "--minibatches",
    "2",
    "--eval-episodes",
    "2",
    "--max-total-tokens",
    "200",
    "--rollout-batch-size",
    "4",
]


def test_a_protocol_environment_generates_gets_its_truth_and_trains(tmp_path, capsys):
    g, t, m, run = tmp_path / "g.parquet", tmp_path / "t.parquet", tmp_path / "m", tmp_path / "run"
    # no expert to play it: generate plays a model (a fresh tiny one over bytes)
    assert (
        main(
            [
                "generate",
                "--env",
                SPEC,
                *SMALL,
                "--episodes",
                "4",
                "--group-size",
                "2",
                "--save-model",
                str(m),
                "--out",
                str(g),
            ]
        )
        == 0
    )
    assert "wrote 4 trajectories (2 tasks x 2)" in capsys.readouterr().out
    b = mv.load(g)
    assert not b.has("oracle_values") and b.meta["generator"]["env_options"] == {"top": 4, "max_turns": 2, "fuzz": 0.0}
    assert (b.num_turns <= 2).all() and set(b.field("stop_reason")) <= {"terminated", "turn_limit"}
    assert main(["validate", str(g)]) == 0
    assert main(["truth", str(g), "-o", str(t), "--model", str(m), "-M", "2", "-q"]) == 0
    assert [len(v) for v in mv.load(t).field("mc_value")] == list(b.num_turns)
    capsys.readouterr()
    assert main(["train", "--env", SPEC, *SMALL, *TRAIN, "--iterations", "1", "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "iter 1/1" in out
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["env"] == SPEC and cfg["env_options"] == {"top": 4, "max_turns": 2}
    rl = [r for r in RunFolder(run).metrics() if r.get("phase") == "rl"]
    assert len(rl) == 1 and rl[0]["iteration"] == 1
    saved = mv.load(run / "trajectories" / "iter=000001.parquet")
    assert len(saved) == 4 and not saved.has("oracle_values") and (saved.num_turns <= 2).all()


def test_declared_environment_options_are_train_flags(tmp_path, capsys):
    run = tmp_path / "auto"
    assert (
        main(
            [
                "train",
                "--env",
                "automation",
                "--difficulty",
                "3",
                "--max-turns",
                "4",
                "--slip",
                "0.2",
                *TRAIN,
                "--iterations",
                "0",
                "--run-dir",
                str(run),
            ]
        )
        == 0
    )
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["env_options"] == {"max_turns": 4, "slip": 0.2}
    capsys.readouterr()
    assert (
        main(
            ["train", "--env", "search", "--slip", "0.2", *TRAIN, "--iterations", "0", "--run-dir", str(tmp_path / "s")]
        )
        == 1
    )
    assert (
        "--slip: expected an option of the search environment (distractors, difficulty, slack, max_turns, "
        "shaping, seed), found one it does not take"
    ) in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "--env",
                "automation",
                "--env-option",
                "slip=2",
                *TRAIN,
                "--iterations",
                "0",
                "--run-dir",
                str(tmp_path / "e"),
            ]
        )
        == 1
    )
    assert "--env-option slip: expected a value in [0, 1), found 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, msg",
    [
        (
            [],
            "--sft-steps: expected 0 for the tests.envs.protocol_game:make_game environment, which has no scripted "
            "expert to imitate",
        ),
        (
            ["--sft-steps", "0", "--estimator", "mpo", "--critic", "expert"],
            "--critic: the tests.envs.protocol_game:make_game environment has no finite model",
        ),
    ],
)
def test_what_a_protocol_environment_cannot_do_is_refused(tmp_path, capsys, argv, msg):
    assert main(["train", "--env", SPEC, *argv, "--iterations", "1", "--run-dir", str(tmp_path / "r")]) == 1
    assert msg in capsys.readouterr().err


def test_an_untrained_models_first_rollout_says_how_long_and_how_to_look_cheaper(tmp_path, capsys, monkeypatch):
    import mpo_viz.rollout.play as play

    monkeypatch.setattr(play, "NOTICE_AFTER_S", 0.0)
    assert (
        main(
            [
                "generate",
                "--env",
                "search",
                "--difficulty",
                "2",
                "--policy",
                "model",
                "--episodes",
                "4",
                "--group-size",
                "1",
                "--batch-size",
                "2",
                "--max-turn-tokens",
                "3",
                "--out",
                str(tmp_path / "x.parquet"),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    # search at difficulty 2: a limit of 2 + 2 turns; 4 episodes in rows of 2: 2 rounds of 4 batch turns
    assert (
        "mpo-viz generate: note: rollout: 2 of the first 2 turns ran to max_turn_tokens=3 without a stop token" in err
    )
    assert "every episode runs to its turn limit (4 turns): 4 episodes take" in err and "(2 x 4 batch turns of" in err
    assert "--max-turn-tokens 8" in err and "--episodes 8" in err and "--max-turns 3" in err


def test_a_protocol_environment_with_an_expert_gets_sft_and_monte_carlo_values(tmp_path):
    from mpo_viz.train import Config, Trainer

    cfg = Config(
        env="tests.envs.protocol_game:make_expert_game",
        sft_steps=2,
        sft_eval_interval=2,
        sft_batch_episodes=2,
        episodes=4,
        group_size=2,
        epochs=1,
        minibatches=2,
        iterations=1,
        eval_episodes=2,
        max_turn_tokens=6,
        max_total_tokens=160,
        rollout_batch_size=4,
        estimator="mpo",
        critic="mc",
        mc_samples=2,
    )
    tr = Trainer(cfg, tmp_path / "r", quiet=True)
    out = tr.run_all()
    sft = tr.history[0]
    assert sft["phase"] == "sft" and sft["sft_steps"] == 2 and sft["sft_expert_success"] == 1.0  # bisection wins
    saved = mv.load(tmp_path / "r" / "trajectories" / "iter=000001.parquet")
    assert out[-1]["iteration"] == 1 and saved.meta["values_source"] == "mc"
    assert [len(v) for v in saved.field("mc_value")] == list(saved.num_turns)
