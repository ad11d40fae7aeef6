"""``data.repeated_aug=3`` on 2 gloo ranks (data parallel) follows the one-process loss curve step by
step, and its checkpoint resumes mid-epoch on 1 process onto the same curve: the repeats and their
augmentations are the same global batches on any world size and after a resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _launch import needs_cpu_fsdp, run_distributed
from helpers import assert_curves_close, read_losses

pytestmark = pytest.mark.multiprocess

STEPS, CKPT_AT, TOL = 5, 2, 2e-4
ARGS = [
    f"train.max_steps={STEPS}", "train.epochs=0", "train.log_every=1", "train.batch_size=8", "model.num_layers=1",
    "schedule.name=constant", "schedule.warmup_steps=0", "log.progress=none", "eval.every=0", "log.flops=false",
    f"checkpoint.every={CKPT_AT}", "checkpoint.keep=5", "checkpoint.export_safetensors=false", "log.report=false", "log.tensorboard=false",
    "data.repeated_aug=3", "data.rrc_scale=[0.3,1.0]",
]  # fmt: skip


def _train(out: Path, *extra: str) -> None:
    from vitscale.config import load_config
    from vitscale.train import train

    train(load_config("digits_vit", ARGS + [f"train.output_dir={out}", *extra]))


def _data_parallel(root: str) -> None:
    _train(Path(root) / "dp", "parallel.dp_replicate=2", "parallel.dp_shard=1")


@needs_cpu_fsdp
@pytest.mark.slow
def test_repeated_aug_two_ranks_and_resume_follow_one_process(tmp_path):
    _train(tmp_path / "single")
    ref = read_losses(tmp_path / "single")
    assert max(ref.values()) - min(ref.values()) > 0.02, "the curve must move for the comparison to mean something"
    _train(tmp_path / "plain", "data.repeated_aug=1")
    assert read_losses(tmp_path / "plain") != ref  # the repeats change the batches: the comparison sees them
    run_distributed(_data_parallel, 2, str(tmp_path))
    assert_curves_close(read_losses(tmp_path / "dp"), ref, range(1, STEPS + 1), "2 ranks, data parallel", TOL)
    resumed = tmp_path / "dp_to_one"
    (resumed / "checkpoints").mkdir(parents=True)
    step = f"step_{CKPT_AT:08d}"
    shutil.copytree(tmp_path / "dp" / "checkpoints" / step, resumed / "checkpoints" / step)
    _train(resumed)  # mid-epoch (digits: 187 steps an epoch), on 1 process
    assert_curves_close(read_losses(resumed), ref, range(CKPT_AT + 1, STEPS + 1), "2-rank checkpoint -> 1 process", TOL)
