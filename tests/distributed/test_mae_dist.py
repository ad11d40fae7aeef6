"""MAE on 2 gloo processes (``torchrun -m vitscale train digits_mae``, FSDP2, the decoder its own FSDP2
unit): the same masks, losses, effective rank and k-NN accuracy as one process, and the exported
weights are the backbone alone; the run's EMA (``train.ema_decay``) is the backbone's, on any number of
processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from _launch import free_port, needs_cpu_fsdp
from helpers import assert_curves_close, read_metrics
from safetensors import safe_open

pytestmark = pytest.mark.multiprocess

ARGS = [
    "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=1", "model.num_attention_heads=2",
    "mae.decoder_width=16", "mae.decoder_depth=1", "mae.decoder_heads=2", "train.max_steps=4", "train.log_every=1",
    "train.batch_size=16", "schedule.name=constant", "schedule.warmup_steps=0", "eval.every=0", "eval.probe_l2=[1e-3]",
    "checkpoint.every=0", "log.progress=none", "log.report=false", "log.tensorboard=false", "log.flops=false", "train.ema_decay=0.9",
]  # fmt: skip


@needs_cpu_fsdp
def test_mae_on_two_ranks_follows_one_process(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    two = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                            str(free_port()), "-m", "vitscale", "train", "digits_mae", *ARGS,
                            f"train.output_dir={tmp_path / 'two'}"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    one = subprocess.run([sys.executable, "-m", "vitscale", "train", "digits_mae", *ARGS, f"train.output_dir={tmp_path / 'one'}"],
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip  (meanwhile)
    log, _ = two.communicate(timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, log[-4000:]
    ref, got = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    for key in ("loss", "train_rankme"):
        curve_got, curve_ref = ({r["step"]: r[key] for r in rows if key in r} for rows in (got, ref))
        assert_curves_close(curve_got, curve_ref, range(1, 5), f"{key} (2 ranks)", 2e-4)
    assert got[-1]["knn_top1"] == ref[-1]["knn_top1"]  # features gathered over the ranks: the whole val split
    with safe_open(tmp_path / "two" / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert not any(k.startswith(("task_parts.", "task.", "decoder.")) for k in keys)
    with safe_open(tmp_path / "two" / "model_ema.safetensors", "pt") as f:
        assert set(f.keys()) == keys  # the EMA of the backbone, under torchrun too
