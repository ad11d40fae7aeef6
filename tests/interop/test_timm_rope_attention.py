"""timm's ``vit_*_patch16_rope_224`` (naver-ai/rope-vit as timm registers it: an ``Eva`` with
``attn_type='rope'``, a key bias, axial RoPE on an ``'xy'`` grid) both ways within 1e-5: random
weights, shrunk to 2 blocks of width 64, at 32 px and 48 x 32 px; the state dict vitscale writes loads
with ``strict=True`` into timm's registered model of the same shape."""

from __future__ import annotations

import pytest
import torch
from helpers import randomize, rel_max

from vitscale.interop import create_timm_model, from_timm, to_timm

timm = pytest.importorskip("timm")

SHRINK = dict(depth=2, embed_dim=64, num_heads=4, img_size=32, num_classes=5)


@pytest.mark.parametrize("name", ["vit_small_patch16_rope_224", "vit_base_patch16_rope_224"])
def test_rope_vit_both_ways(name):
    tm = timm.create_model(name, pretrained=False, dynamic_img_size=True, **SHRINK).eval()
    randomize(tm)
    ours = from_timm(tm).eval()
    assert ours.cfg.qkv_bias and ours.cfg.key_bias and ours.cfg.rope_type == "axial"
    for hw in ((32, 32), (48, 32)):
        x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            assert rel_max(ours(x), tm(x)) < 1e-5, hw
    registered = timm.create_model(name, pretrained=False, **SHRINK).eval()
    registered.load_state_dict(to_timm(ours), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert rel_max(registered(x), tm(x)) < 1e-5
        assert rel_max(create_timm_model(ours).eval()(x), tm(x)) < 1e-5
