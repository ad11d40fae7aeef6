"""Multi-resolution batches need no model change: a ViT and CLIP's image tower take a batch at any
image size that is a multiple of the patch (square or not), resampling their position embeddings on
the fly (``_pos_embed``) exactly as a model resized to that size computes, and as timm's
``dynamic_img_size`` does."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import rel_l2

import vitscale

SIZES = [(24, 24), (40, 40), (32, 48), (48, 16)]  # patch 8: smaller, larger, wide, tall


def _randomize_pos(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("pos_embed") or name.endswith("cls_token"):
                p.normal_(0, 0.5)  # non-trivial embeddings (the init's hide resampling mistakes)


@pytest.mark.parametrize("overrides", [dict(), dict(pool="map", class_token_length=0), dict(class_token_length=3, pool="avg")])
def test_vit_takes_other_sizes_per_batch(overrides):
    torch.manual_seed(0)
    model = vitscale.create_model("vit_debug", **overrides).eval()
    _randomize_pos(model)
    assert "multi" in model.input_modes
    timm = pytest.importorskip("timm")  # noqa: F841
    from vitscale.interop import create_timm_model

    tm = create_timm_model(model, dynamic_img_size=True).eval()
    for h, w in SIZES:
        x = torch.randn(2, 3, h, w)
        resized = copy.deepcopy(model)
        resized.set_image_size(h, w)
        with torch.no_grad():
            out = model(x)
            assert rel_l2(out, resized(x)) < 1e-6, (h, w)
            assert rel_l2(out, tm(x)) < 1e-5, (h, w)
    # and it trains at each size: every parameter, the position embeddings included, gets a gradient
    model.train()
    for h, w in SIZES:
        model.zero_grad()
        model(torch.randn(2, 3, h, w)).square().mean().backward()
        assert model.pos_embed.grad.abs().sum() > 0


def test_clip_image_tower_takes_other_sizes_per_batch():
    torch.manual_seed(0)
    model = vitscale.create_model("clip_debug").eval()
    _randomize_pos(model.visual)
    assert "multi" in model.input_modes
    tokens = torch.randint(0, model.cfg.text.vocab_size, (2, model.cfg.text.encoder_seq_length))
    for h, w in SIZES:
        x = torch.randn(2, 3, h, w)
        resized = copy.deepcopy(model)
        resized.visual.set_image_size(h, w)
        with torch.no_grad():
            img, txt, _ = model(x, tokens)
            img2, txt2, _ = resized(x, tokens)
        assert img.shape == (2, model.cfg.output_dim)
        assert rel_l2(img, img2) < 1e-6 and torch.equal(txt, txt2), (h, w)
