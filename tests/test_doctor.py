"""mpo_viz.doctor: every check fires on its failing example in docs/doctor.md (and only it), stays
quiet on the fixed example and on the shipped sets; the measurements against hand-computed numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from mpo_viz.adapters import from_art, from_chat, from_skyrl, from_steps, from_trl, from_verl
from mpo_viz.checks import OptionError
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.doctor import CHECKS, OPTIONS, Doctor, diagnose, examine

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "doctor.md"
SAMPLES = ROOT / "trajectories" / "samples"


def doc_examples() -> dict[str, dict[str, str]]:
    """``check -> {"rows": jsonl text, "metrics": jsonl text}`` from the code blocks under each
    ``### `check``` heading of docs/doctor.md."""
    out: dict[str, dict[str, str]] = {}
    for head, body in re.findall(r"^### `(\w+)`\n(.*?)(?=^### |^## |\Z)", DOC.read_text(encoding="utf-8"), re.M | re.S):
        blocks = re.findall(r"^```jsonl( metrics)?\n(.*?)^```", body, re.M | re.S)
        out[head] = {("metrics" if tag else "rows"): text for tag, text in blocks}
    return out


EXAMPLES = doc_examples()


def write_example(tmp_path: Path, name: str) -> tuple[Path, Path | None]:
    ex = EXAMPLES[name]
    data = tmp_path / f"{name}.jsonl"
    data.write_text(ex["rows"], encoding="utf-8")
    metrics = None
    if "metrics" in ex:
        metrics = tmp_path / "metrics.jsonl"
        metrics.write_text(ex["metrics"], encoding="utf-8")
    return data, metrics


def fired(findings) -> list[str]:
    return [f.check for f in findings if f.fired]


def rows(*dicts, **common) -> TrajectoryBatch:
    base = {"group_id": "g", "prompt_ids": [1], "reward": 1.0}
    return TrajectoryBatch.from_rows([{**base, **common, "traj_id": f"t{i}", **d} for i, d in enumerate(dicts)])


def test_every_check_has_a_failing_example_in_the_docs():
    assert sorted(EXAMPLES) == sorted(c.name for c in CHECKS)


@pytest.mark.parametrize("name", [c.name for c in CHECKS])
def test_each_check_fires_on_its_documented_example_and_no_other(tmp_path, name):
    data, metrics = write_example(tmp_path, name)
    findings, _ = examine(data, metrics=metrics)
    assert fired(findings) == [name]
    hit = next(f for f in findings if f.check == name)
    assert hit.rows_hit >= 1 and hit.examples and hit.fix


