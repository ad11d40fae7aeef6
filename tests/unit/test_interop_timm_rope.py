"""RoPE ViTs against timm's ``Eva`` (DINOv3, the SBB ``*_rope_*`` ViTs, EVA-02, RoPE-ViT): random
weights, fp32, eval; outputs within 1e-5 relative both ways, at the built image size and another one;
the variants against timm's registered models; RoPE's relative-position property; refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch

timm = pytest.importorskip("timm")
from helpers import randomize, rel_l2  # noqa: E402
from timm.models.eva import Eva  # noqa: E402

from vitscale.cli import main  # noqa: E402
from vitscale.interop import create_timm_model, from_timm, to_timm  # noqa: E402
from vitscale.models import create_model  # noqa: E402
from vitscale.models.common.rope import apply_rope, mixed_rope_sin_cos, rope_positions, rope_sin_cos  # noqa: E402
from vitscale.models.vit.configs import VARIANTS  # noqa: E402
from vitscale.models.vit.state_dict_adapter import TIMM_NAMES  # noqa: E402
from vitscale.models.vit.timm_eva import config_from_eva, eva_kwargs  # noqa: E402
from vitscale.models.vit.timm_registry import build_meta, create_timm_meta, layout_differences  # noqa: E402

TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=7, dynamic_img_size=True)
SIZES = [(32, 32), (48, 40)]  # the built size, and another (a 6 x 5 grid)

TIMM_MODELS = {
    "dinov3": ("vit_small_patch16_dinov3", {}),
    "dinov3_qkvb_token": ("vit_small_patch16_dinov3_qkvb", dict(global_pool="token")),
    "rope_reg1_gap": ("vit_base_patch16_rope_reg1_gap_256", {}),
    "dinov3_plus_swiglu": ("vit_small_plus_patch16_dinov3", {}),
    "rope_map_qk_norm": ("vit_base_patch16_rope_reg1_gap_256", dict(global_pool="map", num_reg_tokens=0, qk_norm=True)),
}
ROPE_VARIANTS = ["vit_s16_dinov3", "vit_b16_dinov3", "vit_l16_dinov3", "vit_splus16_dinov3", "vit_hplus16_dinov3",
                 "vit_7b16_dinov3", "vit_b16_rope_reg1_gap_256"]
# EVA-02 and RoPE-ViT: checked at full width with 2 of their 12 blocks (the blocks are alike; 5x faster)
EVA_ROPE_VARIANTS = ["vit_ti14_eva02", "vit_s14_eva02", "vit_b14_eva02", "vit_b16_eva02_clip", "vit_s16_rope", "vit_b16_rope",
                     "vit_s16_rope_ape", "vit_b16_rope_ape", "vit_s16_rope_mixed", "vit_b16_rope_mixed",
                     "vit_s16_rope_mixed_ape", "vit_b16_rope_mixed_ape"]  # fmt: skip
# timm's registered models at other image sizes: the same variants with that size (and position table)
OTHER_SIZES = {"eva02_tiny_patch14_336": "vit_ti14_eva02", "eva02_small_patch14_336": "vit_s14_eva02",
               "eva02_base_patch14_448": "vit_b14_eva02"}  # fmt: skip


@pytest.mark.parametrize("case", list(TIMM_MODELS))
def test_timm_eva_to_vitscale_and_back(case):
    name, kw = TIMM_MODELS[case]
    torch.manual_seed(0)
    tm = timm.create_model(name, pretrained=False, **TINY, **kw).eval()
    randomize(tm)  # LayerScale, q / v biases and all: every parameter matters
    ours = from_timm(tm).eval()
    assert ours.cfg.pos_embed == "rope" and "pos_embed" not in ours.state_dict()
    tm2 = create_timm_model(ours, load_weights=False, dynamic_img_size=True).eval()
    tm2.load_state_dict(to_timm(ours), strict=True)
    with torch.no_grad():
        for h, w in SIZES:
            x = torch.randn(2, 3, h, w)
            ref = tm(x)
            assert rel_l2(ours(x), ref) < 1e-5, (h, w)
            feats = ours.forward_head(ours.forward_features(x), pre_logits=True)
            assert rel_l2(feats, tm.forward_head(tm.forward_features(x), pre_logits=True)) < 1e-5
            assert rel_l2(tm2(x), ref) < 1e-5


@pytest.mark.parametrize("variant", ["vit_s16_dinov3", "vit_splus16_dinov3", "vit_b16_rope_reg1_gap_256", "vit_b16_eva02_clip",
                                     "vit_s14_eva02", "vit_b16_rope_mixed_ape"])  # fmt: skip
def test_vitscale_rope_variant_to_timm_and_back(variant):
    torch.manual_seed(1)
    small = dict(hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, num_layers=2, patch_dim=8, img_h=32, img_w=32, num_classes=7)
    ours = create_model(variant, **small).eval()
    randomize(ours, seed=1)
    tm = create_timm_model(ours, dynamic_img_size=True).eval()
    assert isinstance(tm, Eva)
    back = from_timm(tm).eval()
    with torch.no_grad():
        for h, w in SIZES:
            x = torch.randn(2, 3, h, w)
            out = ours(x)
            assert rel_l2(tm(x), out) < 1e-5 and rel_l2(back(x), out) < 1e-5, (h, w)
    want = dataclasses.replace(ours.cfg, fc_norm=ours.cfg.use_fc_norm)
    assert back.cfg == want


@pytest.mark.parametrize("variant", ROPE_VARIANTS + EVA_ROPE_VARIANTS)
def test_rope_variants_are_timms_registered_models(variant):
    """Full size, on the meta device: timm's registered model and ours rebuilt as an Eva are the same
    module tree, settings and shapes, and timm's model reads back as our variant."""
    depth = {"depth": 2} if variant in EVA_ROPE_VARIANTS else {}
    tm = create_timm_meta(TIMM_NAMES[variant], **depth)
    cfg = dataclasses.replace(VARIANTS[variant], num_layers=depth.get("depth", VARIANTS[variant].num_layers))
    assert layout_differences(tm, build_meta(Eva, **eva_kwargs(cfg), dynamic_img_size=tm.dynamic_img_size)) == []
    assert config_from_eva(tm) == dataclasses.replace(cfg, fc_norm=cfg.use_fc_norm)


