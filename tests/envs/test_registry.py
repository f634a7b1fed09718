"""Registration that outlives a process: ``--env package.module:factory`` and the ``mpo_viz.envs``
entry-point group, each in fresh processes (a file written by one is replayed by another from the
name it records)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mpo_viz as mv
from mpo_viz.checks import OptionError
from mpo_viz.envs import make_env
from mpo_viz.envs.registry import available_envs, env_options, register_env

ROOT = Path(__file__).resolve().parents[2]
SPEC = "tests.envs.protocol_game:make_game"


def _child_env(*paths) -> dict:
    """The current environment with this checkout (and ``paths``) first on PYTHONPATH, one thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *map(str, paths), *filter(None, [env.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _cli(args, cwd, env=None):
    r = subprocess.run(
        [sys.executable, "-m", "mpo_viz.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env or _child_env(),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def test_module_factory_in_one_process_and_its_file_replayed_in_another(tmp_path):
    # process 1: a fresh model plays the game named by its spec, with a declared option as a flag
    _cli(
        [
            "generate",
            "--env",
            SPEC,
            "--top",
            "4",
            "--episodes",
            "2",
            "--group-size",
            "1",
            "--max-turn-tokens",
            "5",
            "--save-model",
            "m",
            "--out",
            "g.parquet",
        ],
        tmp_path,
    )
    b = mv.load(tmp_path / "g.parquet")
    assert b.meta["generator"]["env"] == SPEC and b.meta["generator"]["env_options"]["top"] == 4
    # process 2 knows nothing but the file: the recorded name rebuilds the environment for the replay
    r = _cli(["truth", "g.parquet", "-o", "t.parquet", "--model", "m", "-M", "2", "-q"], tmp_path)
    assert "turn starts" in r.stdout
    t = mv.load(tmp_path / "t.parquet")
    assert [len(v) for v in t.field("mc_value")] == list(b.num_turns)


def test_an_installed_entry_point_is_listed_in_help_and_plays(tmp_path):
    # a throwaway distribution: a dist-info with an entry point of group mpo_viz.envs, on the child's sys.path
    site = tmp_path / "site"
    (site / "guess_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "guess_plugin-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: guess-plugin\nVersion: 0.1\n"
    )
    (site / "guess_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[mpo_viz.envs]\nguessplug = guess_plugin:make_game\n"
    )
    (site / "guess_plugin.py").write_text("from tests.envs.protocol_game import make_game  # noqa: F401\n")
    script = textwrap.dedent("""
        import contextlib, io, json
        from mpo_viz.cli import main
        from mpo_viz.envs import available_envs
        out = {"envs": available_envs()}
        for argv in (["generate", "--help"], ["train", "--env", "guessplug", "--help"]):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
                main(argv)
            out[argv[0]] = buf.getvalue()
        out["rc"] = main(["generate", "--env", "guessplug", "--top", "4", "--episodes", "2", "--group-size", "1",
                          "--max-turn-tokens", "5", "--out", "g.parquet"])
        print("RESULT " + json.dumps(out))
    """)
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=_child_env(site), timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.split("RESULT ", 1)[1])
    assert "guessplug" in out["envs"] and out["rc"] == 0
    assert "guessplug" in " ".join(out["generate"].split())  # --env's help lists it
    assert "--top TOP" in out["train"] and "--fuzz FUZZ" in out["train"]  # its declared options are train flags
    b = mv.load(tmp_path / "g.parquet")
    assert b.meta["generator"]["env"] == "guessplug"
    assert "guessplug" not in available_envs()  # this process has no such distribution


def test_options_of_a_plain_factory_are_declared_with_option():
    from mpo_viz.options import Option

    def factory(top=6):
        from tests.envs.protocol_game import GuessGame

        return GuessGame(top=top)

    factory.options = (Option("top", 6, kind="int", low=2, high=9),)
    if "guess-local" not in available_envs():
        register_env("guess-local", factory)
    assert env_options("guess-local") == ["top"]
    assert make_env("guess-local", top=3).option_values() == {"top": 3}
    with pytest.raises(OptionError, match="^top: expected an integer >= 2 and <= 9, found 1$"):
        make_env("guess-local", top=1)
    with pytest.raises(OptionError, match=r"expected one of .*search.* or package\.module:factory, found 'nope'"):
        make_env("nope")
    assert json.dumps(make_env(SPEC).option_values())  # recorded in files as JSON
