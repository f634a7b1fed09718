"""Experiment trackers: every metrics line and the config mirrored to TensorBoard event files and to
an offline wandb run, read back from what was written; a clear error when the package is absent."""

import json
import struct
import time

import pytest

from mpo_viz.cli import main
from mpo_viz.train import Config, Trainer
from mpo_viz.train.trackers import check_available, flat_metrics
from tests.train.train_helpers import TINY


def _cfg(tmp_path, **changes):
    d = {k: v for k, v in TINY.items() if k not in ("env", "iterations", "episodes")}
    d.update(estimator="grpo", loss="token_ppo", group_size=2, eval_interval=2, **changes)
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps(d))
    return str(p)


def _lines(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _expected(lines):
    """``{(metric, step): value}`` of every numeric metric of metrics.jsonl (the last line wins at a
    repeated step), by the same flattening rule the trackers document."""
    out = {}
    for rec in lines:
        nums, _ = flat_metrics(rec)
        for k, v in nums.items():
            if k != "iteration":
                out[(k, rec["iteration"])] = v
    return out


def test_flat_metrics():
    nums, texts = flat_metrics(
        {
            "iteration": 3,
            "ok": True,
            "x": 1,
            "t": {"a": 0.5, "b": {"c": 2}},
            "phase": "rl",
            "collapse": ["success"],
            "none": None,
        }
    )
    assert nums == {"iteration": 3.0, "ok": 1.0, "x": 1.0, "t/a": 0.5, "t/b/c": 2.0}
    assert texts == {"phase": "rl", "collapse": '["success"]'}


def test_tensorboard_mirrors_every_metric_and_the_config(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "--config",
            _cfg(tmp_path),
            "--env",
            "search",
            "--episodes",
            "4",
            "--iterations",
            "2",
            "--log-to",
            "tensorboard",
            "--run-dir",
            str(run),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    rc = main(["train", "--resume", str(run), "--iterations", "3"])  # the resumed run keeps mirroring
    assert rc == 0, capsys.readouterr().err
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    got = {(tag, ev.step): ev.value for tag in acc.Tags()["scalars"] for ev in acc.Scalars(tag)}
    expected = _expected(_lines(run))
    assert set(got) == set(expected)  # every metric of every line, and nothing else
    for key, v in expected.items():
        assert got[key] == pytest.approx(v, rel=1e-6, abs=1e-12), key
    assert {("timings/rollout", 3), ("eval_success", 0), ("success", 3)} <= set(got)
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads(text.strip("`\n")) == json.loads((run / "config.json").read_text()) | {"iterations": 2}
    assert [e.step for e in acc.Tensors("phase/text_summary")] == [r["iteration"] for r in _lines(run)]


def _wandb_records(path):
    """The records of a ``.wandb`` file: the LevelDB log format (32 KiB blocks of chunks, each
    ``crc32 (4) | length (2, little-endian) | type (1: full, 2: first, 3: middle, 4: last)``)
    after a 7-byte header, each record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if n == 0 and kind == 0:  # the zero padding of a block
            pos += left
            continue
        buf += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def _complete(path, timeout: float = 60.0):
    """The file's records once wandb's service has written the run's ``exit`` record (it writes
    the file from its own process, and may still be at it when ``finish()`` returns: a read can end
    inside a record being written, which is read again)."""
    from google.protobuf.message import DecodeError  # wandb's dependency

    t0 = time.monotonic()
    while True:
        try:
            records = _wandb_records(path)
        except DecodeError:  # read while the service was writing a record: torn at the end, read again
            if time.monotonic() - t0 > timeout:
                raise
            time.sleep(0.2)
            continue
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() - t0 > timeout:
            return records
        time.sleep(0.2)


def test_wandb_offline_mirrors_every_metric_and_the_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    cfg = Config.load(_cfg(tmp_path)).replace(env="search", episodes=4, iterations=2, log_to="wandb")
    tr = Trainer(cfg, run, quiet=True)
    tr.run_all()
    tr.close()
    (f,) = run.glob("wandb/offline-run-*/run-*.wandb")
    records = _complete(f)
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {i.key: json.loads(i.value_json) for i in runs[0].config.update if not i.key.startswith("_")}
    assert config == json.loads((run / "config.json").read_text())
    got = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            step = r.history.step.num
            for item in r.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    got[(key, step)] = json.loads(item.value_json)
    expected = _expected(_lines(run))
    numeric = {k: v for k, v in got.items() if not isinstance(v, str)}
    assert set(numeric) == set(expected)
    for key, v in expected.items():
        assert numeric[key] == pytest.approx(v, rel=1e-9), key
    assert (got[("phase", 0)], got[("phase", 1)]) == ("eval", "rl")  # text as text
    assert json.loads((run / "tracker.json").read_text())["wandb_id"] == runs[0].run_id


def test_a_missing_package_is_one_clear_error(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ValueError, match=r"log_to: 'wandb' needs the wandb package, which is not installed here"):
        check_available("wandb")
    rc = main(
        [
            "train",
            "--config",
            _cfg(tmp_path),
            "--env",
            "search",
            "--episodes",
            "4",
            "--iterations",
            "1",
            "--log-to",
            "wandb",
            "--run-dir",
            str(tmp_path / "r"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and "pip install 'mpo-viz[trackers]'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # nothing written
    rc = main(["train", "--log-to", "mlflow", "--run-dir", str(tmp_path / "r")])
    assert rc == 1 and "--log-to: expected one of 'wandb', 'tensorboard', found 'mlflow'" in capsys.readouterr().err