@pytest.mark.parametrize("name", list(OTHER_SIZES))
def test_other_sizes_are_the_variants_at_that_size(name):
    """EVA-02's 336 / 448 px models (ImageNet-1k classifiers where the 224 px ones are backbones)."""
    tm = create_timm_meta(name, depth=2)
    side = tm.patch_embed.img_size[0]
    want = dataclasses.replace(VARIANTS[OTHER_SIZES[name]], img_h=side, img_w=side, num_classes=1000, fc_norm=True, num_layers=2)
    assert config_from_eva(tm) == want


@pytest.mark.parametrize("rope_type,rotate_half", [("axial", False), ("dinov3", True), ("mixed", False)])
def test_rope_scores_depend_on_relative_position_only(rope_type, rotate_half):
    """RoPE's defining property: the query-key score of two patches depends on their offset, not
    where they are; the prefix tokens are not rotated."""
    gh, gw, dh = 4, 5, 16
    torch.manual_seed(0)
    if rope_type == "mixed":  # one head's learned frequencies (fx, fy), any values
        sin, cos = (t[0] for t in mixed_rope_sin_cos(rope_positions((gh, gw)), torch.randn(1, 2, dh // 2)))
    else:
        sin, cos = rope_sin_cos((gh, gw), dh, rope_type, 100.0, rotate_half)
    q, k = torch.randn(dh), torch.randn(dh)
    prefix = 2
    qs = apply_rope(q.expand(1, 1, prefix + gh * gw, dh), (sin, cos), rotate_half)[0, 0]  # (T, Dh)
    ks = apply_rope(k.expand(1, 1, prefix + gh * gw, dh), (sin, cos), rotate_half)[0, 0]
    assert torch.equal(qs[:prefix], q.expand(prefix, dh)) and torch.equal(ks[:prefix], k.expand(prefix, dh))
    s = (qs[prefix:] @ ks[prefix:].T).reshape(gh, gw, gh, gw)
    assert torch.allclose(s[0, 0, 1, 2], s[2, 1, 3, 3], atol=1e-5) and torch.allclose(s[1, 3, 0, 1], s[3, 4, 2, 2], atol=1e-5)
    assert not torch.allclose(s[0, 0, 1, 2], s[0, 0, 2, 1], atol=1e-3)  # the offset itself does matter
    assert torch.allclose(qs.norm(dim=-1), q.norm().expand(prefix + gh * gw))  # rotations


def test_what_timm_eva_or_rope_cannot_be_is_refused(capsys):
    pe_core = timm.create_model("vit_pe_core_tiny_patch16_384", pretrained=False, img_size=32, depth=1)
    with pytest.raises(ValueError, match="MAP pooling over the prefix tokens"):
        from_timm(pe_core)
    with pytest.raises(ValueError, match="a key bias"):  # key biases: timm's AttentionRope, with pairs of neighbours only
        create_timm_model(create_model("vit_debug", pos_embed="rope", qkv_bias=True, rope_rotate_half=True))
    with pytest.raises(ValueError, match="divisible by 4"):
        create_model("vit_debug", pos_embed="rope", hidden_size=72, num_attention_heads=4)  # head dim 18
    assert main(["train", "digits_vit", "model.pos_embed=rope", "model.drop_patch_rate=0.1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "drop_patch_rate" in err


def test_mixed_rope_frequencies_are_learned_per_head():
    """RoPE-Mixed (arXiv 2403.13298): each block's attention holds ``(H, 2, Dh/2)`` frequencies, drawn
    as the axial magnitudes along a random direction per head, kept from weight decay as timm keeps
    ``rope.freqs``; the kept patches (MAE's ``keep``) are rotated by their own positions."""
    torch.manual_seed(0)
    model = create_model("vit_s16_rope_mixed", num_layers=2, hidden_size=64, num_attention_heads=4, img_h=32, img_w=32).eval()
    f = model.blocks[0].attn.rope_freqs
    assert f.shape == (4, 2, 8) and not torch.equal(f, model.blocks[1].attn.rope_freqs)
    mags = 10.0 ** (-torch.arange(4) / 4)
    assert torch.allclose(f.norm(dim=1), torch.cat([mags, mags]).expand(4, 8), atol=1e-6)  # |(fx, fy)| per pair
    assert {"blocks.0.attn.rope_freqs", "blocks.1.attn.rope_freqs", "cls_token"} <= model.no_weight_decay()
    x = torch.randn(2, 3, 32, 32)
    every = torch.arange(4).expand(2, 4)
    with torch.no_grad():
        assert torch.allclose(model.forward_features(x, keep=every), model.forward_features(x), atol=1e-6)


def test_eva_options_are_refused_where_they_cannot_apply(capsys):
    from vitscale.models.vit.parallelize import check_tp
    from vitscale.models.vit.transformers_adapter import transformers_config

    for bad, why in ((dict(mlp_inner_norm=True), "mlp_type='swiglu'"), (dict(swiglu_packed=True), "mlp_type='swiglu'"),
                     (dict(rope_ape=True), "needs pos_embed='rope'")):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            create_model("vit_debug", **bad)
    with pytest.raises(ValueError, match="parallel_block"):
        create_model("vit_22b", attn_inner_norm=True, device="meta")
    with pytest.raises(ValueError, match="without RoPE, timm has no model with a norm inside the attention"):
        create_timm_model(create_model("vit_debug", attn_inner_norm=True))  # without RoPE: no timm model has it
    with pytest.raises(ValueError, match="mixed RoPE's learned frequencies"):
        transformers_config(dataclasses.replace(VARIANTS["vit_s16_dinov3"], rope_type="mixed", rope_rotate_half=False))
    assert any("mlp_inner_norm=true" in p for p in check_tp(VARIANTS["vit_b14_eva02"], 2))
    assert check_tp(VARIANTS["vit_s16_rope_mixed"], 2) == []  # its frequencies are sharded with their heads
    assert main(["train", "digits_vit", "model.mlp_inner_norm=true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mlp_inner_norm" in err
