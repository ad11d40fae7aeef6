"""Checkpoints off the node (``checkpoint.remote``) against moto's standalone S3 server: a run mirrors
its checkpoints (index last) and logs to ``s3://``; stopped on one "node", requeued on another whose
disk is empty, it restores them — a damaged remote checkpoint skipped like a local one — and ends on
the uninterrupted run's curve; an unreachable bucket is one line before anything trains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vitscale.config import load_config
from vitscale.train import train

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

TINY = [
    "model.name=vit_debug", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=2",
    "model.num_attention_heads=2", "data.format=synthetic", "data.num_classes=10", "data.synthetic_size=96",
    "data.val_split=0.25", "data.num_workers=0", "train.batch_size=16", "train.cpu_threads=1", "train.log_every=1",
    "eval.batch_size=32", "log.progress=plain", "log.flops=false", "train.max_steps=8", "checkpoint.every=2",
    "checkpoint.keep=3", "log.report=false",
]  # fmt: skip


@pytest.fixture
def moto_s3(s3_server) -> dict:
    """The environment that points s3fs at the session's moto S3 server (tests/conftest.py); each test
    makes a bucket of its own."""
    return s3_server[1]


def _cmd(out: Path, *extra: str) -> list[str]:
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / "empty.yaml").write_text("{}\n")
    return [sys.executable, "-m", "vitscale", "train", str(out.parent / "empty.yaml"), *TINY, f"train.output_dir={out}", *extra]


def _curve(out: Path) -> dict[int, tuple]:
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.slow
def test_requeued_on_an_empty_node_resumes_from_s3(tmp_path, moto_s3, monkeypatch):
    import s3fs

    for k, v in moto_s3.items():
        monkeypatch.setenv(k, v)
    fs = s3fs.S3FileSystem()
    fs.mkdir("ckpts-requeue")
    url = "s3://ckpts-requeue/runs/digits"
    ref = tmp_path / "ref"
    train(load_config(None, TINY + [f"train.output_dir={ref}"]))

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    node_a = tmp_path / "node_a" / "run"
    p = subprocess.Popen(_cmd(node_a, f"checkpoint.remote={url}"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env)  # fmt: skip
    out = []
    for line in p.stdout:
        out.append(line)
        if line.startswith("step 5/"):
            p.send_signal(signal.SIGTERM)  # preempted: saves step 5 (or 6), uploads it, exits
            break
    log = "".join(out) + p.communicate(timeout=120)[0]
    assert p.returncode == 143, log[-3000:]
    stopped = int(log.split("stopped by SIGTERM after step ")[1].split(";")[0])
    remote = sorted(f.rsplit("/", 1)[-1] for f in fs.ls(f"{url}/checkpoints"))
    assert remote == [f"step_{s:08d}" for s in (2, 4, stopped)], remote
    assert set(fs.ls(f"{url}/checkpoints/step_{stopped:08d}", detail=False)) >= {f"ckpts-requeue/runs/digits/checkpoints/step_{stopped:08d}/checkpoint.json"}
    assert fs.cat(f"{url}/config.yaml") == (node_a / "config.yaml").read_bytes()

    # the newest remote checkpoint damaged in the bucket: the requeued run skips it as it would a local one
    shard = f"{url}/checkpoints/step_{stopped:08d}/model-rank00000.safetensors"
    data = bytearray(fs.cat(shard))
    data[-64:] = bytes(64)
    fs.pipe(shard, bytes(data))
    node_b = tmp_path / "node_b" / "run"  # another node: an empty disk
    p = subprocess.run(_cmd(node_b, f"checkpoint.remote={url}"), capture_output=True, text=True, env=env, timeout=300)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-3000:]
    assert f"restored step_00000002, step_00000004, step_{stopped:08d} from {url}" in log
    assert f"skipping damaged checkpoint step_{stopped:08d}" in log and "checksum mismatch" in log
    assert f"resumed from {node_b / 'checkpoints' / 'step_00000004'} at step 4" in log
    assert _curve(node_b) == _curve(ref)  # restored metrics.jsonl up to step 4, then the same steps again
    kept = sorted({2, 4, stopped, 6, 8})[-3:]  # the newest checkpoint.keep=3 by step (a damaged one counts too)
    assert sorted(f.rsplit("/", 1)[-1] for f in fs.ls(f"{url}/checkpoints")) == [f"step_{s:08d}" for s in kept]
    summary = json.loads(fs.cat(f"{url}/summary.json"))
    assert summary["steps"] == 8 and [s["start_step"] for s in summary["segments"]] == [0, 4]


def test_an_unreachable_bucket_is_one_line(tmp_path, moto_s3, monkeypatch):
    for k, v in moto_s3.items():
        monkeypatch.setenv(k, v)
    t0 = time.time()
    p = subprocess.run(_cmd(tmp_path / "run", "checkpoint.remote=s3://no-such-bucket/x"), capture_output=True, text=True,
                       env={**os.environ}, timeout=300)  # fmt: skip
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and lines[-1].startswith("vitscale train: checkpoint.remote=s3://no-such-bucket/x cannot be read or written: "), p.stderr
    assert "Traceback" not in p.stderr and time.time() - t0 < 120
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


class StallingProxy:
    """A TCP proxy on localhost in front of moto's S3 server that relays every request until one that
    matches ``stall_at`` (a checkpoint's upload), then holds that request and every later byte without an
    answer: a location that stops answering mid-run."""

    def __init__(self, target: str, stall_at):
        import socket
        import threading

        self.host, self.port = target.removeprefix("http://").split(":")
        self.stall_at, self.stalled = stall_at, threading.Event()
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.srv.getsockname()[1]}"
        self.conns: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.srv.accept()
            except OSError:
                return
            upstream = socket.create_connection((self.host, int(self.port)))
            self.conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src, dst, requests: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            if requests and self.stall_at.search(data):
                self.stalled.set()
            if self.stalled.is_set():
                continue  # read and dropped: the location no longer answers
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.srv.close()
        for c in self.conns:
            c.close()


@pytest.mark.slow
def test_a_location_that_stops_answering_never_stops_the_run(tmp_path, moto_s3, monkeypatch):
    """The location answers the start-up check and the upload of step 2, then stops answering at the next
    checkpoint's: training goes on past the saves that follow (one warning line), and a SIGTERM then
    ends the run as a preemption does — its checkpoint saved locally — within checkpoint.remote_wait_s."""
    import s3fs

    for k, v in moto_s3.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir("ckpts-stall")
    import re

    proxy = StallingProxy(moto_s3["AWS_ENDPOINT_URL"], re.compile(rb"PUT /\S*/checkpoints/step_(?!00000002/)\d{8}/"))
    env = {**os.environ, **moto_s3, "AWS_ENDPOINT_URL": proxy.url, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    out_dir = tmp_path / "run"
    cmd = _cmd(out_dir, "checkpoint.remote=s3://ckpts-stall/runs/stall", "train.max_steps=20000", "checkpoint.remote_wait_s=3",
               "log.tensorboard=false")  # fmt: skip
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        out, t_signal = [], None
        for line in p.stdout:  # steps and saves go on while the upload hangs, until the warning
            out.append(line)
            if "has not finished after" in line:
                t_signal = time.monotonic()
                p.send_signal(signal.SIGTERM)
                break
        log = "".join(out) + p.communicate(timeout=120)[0]
        took = time.monotonic() - t_signal if t_signal is not None else None
    finally:
        proxy.close()
    assert proxy.stalled.is_set() and t_signal is not None, log[-3000:]
    assert p.returncode == 143, log[-3000:]
    assert took < 60, took  # the save, then at most checkpoint.remote_wait_s for the stalled upload
    stalled = [ln for ln in log.splitlines() if "has not finished after" in ln]
    assert len(stalled) == 1 and "to s3://ckpts-stall/runs/stall" in stalled[0], log[-3000:]  # one line per stall
    assert "(checkpoint.remote_wait_s); training goes on and step_" in stalled[0]
    assert "did not finish in 3 s (checkpoint.remote_wait_s)" in log and "its local checkpoints are complete" in log
    stopped = int(log.split("stopped by SIGTERM after step ")[1].split(";")[0])
    local = sorted(p.name for p in (out_dir / "checkpoints").iterdir())
    assert f"step_{stopped:08d}" in local and stopped > 4, local
    ended = next(ln for ln in log.splitlines() if "did not finish in 3 s" in ln)
    held = ended.split("the upload of ")[1].split(" ")[0]  # still being read at the end: never pruned locally
    assert held in local and len(local) == 3 + (held not in local[-3:]), (held, local)  # checkpoint.keep=3
    remote = s3fs.S3FileSystem(skip_instance_cache=True)
    assert sorted(f.rsplit("/", 1)[-1] for f in remote.ls("s3://ckpts-stall/runs/stall/checkpoints")) >= ["step_00000002"]
    assert remote.exists("s3://ckpts-stall/runs/stall/checkpoints/step_00000002/checkpoint.json")
    assert not remote.exists("s3://ckpts-stall/runs/stall/checkpoints/step_00000004/checkpoint.json")  # never half-published
