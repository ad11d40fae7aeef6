"""The VOLO ImageNet recipes hold the NVIDIA VOLO blog's settings and train end to end with tiny overrides
(debug-width VOLO, synthetic images, random token labels, one step + evaluation)."""

from __future__ import annotations

import json

import pytest
import torch

from vitscale.cli import main
from vitscale.config import load_config
from vitscale.data.token_labels import TokenLabelWriter

# Table 2 of NVIDIA's VOLO blog post (D1 LR: see docs/volo.md) and the fine-tuning command:
# developer.nvidia.com/blog/training-a-state-of-the-art-imagenet-1k-visual-transformer-model-using-nvidia-dgx-superpod
SEED = {
    "imagenet_volo_d1": dict(name="volo_d1", lr=1.6e-3, dp=0.1, crop=0.96),
    "imagenet_volo_d2": dict(name="volo_d2", lr=1e-3, dp=0.2, crop=0.96),
    "imagenet_volo_d3": dict(name="volo_d3", lr=1e-3, dp=0.5, crop=0.96),
    "imagenet_volo_d4": dict(name="volo_d4", lr=1e-3, dp=0.5, crop=1.15),
    "imagenet_volo_d5": dict(name="volo_d5", lr=1e-4, dp=0.75, crop=1.15),
    "imagenet_volo_d5_ft512": dict(name="volo_d5", lr=2.3e-5, dp=0.5, crop=1.15),
}
TINY = [
    "model.layers=[1,1]", "model.outlook_dim=32", "model.outlook_heads=2", "model.hidden_size=64",
    "model.num_heads=4", "model.stem_hidden=8", "model.img_h=32", "model.img_w=32",
    "data.format=synthetic",  # the recipe's paths dropped (a note says so)
    "data.synthetic_size=24", "data.val_split=0.5", "data.num_classes=10",
    "data.num_workers=0", "train.batch_size=8", "train.max_steps=1", "train.epochs=0", "eval.batch_size=8",
    "precision.autocast=none", "log.flops=false", "checkpoint.every=0", "checkpoint.init_from=null",
    "train.device=cpu", "log.report=false",
]  # fmt: skip


@pytest.mark.parametrize("recipe", sorted(SEED))
def test_recipe_settings(recipe):
    cfg, s = load_config(recipe), SEED[recipe]
    assert cfg.model.name == s["name"] and cfg.model.overrides["drop_path_rate"] == s["dp"]
    assert cfg.optim.name == "adamw" and cfg.optim.lr == pytest.approx(s["lr"])
    assert cfg.data.crop_pct == s["crop"] and cfg.data.mixup_alpha == 0 and cfg.data.cutmix_alpha == 0
    assert cfg.data.auto_augment == "rand-m9-mstd0.5-inc1" and cfg.data.random_erasing > 0  # RandAugment + CutOut
    assert cfg.train.task == "token_labeling" and cfg.token_label.mix_token
    # sail-sg/volo main.py --dense-weight 0.5, --cls-weight 1.0; the class target the dense map pooled over
    # the crop (TokenLabelCrossEntropy), mixed with the label in the fine-tune (its README's --ground-truth)
    tl = cfg.token_label
    assert (tl.beta, tl.cls_weight, tl.cls_target, tl.reference_box) == (0.5, 1.0, "crop", False)
    assert tl.ground_truth_mix == recipe.endswith("ft512") and cfg.train.label_smoothing == 0.1
    if recipe.endswith("ft512"):
        assert (cfg.optim.weight_decay, cfg.train.epochs, cfg.schedule.warmup_epochs) == (1e-8, 30, 5)
        assert cfg.model.overrides["img_h"] == 512 and cfg.checkpoint.init_from
    else:
        assert (cfg.optim.weight_decay, cfg.train.epochs, cfg.optim.lr_scale_batch, cfg.train.batch_size) == (
            0.05, 310, 1024, 1024,
        )  # fmt: skip
        # sail-sg/volo main.py: 20 warm-up epochs, 300 cosine epochs, then 10 at min_lr
        assert (cfg.schedule.warmup_epochs, cfg.schedule.cooldown_epochs, cfg.schedule.min_lr) == (20, 10, 1e-5)


@pytest.fixture(scope="module")
def labels(tmp_path_factory):
    root = tmp_path_factory.mktemp("labels")
    g = torch.Generator().manual_seed(0)
    w = TokenLabelWriter(root, "train", 24, (3, 3), 4, 10)
    w.write(torch.arange(24), torch.randn(24, 3, 3, 10, generator=g), torch.randn(24, 10, generator=g))  # teacher logits
    w.close()
    return root


@pytest.mark.parametrize("recipe", sorted(SEED))
def test_recipe_trains_with_tiny_overrides(recipe, labels, tmp_path):
    out = tmp_path / "run"
    rc = main(["train", recipe, *TINY, f"token_label.path={labels}", f"train.output_dir={out}"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1 and 0 <= summary["val_top1"] <= 100
