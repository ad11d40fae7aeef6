"""FLOP counting for every family (ViT analytic; CLIP and VOLO traced on the meta device)."""

from __future__ import annotations

import torch

import vitscale
from vitscale.tools import count_flops, example_inputs, flops


def test_volo_flops_follow_image_size_and_overrides():
    cfg = vitscale.get_model_config("volo_debug")
    f32, f64 = flops(cfg), flops(cfg, 64)
    assert 3.5 < f64 / f32 < 4.5  # ~4x the tokens, local (outlook) attention: close to linear


def test_clip_flops_are_image_plus_text_tower():
    model = vitscale.create_model("clip_debug", device="meta")
    images, tokens = example_inputs(model, 1, "meta")
    image_tower = count_flops(model.visual, images)
    total = flops(model)
    assert total == count_flops(model, images, tokens)
    assert total > image_tower > 0
    assert flops("clip_debug") == total


def test_flops_by_name_config_and_model_agree():
    m = vitscale.create_model("vit_debug", device="meta")
    assert flops("vit_debug") == flops(m.cfg) == flops(m) == count_flops(m, torch.empty(1, 3, 32, 32, device="meta"))
