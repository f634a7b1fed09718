"""The run folder's metrics reader (mpo_viz.data.runfolder.read_metrics): complete lines only, read on
from a byte offset, the partial last line pending, bad lines named."""

import pytest

from mpo_viz.data.runfolder import read_metrics
from mpo_viz.widgets.dashboard import flatten_keys


def test_read_metrics_offsets_and_errors(tmp_path):
    p = tmp_path / "metrics.jsonl"
    assert read_metrics(p) == ([], 0, None)  # not written yet
    p.write_text('{"iteration": 0, "a": {"b": 1}}\n\n{"iteration": 1}\n{"itera')
    recs, off, pending = read_metrics(p)
    assert recs == [{"iteration": 0, "a": {"b": 1}}, {"iteration": 1}] and pending is None
    assert [flatten_keys(r) for r in recs] == [{"iteration": 0, "a/b": 1}, {"iteration": 1}]  # as the views name them
    assert off == len(p.read_bytes()) - len('{"itera')
    assert read_metrics(p, off) == ([], off, None)
    assert read_metrics(p).records == recs and read_metrics(p).offset == off
    p.write_text('{"iteration": 0}\n{"iteration": 1}')  # a last line without its newline: pending, not a record
    assert read_metrics(p) == ([{"iteration": 0}], len('{"iteration": 0}\n'), {"iteration": 1})
    p.write_text('{"iteration": 0}\nnot json\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2: expected one JSON object per line"):
        read_metrics(p)
    p.write_text('{"iteration": 0}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"line 2: expected a JSON object, found list"):
        read_metrics(p)
    with pytest.raises(ValueError, match=r"line 2: expected a JSON object, found list"):
        read_metrics(p, len('{"iteration": 0}\n'))  # line numbers count from the file's start, whatever the offset
