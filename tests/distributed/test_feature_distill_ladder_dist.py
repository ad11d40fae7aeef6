"""UNIC's ladder of projectors (``head_ladder: true``) under FSDP2 on 2 gloo processes: the student's
3 blocks' tokens read through the sharded model (``model(x, intermediates=3)``), the ladder's heads
inside the parts' FSDP2 unit; the curve is the one-process curve within 2e-4, and the step-2
checkpoint the 2 ranks wrote resumes on one process onto the same curve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _launch import needs_cpu_fsdp, run_distributed
from helpers import assert_curves_close, read_losses

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

STEPS, TOL = 4, 2e-4
RUN = ["train.task=feature_distill", "train.max_steps=4", "train.log_every=1", "train.batch_size=8", "log.progress=none",
       "log.report=false", "log.tensorboard=false", "log.flops=false", "checkpoint.every=2", "checkpoint.keep=5", "eval.every=0", "evals=[]",
       "model.num_layers=3", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.pool=token",
       "schedule.warmup_steps=0"]  # fmt: skip


def _teacher(path: Path) -> str:
    import torch

    from vitscale import create_model
    from vitscale.checkpoint import write_weights

    over = {"num_classes": 0, "hidden_size": 24, "ffn_hidden_size": 48}
    torch.manual_seed(0)
    write_weights(create_model("vit_debug", **over).state_dict(), path, {"model": "vit_debug", "overrides": json.dumps(over)})
    return str(path)


def _args(teacher: str, out: Path) -> list[str]:
    # UNIC's running standardisation (PHI-S's eigendecomposition of 16 images' 24-wide features is not
    # the same to float rounding on 2 ranks as on one, ladder or not)
    teachers = f"distill.teachers=[{{name: t, path: {teacher}, head_ladder: true, standardize: running}}]"
    return ["train", "digits_vit", teachers, *RUN, f"train.output_dir={out}"]


def _ranks(teacher: str, out: str) -> int:
    from vitscale.cli import main

    return main(_args(teacher, Path(out)))


@needs_cpu_fsdp
def test_a_ladder_on_two_fsdp2_ranks_follows_one_process_and_resumes_on_one(tmp_path):
    from vitscale.cli import main

    teacher = _teacher(tmp_path / "teacher.safetensors")
    assert run_distributed(_ranks, 2, teacher, str(tmp_path / "two"), timeout=300) == [0, 0]
    assert main(_args(teacher, tmp_path / "one")) == 0
    one = read_losses(tmp_path / "one")
    assert max(one.values()) - min(one.values()) > 0.01  # a curve that moves
    assert "(a ladder: the sum over the student's 3 blocks)" in (tmp_path / "two" / "train.log").read_text()
    assert_curves_close(read_losses(tmp_path / "two"), one, range(1, STEPS + 1), "ladder on 2 FSDP2 ranks", TOL)
    name = "step_00000002"  # written by the 2 ranks, read by one process
    shutil.copytree(tmp_path / "two" / "checkpoints" / name, tmp_path / "resumed" / "checkpoints" / name)
    assert main(_args(teacher, tmp_path / "resumed")) == 0
    assert_curves_close(read_losses(tmp_path / "resumed"), one, range(3, STEPS + 1), "ladder resumed on 1 process", TOL)
