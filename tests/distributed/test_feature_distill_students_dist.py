"""One teacher into two students in one job (``distill.students``, DINOv3's multi-student distillation):
under ``torchrun`` on 3 gloo processes — student ``small`` on rank 0, student ``wide`` (another width) on
ranks 1-2 under FSDP2 — each student's curve is the curve of the same student trained alone on one
process, within 2e-4, although each image's teacher forward ran on one rank of the job only; each
student has its own run folder and export. Then, on 2 processes: plain feature distillation on 2 ranks
follows the one-process curve (issue 48 item 6); the two students resume from their step-2 checkpoints
(``wide``'s written by 2 ranks, read by 1) onto the same curves; students whose checkpoints are at
different steps are refused, naming them; the exchange alone gives each rank its own images'
features, or stops when a student's images are not the other's; and a signal to one rank of the job
stops every student after the same step, from which the same command resumes them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import free_port, needs_cpu_fsdp, run_distributed
from helpers import assert_curves_close, read_losses, read_metrics
from safetensors import safe_open

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

STEPS, TOL = 4, 2e-4
STOP_STEPS = 16  # the signalled job's length: the signal lands well before its end
RUN = ["train.task=feature_distill", "train.max_steps=4", "train.log_every=1", "train.batch_size=12", "log.progress=none",
       "log.report=false", "log.tensorboard=false", "log.flops=false", "checkpoint.every=2", "checkpoint.keep=5", "eval.every=0", "evals=[]",
       "model.num_layers=1", "model.hidden_size=32", "model.ffn_hidden_size=64", "schedule.warmup_steps=0"]  # fmt: skip
WIDE = ["model.hidden_size=48"]


def _teacher(path: Path) -> str:
    import torch

    from vitscale import create_model
    from vitscale.checkpoint import write_weights

    over = {"num_classes": 0, "hidden_size": 48, "ffn_hidden_size": 96}
    torch.manual_seed(0)
    write_weights(create_model("vit_debug", **over).state_dict(), path, {"model": "vit_debug", "overrides": json.dumps(over)})
    return str(path)


def _args(teacher: str, out: Path, *extra: str) -> list[str]:
    return ["train", "digits_vit", f"distill.teachers=[{{name: t, path: {teacher}}}]", *RUN, f"train.output_dir={out}", *extra]


def _students(small: str, wide: str) -> str:
    return f"distill.students=[{{name: small, ranks: {small}}}, {{name: wide, ranks: {wide}, overrides: {{hidden_size: 48}}}}]"


def _two_ranks(teacher: str, root: str) -> list:
    """Inside 2 ranks: plain feature distillation on both, the students' resume, the refused resume, the
    exchange alone (:func:`_exchange`)."""
    from vitscale.cli import main

    root = Path(root)
    return [main(_args(teacher, root / "plain")),
            main(_args(teacher, root / "resumed", _students("[0]", "[1]"))),
            main(_args(teacher, root / "apart", _students("[0]", "[1]"))), _exchange(False), _exchange(True),
            *_stopped_on_one_rank(teacher, root / "stopped")]  # fmt: skip


def _stopped_on_one_rank(teacher: str, out: Path) -> list:
    """A job of two one-rank students in which rank 0 alone is sent SIGUSR1 once its first step is
    logged: the stop is agreed over the job, so both students stop after the same step with a checkpoint
    (a student stopping alone would leave the other waiting for its features); the same command then
    resumes both to the end. Returns both calls' exit codes."""
    import signal
    import threading
    import time

    from vitscale.cli import main

    args = _args(teacher, out, _students("[0]", "[1]"), f"train.max_steps={STOP_STEPS}", "checkpoint.every=0",
                 "checkpoint.save_on_signal=[SIGUSR1]")  # fmt: skip
    if int(os.environ["RANK"]) == 0:
        metrics = out / "students" / "small" / "metrics.jsonl"

        def send() -> None:
            while not (metrics.is_file() and metrics.stat().st_size):
                time.sleep(0.005)
            os.kill(os.getpid(), signal.SIGUSR1)

        threading.Thread(target=send, daemon=True).start()
    return [main(args), main(args)]


def _exchange(differ: bool) -> list:
    """The exchange alone, on 2 ranks (students ``a`` on rank 0, ``b`` on rank 1, 6 images each): the
    features each rank gets are its own images' (computed half here, half on the other rank); with
    rank 1's images not rank 0's, the mismatch is found. Returns ``[error or None, max difference]``."""
    import torch

    from vitscale.config import load_config
    from vitscale.errors import UserError
    from vitscale.tasks.feature_distill_heads import TeacherFeatures
    from vitscale.tasks.feature_distill_students import StudentLayout, student_process

    def teacher(x):  # a fixed function of the images: summary (B, 3) and patches (B, 16, 3) on a 4x4 grid
        return {"t": TeacherFeatures(x.mean((2, 3)), torch.nn.functional.avg_pool2d(x, 2).flatten(2).transpose(1, 2), (4, 4))}

    rank = int(os.environ["RANK"])
    images = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(100 * rank * differ))
    index = torch.arange(6)
    with student_process(StudentLayout(("a", "b"), ((0,), (1,))), rank, load_config("digits_vit"), 60, 1) as ex:
        try:
            got = ex.features(images, index, 0, teacher)["t"]
        except UserError as e:
            return [str(e), None]
        want = teacher(images)["t"]
        ex.finish()
        return [None, max((got.summary - want.summary).abs().max().item(), (got.patches - want.patches).abs().max().item())]


