"""The team's trackers (``log.wandb``, ``log.mlflow``): W&B in its offline mode and an MLflow file store
get the config, every logged value, the summary and the report's plots; a resumed run continues the
same tracker run (the ids kept in ``trackers.json``); a tracker that cannot start is one line and the
run goes on."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import read_losses

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

TINY = [
    "model.name=vit_debug", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=2",
    "model.num_attention_heads=2", "data.format=synthetic", "data.num_classes=10", "data.synthetic_size=96",
    "data.val_split=0.25", "data.num_workers=0", "train.batch_size=16", "train.cpu_threads=1", "train.log_every=1",
    "eval.batch_size=32", "log.progress=plain", "log.flops=false",
]  # fmt: skip


def _train(out: Path, env: dict, *extra: str) -> str:
    (out.parent / "empty.yaml").write_text("{}\n")
    cmd = [sys.executable, "-m", "vitscale", "train", str(out.parent / "empty.yaml"), *TINY, f"train.output_dir={out}", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout + p.stderr


def _wandb_records(path: Path):
    """The protobuf records of a W&B transaction log (``run-<id>.wandb``: a 7-byte header, then LevelDB's
    log format — 32 KiB blocks of records with a 7-byte header: CRC, length, type full/first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf + chunk if kind == 4 else chunk)
            buf = b""
            yield r
        elif kind in (2, 3):
            buf = chunk if kind == 2 else buf + chunk


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


def _wandb_history(run_dir: Path) -> tuple[dict[int, float], dict[str, str], int]:
    """loss by step, the final summary's keys, and the config's size, from an offline run folder."""
    losses, summary, config = {}, {}, 0
    for r in _wandb_records(next(run_dir.glob("run-*.wandb"))):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            items = {_key(i): json.loads(i.value_json) for i in r.history.item}
            if "loss" in items:
                losses[int(items["_step"])] = items["loss"]
        elif kind == "summary":
            summary.update({_key(i): i.value_json for i in r.summary.update})
        elif kind in ("config", "run"):  # the config given to wandb.init travels in the run record
            config += len((r.config if kind == "config" else r.run.config).update)
    return losses, summary, config


@pytest.mark.slow
def test_wandb_offline_and_mlflow_file_store_keep_one_run_across_a_resume(tmp_path):
    out, mlruns = tmp_path / "run", tmp_path / "mlruns"
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path / "wandb_dir"),
           "MLFLOW_TRACKING_URI": mlruns.as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true"}  # fmt: skip
    first = _train(out, env, "train.max_steps=3", "log.wandb=true", "log.mlflow=true", "log.project=cluster_test")
    ids = json.loads((out / "trackers.json").read_text())
    assert set(ids) == {"wandb", "mlflow"}, first
    assert f"wandb: run {ids['wandb']}" in first and f"mlflow: run {ids['mlflow']}" in first
    second = _train(out, env, "train.max_steps=6", "checkpoint.allow_changes=train.max_steps", "log.wandb=true",
                    "log.mlflow=true", "log.project=cluster_test")  # fmt: skip
    assert "resumed from" in second and f"wandb: run {ids['wandb']} (continued)" in second
    assert json.loads((out / "trackers.json").read_text()) == ids  # the same tracker runs
    ours = read_losses(out)
    assert sorted(ours) == [1, 2, 3, 4, 5, 6]

    # W&B: two offline segments of one run id, together every logged loss; the config, the summary, the plots
    segments = sorted((tmp_path / "wandb_dir" / "wandb").glob(f"offline-run-*-{ids['wandb']}"))
    assert len(segments) == 2
    (l1, s1, c1), (l2, s2, c2) = (_wandb_history(d) for d in segments)
    assert {**l1, **l2} == ours and sorted(l1) == [1, 2, 3] and sorted(l2) == [4, 5, 6]
    assert c1 > 50 and json.loads(s2["steps"]) == 6 and "val_top1" in s2 and "segments" not in s2
    assert any(p.name.startswith("loss_") for p in segments[1].glob("files/media/images/report/*.png"))

    # MLflow: one run holding every step's loss, the parameters, the summary and the report's plots
    (run_dir,) = [p for p in mlruns.glob(f"*/{ids['mlflow']}") if p.is_dir()]
    logged = {int(s): float(v) for _, v, s in (line.split() for line in (run_dir / "metrics" / "loss").read_text().splitlines())}
    assert logged == pytest.approx(ours, rel=1e-12)
    assert (run_dir / "params" / "train.batch_size").read_text() == "16"
    assert (run_dir / "tags" / "summary.steps").read_text() == "6"
    assert (run_dir / "artifacts" / "report" / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_a_tracker_that_cannot_start_is_one_line(tmp_path):
    """W&B not installed (a folder on PYTHONPATH whose ``wandb`` fails to import, as a missing one does)
    and an MLflow server that does not answer: one line each, the run trains and ends 0."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "wandb.py").write_text("raise ImportError(\"No module named 'wandb'\")\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    env = {"PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]),
           "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
           "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}  # fmt: skip
    log = _train(tmp_path / "run", env, "train.max_steps=2", "log.wandb=true", "log.mlflow=true")
    notes = [line for line in log.splitlines() if line.startswith("log.")]
    assert notes[0] == ("log.wandb=true, but the wandb package is not installed (pip install wandb): the run goes on "
                        "without it"), log  # fmt: skip
    assert notes[1].startswith("log.mlflow=true, but mlflow could not start (") and notes[1].endswith(": the run goes on without it")
    assert len(notes) == 2 and "Traceback" not in log
    assert sorted(read_losses(tmp_path / "run")) == [1, 2] and not (tmp_path / "run" / "trackers.json").exists()
