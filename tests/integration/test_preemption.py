"""A preempted run loses at most the step in flight (docs/distributed.md, "Running on a cluster"):
SIGTERM sent to every process of the job (as Slurm does: the loader's workers too), then Ctrl-C,
each finishes the step, saves and exits with 128 + the signal; the run started again ends on the
uninterrupted run's curve, its summary and report covering the whole run. The handler's second
signal quits at once. Asynchronous checkpoints keep the same curve and files."""

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

TINY = [
    "model.name=vit_debug", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=2",
    "model.num_attention_heads=2", "model.drop_path_rate=0.1", "data.format=synthetic", "data.num_classes=10",
    "data.synthetic_size=96", "data.val_split=0.25", "train.batch_size=16", "train.cpu_threads=1", "train.log_every=1",
    "optim.lr=1e-3", "schedule.warmup_steps=3", "eval.every=0", "eval.batch_size=32", "log.progress=plain", "log.tensorboard=false",
    "log.flops=false", "checkpoint.keep=10",
]  # fmt: skip
STEPS = 24


def _curve(out: Path) -> dict[int, tuple]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in rows}


def _start(out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vitscale", "train", "-", *TINY, f"train.output_dir={out}", f"train.max_steps={STEPS}",
           "data.num_workers=2", *extra]  # fmt: skip
    (out.parent / "empty.yaml").write_text("{}\n")
    cmd[cmd.index("-")] = str(out.parent / "empty.yaml")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    # a session of its own: a signal to its process group reaches the trainer and its loader workers, as
    # a scheduler's does (Slurm signals every process of the job)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)


def _signal_after(proc: subprocess.Popen, out: Path, step: int, sig: int) -> str:
    """Send ``sig`` to the whole process group once ``step`` is logged; the output of the run."""
    deadline = time.time() + 240
    lines = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith(f"step {step}/"):
            os.killpg(proc.pid, sig)
            break
    rest, _ = proc.communicate(timeout=240)
    return "".join(lines) + rest


@pytest.mark.slow
def test_sigterm_then_ctrl_c_then_resume_is_the_uninterrupted_run(tmp_path):
    ref = tmp_path / "ref"
    ref_summary = train(load_config(None, TINY + [f"train.output_dir={ref}", f"train.max_steps={STEPS}", "data.num_workers=0"]))

    out = tmp_path / "run"
    log = _signal_after(_start(out), out, 5, signal.SIGTERM)
    assert "SIGTERM received: finishing the current step" in log, log[-3000:]
    stopped = [line for line in log.splitlines() if line.startswith("vitscale train: stopped by SIGTERM after step ")]
    assert len(stopped) == 1, log[-3000:]
    step1 = int(stopped[0].split("after step ")[1].split(";")[0])
    assert step1 >= 5 and (out / "checkpoints" / f"step_{step1:08d}").is_dir()
    assert "Traceback" not in log and not (out / "run.lock").exists()

    proc = _start(out, "checkpoint.async_mode=async")  # Ctrl-C (SIGINT to the group), asynchronous saves
    log = _signal_after(proc, out, step1 + 4, signal.SIGINT)
    assert proc.returncode == 130, log[-3000:]
    assert f"resumed from {out / 'checkpoints' / f'step_{step1:08d}'}" in log
    step2 = int(log.split("stopped by SIGINT after step ")[1].split(";")[0])
    assert step2 >= step1 + 4 and (out / "checkpoints" / f"step_{step2:08d}").is_dir()

    proc = _start(out)
    log, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, log[-3000:]
    assert _curve(out) == _curve(ref)  # every step's loss, gradient norm and learning rate, bit for bit
    summary = json.loads((out / "summary.json").read_text())
    final = {k: v for k, v in ref_summary.items() if k.startswith("val_")}  # the final evaluation: loss and accuracy
    assert {"val_loss", "val_top1"} <= final.keys() and {k: summary[k] for k in final} == final
    segments = summary["segments"]
    assert [(s["start_step"], s["end_step"], s.get("ended")) for s in segments] == [
        (0, step1, "SIGTERM"), (step1, step2, "SIGINT"), (step2, STEPS, "finished")]  # fmt: skip
    assert all(s["wall_time_s"] > 0 and s["img_per_s"] > 0 for s in segments)
    assert summary["wall_time_s"] == pytest.approx(sum(s["wall_time_s"] for s in segments))
    assert summary["img_per_s"] == pytest.approx(STEPS * 16 / summary["wall_time_s"])
    assert summary["steps_this_run"] == STEPS - step2
    assert f"{STEPS} steps ({STEPS - step2} after resuming) in " in log and f"over 3 segments (resumed at step {step1}, {step2})" in log
    from vitscale.tools.report import read_run
    from vitscale.tools.report.plots import resume_steps

    assert resume_steps(read_run(out)) == [step1, step2]  # marked on every plot
    assert f"over 3 segments (resumed at steps {step1}, {step2})" in (out / "report.html").read_text()


def test_second_signal_quits_at_once():
    from vitscale.train.preemption import Preempted, Preemption

    p = Preemption(["SIGUSR1", "SIGINT"])
    with p:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert p.requested == signal.SIGUSR1 and p.agreed() == signal.SIGUSR1  # noted: the step goes on
        with pytest.raises(KeyboardInterrupt):  # a second signal (Ctrl-C): at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # handlers restored
    p = Preemption(["SIGTERM"])
    with p, pytest.raises(Preempted) as e:
        p.requested = signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
    assert e.value.exit_code == 143
