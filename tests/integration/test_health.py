"""Health: the hang watchdog (``train.hang_timeout``) on a real hang — the loader's worker frozen, the
step waiting for its batch forever — writes the stacks of every thread to the run folder and ends the
job with exit code 124 and one line naming the file; closing a writer that hangs is abandoned within
a bound; each log record says what share of its time the loop waited for data."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from vitscale.train.closing import bounded

TINY = [
    "model.name=vit_debug", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=2",
    "model.num_attention_heads=2", "data.format=synthetic", "data.num_classes=10", "data.synthetic_size=96",
    "data.val_split=0.25", "train.batch_size=16", "train.cpu_threads=1", "train.log_every=1", "eval.batch_size=32",
    "log.progress=plain", "log.flops=false", "log.report=false", "log.tensorboard=false",
]  # fmt: skip


def test_a_frozen_data_worker_is_found_by_the_watchdog(tmp_path):
    out = tmp_path / "run"
    (tmp_path / "empty.yaml").write_text("{}\n")
    cmd = [sys.executable, "-m", "vitscale", "train", str(tmp_path / "empty.yaml"), *TINY, f"train.output_dir={out}",
           "train.max_steps=400", "data.num_workers=1", "data.prefetch_factor=1", "train.hang_timeout=4"]  # fmt: skip
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    lines = []
    for line in p.stdout:
        lines.append(line)
        if line.startswith("step 3/"):
            break
    workers = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _parent(d) == p.pid]
    assert workers, "".join(lines)
    for w in workers:
        os.kill(w, signal.SIGSTOP)  # a dead data worker: the next batch never comes
    t0 = time.time()
    p.wait(timeout=120)  # the trainer; its frozen worker keeps the output pipe open until it is killed
    took = time.time() - t0
    for w in workers:
        try:
            os.kill(w, signal.SIGKILL)
        except ProcessLookupError:
            pass
    rest = p.stdout.read()
    log = "".join(lines) + rest
    assert p.returncode == 124, log[-3000:]
    assert took < 60, took
    dump = out / "hang-rank0.txt"
    said = [x for x in log.splitlines() if x.startswith("vitscale train: rank 0: no step completed for ")]
    assert said == [f"vitscale train: rank 0: no step completed for {said[0].split('for ')[1].split(' s')[0]} s "
                    f"(train.hang_timeout=4); the stacks of its threads are in {dump}"], log[-3000:]  # fmt: skip
    text = dump.read_text()
    assert text.startswith("rank 0 (pid ") and "last completed step " in text
    assert 'File "' in text and "_batches" in text and "vitscale-watchdog" not in text.split("\n")[0]  # where it waited


def _parent(d: Path) -> int:
    try:
        return int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def test_a_writer_that_hangs_on_close_is_abandoned():
    said = []
    t0 = time.time()
    assert not bounded(lambda: time.sleep(60), "TensorBoard's writer", said.append, seconds=0.5)
    assert time.time() - t0 < 5
    assert said == ["closing TensorBoard's writer took more than 0.5 s: abandoned (it may miss its last records)"]
    assert bounded(lambda: None, "x", said.append) and len(said) == 1


def test_the_log_line_has_the_data_wait_share(tmp_path):
    from vitscale.config import load_config
    from vitscale.train import train

    train(load_config(None, TINY + [f"train.output_dir={tmp_path}", "train.max_steps=3", "data.num_workers=0"]))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= r["data_wait"] <= 100 for r in rows) and "mem_peak_gib" not in rows[0]  # CPU: no device memory
    assert "data_wait " in (tmp_path / "train.log").read_text()
