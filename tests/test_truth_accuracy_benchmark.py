"""benchmarks/truth_accuracy.py (replication v3, E1): the whole pipeline at its smoke size."""

from pathlib import Path

import pandas as pd
import pytest

HERE = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_pipeline_writes_rows_and_resumes(load_script, tmp_path, capsys):
    bench = load_script(HERE / "benchmarks" / "truth_accuracy.py", "bench_truth_accuracy")
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "e1.csv")
    assert set(df.snapshot) == {"start", "ppo@1", "mpo@2"} and set(df["values"]) == {"critic", "flattened", "expert"}
    n = len(df)
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0  # every fit done: nothing runs again
    assert len(pd.read_csv(tmp_path / "e1.csv")) == n


def test_flattened_values_by_hand(load_script):
    import numpy as np

    from mpo_viz.trajectory import TrajectoryBatch

    bench = load_script(HERE / "benchmarks" / "truth_accuracy.py", "bench_truth_accuracy")
    b = TrajectoryBatch.from_rows([{"traj_id": "a", "group_id": "g", "prompt_ids": [1], "response_ids": [2] * 5,
                                    "loss_mask": [1, 1, 0, 1, 1], "reward": 1.0}])
    v = np.array([[0.1, 0.2, 0.9, 0.4, 0.5]])
    np.testing.assert_allclose(bench.flattened(b, v), [[0.1, 0.1, 0.9, 0.4, 0.4]])
