"""Every ViT registered in the installed timm: converts exactly both ways, or is listed with its reason.

The whole registry runs on the meta device (no values: key for key, shape for shape, strict loading
both ways, in seconds); a sample spanning the options runs for real, shrunk to 2 blocks, with random
weights on real photos: timm and vitscale outputs agree within 1e-5 relative, both ways.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

timm = pytest.importorskip("timm")
from helpers import rel_l2  # noqa: E402
from timm.models.vision_transformer import VisionTransformer as TimmViT  # noqa: E402

from vitscale.interop import create_timm_model, from_timm, unsupported_timm_vits  # noqa: E402
from vitscale.interop.timm_vit import DOC, parse_table, timm_vit_models, timm_vit_on_meta, timm_vit_reason  # noqa: E402
from vitscale.models.vit import VisionTransformer  # noqa: E402
from vitscale.models.vit.state_dict_adapter import config_from_timm, state_dict_from_timm, state_dict_to_timm  # noqa: E402


def _registry() -> dict[str, tuple[torch.nn.Module, str | None]]:
    """name -> (timm model on the meta device, None or why vitscale cannot express it)."""
    return {name: (tm, timm_vit_reason(tm)) for name, tm in timm_vit_models()}


def _shapes(sd: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in sd.items()}


@pytest.mark.slow
def test_the_registry_is_enumerated_round_trips_on_meta_and_matches_the_docs_table():
    """One enumeration of the registry (the costly part: a pytest-xdist worker each would build it
    again for every test that shares it), then its three checks in turn."""
    registry = _registry()
    _enumerated(registry)
    _every_expressible_round_trips_on_meta(registry)
    _unexpressible_names_match_the_docs_table(registry)


def _enumerated(registry):
    # timm 1.0 registers ~200 of them; the classic ones are found, other architectures are not
    assert len(registry) > 100
    for name in ("vit_base_patch16_224", "deit_tiny_patch16_224", "vit_base_r50_s16_224"):
        if name in timm.list_models():
            assert name in registry
    assert "eva02_base_patch14_224" not in registry and "resnet50" not in registry


def _every_expressible_round_trips_on_meta(registry):
    """timm -> vitscale -> timm maps every tensor key for key and shape for shape; strict loads both ways.

    (``timm_vit_reason`` has already checked that the timm model rebuilt from the vitscale config is
    the same architecture, so loading back into the original is loading into what ``to_timm`` targets.)
    """
    failures = {}
    exact = [name for name, (_, reason) in registry.items() if reason is None]
    for name in exact:
        tm = registry[name][0]
        try:
            cfg = config_from_timm(tm)
            ours = VisionTransformer(cfg, device="meta")
            sd = state_dict_from_timm(tm.state_dict(), cfg)
            assert _shapes(sd) == _shapes(ours.state_dict())  # every key, every shape
            ours.load_state_dict(sd, strict=True, assign=True)
            back = state_dict_to_timm(ours.state_dict(), cfg)
            assert _shapes(back) == _shapes(tm.state_dict())
            tm.load_state_dict(back, strict=True, assign=True)
        except Exception as e:  # noqa: BLE001 - collect every failing name, report them together
            failures[name] = f"{type(e).__name__}: {e}"[:300]
    assert not failures, failures
    assert len(exact) > 100


def _unexpressible_names_match_the_docs_table(registry):
    """docs/timm_vits.md is current: the same verdict and reason for every name it shares with this timm."""
    version, table = parse_table(DOC.read_text())
    actual = {name: reason for name, (_, reason) in registry.items()}
    fix = "regenerate with: python -m vitscale.interop.timm_vit docs/timm_vits.md"
    changed = {n: (table[n], actual[n]) for n in actual.keys() & table.keys() if table[n] != actual[n]}
    assert not changed, f"{fix}\n{changed}"
    if version == timm.__version__:  # the same timm: the same names too
        assert set(table) == set(actual), fix
    # every reason comes from a named option: none is an architecture vitscale misread
    assert not [n for n, r in actual.items() if r and r.startswith("not reproduced")]


def test_unsupported_timm_vits_names_the_reason():
    bad = unsupported_timm_vits(["vit_base_r50_s16_224", "vit_tiny_patch16_224", "vit_giant_patch14_dinov2"])
    assert set(bad) == {"vit_base_r50_s16_224", "vit_giant_patch14_dinov2"}
    assert "convolutional stem" in bad["vit_base_r50_s16_224"]
    assert "GluMlp" in bad["vit_giant_patch14_dinov2"]


def test_from_timm_refuses_what_it_cannot_express():
    tm = timm_vit_on_meta(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, scale_mlp_norm=True)
    with pytest.raises(ValueError, match="scale_mlp_norm"):
        from_timm(tm)
    # an option the config reader does not know is still caught: the rebuilt timm model would differ
    tm = timm_vit_on_meta(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4)
    tm.blocks[0].attn.scale = 0.5  # a non-standard attention scale
    assert timm_vit_reason(tm).startswith("not reproduced: blocks.0.attn: scale=0.5")
    with pytest.raises(ValueError, match="does not reproduce"):
        from_timm(tm)


# ----------------------------------------------------------------------------- real numbers

# (timm name, extra timm kwargs, image size to feed or None for the model's own): each shrunk to 2 blocks.
SAMPLE = [
    ("deit_tiny_patch16_224", {}, None),  # class token, token pooling (timm's deit module)
    ("deit3_small_patch16_224", {}, None),  # LayerScale 1e-6, no position embedding on the class token
    ("vit_base_patch32_clip_quickgelu_224", {}, None),  # pre-norm, QuickGELU, bias-free patch embedding, eps 1e-5
    ("vit_base_patch16_siglip_224", {}, None),  # MAP head, no class token, tanh GELU, no classifier
    ("vit_so150m_patch16_reg4_map_256", {}, None),  # MAP with a class token + 4 registers, MLP 2320/880
    ("vit_medium_patch16_gap_256", {}, None),  # average pooling + fc_norm, no QKV bias, 256 px
    ("vit_betwixt_patch16_reg4_gap_256", {}, None),  # 4 registers and no class token
    ("vit_small_patch14_reg4_dinov2", {"img_size": 224}, None),  # class token + registers, patch 14
    ("vit_base_patch16_xp_224", {}, None),  # parallel block, RMSNorm, QK norm, no QKV bias, pre-norm
    ("vit_pwee_patch16_reg1_gap_256", {}, None),  # parallel block with QKV bias, one register
    ("test_vit4", {}, 160),  # dynamic image size (fed 160 px, built for 224), RMSNorm, register, avg
    ("vit_base_patch16_radio_v3", {"img_size": 224}, None),  # no final norm, 8 prefix tokens, features only
    ("vit_base_patch16_224_miil", {}, None),  # no QKV bias, 11221 classes
    ("flexivit_small", {}, None),  # 240 px
    ("vit_small_patch8_224", {"in_chans": 1, "img_size": 32}, None),  # patch 8, one channel: the digits
]


@functools.cache
def _pictures(channels: int) -> torch.Tensor:
    if channels == 1:
        from sklearn.datasets import load_digits

        return torch.tensor(load_digits().images[:2], dtype=torch.float32)[:, None] / 16.0  # (2, 1, 8, 8)
    from sklearn.datasets import load_sample_images

    photos = np.stack([img[:427, :427] for img in load_sample_images().images])  # square crops
    return torch.tensor(photos, dtype=torch.float32).permute(0, 3, 1, 2) / 255.0  # (2, 3, 427, 427)


def _images(size: int, channels: int) -> torch.Tensor:
    """Real pictures at ``size`` px: scikit-learn's two sample photos (RGB) or two handwritten digits (grey)."""
    x = F.interpolate(_pictures(channels), size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return (x - 0.5) / 0.5


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Every tensor random (the init's zeros and ones hide layout mistakes), at a scale that keeps
    activations O(1) through the blocks."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.ndim >= 2 and not name.endswith(("pos_embed", "cls_token", "reg_token", "latent")):
                p.copy_(r / p[0].numel() ** 0.5)  # fan-in scaling
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * r)
            else:
                p.copy_(0.2 * r)


@pytest.mark.parametrize("name,extra,feed", SAMPLE, ids=[s[0] for s in SAMPLE])
def test_sample_outputs_agree_both_ways(name, extra, feed):
    if name not in timm.list_models():
        pytest.skip(f"{name} is not registered in timm {timm.__version__}")
    torch.manual_seed(0)
    # weight_init="skip": every tensor is overwritten below (randomized, or loaded from vitscale's)
    tm = timm.create_model(name, pretrained=False, depth=2, weight_init="skip", **extra).eval()
    assert type(tm) is TimmViT
    _randomize(tm, seed=len(name))
    ours = from_timm(tm).eval()
    size = feed or ours.cfg.img_h
    x = _images(size, ours.cfg.num_channels)
    with torch.no_grad():
        ref = tm(x)
        out = ours(x)
        assert out.shape == ref.shape and torch.isfinite(ref).all()
        assert rel_l2(out, ref) < 1e-5, name

        # back: a fresh timm model from vitscale's weights gives the same outputs ...
        back = create_timm_model(ours, dynamic_img_size=tm.dynamic_img_size, weight_init="skip").eval()
        assert rel_l2(back(x), out) < 1e-5, name
    # ... and timm -> vitscale -> timm returns every tensor unchanged (ViT-22B blocks move the
    # attention output bias into the MLP's: the same sum, so compare those per block)
    sd, sd_back = tm.state_dict(), back.state_dict()
    assert sd.keys() == sd_back.keys()
    for k in sd:
        if k.endswith(("attn_out_proj.bias", "mlp_out_proj.bias")):
            continue
        assert torch.equal(sd[k], sd_back[k]), k
    for k in [k for k in sd if k.endswith("attn_out_proj.bias")]:
        m = k.replace("attn_out_proj", "mlp_out_proj")
        torch.testing.assert_close(sd[k] + sd[m], sd_back[k] + sd_back[m], rtol=0, atol=1e-6)
