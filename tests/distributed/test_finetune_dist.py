"""Fine-tuning on 2 gloo processes: ``checkpoint.init_from`` a timm file (rank 0 reads, the weights are
broadcast, each rank keeps its shard), ``model.freeze``, ``optim.layer_decay`` and a DeiT distillation
teacher (its losses on the class head: no distillation token in a timm ViT's weights) — sharded like the student under FSDP2 (``torchrun -m vitscale train``), replicated under
tensor parallelism — follow the one-process loss curve step by step; the frozen patch embedding is
the timm file's at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _launch import free_port, needs_cpu_fsdp, run_distributed
from helpers import read_losses

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

STEPS = 4
TOL = 2e-4
DIGITS_VIT = {"patch_dim": 4, "hidden_size": 96, "ffn_hidden_size": 192, "num_attention_heads": 4, "num_layers": 4,
              "pool": "avg", "img_h": 32, "img_w": 32}  # fmt: skip


def _args(root: Path) -> list[str]:
    return [
        f"train.max_steps={STEPS}", "train.epochs=0", "train.log_every=1", "train.batch_size=8", "schedule.name=constant",
        "schedule.warmup_steps=0", "log.progress=none", "eval.every=0", "log.flops=false", "log.report=false", "log.tensorboard=false",
        f"checkpoint.init_from={root / 'timm.pth'}", "model.freeze=patch_embed.*", "optim.layer_decay=0.8",
        f"distill.teacher={root / 'timm.pth'}", "distill.teacher_model=vit_debug",
        f"distill.teacher_overrides={json.dumps(DIGITS_VIT)}", "distill.kind=soft",
    ]  # fmt: skip


def _train(root: str, out: str, *extra: str) -> None:
    from vitscale.config import load_config
    from vitscale.train import train

    train(load_config("digits_vit", _args(Path(root)) + [f"train.output_dir={out}", *extra]))


def _tp(root: str) -> None:
    _train(root, str(Path(root) / "tp"), "parallel.tp=2", "parallel.dp_shard=1")


@needs_cpu_fsdp
def test_init_from_freeze_layer_decay_and_a_teacher_on_two_ranks(tmp_path):
    import vitscale
    from vitscale.interop import to_timm

    torch.manual_seed(0)
    timm_model = vitscale.create_model("vit_debug", **DIGITS_VIT, num_classes=10)
    torch.save(to_timm(timm_model), tmp_path / "timm.pth")  # a timm-format file (QKV rows in timm's order)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "vitscale", "train", "digits_vit", *_args(tmp_path), f"train.output_dir={tmp_path / 'fsdp'}",
           "distill.teacher_layout=sharded"]  # fmt: skip
    fsdp = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _train(str(tmp_path), str(tmp_path / "single"))  # the one-process reference, meanwhile
    log, _ = fsdp.communicate(timeout=400)
    assert fsdp.returncode == 0, log[-4000:]
    run_distributed(_tp, 2, str(tmp_path))
    ref = read_losses(tmp_path / "single")
    assert max(ref.values()) - min(ref.values()) > 0.01, "the curve must move for the comparison to mean something"
    for label in ("fsdp", "tp"):
        got = read_losses(tmp_path / label)
        assert sorted(got) == list(range(1, STEPS + 1)), label
        for s in got:
            assert abs(got[s] - ref[s]) / abs(ref[s]) <= TOL, f"{label} step {s}: {got[s]} vs one process {ref[s]}"
    text = (tmp_path / "fsdp" / "train.log").read_text()
    assert "distill: teacher vit_debug (0.31M params, sharded)" in text and "checkpoint.init_from: 56 tensors from" in text
    assert "(timm: timm's naming)" in text  # the names alone say whose file it is
    assert "distill: teacher vit_debug (0.31M params, replicated)" in (tmp_path / "tp" / "train.log").read_text()
    from safetensors.torch import load_file

    for label in ("fsdp", "tp", "single"):  # frozen: the timm file's weights at the end, on every layout
        end = load_file(str(tmp_path / label / "model.safetensors"))
        assert torch.equal(end["patch_embed.proj.weight"], timm_model.patch_embed.proj.weight.detach()), label
        assert not torch.equal(end["blocks.0.mlp.fc1.weight"], timm_model.blocks[0].mlp.fc1.weight.detach()), label
