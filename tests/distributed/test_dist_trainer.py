"""The trainer on 2 gloo processes: FSDP (through ``torchrun -m vitscale train``), data parallel and
tensor parallel runs of ``digits_vit`` follow the one-process loss curve step by step; a checkpoint
written by 2 FSDP ranks resumes on 1 rank and on a TP layout onto the same curve."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _launch import free_port, needs_cpu_fsdp, run_distributed
from helpers import assert_curves_close, read_losses

pytestmark = pytest.mark.multiprocess

STEPS = 6
CKPT_AT = 3
TOL = 2e-4
ARGS = [
    f"train.max_steps={STEPS}", "train.epochs=0", "train.log_every=1", "train.batch_size=8", "model.num_layers=2",
    "schedule.name=constant", "schedule.warmup_steps=0", "log.progress=none", "eval.every=0",
    f"checkpoint.every={CKPT_AT}", "checkpoint.keep=5", "checkpoint.export_safetensors=false",
    "log.flops=false", "log.report=false", "log.tensorboard=false",
]  # fmt: skip


def _train(out: Path, *extra: str) -> None:
    from vitscale.config import load_config
    from vitscale.train import train

    train(load_config("digits_vit", ARGS + [f"train.output_dir={out}", *extra]))


def _layouts(root: str) -> None:
    """Inside 2 ranks: data parallel, tensor parallel, and TP resuming the FSDP checkpoint."""
    root = Path(root)
    _train(root / "dp", "parallel.dp_replicate=2", "parallel.dp_shard=1")
    _train(root / "tp", "parallel.tp=2", "parallel.dp_shard=1")
    _train(root / "fsdp_to_tp", "parallel.tp=2", "parallel.dp_shard=1")


def _seed_resume(src: Path, dst: Path) -> None:
    (dst / "checkpoints").mkdir(parents=True)
    shutil.copytree(src / "checkpoints" / f"step_{CKPT_AT:08d}", dst / "checkpoints" / f"step_{CKPT_AT:08d}")


@needs_cpu_fsdp
@pytest.mark.slow
def test_trainer_layouts_and_resharded_resume(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
        "-m", "vitscale", "train", "digits_vit", *ARGS, f"train.output_dir={tmp_path / 'fsdp'}",
        "checkpoint.export_safetensors=true",
    ]  # fmt: skip
    fsdp = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _train(tmp_path / "single")  # the one-process reference, meanwhile
    log, _ = fsdp.communicate(timeout=300)
    assert fsdp.returncode == 0, log[-4000:]
    ref = read_losses(tmp_path / "single")
    assert max(ref.values()) - min(ref.values()) > 0.02, "the curve must move for the comparison to mean something"
    assert_curves_close(read_losses(tmp_path / "fsdp"), ref, range(1, STEPS + 1), "fsdp (torchrun)", TOL)
    assert (tmp_path / "fsdp" / "checkpoints" / f"step_{CKPT_AT:08d}" / "model-rank00001.safetensors").is_file()  # rank 1's shard
    # the run folder records how it ran: the layout under torchrun, and rank 0's output in train.log
    env_ = json.loads((tmp_path / "fsdp" / "summary.json").read_text())["env"]
    assert env_["layout"] == {"world_size": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 1, "micro_batch_per_rank": 4,
                              "grad_accum": 1, "launcher": "torchrun", "local_world_size": 2}  # fmt: skip
    assert env_["command"].startswith("python -m vitscale train digits_vit ")
    run_log = (tmp_path / "fsdp" / "train.log").read_text().splitlines()
    assert run_log[0].startswith("==> ") and run_log[0].endswith(env_["command"])
    assert sum(line.startswith("vit_debug: 6 steps in ") for line in run_log) == 1  # rank 0's summary, once
    assert sum(line.startswith("vit_debug: 6 steps in ") for line in log.splitlines()) == 1  # rank 1 prints none

    _seed_resume(tmp_path / "fsdp", tmp_path / "fsdp_to_tp")
    run_distributed(_layouts, 2, str(tmp_path))
    assert_curves_close(read_losses(tmp_path / "dp"), ref, range(1, STEPS + 1), "data parallel", TOL)
    assert_curves_close(read_losses(tmp_path / "tp"), ref, range(1, STEPS + 1), "tensor parallel", TOL)
    assert_curves_close(read_losses(tmp_path / "fsdp_to_tp"), ref, range(CKPT_AT + 1, STEPS + 1), "FSDP checkpoint -> TP", TOL)

    _seed_resume(tmp_path / "fsdp", tmp_path / "fsdp_to_one")  # 2 ranks -> 1
    _train(tmp_path / "fsdp_to_one")
    assert_curves_close(read_losses(tmp_path / "fsdp_to_one"), ref, range(CKPT_AT + 1, STEPS + 1), "FSDP checkpoint -> 1 process", TOL)

    # `vitscale convert`: the 2-rank FSDP checkpoint consolidates into one safetensors file holding
    # exactly the weights the FSDP run gathered and exported at its last step (and, up to the
    # layouts' float rounding, the one-process run's weights).
    from safetensors.torch import load_file

    from vitscale.checkpoint.consolidate import consolidate, load_consolidated
    from vitscale.cli import main

    out = tmp_path / "fsdp.safetensors"
    assert main(["convert", str(tmp_path / "fsdp"), str(out)]) == 0
    got = load_consolidated(out)
    exported = load_file(str(tmp_path / "fsdp" / "model.safetensors"))
    single = load_consolidated(consolidate(tmp_path / "single", tmp_path / "single.safetensors")[0])
    assert set(got) == set(exported) == set(single) and "blocks.0.attn.qkv_per_head.weight" in got
    for k in exported:
        assert torch.equal(got[k], exported[k]), k
        torch.testing.assert_close(got[k], single[k], atol=2e-3, rtol=0)
    parts = consolidate(tmp_path / "fsdp", tmp_path / "split.safetensors", max_shard_bytes=200_000)
    assert len(parts) > 1 and load_consolidated(tmp_path / "split.safetensors").keys() == got.keys()
