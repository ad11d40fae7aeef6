"""A signal is honoured even when a step cannot end (issue 49's rule): from the first SIGTERM / SIGINT of
``checkpoint.save_on_signal`` a deadline runs (``checkpoint.signal_deadline``); when the step in
progress has not ended by then, one line names the last checkpoint saved and the process exits with
128 + the signal's number. Each test runs a real process and makes its step hang: the component's own
loop asleep in a child interpreter, and a real ``vitscale train`` whose data stream stops sending (a
``pipe:`` command that goes silent after its first shard: a stuck remote, which ``data.remote_timeout_s``
would only notice much later)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from PIL import Image

REPO = Path(__file__).parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}


def _wait_for(cond, seconds: float, what: str, proc: subprocess.Popen) -> None:
    t = time.monotonic()
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the child ended ({proc.returncode}) before {what}: {proc.stderr.read()[-3000:]}")
        if time.monotonic() - t > seconds:
            raise AssertionError(f"no {what} within {seconds} s")
        time.sleep(0.05)


def test_a_step_that_never_ends_exits_at_the_deadline_naming_the_checkpoint(tmp_path):
    """The save-on-signal component with its deadline, in a child whose "step" sleeps for a minute:
    SIGINT is noted (Ctrl-C), the step does not end, and 0.5 s later the child exits 130 with the line."""
    ready = tmp_path / "ready"
    code = ("import time, pathlib\nfrom vitscale.train.preemption import Preemption\n"
            "p = Preemption(['SIGTERM', 'SIGINT'], deadline=0.5)\np.watch(lambda: 'runs/x/checkpoints/step_00000007')\n"
            f"with p:\n    pathlib.Path({str(ready)!r}).touch()\n    time.sleep(60)\n    p.agreed()\n")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        _wait_for(ready.exists, 120, "start", proc)
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert 0.4 < took < 20, took  # at the deadline, not at the end of the 60 s "step"
    assert "SIGINT received: finishing the current step (within 0.5 s)" in err
    assert ("vitscale train: SIGINT: the step in progress did not end within checkpoint.signal_deadline=0.5 s; exiting "
            "without saving it (the last checkpoint saved is runs/x/checkpoints/step_00000007: run the same command "
            "to resume)") in err  # fmt: skip


def _shard(path: Path, n: int) -> Path:
    with tarfile.open(path, "w") as tf:
        for i in range(n):
            buf = io.BytesIO()
            Image.new("L", (8, 8), 25 * (i % 10)).save(buf, format="PNG")
            for ext, data in (("png", buf.getvalue()), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"k{i:03d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.slow
def test_sigterm_during_a_step_waiting_on_a_silent_stream_exits_at_the_deadline(tmp_path):
    """``vitscale train`` on a stream that sends 17 samples (two steps of 8 and one more), saving each step,
    then goes silent: the third step waits for data that does not come (the 17th sample is whole only at the
    end of its archive). SIGTERM then: before the deadline the run said it would finish the step; after it
    (1 s), it exits 143 naming step 2's checkpoint. ``data.samples_per_epoch`` is set, so start-up reads the
    first sample only (not the whole first shard), and no shuffle buffer: neither waits for the silent
    command to end before the third step."""
    shard = _shard(tmp_path / "a.tar", 17)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "vitscale", "train", "digits_vit", "data.format=webdataset", "data.webdataset_mode=stream",
           f"data.train_path=pipe:cat {shard}; exec sleep 30", "data.num_classes=10", "data.samples_per_epoch=24",
           "data.shuffle_buffer=0", "data.num_workers=0", "data.remote_timeout_s=120", "train.batch_size=8", "train.max_steps=10", "checkpoint.every=1",
           "checkpoint.signal_deadline=1", "model.num_layers=1", "model.hidden_size=16", "model.ffn_hidden_size=32",
           "log.flops=false", "log.progress=plain", "log.report=false", "log.tensorboard=false", "eval.every=0", f"train.output_dir={out}"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    try:
        step2 = out / "checkpoints" / "step_00000002"
        _wait_for(step2.is_dir, 300, "checkpoint of step 2", proc)
        time.sleep(1.0)  # the third step is waiting for its batch
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the silent command too
        except ProcessLookupError:
            pass
    assert proc.returncode == 143, err[-3000:]
    assert took < 30, took
    assert "SIGTERM received: finishing the current step (within 1 s)" in err
    line = [ln for ln in err.splitlines() if "did not end within checkpoint.signal_deadline=1 s" in ln]
    assert len(line) == 1, err[-3000:]
    assert line[0].startswith("vitscale train: SIGTERM: the step in progress") and f"{step2}: run the same command" in line[0]
    assert not (out / "checkpoints" / "step_00000003").exists()
