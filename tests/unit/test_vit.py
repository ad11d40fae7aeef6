"""The ViT zoo: every variant at debug size, full sizes on meta, position-embedding resampling."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import vitscale
from vitscale.errors import ConfigError
from vitscale.models.vit import VisionTransformer, ViTConfig
from vitscale.models.vit.configs import VARIANTS
from vitscale.models.vit.flops import vit_flops
from vitscale.tools import count_flops

VIT_NAMES = vitscale.list_models(family="vit")


def debug_size(cfg: ViTConfig) -> ViTConfig:
    """Keep a variant's structure (block type, heads, pooling, biases, norms), shrink its sizes."""
    return dataclasses.replace(
        cfg, img_h=32, img_w=32, patch_dim=8, num_layers=2, hidden_size=64, ffn_hidden_size=128,
        num_attention_heads=4, num_classes=10,
    )  # fmt: skip


def test_registry_lists_every_size():
    expected = {"vit_debug", "vit_ti16", "vit_s16", "vit_b32", "vit_b16", "vit_l16", "vit_h16", "vit_h14",
                "vit_g14", "vit_bigg14", "vit_22b"}  # fmt: skip
    assert expected <= set(VIT_NAMES)


@pytest.mark.parametrize("name", VIT_NAMES)
def test_variant_at_debug_size_forward_backward(name):
    torch.manual_seed(0)
    model = VisionTransformer(debug_size(VARIANTS[name]))
    model.init_weights()
    x = torch.randn(2, 3, 32, 32)
    out = model(x)
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    out.square().mean().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None, f"{n} got no gradient"
        assert torch.isfinite(p.grad).all(), n
        # every parameter is actually used: its gradient is not identically zero
        assert p.grad.abs().sum() > 0, f"{n} has an all-zero gradient"


@pytest.mark.parametrize("name", ["vit_b16", "vit_22b"])
def test_grad_checkpointing_gives_same_output_and_grads(name):
    torch.manual_seed(0)
    cfg = dataclasses.replace(debug_size(VARIANTS[name]), drop_path_rate=0.0)
    model = VisionTransformer(cfg)
    model.init_weights()
    x = torch.randn(2, 3, 32, 32)
    out1 = model(x)
    out1.sum().backward()
    g1 = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    out2 = model(x)
    out2.sum().backward()
    torch.testing.assert_close(out2, out1, rtol=0, atol=0)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, g1[n], rtol=1e-6, atol=1e-7)


# NeMo table sizes (M): B/16 86, L/16 303, H/16 632, H/14 632, g/14 1011, G/14 1843 — within 2%.
@pytest.mark.parametrize(
    "name, millions",
    [("vit_b16", 86), ("vit_l16", 303), ("vit_h16", 632), ("vit_h14", 632), ("vit_g14", 1011), ("vit_bigg14", 1843)],
)
def test_full_sizes_match_nemo_table_on_meta(name, millions):
    model = vitscale.create_model(name, device="meta")
    n = sum(p.numel() for p in model.parameters())
    assert all(p.is_meta for p in model.parameters())
    assert abs(n / 1e6 - millions) / millions < 0.02, n


def test_vit_22b_parameter_count():
    model = vitscale.create_model("vit_22b", device="meta")
    blocks = sum(p.numel() for p in model.blocks.parameters())
    total = sum(p.numel() for p in model.parameters())
    # The paper's 21.7B (21,743M) is the transformer body; embeddings + MAP head + classifier add ~0.47B.
    assert abs(blocks - 21.743e9) / 21.743e9 < 0.001, blocks
    assert 21.7e9 < total < 22.3e9
    blk = model.blocks[0]
    assert blk.in_proj_per_head.bias is None and blk.norm.bias is None and blk.mlp_bias_per_head is not None
    assert model.cls_token is None and model.attn_pool is not None


def test_meta_build_then_to_empty_and_init():
    model = vitscale.create_model("vit_debug", device="meta")
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    model.init_weights()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    ref = vitscale.create_model("vit_debug")
    # same initialisation statistics as a normally built model
    assert abs(model.blocks[0].attn.qkv_per_head.weight.std() - ref.blocks[0].attn.qkv_per_head.weight.std()) < 0.005
    assert torch.isfinite(model(torch.randn(1, 3, 32, 32))).all()


def test_pos_embed_resample_identity_on_same_grid():
    model = vitscale.create_model("vit_debug")
    sd = model.state_dict()
    other = vitscale.create_model("vit_debug")
    other.load_state_dict(sd)
    torch.testing.assert_close(other.pos_embed, model.pos_embed, rtol=0, atol=0)
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(other(x), model(x))
    from vitscale.models.common import resample_pos_embed

    pe = model.pos_embed
    assert resample_pos_embed(pe, (4, 4), (4, 4), 1) is pe


