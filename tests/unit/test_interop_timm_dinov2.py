"""DINOv2's ViTs (timm's ``vit_*_patch14_dinov2`` / ``vit_*_patch14_reg4_dinov2``) in the zoo: each
variant is timm's registered model (meta device, no weights), and a shrunk one (random weights, fp32,
eval) gives timm's outputs within 1e-5 both ways, at its built size and at another one (the position
embeddings interpolated, as timm's ``dynamic_img_size``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

timm = pytest.importorskip("timm")
from helpers import randomize, rel_l2  # noqa: E402

from vitscale.interop import create_timm_model, from_timm  # noqa: E402
from vitscale.models import create_model  # noqa: E402
from vitscale.models.vit.configs import VARIANTS  # noqa: E402
from vitscale.models.vit.state_dict_adapter import TIMM_NAMES, config_from_timm  # noqa: E402
from vitscale.models.vit.timm_registry import create_timm_meta  # noqa: E402

DINOV2 = [v for v in VARIANTS if v.endswith("_dinov2")]
TINY = dict(
    img_size=28, depth=2, embed_dim=64, num_heads=4, dynamic_img_size=True
)  # a 2 x 2 grid of 14 px patches


def test_the_zoo_has_dinov2_s_b_l_with_and_without_registers():
    assert sorted(DINOV2) == sorted(f"vit_{s}14{r}_dinov2" for s in "sbl" for r in ("", "_reg4"))


@pytest.mark.parametrize("variant", DINOV2)
def test_dinov2_variants_are_timms_registered_models(variant):
    cfg = VARIANTS[variant]
    assert config_from_timm(create_timm_meta(TIMM_NAMES[variant])) == dataclasses.replace(
        cfg, fc_norm=cfg.use_fc_norm
    )


@pytest.mark.parametrize("name", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_timm_dinov2_to_vitscale_and_back(name):
    torch.manual_seed(0)
    tm = timm.create_model(name, pretrained=False, **TINY).eval()
    randomize(tm)  # LayerScale, registers, position embeddings: every parameter matters
    ours = from_timm(tm).eval()
    assert ours.cfg.layer_scale_init == 1e-5 and ours.cfg.patch_dim == 14
    back = create_timm_model(ours, dynamic_img_size=True).eval()
    with torch.no_grad():
        for size in (28, 42):  # the built grid and a 3 x 3 one
            x = torch.randn(2, 3, size, size)
            ref = tm(x)
            assert ref.shape == (2, 64)
            assert rel_l2(ours(x), ref) < 1e-5 and rel_l2(back(x), ref) < 1e-5, size


@pytest.mark.parametrize("variant", ["vit_s14_dinov2", "vit_s14_reg4_dinov2"])
def test_vitscale_dinov2_variant_to_timm(variant):
    ours = create_model(variant, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, num_layers=2,
                        img_h=28, img_w=28).eval()  # fmt: skip
    randomize(ours, seed=1)
    tm = create_timm_model(ours).eval()
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        assert rel_l2(tm(x), ours(x)) < 1e-5