def _seed(src: Path, dst: Path, step: int = 2) -> None:
    name = f"step_{step:08d}"
    shutil.copytree(src / "checkpoints" / name, dst / "checkpoints" / name)


@needs_cpu_fsdp
def test_two_students_from_one_teacher_forward_follow_their_runs_alone(tmp_path, capfd):
    from vitscale.cli import main

    teacher = _teacher(tmp_path / "teacher.safetensors")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port", str(free_port()),
           "-m", "vitscale", *_args(teacher, tmp_path / "job", _students("[0]", "[1, 2]"))]  # fmt: skip
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert main(_args(teacher, tmp_path / "small")) == 0  # each student alone, on one process, meanwhile
    assert main(_args(teacher, tmp_path / "wide", *WIDE)) == 0
    log, _ = job.communicate(timeout=400)
    assert job.returncode == 0, log[-4000:]
    small, wide = read_losses(tmp_path / "small"), read_losses(tmp_path / "wide")
    assert max(small.values()) - min(small.values()) > 0.05 and small[1] != wide[1]  # curves that move, two students
    students = tmp_path / "job" / "students"
    assert_curves_close(read_losses(students / "small"), small, range(1, STEPS + 1), "student small (rank 0)", TOL)
    assert_curves_close(read_losses(students / "wide"), wide, range(1, STEPS + 1), "student wide (ranks 1-2)", TOL)
    assert "this rank: 4 of every 12 images" in (students / "wide" / "train.log").read_text()  # the forward shared by 3 ranks
    assert all("students_exchange_time_pct" in r and "t_time_pct" in r for r in read_metrics(students / "wide") if "loss" in r)
    for name, width in (("small", 32), ("wide", 48)):  # each student's own export: its backbone alone
        with safe_open(students / name / "model.safetensors", "pt") as f:
            assert f.get_tensor("pos_embed").shape[-1] == width and not any(k.startswith("task.") for k in f.keys())
    assert (tmp_path / "job" / "students.yaml").is_file()

    for name in ("small", "wide"):  # the job resumed from its students' step-2 checkpoints, on 2 ranks
        _seed(students / name, tmp_path / "resumed" / "students" / name)
    _seed(students / "small", tmp_path / "apart" / "students" / "small")  # wide has none: it would start at step 1
    capfd.readouterr()
    rcs = run_distributed(_two_ranks, 2, teacher, str(tmp_path), timeout=400)
    err = capfd.readouterr().err
    assert_curves_close(read_losses(tmp_path / "plain"), small, range(1, STEPS + 1), "feature_distill on 2 ranks", TOL)
    resumed = tmp_path / "resumed" / "students"
    assert_curves_close(read_losses(resumed / "small"), small, range(3, STEPS + 1), "student small resumed", TOL)
    assert_curves_close(read_losses(resumed / "wide"), wide, range(3, STEPS + 1), "student wide resumed on 1 rank", TOL)
    assert all(rc[:3] == [0, 0, 1] for rc in rcs), rcs
    assert [rc[3] for rc in rcs] == [[None, 0.0], [None, 0.0]]  # the exchange alone: each rank its own images' features
    assert all("the students' batches were not the same images" in rc[4][0] for rc in rcs), rcs  # another image: stopped
    assert "the students are at different steps (small: step 3, wide: step 1)" in err, err[-3000:]
    assert not (tmp_path / "apart" / "students" / "wide" / "checkpoints").exists()
    stopped = tmp_path / "stopped" / "students"  # SIGUSR1 to rank 0 alone: both students stop after one step
    assert all(rc[5] != 0 and rc[6] == 0 for rc in rcs), rcs
    lines = {n: [ln for ln in (stopped / n / "train.log").read_text().splitlines() if "stopped by SIGUSR1 after step" in ln]
             for n in ("small", "wide")}  # fmt: skip
    assert all(len(v) == 1 for v in lines.values()), lines
    step = int(lines["small"][0].split("after step ")[1].split(";")[0])
    assert step < STOP_STEPS and f"after step {step};" in lines["wide"][0], lines
    for n in ("small", "wide"):  # then resumed from that step's checkpoint to the end, each on its own curve
        steps = [r["step"] for r in read_metrics(stopped / n) if "loss" in r]
        assert steps == list(range(1, STOP_STEPS + 1)), (n, steps)
        assert f"resumed from {stopped / n / 'checkpoints'}/step_{step:08d}" in (stopped / n / "train.log").read_text()