def test_pos_embed_interpolates_to_512px_and_trains():
    small = vitscale.create_model("vit_debug", img_h=224, img_w=224, patch_dim=16)
    big = vitscale.create_model("vit_debug", img_h=512, img_w=512, patch_dim=16)
    big.load_state_dict(small.state_dict())  # 14x14 grid -> 32x32 grid on load
    assert big.pos_embed.shape == (1, 1 + 32 * 32, 64)
    torch.testing.assert_close(big.pos_embed[:, :1], small.pos_embed[:, :1])  # class token kept
    x = torch.randn(1, 3, 512, 512)
    out = big(x)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert big.pos_embed.grad is not None and big.pos_embed.grad.abs().sum() > 0
    # a smooth embedding stays smooth: interpolating a linear ramp gives a ramp in the same range
    ramp = torch.linspace(-1, 1, 14).repeat(14, 1).reshape(1, 196, 1).expand(1, 196, 64)
    from vitscale.models.common import resample_pos_embed

    up = resample_pos_embed(ramp, (32, 32), (14, 14), 0)
    assert up.min() >= -1.05 and up.max() <= 1.05


def test_runtime_image_size_change_and_set_image_size():
    model = vitscale.create_model("vit_debug").eval()
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        y_dynamic = model(x)  # interpolated on the fly
        model.set_image_size(48)
        y_resized = model(x)
    torch.testing.assert_close(y_dynamic, y_resized)
    assert model.cfg.img_h == 48 and model.pos_embed.shape[1] == 1 + 36


def test_uniform_api():
    model = vitscale.create_model("vit_debug", pool="map", class_token_length=0)
    assert {"pos_embed", "attn_pool.latent"} <= model.no_weight_decay()
    names = dict(model.named_parameters())
    assert all(n in names for n in model.no_weight_decay())
    feats = model.forward_features(torch.randn(2, 3, 32, 32))
    assert feats.shape == (2, 16, 64)
    assert model.forward_head(feats, pre_logits=True).shape == (2, 64)
    model.reset_classifier(3)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)
    model.reset_classifier(0)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 64)


def test_nemo_pre_logits_head_and_patch_dropout():
    model = vitscale.create_model("vit_debug", pre_logits=True, drop_patch_rate=0.5, class_token_length=8)
    x = torch.randn(2, 3, 32, 32)
    model.train()
    assert model.forward_features(x).shape == (2, 8 + 8, 64)  # half of the 16 patches kept
    model.eval()
    assert model.forward_features(x).shape == (2, 8 + 16, 64)
    assert isinstance(model.pre_logits[1], torch.nn.Tanh)


def test_bad_config_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="divisible"):
        vitscale.create_model("vit_debug", hidden_size=65)
    with pytest.raises(ValueError, match="class_token_length"):
        vitscale.create_model("vit_debug", class_token_length=0)
    with pytest.raises(TypeError, match="did you mean 'hidden_size'"):
        vitscale.create_model("vit_debug", hiden_size=32)
    with pytest.raises(ConfigError, match="did you mean 'vit_b16'"):
        vitscale.create_model("vit_b61")


def test_flops_analytic_equals_flop_counter():
    for name in ["vit_debug", "vit_b16"]:
        cfg = VARIANTS[name]
        model = vitscale.create_model(name, device="meta")
        x = torch.empty(1, 3, cfg.img_h, cfg.img_w, device="meta")
        assert vit_flops(cfg) == count_flops(model, x)
    cfg = debug_size(VARIANTS["vit_22b"])
    model = VisionTransformer(cfg, device="meta")
    assert vit_flops(cfg) == count_flops(model, torch.empty(1, 3, 32, 32, device="meta"))
    # ViT-B/16 at 224: ~17.6 GMACs, the figure timm and the literature quote
    assert abs(vit_flops(VARIANTS["vit_b16"]) / 2e9 - 17.56) < 0.05
    assert vitscale.tools.flops("vit_b16", img_size=384) > 3 * vit_flops(VARIANTS["vit_b16"])


@pytest.mark.parametrize("overrides", [{}, {"pool": "map", "class_token_length": 0, "class_token": False},
                                       {"class_token_length": 3, "pool": "avg"}])  # fmt: skip
def test_flops_with_patch_dropout_count_the_kept_patches_in_training(overrides):
    """Training runs the blocks on the patches patch dropout keeps; inference on every patch: the
    analytic count of each mode equals PyTorch's counter on the model in that mode."""
    for rate in (0.5, 0.3):
        cfg = dataclasses.replace(debug_size(VARIANTS["vit_b16"]), drop_patch_rate=rate, **overrides)
        model = VisionTransformer(cfg, device="meta")
        x = torch.empty(1, 3, cfg.img_h, cfg.img_w, device="meta")
        train, infer = vit_flops(cfg, training=True), vit_flops(cfg)
        assert train == count_flops(model.train(), x) and infer == count_flops(model.eval(), x)
        assert train < infer == vit_flops(dataclasses.replace(cfg, drop_patch_rate=0.0), training=True)
    # ViT-B/16 at 224 px, half the patches dropped: 98 of 196 patches (+ the class token) in the blocks
    b16 = VARIANTS["vit_b16"]
    half = dataclasses.replace(b16, drop_patch_rate=0.5)
    assert vitscale.tools.flops(half, training=True) == vit_flops(half, training=True) < 0.5 * vit_flops(b16)
    assert vitscale.tools.flops(half) == vit_flops(b16)  # inference: every patch


