"""benchmarks/envs.py runs end to end on small cells and reports consistent columns."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("cell", ["sokoban 6x6, 2 boxes, 4-10 moves", "frozenlake 4x4 slippery"])
def test_small_cells(load_script, cell):
    bench = load_script(HERE / "benchmarks" / "envs.py", "bench_envs")
    name, opts = bench.CELLS[cell]
    s = bench.step_cell(name, opts, episodes=2)
    assert s["turns"] > 0 and s["step_us"] > s["bare_us"] > 0
    assert s["overhead_us"] == pytest.approx(s["step_us"] - s["bare_us"])
    o = bench.oracle_cell(name, opts, tasks=2)
    assert o["max_s"] >= o["median_s"] > 0 and o["states_max"] >= o["states_median"] > 0
    g = bench.generate_cell(name, opts, episodes=4)
    assert g["episodes"] == 4 and g["eps_per_s"] > 0


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", ["gem:game:Sokoban-v0-easy", "textarena:FrozenLake-v0"])
def test_adapter_cells(load_script, name):
    bench = load_script(HERE / "benchmarks" / "envs.py", "bench_envs")
    pytest.importorskip(name.partition(":")[0], reason=f"the {name.partition(':')[0]} extra is not installed")
    r = bench.adapter_cell(name, episodes=3)
    assert r["turns"] > 0 and r["step_us"] > 0 and r["bare_us"] > 0
    assert r["overhead_us"] == pytest.approx(r["step_us"] - r["bare_us"])
    assert r["eps_per_s"] > 0 and r["bare_eps_per_s"] > 0
