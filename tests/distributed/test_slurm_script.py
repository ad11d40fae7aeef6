"""``scripts/slurm_train.sbatch`` run as Slurm runs it, with Slurm's commands replaced by small local
stand-ins on PATH (``srun`` runs the command here, ``scancel --signal`` signals every process of the job
step, ``scontrol requeue`` leaves a mark): the warning signal the script asks for (``--signal=B:USR1``)
makes every rank save and exit, the script requeues the job, and the requeued job resumes from that
checkpoint and finishes. The real torchrun, two ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _launch import free_port, needs_cpu_fsdp

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, needs_cpu_fsdp]

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["train.max_steps=40", "train.log_every=1", "train.batch_size=8", "model.num_layers=2", "log.progress=plain",
        "eval.every=0", "checkpoint.export_safetensors=false", "log.flops=false", "log.report=false", "log.tensorboard=false"]  # fmt: skip

SRUN = """#!/bin/bash
# srun stand-in: `srun ... -w NODE hostname --ip-address` answers 127.0.0.1; otherwise run the command here
for a in "$@"; do [[ $a == hostname ]] && { echo 127.0.0.1; exit 0; }; done
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
echo $$ > "$SLURM_STANDIN/step.pid"
exec "$@"
"""
SCONTROL = """#!/bin/bash
case "$1" in
  show) echo localhost ;;
  requeue) echo "$2" >> "$SLURM_STANDIN/requeued" ;;
esac
"""
SCANCEL = """#!/usr/bin/env python3
# scancel --signal=SIG JOB stand-in: SIG to every process of the job step (the srun stand-in and all below it)
import os, signal, sys
from pathlib import Path
sig = getattr(signal, "SIG" + sys.argv[1].split("=", 1)[1])
root = int((Path(os.environ["SLURM_STANDIN"]) / "step.pid").read_text())
kids = {}
for d in Path("/proc").iterdir():
    try:
        if d.name.isdigit():
            kids.setdefault(int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(d.name))
    except (OSError, ValueError, IndexError):
        pass
todo, step = [root], []
while todo:
    p = todo.pop()
    step.append(p)
    todo += kids.get(p, [])
for p in step:
    try:
        os.kill(p, sig)
    except ProcessLookupError:
        pass
"""


def _standins(folder: Path) -> dict:
    folder.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("scancel", SCANCEL)):
        (folder / name).write_text(textwrap.dedent(text))
        (folder / name).chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "SLURM_STANDIN": str(folder), "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_NUM_NODES": "1", "GPUS_PER_NODE": "2", "PYTHON": sys.executable,
            "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # fmt: skip


def test_the_warning_signal_saves_requeues_and_the_requeued_job_resumes(tmp_path):
    env = {**os.environ, **_standins(tmp_path / "bin"), "MASTER_PORT": str(free_port())}
    out = tmp_path / "run"
    cmd = ["bash", str(ROOT / "scripts" / "slurm_train.sbatch"), "digits_vit", *ARGS, f"train.output_dir={out}"]
    job = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while not (out / "metrics.jsonl").exists() or len((out / "metrics.jsonl").read_text().splitlines()) < 3:
        assert time.time() < deadline and job.poll() is None, job.stdout.read()[-3000:]
        time.sleep(0.1)
    job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 does two minutes before the time limit
    log, _ = job.communicate(timeout=240)
    assert job.returncode == 0, log[-4000:]
    assert (tmp_path / "bin" / "requeued").read_text().split() == ["4242"], log[-4000:]
    stopped = [x for x in log.splitlines() if x.startswith("vitscale train: stopped by SIGUSR1 after step ")]
    assert len(stopped) == 1, log[-4000:]  # rank 0's line (rank 1 stops on the same step)
    step = int(stopped[0].split("after step ")[1].split(";")[0])
    assert (out / "checkpoints" / f"step_{step:08d}" / "model-rank00001.safetensors").is_file()
    assert "requeueing job 4242" in log and "Traceback" not in log.split("requeueing")[0].split("stopped by")[0]

    env["MASTER_PORT"] = str(free_port())
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # Slurm starts it again
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert f"resumed from {out / 'checkpoints' / f'step_{step:08d}'} at step {step}" in again.stdout
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 41))
    assert (tmp_path / "bin" / "requeued").read_text().split() == ["4242"]  # finished: not requeued again
