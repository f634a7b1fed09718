"""Text instead of ids (a local tokenizer folder, built here: nothing downloads), the report's
export folder, and the edge cases of issue 17: empty batches keep their columns, a foreign Parquet
file is one problem that says what it looks like, `info` on a fully rejected file, load(dict)."""

from __future__ import annotations

import json
import re
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mpo_viz as mv
from mpo_viz.cli import main
from mpo_viz.data.schema import TrajectoryError
from mpo_viz.data.token_text import load_local_tokenizer, tokenizer_decoder
from mpo_viz.envs.tokenizer import build_tokenizer
from mpo_viz.render.report import ReportConfig, build_report

WORDS = ["search", "paris", "capital", "of", "france", "answer", "is", "the"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok") / "word_tokenizer"
    build_tokenizer(WORDS).save_pretrained(str(d))
    return d


def _rows(with_tokens=False):
    # ids: 0 [PAD], 1 [UNK], 2-5 role markers (system, user, assistant, tool), 6 <|eot|>, then the words from 7 in order
    ids = [7, 14, 8, 6, 5, 9, 6]  # search the paris <|eot|> <|tool|> capital <|eot|>
    row = {
        "traj_id": "t0",
        "group_id": "g",
        "prompt_ids": [2],
        "response_ids": ids,
        "loss_mask": [1, 1, 1, 1, 0, 0, 0],
        "reward": 1.0,
        "values": [0.1, 0.2, 0.3, 0.4, 0, 0, 0],
    }
    if with_tokens:
        row["response_tokens"] = ["S", "T", "P", "E", "O", "C", "E"]
    return [row]


def test_tokenizer_folder_decodes_ids(tok_dir):
    dec = tokenizer_decoder(tok_dir)
    assert dec([7, 14, 8, 6, 5]) == ["search", "the", "paris", "<|eot|>", "<|tool|>"]
    # a bare tokenizer.json (the tokenizers library) works too, and gives the same strings
    assert tokenizer_decoder(tok_dir / "tokenizer.json")([7, 8, 6]) == ["search", "paris", "<|eot|>"]
    with pytest.raises(ValueError, match="no such path"):
        load_local_tokenizer(tok_dir / "missing")
    empty = tok_dir.parent / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no tokenizer"):
        load_local_tokenizer(empty)


def test_explorer_and_report_show_decoded_text(tok_dir, tmp_path):
    from mpo_viz.widgets import TrajectoryExplorer

    b = mv.TrajectoryBatch.from_rows(_rows())
    ex = TrajectoryExplorer(b, tokens=tok_dir)
    p = ex.strip.payload_dict
    assert p["tokens"] == ["search", "the", "paris", "<|eot|>", "<|tool|>", "capital", "<|eot|>"]
    assert p["spaced"] is True  # word-level pieces without spaces: the strip spaces them out
    html = build_report(b, ReportConfig(tokenizer=str(tok_dir), progress=False))
    payload = json.loads(re.search(r'id="payload-0">(.*?)</script>', html, re.S).group(1))
    assert payload["tokens"][:3] == ["search", "the", "paris"]
    # response_tokens in the data win: the tokenizer only fills in what is absent
    b2 = mv.TrajectoryBatch.from_rows(_rows(with_tokens=True))
    html = build_report(b2, ReportConfig(tokenizer=str(tok_dir), progress=False))
    payload = json.loads(re.search(r'id="payload-0">(.*?)</script>', html, re.S).group(1))
    assert payload["tokens"][:3] == ["S", "T", "P"]
    # the command line: --tokenizer DIR; a bad folder is one line naming it, before any work
    data = tmp_path / "d.jsonl"
    mv.save(b, data)
    assert (
        main(["report", str(data), "-o", str(tmp_path / "r.html"), "--tokenizer", str(tok_dir), "--no-progress"]) == 0
    )
    assert '"search","the","paris"' in (tmp_path / "r.html").read_text()
    assert main(["report", str(data), "-o", str(tmp_path / "r2.html"), "--tokenizer", str(tmp_path / "nope")]) == 1
    assert not (tmp_path / "r2.html").exists()


def test_report_export_folder(tmp_path):
    from mpo_viz.render.export import static_export_available

    b = mv.synthetic.make_batch(6, seed=4, turns=(2, 3), turn_len=(3, 8), obs_len=(2, 5))
    out = tmp_path / "export"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        html = build_report(b, ReportConfig(estimators=("mpo", "gae"), export_dir=str(out), progress=False))
    names = {p.name for p in out.iterdir()}
    assert {"summary.csv", "advantages_by_estimator.csv", "estimator_agreement.csv", "value_variance.csv"} <= names
    import pandas as pd

    agree = pd.read_csv(out / "estimator_agreement.csv")
    assert len(agree) == 1  # one pair of estimators
    if static_export_available():
        assert "across_within.svg" in names
    else:
        assert any("kaleido" in str(x.message) for x in w) and not any(n.endswith(".png") for n in names)
        assert "no static renderer (kaleido) installed" in html
    # in the page: every figure has PNG / SVG links and the grid tables a CSV link
    assert html.count('data-fmt="svg"') == html.count('data-fmt="png"') >= 3
    assert "download='estimator_agreement.csv'" in html


def test_empty_batch_keeps_its_columns():
    b = mv.synthetic.make_batch(4, seed=0)
    e = b[0:0]
    assert e.values is not None and tuple(e.values.shape) == (0, 0)
    from mpo_viz import advantages as adv

    assert adv.missing(e, "mpo") == []
    assert adv.compute(e, "mpo").advantages.shape == (0, 0)


def test_foreign_parquet_is_one_problem_pointing_to_convert(tmp_path):
    f = tmp_path / "verl_dump.parquet"
    pq.write_table(
        pa.table(
            {
                "prompts": [[1, 2], [3]],
                "responses": [[4, 5], [6]],
                "attention_mask": [[1, 1, 1, 1], [1, 1]],
                "token_level_scores": [[0.0, 1.0], [0.0]],
            }
        ),
        f,
    )
    for errors in ("raise", "collect"):
        with pytest.raises(TrajectoryError) as ei:
            mv.load(f, errors=errors)
        assert len(ei.value.problems) == 1
        msg = str(ei.value)
        assert (
            "looks like a verl dump" in msg and "mpo-viz convert --from verl" in msg and "row" not in msg.split(":")[0]
        )


def test_info_on_a_fully_rejected_file_lists_no_fields(tmp_path, capsys):
    f = tmp_path / "bad.jsonl"
    f.write_text(
        json.dumps(
            {
                "traj_id": "a",
                "group_id": "g",
                "prompt_ids": [1],
                "response_ids": [1, 2],
                "loss_mask": [1, 2],
                "reward": 1.0,
            }
        )
        + "\n"
    )
    assert main(["info", str(f)]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("fields"))
    assert "none: no valid row" in line and "traj_id" not in line


def test_load_of_a_dict_says_what_it_expected():
    with pytest.raises(TypeError, match=r"path: expected a file or folder path.*found dict.*from_rows"):
        mv.load({"traj_id": "a"})
