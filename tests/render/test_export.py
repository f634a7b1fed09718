"""Server-side static export of figures, both ways: with no renderer (kaleido absent) the widgets'
``export_figures``, the report's ``export_dir`` and ``mpo-viz report --export`` say what to install
and that the browser-side PNG / SVG buttons still work; with a renderer (a stand-in kaleido module
and a recording ``write_image``: nothing is installed or downloaded) every figure is written in every
format, under the names the views and the report give them."""

from __future__ import annotations

import sys
import types
import warnings

import plotly.graph_objects as go
import pytest

import mpo_viz as mv
from mpo_viz.cli import main
from mpo_viz.render.export import NO_RENDERER, static_export_available, write_figures
from mpo_viz.render.report import ExportWarning, ReportConfig, build_report
from mpo_viz.widgets import TrajectoryExplorer


@pytest.fixture
def no_renderer(monkeypatch):
    """kaleido cannot be imported (``sys.modules[name] = None`` makes ``import`` raise ImportError)."""
    monkeypatch.setitem(sys.modules, "kaleido", None)


@pytest.fixture
def fake_renderer(monkeypatch):
    """A stand-in kaleido and a ``write_image`` that records (path, format) and writes a marker."""
    monkeypatch.setitem(sys.modules, "kaleido", types.ModuleType("kaleido"))
    calls = []

    def write_image(self, path, format=None, **kw):  # noqa: A002 - plotly's own argument name
        calls.append((str(path), format))
        with open(path, "w") as fh:
            fh.write(f"{format}:{len(self.data)} traces")

    monkeypatch.setattr(go.Figure, "write_image", write_image)
    return calls


@pytest.fixture(scope="module")
def batch():
    return mv.synthetic.make_batch(6, seed=4, turns=(2, 3), turn_len=(3, 8), obs_len=(2, 5))


def _figs():
    return {"a curve": go.Figure(go.Scatter(y=[1, 2])), "bars": go.Figure([go.Bar(y=[1]), go.Bar(y=[2])])}


def test_detection_follows_the_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "kaleido", None)
    assert static_export_available() is False
    monkeypatch.setitem(sys.modules, "kaleido", types.ModuleType("kaleido"))
    assert static_export_available() is True


def test_without_a_renderer_the_error_says_what_to_do(no_renderer, tmp_path):
    with pytest.raises(RuntimeError) as e:
        write_figures(_figs(), tmp_path / "img")
    msg = str(e.value)
    assert msg == NO_RENDERER
    assert "pip install kaleido" in msg and "PNG / SVG buttons" in msg and "CSV" in msg
    assert not (tmp_path / "img").exists()  # nothing half-written


def test_with_a_renderer_every_figure_in_every_format(fake_renderer, tmp_path):
    paths = write_figures(_figs(), tmp_path / "img", formats=("png", "svg"))
    assert [p.name for p in paths] == ["a_curve.png", "a_curve.svg", "bars.png", "bars.svg"]
    assert [f for _, f in fake_renderer] == ["png", "svg", "png", "svg"]
    assert (tmp_path / "img" / "bars.svg").read_text() == "svg:2 traces"


def test_a_failing_renderer_names_the_figure(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "kaleido", types.ModuleType("kaleido"))

    def broken(self, *a, **k):
        raise ValueError("no Chrome found")

    monkeypatch.setattr(go.Figure, "write_image", broken)
    with pytest.raises(RuntimeError, match=r"failed on figure 'bars' as svg \(ValueError: no Chrome found\)"):
        write_figures({"bars": _figs()["bars"]}, tmp_path, formats="svg")


def test_explorer_export_figures_both_ways(batch, monkeypatch, tmp_path):
    ex = TrajectoryExplorer(batch, estimators=["mpo", "gae"], row=2)
    name = f"value_curve_{batch.traj_ids[2]}"
    monkeypatch.setitem(sys.modules, "kaleido", None)
    with pytest.raises(RuntimeError, match="pip install kaleido"):
        ex.export_figures(tmp_path / "none")
    monkeypatch.setitem(sys.modules, "kaleido", types.ModuleType("kaleido"))
    calls = []
    monkeypatch.setattr(
        go.Figure, "write_image", lambda self, p, format=None, **k: calls.append(format) or open(p, "w").close()
    )
    out = ex.export_figures(tmp_path / "img", formats=("svg", "pdf"))
    assert [p.name for p in out] == [f"{name}.svg", f"{name}.pdf"] and calls == ["svg", "pdf"]


def test_report_export_without_a_renderer(batch, no_renderer, tmp_path):
    out = tmp_path / "export"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        html = build_report(batch, ReportConfig(estimators=("mpo", "gae"), export_dir=str(out), progress=False))
    msgs = [str(x.message) for x in w if issubclass(x.category, ExportWarning)]
    assert len(msgs) == 1
    n_csv = len(list(out.glob("*.csv")))
    assert n_csv >= 4 and not list(out.glob("*.png")) and not list(out.glob("*.svg"))
    assert f"wrote {n_csv} tables as CSV" in msgs[0]
    assert "pip install kaleido" in msgs[0] and "PNG / SVG links" in msgs[0]
    assert "no static renderer (kaleido) installed" in html


def test_report_export_with_a_renderer(batch, fake_renderer, tmp_path):
    out = tmp_path / "export"
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)
        html = build_report(batch, ReportConfig(estimators=("mpo", "gae"), export_dir=str(out), progress=False))
    svgs = sorted(p.stem for p in out.glob("*.svg"))
    pngs = sorted(p.stem for p in out.glob("*.png"))
    assert svgs == pngs and "across_within" in svgs
    assert any(s.startswith("value_curve_") for s in svgs)
    # every figure of the page once per format: the page's PNG links count the figures
    assert len(svgs) == html.count('data-fmt="png"')
    assert len(fake_renderer) == 2 * len(svgs)
    n_files = len(list(out.iterdir()))
    assert f"exported {n_files} files to {out}" in html


def test_cli_report_export_says_so(batch, no_renderer, tmp_path, capsys):
    data = tmp_path / "b.parquet"
    mv.save(batch, data)
    assert (
        main(
            [
                "report",
                str(data),
                "-o",
                str(tmp_path / "r.html"),
                "--estimators",
                "mpo,gae",
                "--export",
                str(tmp_path / "exp"),
                "--no-progress",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    note = [ln for ln in err.splitlines() if ln.startswith("note: export:")]
    assert len(note) == 1 and "pip install kaleido" in note[0] and "PNG / SVG links" in note[0], err
    assert "RuntimeWarning" not in err and "ExportWarning" not in err
