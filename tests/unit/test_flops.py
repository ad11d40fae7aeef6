"""FLOP counting for every family: analytic for each (``vitscale models`` in about a second: tracing
every CLIP and VOLO took most of its 15 s), checked against PyTorch's FlopCounterMode on the meta device."""

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


def test_analytic_clip_and_volo_flops_equal_flopcountermode():
    """The counts ``vitscale models`` prints without tracing equal the traced ones: the debug variants
    at their size and another, a VOLO with a strided outlook attention and no aux head."""
    import dataclasses

    from vitscale.models.common.flops import traced_flops
    from vitscale.models.registry import resolve_model

    for name, change in (("clip_debug", {}), ("volo_debug", {}), ("volo_debug", {"outlook_stride": 2, "aux_head": False})):
        r = resolve_model(name)
        cfg = dataclasses.replace(r.cfg, **change) if change else r.cfg
        for c in (cfg, cfg.with_image_size(64)):
            assert r.family.flops is not None and r.family.flops(c, (c.img_h, c.img_w), False) == traced_flops(r.family.model_cls, c)