SHIPPED = sorted((ROOT / "trajectories").glob("*.parquet")) + [ROOT / "trajectories" / "example"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_quiet_on_the_shipped_sets(path):
    findings, batch = examine(path)
    assert len(batch) and fired(findings) == []


def test_quiet_on_the_converted_samples():
    tok = SAMPLES / "tokenizer"
    converted = [
        from_verl(SAMPLES / "verl_batch.pt"),
        from_skyrl(SAMPLES / "skyrl_generator_output.json"),
        from_steps(SAMPLES / "verifiers_rollouts.jsonl"),
        from_steps(SAMPLES / "rllm_episodes.jsonl"),
        from_steps(SAMPLES / "agl_rollouts.jsonl"),
        from_chat(SAMPLES / "openai_chat.jsonl", tokenizer=tok),
        from_trl(SAMPLES / "trl", tokenizer=tok),
        from_art(SAMPLES / "art" / "trajectories" / "train", tokenizer=tok),
    ]
    for batch, report in converted:
        assert fired(diagnose(batch, rejected=report.rejected)) == []


# ------------------------------------------------------------------ each check: the fixed version is quiet
def test_return_reset_vs_carried_across_the_observation():
    # verl #7278's trajectory: returns carried over the tool reply are the fix
    common = {"response_ids": [5, 6, 7, 8, 9, 10], "loss_mask": [1, 1, 0, 0, 1, 1]}
    bad = diagnose(rows({"returns": [0, 0, 0, 0, 1, 1]}, **common))
    good = diagnose(rows({"returns": [1, 1, 0, 0, 1, 1]}, **common))
    assert fired(bad) == ["return_dropped_before_observation"] and fired(good) == []
    # a GRPO-style advantage broadcast over every turn is fine; an all-zero row (flat group) too
    assert fired(diagnose(rows({"advantages": [0.5] * 6}, {"advantages": [0.0] * 6, "reward": 0.0}, **common))) == []


def test_terminal_reward_kept_decayed_or_bootstrapped():
    common = {"response_ids": [5, 6, 7, 8], "loss_mask": [1, 1, 0, 0], "values": [0.5, 0.5, 0.0, 0.0]}
    assert fired(diagnose(rows({"returns": [1, 1, 0, 0]}, **common))) == []
    assert fired(diagnose(rows({"returns": [0.81, 0.81, 0, 0]}, **common))) == ["terminal_reward_on_masked_tail"]
    # a truncated row may bootstrap: not terminal, not checked
    assert fired(diagnose(rows({"returns": [0.81, 0.81, 0, 0], "truncated": True}, **common))) == []
    # the last turn's reward sum (turn-level returns broadcast) is a valid return at the last token
    turn = {"token_rewards": [0.5, 0.5, 0, 0], "returns": [1, 1, 0, 0]}
    assert fired(diagnose(rows(turn, **common))) == []


def test_masked_tail_value_read_or_not():
    common = {"response_ids": [5, 6, 7], "loss_mask": [1, 1, 0]}
    # G_last = r + V_tail = 1 + 5: read; the same tail value with G_last = r: not read
    read = diagnose(rows({"values": [0.2, 0.3, 5.0], "returns": [6.0, 6.0, 0]}, **common))
    unread = diagnose(rows({"values": [0.2, 0.3, 5.0], "returns": [1.0, 1.0, 0]}, **common))
    assert fired(read) == ["masked_values_read"] and fired(unread) == []
    # non-zero values on observation tokens are a critic's normal output: quiet; NaN there is not
    obs = {"response_ids": [5, 6, 7], "loss_mask": [1, 0, 1]}
    assert fired(diagnose(rows({"values": [0.1, 0.7, 0.2]}, **obs))) == []
    nan = diagnose(rows({"values": [0.1, float("nan"), 0.2]}, **obs))
    assert fired(nan) == ["masked_values_read"] and nan[3].examples == ["t0"]


def test_values_shifted_measures_the_three_alignments():
    # G = [6 5 4 3 2 1]; tokens 1..4 have both neighbours. Aligned V = G + 1: error 1 each;
    # V one token later (V[t+1] = G[t]): 0 each -> fires; aligned values: quiet
    common = {"response_ids": [5] * 6, "loss_mask": [1] * 6, "reward": 6.0, "token_rewards": [1] * 6}
    f = diagnose(rows({"values": [7, 6, 5, 4, 3, 2]}, **common))
    shifted = next(x for x in f if x.check == "values_shifted")
    assert shifted.fired and "aligned 1," in shifted.detail and "later 0 " in shifted.detail
    assert fired(diagnose(rows({"values": [6, 5, 4, 3, 2, 1]}, **common))) == []
    # the threshold is an option: even at ratio 0.99 a shift that fits no better stays quiet
    noisy = {"values": [6.5, 5.5, 4.5, 3.5, 2.5, 1.5]}  # aligned error .25, shifted .25 and 2.25
    assert fired(diagnose(rows(noisy, **common), shift_ratio=0.99)) == []


def test_flat_groups_share_and_threshold():
    one = {"response_ids": [5], "loss_mask": [1]}
    b = rows(
        {"group_id": "a", "reward": 1.0},
        {"group_id": "a", "reward": 1.0},
        {"group_id": "b", "reward": 1.0},
        {"group_id": "b", "reward": 0.0},
        {"group_id": "c", "reward": 0.0},
        {"group_id": "c", "reward": 0.0},
        {"group_id": "d", "reward": 0.0},
        **one,
    )
    f = next(x for x in diagnose(b) if x.check == "flat_groups")
    # groups of two or more: a (flat), b, c (flat); d is a group of one and does not count
    assert f.fired and f.rows_hit == 4 and "2 of 3 groups (67%)" in f.detail
    assert not next(x for x in diagnose(b, max_flat_share=0.7) if x.check == "flat_groups").fired


def test_missing_reward_counts_turn_and_token_rewards_as_rewards():
    common = {"response_ids": [5, 6], "loss_mask": [1, 1], "reward": float("nan")}
    b = rows({}, {"turn_rewards": [1.0]}, {"token_rewards": [0.0, 1.0]}, **common)
    f = next(x for x in diagnose(b) if x.check == "missing_reward")
    assert f.fired and f.examples == ["t0"] and f.rows_hit == 1


def test_turn_collapse_peak_and_last_step():
    def turns(k, step):
        return {"response_ids": [5] * (2 * k - 1), "loss_mask": [1, 0] * (k - 1) + [1], "step": step}

    # mean turns per step: 4, 6, 3 -> 3 <= 0.5 * 6 fires; 4, 6, 4 does not
    b = rows(turns(4, 0), turns(6, 1), turns(2, 2), turns(4, 2))
    f = next(x for x in diagnose(b) if x.check == "turn_collapse")
    assert f.fired and f.rows_hit == 2 and "peak 6 (step 1)" in f.detail and "2: 3" in f.detail
    assert not next(
        x for x in diagnose(rows(turns(4, 0), turns(6, 1), turns(4, 2))) if x.check == "turn_collapse"
    ).fired
    assert next(x for x in diagnose(rows(turns(4, 0), turns(1, 1))) if x.check == "turn_collapse").status == "skipped"


def test_explained_variance_against_the_batch_number(tmp_path):
    # G = [1 1 0 0], V - G = [-.1 -.1 .1 .1]: 1 - .01/.25 = .96 over the batch
    data, _ = write_example(tmp_path, "explained_variance_per_microbatch")
    for logged, fires in ((0.96, False), (0.92, False), (0.2, True)):
        m = tmp_path / f"m{logged}.jsonl"
        m.write_text(json.dumps({"iteration": 0, "critic_explained_var": logged}) + "\n", encoding="utf-8")
        f = next(x for x in examine(data, metrics=m)[0] if x.check == "explained_variance_per_microbatch")
        assert f.fired is fires, logged
    assert "over the batch 0.96" in f.detail


def test_a_run_folder_reads_its_metrics_and_iterations():
    findings, batch = examine(ROOT / "trajectories" / "trained" / "run")
    by = {f.check: f for f in findings}
    assert (
        by["explained_variance_per_microbatch"].status == "ok"
        and "of 3 step(s)" in by["explained_variance_per_microbatch"].detail
    )
    assert by["turn_collapse"].status == "ok"


def test_refused_rows_are_reported_not_dropped(tmp_path):
    data, _ = write_example(tmp_path, "reward_on_observation")
    findings, batch = examine(data)
    assert len(batch) == 0
    f = findings[0]
    assert f.check == "reward_on_observation" and f.examples == ["a"]
    assert all(x.status == "skipped" for x in findings[1:])


def test_options_are_checked_by_their_declarations():
    assert {o.name for o in OPTIONS} == {"max_flat_share", "shift_ratio", "collapse_drop", "ev_tol"}
    b = rows({"response_ids": [5], "loss_mask": [1]})
    with pytest.raises(OptionError, match="max_flat_share"):
        diagnose(b, max_flat_share=2.0)
    with pytest.raises(TypeError, match="unknown option"):
        diagnose(b, flat=0.2)
    assert np.isfinite(b.outcome_reward).all()


def test_the_report_shows_the_findings_first():
    from mpo_viz.render.report import ReportConfig, build_report

    one = {"response_ids": [5, 6], "loss_mask": [1, 1]}
    flat = rows(
        {"group_id": "a"}, {"group_id": "a"}, {"group_id": "b", "reward": 0.0}, {"group_id": "b", "reward": 0.0}, **one
    )
    html = build_report(flat, ReportConfig(estimators=("grpo",), progress=False))
    doc = html[html.index("<h2 id=doctor>") :]
    assert html.index("<h2 id=doctor>") < html.index("<h2>Summary</h2>")
    assert "flat_groups" in doc[: doc.index("<h2>Summary</h2>")] and "1 of " in doc
    quiet = build_report(
        rows({"reward": 1.0}, {"reward": 0.0}, **one), ReportConfig(estimators=("grpo",), progress=False)
    )
    section = quiet[quiet.index("<h2 id=doctor>") : quiet.index("<h2>Summary</h2>")]
    assert "0 of " in section and "flat_groups" not in section


def test_chunks_give_the_findings_of_the_whole():
    one = {"response_ids": [5], "loss_mask": [1]}
    a = rows({"group_id": "a"}, {"group_id": "a"}, **one)  # a flat group
    b = rows({"group_id": "b", "reward": float("nan")}, {"group_id": "b", "reward": 0.0}, **one)
    b = TrajectoryBatch.from_rows([{**r, "traj_id": "u" + r["traj_id"]} for r in b.rows()])
    doc = Doctor()
    doc.add(a)
    doc.add(b)
    merged = {f.check: f for f in doc.findings()}
    assert doc.findings() == diagnose(TrajectoryBatch.concat([a, b]))
    # both groups are flat (the second scores 0 + 0: a missing reward reads 0): 4 rows, 2 of 2 groups
    assert merged["flat_groups"].fired and merged["flat_groups"].rows_hit == 4
    assert "2 of 2 groups" in merged["flat_groups"].detail
    assert merged["missing_reward"].fired and merged["missing_reward"].examples == ["ut0"]
    assert merged["values_shifted"].status == "skipped"
    assert [f.check for f in doc.findings()] == [c.name for c in CHECKS]
