"""The rest of timm's small and base RoPE ViTs both ways within 1e-5: EVA-02 Ti / S / B and
EVA-02-CLIP B/16 (a learned table beside RoPE, a packed SwiGLU or one with a norm inside, unfused
q / k / v, a norm inside the attention), RoPE-ViT's ``+ APE`` / RoPE-Mixed models (learned
per-head frequencies) and PE-Spatial Ti (a learned table beside RoPE). The first 13, with
``vit_*_patch16_rope_224`` (``test_timm_rope_attention.py``), are the 15 of timm 1.0.31's 26 small and
base RoPE ViTs that the DINOv3 and ``rope_reg*_gap`` conversions left. Random weights built by timm itself (nothing downloaded), shrunk to 2 blocks of
width 64 at a 2 x 2 patch grid, compared at that size and at 3 x 2 patches (timm's
``dynamic_img_size``); the state dict vitscale writes loads with ``strict=True`` into timm's registered
model of the same shape; timm files read by ``create_model(pretrained=...)`` and ``load_pretrained``
(``checkpoint.init_from``)."""

from __future__ import annotations

import pytest
import torch
from helpers import randomize, rel_max
from safetensors.torch import save_file

import vitscale
from vitscale.errors import UserError
from vitscale.interop import create_timm_model, from_timm, load_timm_checkpoint, to_timm
from vitscale.interop.pretrained import load_pretrained

timm = pytest.importorskip("timm")

# timm name -> what vitscale's config of it sets besides pos_embed='rope'
MODELS = {
    "eva02_tiny_patch14_224": dict(rope_ape=True, swiglu_packed=True),
    "eva02_tiny_patch14_336": dict(rope_ape=True, swiglu_packed=True),
    "eva02_small_patch14_224": dict(rope_ape=True, swiglu_packed=True),
    "eva02_small_patch14_336": dict(rope_ape=True, swiglu_packed=True),
    "eva02_base_patch14_224": dict(rope_ape=True, mlp_inner_norm=True, qkv_fused=False),
    "eva02_base_patch14_448": dict(rope_ape=True, mlp_inner_norm=True, qkv_fused=False),
    "eva02_base_patch16_clip_224": dict(rope_ape=True, mlp_inner_norm=True, qkv_fused=False, attn_inner_norm=True),
    "vit_small_patch16_rope_ape_224": dict(rope_ape=True, pos_embed_prefix=False),
    "vit_base_patch16_rope_ape_224": dict(rope_ape=True, pos_embed_prefix=False),
    "vit_small_patch16_rope_mixed_224": dict(rope_type="mixed"),
    "vit_base_patch16_rope_mixed_224": dict(rope_type="mixed"),
    "vit_small_patch16_rope_mixed_ape_224": dict(rope_type="mixed", rope_ape=True, pos_embed_prefix=False),
    "vit_base_patch16_rope_mixed_ape_224": dict(rope_type="mixed", rope_ape=True, pos_embed_prefix=False),
    "vit_pe_spatial_tiny_patch16_512": dict(rope_ape=True),  # Perception Encoder's spatial tower, arXiv 2504.13181
}


def shrunk(name: str) -> dict:
    p = 14 if "patch14" in name else 16
    return dict(depth=2, embed_dim=64, num_heads=4, img_size=2 * p, num_classes=5)


def _x(h: int, w: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(MODELS))
def test_timm_model_both_ways(name):
    kw = shrunk(name)
    tm = timm.create_model(name, pretrained=False, dynamic_img_size=True, **kw).eval()
    randomize(tm)  # q / v biases, LayerScale, the mixed frequencies, inner norms: every parameter matters
    ours = from_timm(tm).eval()
    for field, value in MODELS[name].items():
        assert getattr(ours.cfg, field) == value, field
    p = kw["img_size"] // 2
    with torch.no_grad():
        for hw in ((2 * p, 2 * p), (3 * p, 2 * p)):  # the built grid, and 3 x 2 patches
            assert rel_max(ours(_x(*hw)), tm(_x(*hw))) < 1e-5, hw
        registered = timm.create_model(name, pretrained=False, **kw).eval()
        registered.load_state_dict(to_timm(ours), strict=True)
        x = _x(2 * p, 2 * p, seed=1)
        assert rel_max(registered(x), tm(x)) < 1e-5
        assert rel_max(create_timm_model(ours).eval()(x), tm(x)) < 1e-5


@pytest.fixture(scope="module")
def eva02_files(tmp_path_factory):
    """EVA-02 S (packed SwiGLU) as timm's own Hub folder (``save_for_hf``) and RoPE-Mixed + APE as a
    bare ``.safetensors``, random weights, with their timm models."""
    folder = tmp_path_factory.mktemp("eva")
    torch.manual_seed(0)
    eva = timm.create_model("eva02_small_patch14_224", pretrained=False, **shrunk("eva02_small_patch14_224")).eval()
    randomize(eva, seed=2)
    timm.models.save_for_hf(eva, str(folder / "eva02_s"), safe_serialization=True)
    mixed = timm.create_model("vit_small_patch16_rope_mixed_ape_224", pretrained=False, **shrunk("vit_small")).eval()
    randomize(mixed, seed=3)
    save_file({k: v.contiguous() for k, v in mixed.state_dict().items()}, str(folder / "mixed.safetensors"))
    return (eva, folder / "eva02_s"), (mixed, folder / "mixed.safetensors")


# the vitscale variants' overrides of the same shape as shrunk()
SMALL = dict(num_layers=2, hidden_size=64, num_attention_heads=4)


def test_timm_files_load_as_the_variants(eva02_files):
    (eva, hub), (mixed, path) = eva02_files
    x = _x(28, 28)
    ours = vitscale.create_model("vit_s14_eva02", pretrained=str(hub), **SMALL, ffn_hidden_size=170, img_h=28, img_w=28)
    with torch.no_grad():
        assert rel_max(ours(x), eva(x)) < 1e-5
    model = vitscale.create_model("vit_s16_rope_mixed_ape", **SMALL, ffn_hidden_size=256, img_h=32, img_w=32, num_classes=5)
    _, lines, report = load_pretrained(model, str(path))  # checkpoint.init_from's path
    assert "(timm: " in lines[0] and not report["missing"] and not report["unexpected"]
    with torch.no_grad():
        assert rel_max(model.eval()(_x(32, 32)), mixed(_x(32, 32))) < 1e-5
        assert rel_max(load_timm_checkpoint(path, "vit_small_patch16_rope_mixed_ape_224", **shrunk("vit_small"))(_x(32, 32)),
                       mixed(_x(32, 32))) < 1e-5  # fmt: skip
    # weights of another position scheme than the model's are one line naming it
    for variant, want in (("vit_s16_rope_ape", "learned_rope_freqs=True"), ("vit_s16_rope_mixed", "learned_pos_table=True")):
        with pytest.raises(UserError, match=want) as e:
            vitscale.create_model(variant, pretrained=str(path), **SMALL, ffn_hidden_size=256, img_h=32, img_w=32)
        assert "\n" not in str(e.value)
