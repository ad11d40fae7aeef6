"""Variable resolution on 2 gloo processes: a NaFlex digits run and a multi-resolution digits run under
FSDP2 follow their one-process loss curves step by step (each step's size and images come from the
keyed randomness, the same on every layout), and a run resumed from the 2-rank checkpoint on one
process continues the uninterrupted curve."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _launch import needs_cpu_fsdp, run_distributed
from helpers import assert_curves_close, read_losses

pytestmark = pytest.mark.multiprocess

STEPS = 6
CKPT_AT = 3
TOL = 2e-4
COMMON = [
    f"train.max_steps={STEPS}", "train.epochs=0", "train.log_every=1", "model.num_layers=2", "schedule.name=constant",
    "schedule.warmup_steps=0", "log.progress=none", "eval.every=0", f"checkpoint.every={CKPT_AT}", "checkpoint.keep=5",
    "checkpoint.export_safetensors=false", "log.flops=false", "log.report=false", "evals=[]", "log.tensorboard=false",
]  # fmt: skip
RUNS = {  # the batches are multiples of 2: the same steps on 1 and 2 ranks
    "naflex": ("digits_naflex", ["data.batch_sizes=[24,16,8]", "data.tokens_per_batch=0"]),
    "multi": ("digits_vit", ["data.image_sizes=[24,32,40]", "data.batch_sizes=[16,16,8]"]),
}


def _train(out: Path, name: str, *extra: str) -> None:
    from vitscale.config import load_config
    from vitscale.train import train

    config, overrides = RUNS[name]
    train(load_config(config, COMMON + overrides + [f"train.output_dir={out}", *extra]), summary="none")


def _two_ranks(root: str) -> None:
    for name in RUNS:
        _train(Path(root) / f"{name}_fsdp", name, "parallel.dp_shard=2")


@needs_cpu_fsdp
@pytest.mark.slow
def test_naflex_and_multi_resolution_follow_one_process_and_resume(tmp_path):
    run_distributed(_two_ranks, 2, str(tmp_path))
    for name in RUNS:
        _train(tmp_path / f"{name}_one", name)
        ref = read_losses(tmp_path / f"{name}_one")
        assert max(ref.values()) - min(ref.values()) > 0.02, f"{name}: the curve must move for the comparison to mean something"
        assert_curves_close(read_losses(tmp_path / f"{name}_fsdp"), ref, range(1, STEPS + 1), f"{name} on 2 FSDP ranks", TOL)
        resumed = tmp_path / f"{name}_resumed"  # the 2-rank checkpoint of step 3, continued on one process
        (resumed / "checkpoints").mkdir(parents=True)
        step = f"step_{CKPT_AT:08d}"
        shutil.copytree(tmp_path / f"{name}_fsdp" / "checkpoints" / step, resumed / "checkpoints" / step)
        _train(resumed, name)
        assert_curves_close(read_losses(resumed), ref, range(CKPT_AT + 1, STEPS + 1), f"{name} resumed at step {CKPT_AT}", TOL)