def test_torch_compile_fullgraph_on_cpu():
    torch.manual_seed(0)
    model = vitscale.create_model("vit_debug").eval()
    x = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_trunc_normal_keeps_its_spread_in_bf16():
    from vitscale.models.common.init import trunc_normal_

    t = torch.empty(512, 512, dtype=torch.bfloat16)
    torch.manual_seed(0)
    trunc_normal_(t, std=0.02)
    # torch 2.11's own draw in bf16 puts ~0.4% of the values on the cut at +-2 (std 0.128)
    assert abs(t.float().std().item() - 0.02) < 0.001 and t.abs().max().item() < 0.2
    a, b = torch.empty(64, 64), torch.empty(64, 64)
    torch.manual_seed(0)
    trunc_normal_(a, std=0.02)
    torch.manual_seed(0)
    torch.nn.init.trunc_normal_(b, std=0.02)
    assert torch.equal(a, b)  # fp32: PyTorch's draw, unchanged


def test_patch_init_fan_in_is_torch_conv_default_as_timm_keeps_it():
    """``patch_init=fan_in``: the patch projection drawn as PyTorch's ``Conv2d`` default, U(+-1/sqrt(fan_in))
    for weight and bias (timm's VisionTransformer leaves its patch projection so); the rest unchanged."""
    kw = dict(
        patch_dim=4,
        hidden_size=96,
        ffn_hidden_size=192,
        num_attention_heads=4,
        num_layers=1,
        img_h=32,
        img_w=32,
    )
    torch.manual_seed(0)
    normal = vitscale.create_model("vit_debug", **kw)
    torch.manual_seed(0)
    fan_in = vitscale.create_model("vit_debug", patch_init="fan_in", **kw)
    bound = 1 / (3 * 4 * 4) ** 0.5
    w, b = fan_in.patch_embed.proj.weight, fan_in.patch_embed.proj.bias
    assert w.abs().max() <= bound and abs(w.std().item() - bound / 3**0.5) < 0.01 and b.abs().max() <= bound
    assert b.abs().min() > 0 and b.abs().max() > bound / 2  # drawn, not zero
    w0 = normal.patch_embed.proj.weight
    assert abs(w0.std().item() - 0.02) < 0.003 and not normal.patch_embed.proj.bias.any()
    assert abs(fan_in.blocks[0].mlp.fc1.weight.std().item() - 0.02) < 0.002  # the other matrices: as before
    with pytest.raises(ValueError, match="patch_init must be one of"):
        vitscale.create_model("vit_debug", patch_init="xavier")
    with pytest.raises(ValueError, match="NaFlex ViT's patch projection is a Linear"):
        vitscale.create_model("naflex_debug", patch_init="fan_in")


def test_pos_embed_sincos_is_maes_fixed_table_and_converts_to_timm_exactly():
    """``pos_embed_sincos``: the position table holds MAE's fixed 2-D sin-cos embeddings (zeros for the
    class token: facebookresearch/mae ``models_mae.py`` lines 37 and 68-69) and is never trained (no
    gradient, not in the optimizer); it is still the model's ``pos_embed``, so timm's ViT reads it as its
    learned table (the same outputs, and the same table back) and a resize keeps it fixed."""
    from vitscale.interop import create_timm_model, from_timm, to_timm
    from vitscale.models.common.pos_embed import sincos_2d
    from vitscale.train.optim import param_groups

    kw = dict(patch_dim=4, hidden_size=32, ffn_hidden_size=64, num_attention_heads=2, num_layers=1, pool="avg")
    torch.manual_seed(0)
    model = vitscale.create_model("vit_debug", pos_embed_sincos=True, **kw).eval()
    table = torch.cat([torch.zeros(1, 32), sincos_2d(32, 8, 8)])[None]
    assert not model.pos_embed.requires_grad and torch.equal(model.pos_embed, table)
    grouped = {id(p) for g in param_groups(model, 0.05, None) for p in g["params"]}
    assert id(model.pos_embed) not in grouped and len(grouped) == sum(1 for _ in model.parameters()) - 1
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tm = create_timm_model(model).eval()
        assert torch.equal(to_timm(model)["pos_embed"], table) and (tm(x) - model(x)).abs().max() < 1e-5
        back = from_timm(tm)  # timm's table is a learned one: read as one, with the same values
        assert back.cfg.pos_embed == "learned" and not back.cfg.pos_embed_sincos and back.pos_embed.requires_grad
        assert torch.equal(back.pos_embed, table)
    model.set_image_size(64)
    assert model.pos_embed.shape == (1, 1 + 256, 32) and not model.pos_embed.requires_grad
    for bad in (dict(pos_embed="rope"), dict(hidden_size=30, num_attention_heads=2)):
        with pytest.raises(ValueError, match="pos_embed_sincos=True fills the position table"):
            vitscale.create_model("vit_debug", pos_embed_sincos=True, **{**kw, **bad})
    with pytest.raises(ValueError, match="NaFlex ViT's position table is learned"):
        vitscale.create_model("naflex_debug", pos_embed_sincos=True)
