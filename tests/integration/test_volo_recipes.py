"""The VOLO ImageNet recipes hold the NVIDIA VOLO blog's settings (each trains as it ships:
test_recipes_as_shipped.py)."""

from __future__ import annotations

import pytest

from vitscale.config import load_config

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
