"""Settings a recipe does not ship (the sigmoid loss, the rsqrt schedule, head weight decay, gradient
accumulation, TensorBoard) on top of an ImageNet recipe, tiny, on synthetic data. Every recipe as it
ships: test_recipes_as_shipped.py."""

import json

import pytest

from vitscale.config import load_config
from vitscale.train import train

TINY_MODEL = [
    "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_layers=1", "model.num_attention_heads=2",
    "model.patch_dim=8", "data.format=synthetic",  # the recipe's paths dropped (a note says so)
    "data.num_classes=10", "data.synthetic_size=32",
    "data.val_split=0.5", "data.num_workers=0", "train.batch_size=8", "train.log_every=1", "eval.batch_size=16",
    "log.progress=none", "schedule.warmup_steps=1", "train.cpu_threads=1", "log.report=false",
]  # fmt: skip


@pytest.mark.parametrize("loss", ["sigmoid"])
def test_sigmoid_loss_rsqrt_schedule_head_decay(tmp_path, loss):
    cfg = load_config("imagenet_vit_b16", TINY_MODEL + [
        "data.img_size=32", "train.epochs=0", "train.max_steps=3", f"train.loss={loss}", "schedule.name=rsqrt",
        "schedule.cooldown_steps=1", "optim.head_weight_decay=3.0", "train.grad_accum=2", "optim.lr_scale_batch=1024",
        "log.tensorboard=true", f"train.output_dir={tmp_path}"])  # fmt: skip
    s = train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["lr"] == 0.0 and rows[0]["lr"] == pytest.approx(3e-3 * 8 / 1024)  # scaled, warmup 1
    assert s["steps"] == 3 and all(r["loss"] > 0 for r in rows)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))  # optional TensorBoard events
