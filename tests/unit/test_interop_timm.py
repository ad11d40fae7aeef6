"""timm <-> vitscale ViT parity: random weights, fp32, eval; outputs within 1e-5 relative both ways."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
import torch

timm = pytest.importorskip("timm")
from helpers import randomize, rel_l2  # noqa: E402
from timm.models.vision_transformer import ParallelScalingBlock  # noqa: E402
from timm.models.vision_transformer import VisionTransformer as TimmViT  # noqa: E402

from vitscale.errors import UserError  # noqa: E402
from vitscale.interop import create_timm_model, from_timm, load_timm_checkpoint, to_timm  # noqa: E402
from vitscale.models import create_model  # noqa: E402

BASE = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=7)

# A spread of timm configurations covering every option vitscale can express.
TIMM_CONFIGS = {
    "cls_token": dict(),
    "no_class_token_avg": dict(class_token=False, global_pool="avg"),
    "registers": dict(reg_tokens=4, no_embed_class=True),
    "registers_embed_prefix": dict(reg_tokens=2),
    "avg_fc_norm_off": dict(global_pool="avg", fc_norm=False),
    "map_head": dict(class_token=False, global_pool="map"),
    "qk_norm": dict(qk_norm=True),
    "no_qkv_bias": dict(qkv_bias=False),
    "layer_scale": dict(init_values=1e-3),
    "pre_norm_clip_style": dict(pre_norm=True),
    "no_head": dict(num_classes=0),
    "parallel_block": dict(block_fn=ParallelScalingBlock, qkv_bias=False, qk_norm=True),
    "parallel_block_qkv_bias": dict(block_fn=ParallelScalingBlock, qkv_bias=True),
    "parallel_map_22b_style": dict(
        block_fn=ParallelScalingBlock, qkv_bias=False, qk_norm=True, class_token=False, global_pool="map"
    ),
    "parallel_block_fused_out_proj": dict(block_fn=partial(ParallelScalingBlock, fuse_out_proj=True), qkv_bias=True),
    "mlp_ratio_3": dict(mlp_ratio=3.0),
    "gelu_tanh": dict(act_layer="gelu_tanh"),
    "silu_rmsnorm": dict(act_layer="silu", norm_layer="rmsnorm", qk_norm=True),
    "registers_no_class_token": dict(class_token=False, reg_tokens=3, global_pool="avg"),
    "dynamic_img_size": dict(dynamic_img_size=True, global_pool="map", class_token=False),
}


@pytest.mark.parametrize("name", list(TIMM_CONFIGS))
def test_timm_to_vitscale_and_back(name):
    torch.manual_seed(0)
    tm = TimmViT(**{**BASE, **TIMM_CONFIGS[name]}).eval()
    randomize(tm)
    x = torch.randn(3, 3, 32, 32)
    ours = from_timm(tm).eval()
    with torch.no_grad():
        ref = tm(x)
        out = ours(x)
        assert out.shape == ref.shape
        assert rel_l2(out, ref) < 1e-5
        # features (pre-logits) agree too
        assert rel_l2(ours.forward_head(ours.forward_features(x), pre_logits=True),
                    tm.forward_head(tm.forward_features(x), pre_logits=True)) < 1e-5  # fmt: skip

    # back: our state dict loads strictly into the matching timm model and gives the same output
    tm2 = create_timm_model(ours, load_weights=False, dynamic_img_size=tm.dynamic_img_size).eval()
    missing = tm2.load_state_dict(to_timm(ours), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    with torch.no_grad():
        assert rel_l2(tm2(x), out) < 1e-5
        if tm.dynamic_img_size:  # another image size: both interpolate the position embeddings alike
            x48 = torch.randn(2, 3, 48, 48)
            assert rel_l2(ours(x48), tm(x48)) < 1e-5 and rel_l2(tm2(x48), tm(x48)) < 1e-5


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(class_token_length=3, pool="avg"),
        dict(parallel_block=True, qkv_bias=False, qk_norm=True, pool="map", class_token_length=0),
        dict(layer_scale_init=1e-2, pos_embed_prefix=False, class_token_length=2),
        dict(class_token=False, class_token_length=4, pool="avg"),  # registers only
        dict(norm_type="rmsnorm", qk_norm=True, pool="map", class_token_length=0),
        dict(norm_type="rmsnorm", parallel_block=True, qkv_bias=False, qk_norm=True, class_token_length=3),
        dict(drop_path_rate=0.1, hidden_dropout=0.1, attention_dropout=0.05, head_dropout=0.2),
    ],
)
def test_vitscale_to_timm_and_back(overrides):
    torch.manual_seed(1)
    ours = create_model("vit_debug", **overrides).eval()
    randomize(ours, seed=1)
    x = torch.randn(2, 3, 32, 32)
    tm = create_timm_model(ours).eval()
    with torch.no_grad():
        out = ours(x)
        assert rel_l2(tm(x), out) < 1e-5
        back = from_timm(tm).eval()
        assert rel_l2(back(x), out) < 1e-5
    # the whole configuration comes back, dropout rates included (timm keeps them in float32)
    want = dataclasses.asdict(dataclasses.replace(ours.cfg, fc_norm=ours.cfg.use_fc_norm))
    got = dataclasses.asdict(back.cfg)
    floats = [k for k, v in want.items() if isinstance(v, float)]
    assert {k: v for k, v in got.items() if k not in floats} == {k: v for k, v in want.items() if k not in floats}
    assert [got[k] for k in floats] == pytest.approx([want[k] for k in floats], rel=1e-6)


def test_register_and_norm_options_map_to_timm():
    ours = create_model("vit_debug", class_token=False, class_token_length=2, pool="avg", norm_type="rmsnorm")
    tm = create_timm_model(ours)
    assert not tm.has_class_token and tm.num_reg_tokens == 2 and tm.cls_token is None
    assert type(tm.blocks[0].norm1).__name__ == "RmsNorm" and type(tm.blocks[0].attn.q_norm).__name__ == "Identity"
    assert set(to_timm(ours)) == set(tm.state_dict()) and "reg_token" in tm.state_dict()
    with pytest.raises(ValueError, match="class token"):
        create_model("vit_debug", class_token=False, pool="token")


def test_22b_bias_free_norms_have_no_timm_equivalent():
    ours = create_model("vit_debug", norm_bias=False)
    with pytest.raises(ValueError, match="norm_bias"):
        to_timm(ours) and create_timm_model(ours)


def test_load_timm_checkpoint_from_disk(tmp_path):
    from safetensors.torch import save_file

    tm = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=5, img_size=64).eval()
    randomize(tm, seed=3)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, str(path))
    ours = load_timm_checkpoint(path, "vit_tiny_patch16_224", num_classes=5, img_size=64).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert rel_l2(ours(x), tm(x)) < 1e-5
    # a .pth file of plain tensors loads too (weights_only: no arbitrary unpickling)
    pth = tmp_path / "model.pth"
    torch.save({"state_dict": tm.state_dict()}, pth)
    ours2 = load_timm_checkpoint(pth, "vit_tiny_patch16_224", num_classes=5, img_size=64).eval()
    with torch.no_grad():
        assert rel_l2(ours2(x), tm(x)) < 1e-5
    # without num_classes: the file's class count (5), not timm's default 1000
    ours3 = load_timm_checkpoint(pth, "vit_tiny_patch16_224", img_size=64).eval()
    with torch.no_grad():
        assert ours3.num_classes == 5 and rel_l2(ours3(x), tm(x)) < 1e-5
    # weights that do not fit: one line naming the first tensor, never torch's raw size-mismatch dump
    with pytest.raises(UserError, match=r"pos_embed is 1x17x192 in the file, 1x197x192 in timm's vit_tiny_patch16_224") as e:
        load_timm_checkpoint(pth, "vit_tiny_patch16_224")
    assert "\n" not in str(e.value) and "img_size=..." in str(e.value)


def test_pickled_objects_are_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    pth = tmp_path / "evil.pth"
    torch.save({"state_dict": {"x": Evil()}}, pth)
    with pytest.raises(Exception):  # noqa: B017 - weights_only refuses the object
        load_timm_checkpoint(pth, "vit_tiny_patch16_224")
