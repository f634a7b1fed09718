"""`make demo` (mpo_viz.demo) on the shipped trajectories: it finishes, writes its reports, and says
"constant — no signal" where a trained critic's values are flat instead of printing 0.00000."""

from __future__ import annotations

from pathlib import Path

from mpo_viz import demo

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs_and_names_a_constant_critic(tmp_path, capsys):
    assert demo.main([str(ROOT / "trajectories"), str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "automation_report.html").stat().st_size > 10_000
    rows = [ln for ln in out.splitlines() if ln.startswith(("search_early", "automation_early"))]
    critic = {ln.split()[0]: ln for ln in rows if ln.split()[1] == "critic"}
    assert "constant (sd 0.0013 over all tokens) — no signal" in critic["search_early"]  # sd 0.0013 < 0.01
    assert "constant" not in critic["automation_early"] and "0.00327" in critic["automation_early"]
    assert " 0.00000 " not in out
