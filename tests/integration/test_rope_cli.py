"""A DINOv3 (RoPE) ViT through the real command line: initialised from a timm ``Eva`` safetensors file
(``checkpoint.init_from``), trained on the digits, and its trained weights loaded back into timm's
model with ``strict=True``, computing the same logits at two image sizes."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import read_losses, rel_l2
from safetensors.torch import load_file, save_file

from vitscale.cli import main
from vitscale.interop import to_timm
from vitscale.models import create_model

pytestmark = pytest.mark.slow

# digits-sized: 32 px, patch 4 (an 8 x 8 grid), width 64, 4 heads (head dim 16), 2 blocks
SIZE = dict(patch_dim=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_layers=2, img_h=32, img_w=32)
TIMM_SIZE = dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=10)
RUN = ["train.epochs=0", "train.max_steps=40", "train.batch_size=32", "train.log_every=10", "schedule.warmup_steps=5",
       "train.label_smoothing=0", "optim.lr=1e-2", "optim.weight_decay=0", "eval.every=0", "checkpoint.every=0", "log.progress=none", "log.report=false",
       "log.tensorboard=false"]  # fmt: skip


def test_dinov3_from_a_timm_file_trains_and_loads_back_into_timm(tmp_path):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    tm = timm.create_model("vit_small_patch16_dinov3", pretrained=False, **TIMM_SIZE)
    src = tmp_path / "dinov3.safetensors"
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, str(src))
    out = tmp_path / "run"
    model = ["model.name=vit_s16_dinov3", *(f"model.{k}={v}" for k, v in SIZE.items())]
    rc = main(["train", "digits_vit", *model, f"checkpoint.init_from={src}", "checkpoint.init_format=timm", *RUN,
               f"train.output_dir={out}"])  # fmt: skip
    assert rc == 0
    log = (out / "train.log").read_text()
    ours = create_model("vit_s16_dinov3", **SIZE, num_classes=10).eval()
    assert f"checkpoint.init_from: {len(ours.state_dict())} tensors from {src} (timm" in log  # class + register tokens joined
    losses = read_losses(out)
    assert sorted(losses) == [1, 10, 20, 30, 40] and all(math.isfinite(v) for v in losses.values())
    assert losses[40] < losses[1], losses
    # timm's near-zero head starts every image at ln 10; the trained model's val loss is below it
    summary = json.loads((out / "summary.json").read_text())
    assert summary["val_loss"] < losses[1] - 0.01, (summary["val_loss"], losses)

    # the trained weights go back to timm: strict load, same logits at 32 px and at 40 x 48 px
    ours.load_state_dict(load_file(out / "model.safetensors"), strict=True)
    back = timm.create_model("vit_small_patch16_dinov3", pretrained=False, **TIMM_SIZE).eval()
    back.load_state_dict(to_timm(ours), strict=True)
    with torch.no_grad():
        for hw in ((32, 32), (40, 48)):
            x = torch.randn(4, 3, *hw)
            assert rel_l2(back(x), ours(x)) < 1e-5, hw
