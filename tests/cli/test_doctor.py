"""``mpo-viz doctor``: one table, --json, exit 1 when a check fires, thresholds as flags."""

from __future__ import annotations

import json
from pathlib import Path

from mpo_viz.cli import main
from mpo_viz.doctor import CHECKS

ROOT = Path(__file__).resolve().parents[2]

FLAT = "\n".join(
    json.dumps({"traj_id": t, "group_id": g, "prompt_ids": [1], "response_ids": [5], "loss_mask": [1], "reward": r})
    for t, g, r in (("a", "g", 1.0), ("b", "g", 1.0), ("c", "h", 0.0), ("d", "h", 1.0))
)


def test_table_and_exit_code(tmp_path, capsys):
    path = tmp_path / "x.jsonl"
    path.write_text(FLAT + "\n", encoding="utf-8")
    assert main(["doctor", str(path)]) == 1  # one of the two groups is flat: 50% reaches the default 0.5
    out = capsys.readouterr().out
    assert out.count("\n") > len(CHECKS) and "what to fix" in out
    line = next(x for x in out.splitlines() if x.startswith("flat_groups "))
    assert "fired" in line and " 2  a, b" in line and "dynamic sampling" in line
    assert "1 of 9 checks fired: flat_groups" in out
    assert main(["doctor", str(path), "--max-flat-share", "0.6"]) == 0


def test_json_lists_every_check(tmp_path, capsys):
    path = tmp_path / "x.jsonl"
    path.write_text(FLAT + "\n", encoding="utf-8")
    assert main(["doctor", "--json", str(path)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"] == 4 and doc["fired"] == 1
    assert [f["check"] for f in doc["findings"]] == [c.name for c in CHECKS]
    flat = doc["findings"][[c.name for c in CHECKS].index("flat_groups")]
    assert flat["status"] == "fired" and flat["examples"] == ["a", "b"] and flat["rows_hit"] == 2


def test_quiet_file_exits_0(capsys):
    assert main(["doctor", str(ROOT / "trajectories" / "example")]) == 0
    assert "0 of 9 checks fired" in capsys.readouterr().out


def test_bad_threshold_names_the_flag(tmp_path, capsys):
    path = tmp_path / "x.jsonl"
    path.write_text(FLAT + "\n", encoding="utf-8")
    assert main(["doctor", str(path), "--shift-ratio", "2"]) == 1
    assert "--shift-ratio" in capsys.readouterr().err
