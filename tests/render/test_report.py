"""mpo_viz.render.report and the `mpo-viz advantages` / `mpo-viz report` commands, end to end."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz import advantages as adv
from mpo_viz import analysis as an
from mpo_viz.cli import main
from mpo_viz.render.report import LeftOutNote, ReportConfig, build_report


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    b = mv.synthetic.make_batch(16, seed=5, turns=(2, 4), turn_len=(5, 30), obs_len=(5, 30), group_size=4)
    path = d / "small.parquet"
    mv.save(b, path)
    return path, b


def _check_columns(out, ref_batch, names, **opts):
    got = mv.load(out)
    assert got.traj_ids == ref_batch.traj_ids
    for n in names:
        r = adv.compute(ref_batch, n, **{k: v for k, v in opts.items() if k in adv.get_estimator(n).options})
        m = ref_batch.mask.numpy() != 0
        np.testing.assert_allclose(got.padded(f"adv_{n}").numpy()[m], r.advantages.numpy()[m], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.padded(f"ret_{n}").numpy()[m], r.returns.numpy()[m], rtol=1e-5, atol=1e-6)
    return got


def test_advantages_cli_small_file(small, tmp_path, capsys):
    path, b = small
    out = tmp_path / "out.parquet"
    rc = main(
        [
            "advantages",
            str(path),
            "-e",
            "mpo,gae,grpo",
            "--beta",
            "0.5",
            "--lam",
            "0.9",
            "-o",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    assert "16 trajectories" in capsys.readouterr().out
    got = _check_columns(out, b, ["mpo", "gae", "grpo"], beta=0.5, lam=0.9)
    assert got.meta["advantage_estimators"]["mpo"] == {"lam": 0.9, "beta": 0.5}
    # the original fields survive
    np.testing.assert_array_equal(got.padded("old_logprobs").numpy(), b.padded("old_logprobs").numpy())


def test_advantages_cli_streams_chunks_and_keeps_groups(small, tmp_path):
    path, b = small
    out = tmp_path / "out.jsonl"
    # ~1/10 of the file per chunk: many chunk boundaries fall inside groups of 4
    assert int(b.lengths.sum()) > 10 * 150
    rc = main(["advantages", str(path), "-e", "grpo,rloo,mpo", "-o", str(out), "--max-tokens", "150", "--no-progress"])
    assert rc == 0
    _check_columns(out, b, ["grpo", "rloo", "mpo"])


def test_malformed_file_clean_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    good = {
        "traj_id": "a",
        "group_id": "g",
        "prompt_ids": [1],
        "response_ids": [1, 2],
        "loss_mask": [1, 1],
        "reward": 1.0,
    }
    bad.write_text(json.dumps(good) + "\n" + json.dumps({**good, "traj_id": "b", "loss_mask": [1, 2]}) + "\n")
    rc = main(["advantages", str(bad), "-e", "grpo", "-o", str(tmp_path / "o.parquet"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "Traceback" not in err and "loss_mask" in err and "line 2" in err
    assert not (tmp_path / "o.parquet").exists() and not list(tmp_path.glob("*.tmp"))
    rc = main(["report", str(bad), "-o", str(tmp_path / "r.html"), "--no-progress"])
    assert rc == 1 and "loss_mask" in capsys.readouterr().err


def test_unknown_estimator_is_a_clean_error(small, tmp_path, capsys):
    path, _ = small
    rc = main(["advantages", str(path), "-e", "mpo,nope", "-o", str(tmp_path / "o.parquet"), "--no-progress"])
    assert rc == 1 and "nope" in capsys.readouterr().err


def test_report_cli_is_self_contained(small, tmp_path, capsys):
    path, b = small
    out = tmp_path / "r.html"
    rc = main(["report", str(path), "-o", str(out), "-e", "mpo,gae,grpo", "--max-tokens", "400", "--no-progress"])
    assert rc == 0 and "wrote" in capsys.readouterr().out
    html = out.read_text()
    # nothing is fetched: no external script, stylesheet or CDN
    assert not re.search(r"<(script|link)[^>]+(src|href)=", html)
    assert "window.mpoStrip = { mount, render }" in html and "Plotly" in html
    payloads = re.findall(r'<script type="application/json" id="payload-\d+">(.*?)</script>', html, re.S)
    assert 3 <= len(payloads) <= 6
    p = json.loads(payloads[0])
    assert {"adv_mpo", "adv_gae", "adv_grpo", "value", "td"} <= set(p["channels"])
    assert "Estimator agreement" in html and "fig-across-within" in html


def test_report_selection_and_summary(small):
    _, b = small
    html = build_report(b, ReportConfig(estimators=("mpo", "gae"), n_best=1, n_worst=1, n_disagreed=0, progress=False))
    scores = b.token_rewards.numpy().sum(1).round(9)
    from mpo_viz import analysis as an

    dis = an.disagreement(b, {k: r.advantages for k, r in an.compute_advantages(b, ["mpo", "gae"]).items()})

    groups = np.array(b.group_ids)

    def choose(target, shown=()):
        # among the trajectories with that score, the largest disagreement (first on ties), from a
        # group not shown yet when there is one
        idx = np.flatnonzero(scores == target)
        fresh = idx[~np.isin(groups[idx], list(shown))]
        pool = fresh if len(fresh) else idx
        return pool[int(np.argmax(dis[pool]))], len(idx)

    bi, nb = choose(scores.max())
    wi, nw = choose(scores.min(), shown=[groups[bi]])
    heads = re.findall(r"<h3>(\S+) <small>([^<]*)</small>", html)
    assert heads[0][0] == b.traj_ids[bi] and heads[0][1].startswith(f"highest score {scores.max():.4g}")
    assert heads[1][0] == b.traj_ids[wi] and heads[1][1].startswith(f"lowest score {scores.min():.4g}")
    for (_, label), n, i in ((heads[0], nb, bi), (heads[1], nw, wi)):
        how = "the largest estimator disagreement" if dis[i] > 0 else "the first in the data from a group not shown yet"
        assert (f"shared by {n:,} trajectories: chosen by {how}" in label) == (n > 1)
    assert f"<td>trajectories</td><td>{len(b)}</td>" in html


def test_report_ties_on_binary_rewards_and_one_score():
    # 0/1 rewards: 3 successes, 3 failures; the one chosen among each is the most disagreed-on
    b = mv.synthetic.make_batch(6, seed=2, turns=(2, 4), turn_len=(5, 20), obs_len=(3, 10), group_size=2)
    from mpo_viz import analysis as an

    html = build_report(b, ReportConfig(estimators=("mpo", "gae"), n_best=1, n_worst=1, n_disagreed=0, progress=False))
    scores = b.token_rewards.numpy().sum(1).round(9)
    dis = an.disagreement(b, {k: r.advantages for k, r in an.compute_advantages(b, ["mpo", "gae"]).items()})
    heads = re.findall(r"<h3>(\S+) <small>([^<]*)</small>", html)
    labels = " | ".join(h[1] for h in heads)
    assert "best (score" not in labels and "worst (score" not in labels
    groups = np.array(b.group_ids)
    shown: list = []
    for (tid, label), target in zip(heads, (scores.max(), scores.min())):
        idx = np.flatnonzero(scores == target)
        fresh = idx[~np.isin(groups[idx], shown)]
        pool = fresh if len(fresh) else idx
        assert dis[b.traj_ids.index(tid)] == dis[pool].max()
        shown.append(groups[b.traj_ids.index(tid)])
        if len(idx) > 1:
            assert f"shared by {len(idx)} trajectories" in label
    # every trajectory with the same score: no best or worst, the largest disagreement instead
    same = mv.TrajectoryBatch.from_rows(
        [
            {
                "traj_id": f"t{i}",
                "group_id": "g",
                "prompt_ids": [1],
                "response_ids": [1, 2, 3, 4, 5],
                "loss_mask": [1, 1, 0, 1, 1],
                "values": [1.2, -1.0 + 0.1 * i, 0, 0.9, 0.3],
                "reward": 1.0,
            }
            for i in range(4)
        ]
    )
    html = build_report(
        same, ReportConfig(estimators=("mpo", "gae"), n_best=1, n_worst=1, n_disagreed=1, progress=False)
    )
    heads = re.findall(r"<h3>(\S+) <small>([^<]*)</small>", html)
    assert (
        len(heads) == 1 and "every trajectory scores 1, so none is best or worst: chosen by the largest" in heads[0][1]
    )
    assert "most disagreed-on" in heads[0][1]  # the same trajectory, both reasons on one heading
    assert "highest score" not in html and "lowest score" not in html


def test_selected_trajectories_span_groups():
    # 5 groups of 4; every group holds successes and failures, so one group could fill every selection
    b = mv.synthetic.make_batch(20, seed=3, turns=(2, 4), turn_len=(4, 12), obs_len=(2, 6), group_size=4)
    html = build_report(
        b, ReportConfig(estimators=("mpo", "gae", "grpo"), n_best=2, n_worst=2, n_disagreed=1, progress=False)
    )
    tids = [t for t, _ in re.findall(r"<h3>(\S+) <small>([^<]*)</small>", html)]
    groups = [b.group_ids[b.traj_ids.index(t)] for t in tids]
    assert len(tids) >= 4 and len(set(groups)) == len(tids), groups  # the most disagreed-on may be one shown
    # fewer groups than selections: a group repeats only when none is left
    two = b.select(traj_ids=[t for t, g in zip(b.traj_ids, b.group_ids) if g in set(b.group_ids[:8])])
    html = build_report(
        two, ReportConfig(estimators=("mpo", "gae"), n_best=2, n_worst=2, n_disagreed=0, progress=False)
    )
    tids = [t for t, _ in re.findall(r"<h3>(\S+) <small>([^<]*)</small>", html)]
    assert len(tids) == 4 and len({two.group_ids[two.traj_ids.index(t)] for t in tids}) == 2


def test_nothing_to_rank_by_is_said():
    # grpo and rloo give every turn of a trajectory the sign of its score against the group: they
    # agree on every sign (0% differ), so ties on the score have nothing to be ranked by
    rows = [
        {
            "traj_id": f"t{i}",
            "group_id": f"g{i // 4}",
            "prompt_ids": [1],
            "response_ids": [1, 2, 3, 4],
            "loss_mask": [1, 1, 0, 1],
            "reward": float(i % 4 < 2),
        }
        for i in range(12)
    ]
    b = mv.TrajectoryBatch.from_rows(rows)
    html = build_report(b, ReportConfig(estimators=("grpo", "rloo"), n_best=2, n_worst=2, progress=False))
    heads = re.findall(r"<h3>(\S+) <small>([^<]*)</small>", html)
    assert len(heads) == 4
    for _, label in heads:
        assert "largest estimator disagreement" not in label and "(0% of turn signs differ)" not in label
        assert (
            "chosen by the first in the data from a group not shown yet: there was nothing to rank by (the "
            "estimators agree on the sign of each of its turns: 0% differ)"
        ) in label
    assert len({b.group_ids[b.traj_ids.index(t)] for t, _ in heads}) == 3  # 3 groups: one repeats, no more


def test_report_and_value_curve_name_a_fitted_critic():
    from mpo_viz.render import plots
    from mpo_viz.train.fitted_critic import fit_critic

    rows = [
        {
            "traj_id": f"t{i}",
            "group_id": f"g{i // 2}",
            "prompt_ids": [1 + i % 3],
            "response_ids": [2, 3, 4, 5, 6],
            "loss_mask": [1, 1, 0, 1, 1],
            "reward": float(i % 3 == 0),
        }
        for i in range(12)
    ]
    res = fit_critic(mv.TrajectoryBatch.from_rows(rows), steps=3, size="1m", holdout=0.25, progress=False)
    assert res.batch.meta["values_source"] == "fitted_critic"
    # a fit that generalizes (its record says held-out EV 0.4): the values are named, not refused
    good = res.batch.with_meta(critic_fit={**res.info, "heldout_explained_variance": 0.4})
    html = build_report(good, ReportConfig(progress=False))
    assert "<b>mpo, gae: values from a fitted critic (held-out EV 0.4)</b>" in html
    assert (
        "held-out trajectories): held-out explained variance 0.4 (on trajectories it was not fitted to), "
        f"in-sample {res.info['train_explained_variance']:.3g} (on its training trajectories)"
    ) in html
    assert (
        "vs mpo returns — in-sample: over all of this data, the critic&#x27;s own training part included</td>" in html
    )
    assert "NOISE" not in html
    assert "Within-turn part (micro_mpo)" in html and "in a failed episode a wrong answer can be blue" in html
    names = [t["name"] for t in plots.value_curve_parts(good, 0)["traces"]]
    assert names[0] == "value (fitted critic (held-out EV 0.40))"
    # values of another source: no such label
    plain = res.batch.with_meta(values_source="critic")
    assert "values from a fitted critic" not in build_report(plain, ReportConfig(progress=False))
    assert plots.value_curve_parts(plain, 0)["traces"][0]["name"] == "value"


@pytest.mark.parametrize("ev", [0.05, -0.539])
def test_a_critic_with_heldout_ev_at_most_005_is_labelled_noise_everywhere(ev):
    from mpo_viz.render.strip import NOISE_LABEL, strip_payload

    b = mv.load(Path(__file__).resolve().parents[2] / "trajectories" / "search.parquet")[:40]
    noisy = b.with_meta(
        values_source="fitted_critic", critic_fit={"heldout_explained_variance": ev, "train_explained_variance": 0.51}
    )
    html = build_report(noisy, ReportConfig(estimators=("mpo", "gae", "grpo"), progress=False))
    why = f"values from a fitted critic with held-out explained variance {ev:.2f} (≤ 0.05)"
    # the summary, beside the in-sample EV of 0.51 the issue saw alone
    assert (
        f"<td>critic-based credit</td><td>NOISE: {why}: it predicts returns it was not fitted to no better than their "
        "mean; mpo, gae not ranked</td>" in html
    )
    assert "in-sample 0.51 (on its training trajectories)" in html
    # the estimator table and the verdict: mpo and gae are not ranked
    assert "<p class=warn><b>mpo, gae: NOISE</b>" in html
    reading = re.search(r"<p class=reading>([^<]*)</p>", html).group(1)
    assert reading.startswith("Token credit closest to the oracle: grpo") and "Not ranked: mpo, gae (" in reading
    # the strips: every channel built on the values says so
    p = strip_payload(
        noisy, 0, advantages={k: r.advantages for k, r in an.compute_advantages(noisy, ["mpo", "grpo"]).items()}
    )
    assert p["channel_info"]["adv_mpo"]["label"] == "advantage (mpo)" + NOISE_LABEL
    assert (
        p["channel_info"]["value"]["label"].endswith(NOISE_LABEL)
        and p["meta"]["critic"] == f"NOISE: {why}: it predicts returns it was not fitted to no better than their mean"
    )
    assert "NOISE" not in p["channel_info"]["adv_grpo"]["label"]
    assert NOISE_LABEL in html  # the report's strips carry those labels


def test_too_little_data_and_an_untrained_critic_give_no_verdict():
    b = mv.load(Path(__file__).resolve().parents[2] / "trajectories" / "search.parquet")[:4]
    b = b.with_meta(values_source="untrained_critic")
    html = build_report(b, ReportConfig(estimators=("mpo", "grpo"), progress=False))
    reading = re.search(r"<p class=reading>([^<]*)</p>", html).group(1)
    assert reading.startswith("Too little data for a verdict: 4 trajectories (a verdict needs at least 16)")
    assert "best" not in reading and "closest" not in reading
    assert "<td>critic-based credit</td><td>NOISE: values from an untrained critic" in html


def test_report_without_values_uses_what_the_data_allow():
    rows = [
        {
            "traj_id": f"t{i}",
            "group_id": f"g{i // 2}",
            "prompt_ids": [1],
            "response_ids": [1, 2, 3, 4],
            "loss_mask": [1, 0, 1, 1],
            "reward": float(i % 2),
        }
        for i in range(4)
    ]
    b = mv.TrajectoryBatch.from_rows(rows)
    with pytest.warns(
        LeftOutNote,
        match=r"^mpo, gae left out: they need critic values, and FILE has none. Fit a "
        r"critic to its returns and report again: mpo-viz fit-critic FILE -o "
        r"with_values.parquet && mpo-viz report with_values.parquet$",
    ):
        html = build_report(b, ReportConfig(progress=False))
    assert "<td>estimators</td><td>grpo</td>" in html
    assert "<td>estimators left out</td><td>mpo, gae left out: they need critic values" in html
    assert "absent: no across/within diagnostic" in html and "fig-across-within" not in html
    assert "fig-value-" not in html and 'id="payload-0"' in html
    with warnings.catch_warnings():
        warnings.simplefilter("error", LeftOutNote)
        build_report(b, ReportConfig(progress=False, estimators=("grpo",)))  # named: nothing left out


def test_report_cli_says_what_was_left_out_and_what_lacks_a_reward(tmp_path, capsys):
    from mpo_viz import checks

    checks._WARNED.clear()
    rows = [
        {
            "traj_id": f"t{i}",
            "group_id": f"g{i // 2}",
            "prompt_ids": [1],
            "response_ids": [1, 2, 3, 4],
            "loss_mask": [1, 0, 1, 1],
            "reward": float(i % 2) if i != 3 else float("nan"),
        }
        for i in range(4)
    ]
    path = tmp_path / "logs.parquet"
    mv.save(mv.TrajectoryBatch.from_rows(rows), path)
    assert main(["report", str(path), "-o", str(tmp_path / "r.html"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert (
        f"note: mpo, gae left out: they need critic values, and {path} has none. Fit a critic to its returns and "
        f"report again: mpo-viz fit-critic {path} -o with_values.parquet" in err
    )
    # the count is the streamed chunk's (the report reads group-aligned chunks), the names are the file's
    assert re.search(
        r"warning: grpo: 1 of \d+ trajectories have no reward \(a NaN reward and no turn_rewards or "
        r"token_rewards\): 't3', in 1 group\(s\) \('g1'\)",
        err,
    )
    checks._WARNED.clear()


def test_advantages_cli_folder_output(small, tmp_path):
    path, b = small
    out = tmp_path / "annotated"
    assert (
        main(["advantages", str(path), "-e", "grpo,gae", "-o", str(out), "--max-tokens", "400", "--no-progress"]) == 0
    )
    assert len(list(out.glob("part-*.parquet"))) > 1
    _check_columns(out, b, ["grpo", "gae"])
    with pytest.raises(ValueError, match="already holds part"):
        from mpo_viz.render.annotate import AnnotateConfig, annotate_file

        annotate_file(path, out, AnnotateConfig(estimators=("gae",), progress=False))


def test_help_lists_every_registered_estimator_and_option(capsys):
    for cmd in ("advantages", "report"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "``" not in out and ":func:" not in out
        for n in adv.available_estimators():
            assert n in out
        for o in adv.vocabulary().values():  # every declared option is a flag, with its doc
            assert "--" + o.name.replace("_", "-") in out and o.doc.split(" (")[0] in out
        # a default that differs between estimators is shown per estimator
        assert "defaults bilevel_gae 1.0, gae 1.0, mpo 0.95" in out


def test_unknown_estimator_names_the_flag(small, tmp_path, capsys):
    path, _ = small
    assert main(["report", str(path), "-e", "MPO", "-o", str(tmp_path / "r.html"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "--estimators: unknown estimator 'MPO' (names are lower case: 'mpo'); available: bilevel_gae, drgrpo" in err
    assert not (tmp_path / "r.html").exists()


def test_advantages_refuses_to_write_over_or_into_its_input(small, tmp_path, capsys):
    path, _ = small
    folder = tmp_path / "logs"
    folder.mkdir()
    mv.save(mv.load(path), folder / "a.parquet")
    before = (folder / "a.parquet").read_bytes()
    for inp, out in (
        (folder / "a.parquet", folder / "a.parquet"),  # the input itself
        (folder, folder / "scored.parquet"),  # inside the input folder
        (folder / "a.parquet", folder),
    ):  # a folder output holding the input
        assert main(["advantages", str(inp), "-o", str(out), "--no-progress"]) == 1
        assert "--output: expected an output outside the input" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["a.parquet"]
    assert (folder / "a.parquet").read_bytes() == before
    assert main(["advantages", str(folder / "a.parquet"), "-o", str(tmp_path / "scored.parquet"), "--no-progress"]) == 0


def test_option_errors_name_the_command_line_flag(small, tmp_path, capsys):
    path, _ = small
    assert (
        main(
            [
                "advantages",
                str(path),
                "-e",
                "mpo",
                "--turn-lam",
                "2",
                "-o",
                str(tmp_path / "o.parquet"),
                "--no-progress",
            ]
        )
        == 1
    )
    assert "error: --turn-lam: expected a value in [0, 1], found 2.0" in capsys.readouterr().err
    assert main(["report", str(path), "--max-tokens", "0", "-o", str(tmp_path / "r.html"), "--no-progress"]) == 1
    assert "error: --max-tokens: expected an integer >= 1, found 0" in capsys.readouterr().err
    # an option none of the chosen estimators takes is refused, naming the flag and who takes it
    assert (
        main(
            [
                "advantages",
                str(path),
                "-e",
                "gae,grpo",
                "--beta",
                "0.5",
                "-o",
                str(tmp_path / "o.parquet"),
                "--no-progress",
            ]
        )
        == 1
    )
    assert "error: --beta: none of the estimators gae, grpo takes this option (mpo does)" in capsys.readouterr().err
    # a flag option with a default of True can be switched off
    assert (
        main(
            [
                "advantages",
                str(path),
                "-e",
                "reinforce_pp",
                "--no-whiten",
                "-o",
                str(tmp_path / "w.parquet"),
                "--no-progress",
            ]
        )
        == 0
    )
    got = mv.load(tmp_path / "w.parquet")
    assert got.meta["advantage_estimators"]["reinforce_pp"] == {"whiten": False}
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "r.html").exists()


def test_report_accuracy_section_against_the_benchmark(tmp_path):
    from pathlib import Path

    from mpo_viz.advantages import compute

    root = Path(__file__).resolve().parents[2]
    from experiments import (
        credit_accuracy as bench,  # an independent implementation of the same measures
    )

    b = mv.load(root / "trajectories" / "tooluse.parquet")[:80]
    path = tmp_path / "t.parquet"
    mv.save(b, path)
    # streamed in several chunks: the accuracy statistics are merged across them
    html = build_report(path, ReportConfig(estimators=("mpo", "vapo", "grpo"), max_tokens=3000, progress=False))
    sec = html[html.index("<h2 id=accuracy>") :]
    assert "Accuracy against the oracle" in sec and "<p class=reading>Token credit closest to the oracle:" in sec
    assert "experiments/credit_accuracy.py" in sec and "download='accuracy.csv'" in sec
    rows = re.findall(r"<tr><td>(mpo|vapo|grpo)</td>((?:<td>[^<]*</td>)+)</tr>", sec)
    ref = bench.reference(b)
    for name, cells in rows:
        vals = [float("nan") if c == "—" else float(c) for c in re.findall(r"<td>([^<]*)</td>", cells)]
        want = bench.metrics(compute(b, name).advantages.double().numpy(), ref)
        cols = [
            "turn_corr",
            "turn_sign",
            "tok_corr",
            "within_corr",
            "dec_sign",
            "dec_mass",
            "tok_slope",
            "dec_slope",
            "turn_slope",
        ]
        np.testing.assert_allclose(vals, [want[c] for c in cols], rtol=2e-3, atol=1e-4, err_msg=name)  # 4 digits
    assert len(rows) == 3
    assert "explained variance of the values (oracle)" in html and "critic explained" not in html
    # no oracle: the section says what would tell instead
    plain = build_report(mv.synthetic.make_batch(5, seed=3), ReportConfig(progress=False))
    assert "cannot be measured here" in plain and "explained variance" in plain


def test_report_accuracy_uses_the_policys_truth_when_the_file_has_it():
    """A file with the Monte-Carlo truth (here the expert's own, so the oracle is there too): the
    accuracy section is against the policy's truth and says which; the expert's section follows,
    labelled biased; without the truth the section is the oracle's as before."""
    from mpo_viz.envs import NoisyExpert
    from mpo_viz.envs.generate import GenerateConfig, generate
    from mpo_viz.rollout.truth import mc_truth

    b = generate(GenerateConfig(env="automation", episodes=16, group_size=4, seed=2))
    t = mc_truth(b, NoisyExpert(noise=0.25), m=4, seed=0, progress=False)
    html = build_report(t, ReportConfig(estimators=("mpo", "grpo"), n_best=1, n_worst=0, n_disagreed=0, progress=False))
    assert "Accuracy against this policy's truth" in html
    assert "Truth used: the Monte-Carlo values of expert(noise=0.25), M = 4" in html
    assert "Accuracy against the scripted expert's oracle (biased for this policy)" in html
    assert html.index("this policy's truth") < html.index("scripted expert's oracle")
    plain = build_report(
        b, ReportConfig(estimators=("mpo", "grpo"), n_best=1, n_worst=0, n_disagreed=0, progress=False)
    )
    assert "this policy's truth" not in plain and "Accuracy against the oracle" in plain


@pytest.fixture(scope="module")
def token_truth_batch():
    from mpo_viz.envs import NoisyExpert
    from mpo_viz.envs.generate import GenerateConfig, generate
    from mpo_viz.rollout.token_truth import mc_token_truth
    from mpo_viz.rollout.truth import mc_truth

    b = generate(GenerateConfig(env="automation", episodes=16, group_size=4, seed=2))
    t = mc_truth(b, NoisyExpert(noise=0.25), m=4, seed=0, q=True, progress=False)
    return mc_token_truth(t, NoisyExpert(noise=0.25), m=8, seed=0, progress=False)


def test_report_shows_the_within_turn_table_when_the_file_has_the_token_truth(token_truth_batch):
    html = build_report(
        token_truth_batch,
        ReportConfig(estimators=("mpo", "turn_gae", "grpo"), n_best=1, n_worst=0, n_disagreed=0, progress=False),
    )
    assert "Within-turn credit against this policy's token truth" in html
    assert (
        "Truth used: the Monte-Carlo token truth of expert(noise=0.25) at uncertain tokens (1 − π &gt; 0.01, at "
        "most 4 a turn, 1 control a turn): M = 8 continuation pairs per token, estimator pi"
    ) in html
    assert "a turn's true mean Â_k/n_k from the turn-level truth above (Â_k)" in html
    # flat credit (turn GAE, GRPO) is 0 within turns by construction, and the table and the reading say so
    assert html.count(an.FLAT_NOTE) >= 2 and "turn_gae, grpo: flat inside turns, 0 by construction" in html
    # the order: the turn truth, the token truth, then the expert's oracle (biased for the policy)
    i_turn, i_tok = html.index("Accuracy against this policy's truth"), html.index("Within-turn credit against")
    assert i_turn < i_tok < html.index("Accuracy against the scripted expert's oracle")
    # the strips carry the truth and the page says how to read it
    assert '"truth":{"channel":"truth","se":[' in html and "<b>True advantage</b>: a bar under each token" in html


def test_the_policys_truth_ranks_no_noise_critic_and_no_truth_too_noisy(token_truth_batch):
    """Issue 52, item 5: with critic values that are noise, the critic-based estimators are not ranked
    against the Monte-Carlo truth either; a truth whose reliability is below MIN_RELIABILITY gives no
    verdict, and its noise-corrected columns are withheld (no interval beyond 1)."""
    b = token_truth_batch.with_meta(values_source="fitted_critic", critic_fit={"heldout_explained_variance": 0.01})
    html = build_report(
        b, ReportConfig(estimators=("mpo", "gae", "grpo"), n_best=0, n_worst=0, n_disagreed=0, progress=False)
    )
    assert "NOISE: not ranked (its credit rests on critic values that are noise)" in html
    readings = re.findall(r"<p class=reading>(.*?)</p>", html, flags=re.S)
    mc = next(r for r in readings if "Monte-Carlo values of" in r)
    assert "Not ranked: mpo, gae (" in mc and ("closest to this policy&#x27;s truth: grpo" in mc or "Too little" in mc)
    # a turn truth (Q̂ − V̂) whose standard errors dwarf its spread: reliability below the minimum
    k = b.num_turns
    noisy = b.with_turn_fields(mc_value_se=[[0.6] * n for n in k], mc_q_se=[[0.6] * n for n in k])
    ac = an.mc_accuracy(noisy, {"grpo": an.compute_advantages(noisy, ["grpo"])["grpo"]})
    assert ac.reliability.iloc[0] < an.MIN_RELIABILITY
    assert np.isnan(ac.turn_corr_dis.iloc[0]) and np.isnan(ac.dis_hi.iloc[0]) and "too little data" in ac.note.iloc[0]
    html = build_report(
        noisy.with_meta(values_source="oracle"),
        ReportConfig(estimators=("mpo", "grpo"), n_best=0, n_worst=0, n_disagreed=0, progress=False),
    )
    assert "too little data for a verdict" in html


def test_the_agreement_table_says_why_sign_agreement_and_flips_differ(small):
    _, b = small
    html = build_report(b, ReportConfig(estimators=("mpo", "grpo"), n_best=0, n_worst=0, n_disagreed=0, progress=False))
    assert "sign_one_zero" in html and "sign_opposite" in html
    assert "a low sign_agreement beside n_sign_flips = 0 is no contradiction" in html
