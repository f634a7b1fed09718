"""The views' fast paths against the code they replace: the turn and agreement tables written
column by column equal pandas' ``to_html``; the picker's labels taken column by column equal the
row-by-row formatting."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import mpo_viz as mv
from mpo_viz.widgets import EstimatorComparison, TrajectoryExplorer
from mpo_viz.widgets.explorer import _frame_html_pandas, frame_html, trajectory_table
from mpo_viz.widgets.picker import _NBSP, TrajectoryPicker, format_cell


@pytest.fixture(scope="module")
def batch():
    # one-token turns, turns without observations, a single turn: the tables' edge cases
    return mv.synthetic.make_batch(12, seed=2, turns=(1, 9), turn_len=(1, 30), obs_len=(0, 10))


def test_frame_html_equals_pandas_on_edge_cases():
    df = pd.DataFrame(
        {
            "turn": [0, 1, 2],
            "x": [0.123456, np.nan, -0.0],
            "s": ["a<b&\"c'", None, "x"],
            "b": [True, False, True],
            "f32": np.array([1.5, np.inf, -1e-7], dtype=np.float32),
            "big": [1e20, 123456.0, 0.5],
            "u": np.array([1, 2, 255], dtype=np.uint8),
        }
    )
    twice = pd.DataFrame([[1, 2.5]], columns=["a", "a"])
    for d in (
        df,
        df.iloc[:0],
        df[["s"]],
        pd.DataFrame({"cat": pd.Categorical(["a", "b"])}),
        twice,
        pd.DataFrame(np.eye(2)),
    ):
        assert frame_html(d) == _frame_html_pandas(d)


def test_frame_html_equals_pandas_on_the_views_tables(batch):
    ex = TrajectoryExplorer(batch, estimators=["mpo", "gae", "grpo"])
    cmp = EstimatorComparison(batch, ["mpo", "gae", "grpo"])
    for row in range(len(batch)):
        ex.select(row)
        cmp.select(row)
        tables = [ex.turn_df, *ex.tables().values(), *cmp.tables().values()]
        for df in tables:
            assert frame_html(df) == _frame_html_pandas(df)
    assert "<td>—</td>" in frame_html(ex.turn_df.assign(x=np.nan))


def test_picker_labels_equal_the_row_by_row_formatting(batch):
    t = trajectory_table(batch, {k: mv.advantages.compute(batch, k).advantages for k in ("mpo", "gae")})
    t.loc[3, "disagree"] = np.nan
    t.loc[5, "reward"] = np.inf
    t["flag"] = t["turns"] > 5  # numpy bools format as numbers in a row, as before
    t["f32"] = t["reward"].astype(np.float32)
    p = TrajectoryPicker(t, page_size=len(t))
    want = [_NBSP.join(format_cell(t.iloc[i][c], p.widths.get(c, 9)) for c in p.columns) for i in range(len(t))]
    assert p._labels(range(len(t))) == want
    assert [lab for lab, _ in p.select.options] == [want[i] for i in p._order]
