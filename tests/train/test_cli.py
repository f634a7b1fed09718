"""``mpo-viz train`` and ``mpo_viz.train.launch``: a run from the shell, resume, errors naming the
flag, and a subprocess a notebook can stop and resume."""

import json
import time

import pytest

from mpo_viz.cli import main
from mpo_viz.train import Trainer, launch
from tests.train.train_helpers import TINY, tiny


def _cfg_file(tmp_path, **changes):
    d = {k: v for k, v in TINY.items() if k not in ("env", "iterations", "episodes")}
    d.update(changes)
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps(d))
    return str(p)


def test_train_then_resume_from_the_shell(tmp_path, capsys):
    run = str(tmp_path / "run")
    rc = main(
        [
            "train",
            "--env",
            "search",
            "--estimator",
            "grpo",
            "--loss",
            "token_ppo",
            "--group-size",
            "2",
            "--episodes",
            "4",
            "--iterations",
            "1",
            "--run-dir",
            run,
            "--config",
            _cfg_file(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "iter 1/1 | success" in out and "done: 1 iterations" in out
    assert "eval before RL: sampled success" in out  # where the curve starts
    assert "final eval: sampled success" in out  # the last iteration is always evaluated
    rc = main(["train", "--resume", run, "--iterations", "2"])
    out = capsys.readouterr().out
    assert rc == 0 and "resuming" in out and "iter 2/2" in out and "before RL" not in out
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["phase"]) for r in lines] == [
        (0, "eval"),
        (1, "rl"),
        (1, "eval"),
        (2, "rl"),
        (2, "eval"),
    ]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["iterations"] == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--episodes", "0"], "--episodes: expected an integer >= 1, found 0"),
        (["--estimator", "grpo", "--loss", "token_ppo"], "--group-size: the group estimator 'grpo'"),
        (["--loss", "ppo"], "--loss: expected one of"),
        (["--difficulty", "hard"], "--difficulty: expected N or MIN-MAX"),
        (
            ["--estimator", "grpo", "--group-size", "2", "--critic-lr", "0.001"],
            "--critic-lr: the estimator 'grpo' uses no critic",
        ),
        (
            ["--loss-option", "token_clip"],
            "--loss-option: expected KEY=VALUE (e.g. --loss-option token_clip=2), found 'token_clip'",
        ),
        (["--estimator-option", "=1"], "--estimator-option: expected KEY=VALUE"),
        (["--loss", "token_ppo", "--loss-option", "token_clip=2"], "loss 'token_ppo' has no option 'token_clip'"),
        (["--estimator-option", "turn_lam=2"], "--estimator-option turn_lam: expected a value in [0, 1], found 2"),
        (["--config", "BAD_OPTIONS"], "tiny.json: estimator_options.turn_lam: expected a value in [0, 1], found 2"),
    ],
)
def test_bad_flags_are_named(tmp_path, capsys, argv, message):
    if "BAD_OPTIONS" in argv:  # the same bad value from a config file names the file and the field
        argv = ["--config", _cfg_file(tmp_path, estimator_options={"turn_lam": 2})]
    rc = main(["train", "--run-dir", str(tmp_path / "r"), "--iterations", "1", *argv])
    err = capsys.readouterr().err
    assert rc != 0 and message in err, err
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_estimator_and_loss_options_from_flags_merge_into_the_config_file(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = _cfg_file(
        tmp_path,
        loss_options={"clip_high": 0.28, "token_clip": 4.0},
        estimator_options={"beta": 0.5},
        critic_warmup_steps=0,
    )
    rc = main(
        [
            "train",
            "--run-dir",
            str(run),
            "--config",
            cfg,
            "--env",
            "search",
            "--episodes",
            "2",
            "--iterations",
            "1",
            "--loss-option",
            "token_clip=2",
            "--estimator-option",
            "turn_lam=1.0",
            "--estimator-option",
            "within=local",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    saved = json.loads((run / "config.json").read_text())
    assert saved["loss_options"] == {"clip_high": 0.28, "token_clip": 2}  # the flag wins key by key
    assert saved["estimator_options"] == {"beta": 0.5, "turn_lam": 1.0, "within": "local"}


def test_config_file_errors_name_the_file_and_field(tmp_path, capsys):
    cfg = _cfg_file(tmp_path, max_turn_tokens=0)
    assert main(["train", "--run-dir", str(tmp_path / "r"), "--config", cfg]) == 1
    assert f"{cfg}: max_turn_tokens: expected an integer >= 1" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"learning_rate": 1}')
    assert main(["train", "--run-dir", str(tmp_path / "r"), "--config", str(tmp_path / "bad.json")]) == 1
    assert "unknown field(s) 'learning_rate'" in capsys.readouterr().err


def test_resume_with_other_settings_is_refused_naming_them(tmp_path, capsys):
    cfg = tiny(estimator="grpo", loss="token_ppo", group_size=2, iterations=1, eval_interval=0)
    list(Trainer(cfg, tmp_path / "run", quiet=True).iterate())
    rc = main(["train", "--resume", str(tmp_path / "run"), "--iterations", "3", "--seed", "5", "--epochs", "3"])
    err = capsys.readouterr().err
    assert rc == 1 and "differing fields" in err and "seed: 0 != 5" in err and "epochs: 1 != 3" in err
    assert main(["train", "--resume", str(tmp_path / "run"), "--run-dir", "x"]) == 2


def _wait_for(pred, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_launch_stop_and_resume(tmp_path):
    cfg = tiny(estimator="grpo", loss="token_ppo", group_size=2, iterations=200, eval_interval=0)
    run = tmp_path / "run"
    h = launch(cfg, run)
    metrics = run / "metrics.jsonl"

    def rl_lines():
        return [ln for ln in metrics.read_text().splitlines() if '"phase": "rl"' in ln] if metrics.exists() else []

    # wait for two RL iterations (SFT and the critic warm-up write lines of their own first): a stop
    # that lands between an iteration's metrics line and its checkpoint rolls that line back
    assert _wait_for(lambda: len(rl_lines()) >= 2 or not h.running, 600), h.log()
    assert h.running, h.log()
    rc = h.stop()
    assert rc == 130 and not h.running, h.log()
    assert "interrupted at iteration" in h.log()
    done = len(rl_lines())
    tr = Trainer.resume(run, quiet=True)
    assert tr.iteration == done >= 1
    # launching on the same folder continues the run
    h2 = launch(cfg, run, iterations=done + 1)
    assert h2.wait(600) == 0, h2.log()
    assert "resuming" in h2.log() and f"iter {done + 1}/{done + 1}" in h2.log()
    assert Trainer.resume(run, quiet=True).iteration == done + 1


def test_every_field_and_option_has_a_typed_flag_and_none_is_a_value(tmp_path, capsys):
    from mpo_viz.cli import build_parser
    from mpo_viz.cli.train import _overrides, _with_options
    from mpo_viz.train import Config

    parser = build_parser()
    args = parser.parse_args(
        [
            "train",
            "--token-clip",
            "none",
            "--dual-clip",
            "3",
            "--beta",
            "0.5",
            "--critic-lr",
            "none",
            "--difficulty",
            "3-5",
            "--episodes",
            "8",
        ]
    )
    assert _overrides(args) == {"critic_lr": None, "difficulty": [3, 5], "episodes": 8}
    assert _with_options({"loss_options": {"clip_high": 0.28}}, args) == {
        "estimator_options": {"beta": 0.5},
        "loss_options": {"clip_high": 0.28, "token_clip": None, "dual_clip": 3.0},
    }
    cfg = Config(**_overrides(args), **_with_options({}, args))
    assert cfg.loss_options["token_clip"] is None and cfg.critic_lr is None  # the bare turn-level trust region
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for flag in [f"--{n.replace('_', '-')}" for n, o in Config.options().items() if o.kind != "dict"]:
        assert flag in help_text, flag
    assert (
        "--token-clip TOKEN_CLIP" in help_text
        and "a number > 1" in help_text
        and "defaults gspo None, turn_ppo 2.0" in help_text
    )
    assert (
        "--episodes EPISODES Episodes rolled out per iteration (N); a multiple of group_size. (an integer >= 1; "
        "default 64)" in help_text
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dual-clip", "0.5"], "--dual-clip: expected a number > 1 (verl uses 3) or None, found 0.5"),
        (["--turn-lam", "2"], "--turn-lam: expected a value in [0, 1], found 2.0"),
        (["--top-p", "0"], "--top-p: expected a value in (0, 1], found 0.0"),
        (
            ["--token-clip", "abc"],
            "argument --token-clip: expected a number > 1 (a band [1/c, c] on each token's own "
            "ratio) or None, found 'abc'",
        ),
        (["--episodes", "x"], "argument --episodes: expected an integer >= 1, found 'x'"),
        (["--difficulty", "x"], "--difficulty: expected N or MIN-MAX (expert turns), found 'x'"),
    ],
)
def test_typed_option_flags_are_named_in_errors(tmp_path, capsys, argv, message):
    try:
        rc = main(["train", "--run-dir", str(tmp_path / "r"), *argv])
    except SystemExit as e:  # a flag argparse cannot read: its one-line usage error
        rc = e.code
    err = capsys.readouterr().err
    assert rc != 0 and message in err, err
