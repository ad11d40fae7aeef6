"""timm NaFlexVit <-> vitscale NaFlex ViT parity: timm's registered NaFlex models at a small width and
depth (random weights, no download), fp32, eval; outputs on the same patch dictionaries — made by
timm's own NaFlex patchify and collator — within 1e-5 relative, both ways."""

from __future__ import annotations

import dataclasses

import pytest
import torch

timm = pytest.importorskip("timm")
from helpers import randomize, rel_l2  # noqa: E402
from timm.data.naflex_dataset import NaFlexCollator  # noqa: E402
from timm.data.naflex_transforms import patchify_image  # noqa: E402
from timm.models.naflexvit import NaFlexVit  # noqa: E402

from vitscale.interop import create_timm_model, from_timm, load_timm_checkpoint, timm_kwargs, to_timm  # noqa: E402
from vitscale.models import create_model  # noqa: E402
from vitscale.models.naflex import NaFlexViT  # noqa: E402

# Every NaFlex model of timm 1.0.31 that vitscale converts (the RADIO backbones resample their grid
# without antialias and, for v3, with align_corners: refused by name below).
NAMES = [
    "naflexvit_base_patch16_gap",
    "naflexvit_base_patch16_map",
    "naflexvit_base_patch16_par_gap",
    "naflexvit_base_patch16_parfac_gap",
    "naflexvit_base_patch16_siglip",
    "naflexvit_so150m2_patch16_reg1_gap",
    "naflexvit_so150m2_patch16_reg1_map",
    "naflexvit_so400m_patch16_siglip",
]
SMALL = dict(embed_dim=64, depth=2, num_heads=4, num_classes=7)
# image sizes (patch 16): 3x5, 4x4, 6x2, 1x1 patches, and the 16x16 grid itself — downsampling,
# upsampling, identity, aspect ratios both ways
SIZES = [(48, 80), (64, 64), (96, 32), (16, 16), (256, 256)]


def _batch(sizes=SIZES, seq_len: int = 260, patch: int = 16, seed: int = 0) -> dict:
    """A NaFlex batch from timm's data path: ``patchify_image`` per image, ``NaFlexCollator``."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for h, w in sizes:
        p, c, v = patchify_image(torch.randn(3, h, w, generator=g), (patch, patch))
        items.append(({"patches": p, "patch_coord": c, "patch_valid": v}, 0))
    return NaFlexCollator(seq_len)(items)[0]


@pytest.mark.parametrize("name", NAMES)
def test_timm_naflex_to_vitscale_and_back(name):
    assert name in timm.list_models("naflexvit_*")
    tm = timm.create_model(name, pretrained=False, **SMALL).eval()
    randomize(tm)
    ours = from_timm(tm).eval()
    assert isinstance(ours, NaFlexViT)
    batch = _batch()
    x = torch.randn(2, 3, 48, 96)  # plain images of another size: the classic path
    with torch.no_grad():
        ref = tm(batch)
        out = ours(batch)
        assert out.shape == ref.shape == (len(SIZES), 7)
        assert rel_l2(out, ref) < 1e-5
        assert rel_l2(ours(x), tm(x)) < 1e-5
        feats = tm.forward_features(batch["patches"], batch["patch_coord"], batch["patch_valid"])
        ref_pre = tm.forward_head(**feats, pre_logits=True)
        assert rel_l2(ours(batch, pre_logits=True), ref_pre) < 1e-5

    # back: our state dict loads strictly into the matching timm model and gives the same outputs
    tm2 = create_timm_model(ours, load_weights=False).eval()
    result = tm2.load_state_dict(to_timm(ours), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    with torch.no_grad():
        assert rel_l2(tm2(batch), out) < 1e-5


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(pool="map", class_token_length=0, qk_norm=True, layer_scale_init=0.1),
        dict(pool="token", class_token=True, class_token_length=3, pos_embed_interp="bilinear"),
        dict(pos_embed_type="factorized", pos_embed_ar_preserving=True, pos_embed_grid=(5, 3)),
        dict(norm_type="rmsnorm", activation="silu", pre_norm=True, patch_bias=False, pos_embed_grid=(6, 6)),
    ],
)
def test_vitscale_naflex_to_timm_and_back(overrides):
    torch.manual_seed(1)
    ours = create_model("naflex_debug", **overrides).eval()
    randomize(ours, seed=1)
    batch = _batch([(24, 40), (32, 32), (40, 16), (8, 8)], seq_len=20, patch=8)
    tm = create_timm_model(ours).eval()
    assert type(tm) is NaFlexVit
    with torch.no_grad():
        out = ours(batch)
        assert rel_l2(tm(batch), out) < 1e-5
        back = from_timm(tm).eval()
        assert rel_l2(back(batch), out) < 1e-5
    # the whole configuration comes back (the image size: timm keeps only the grid; here grid x patch)
    want = dataclasses.replace(ours.cfg, fc_norm=ours.cfg.use_fc_norm)
    want = dataclasses.replace(want, img_h=back.cfg.img_h, img_w=back.cfg.img_w)
    if want.class_token_length == 0:  # no prefix token: the flag names nothing (read back as True)
        want = dataclasses.replace(want, class_token=True)
    assert back.cfg == want
    assert timm_kwargs(ours)["pos_embed_grid_size"] == ours.cfg.pos_embed_grid


# vitscale's variants and the timm names they cite (vitscale/models/naflex/configs.py)
VARIANT_OF = {
    "naflex_b16_gap": "naflexvit_base_patch16_gap",
    "naflex_b16_par_gap": "naflexvit_base_patch16_par_gap",
    "naflex_b16_parfac_gap": "naflexvit_base_patch16_parfac_gap",
    "naflex_b16_map": "naflexvit_base_patch16_map",
    "naflex_so150m2_16_reg1_gap": "naflexvit_so150m2_patch16_reg1_gap",
    "naflex_so150m2_16_reg1_map": "naflexvit_so150m2_patch16_reg1_map",
    "naflex_b16_siglip": "naflexvit_base_patch16_siglip",
    "naflex_so400m16_siglip": "naflexvit_so400m_patch16_siglip",
}


@pytest.mark.parametrize("ours", list(VARIANT_OF))
def test_variant_table_is_timms_at_full_size(ours):
    """Each full-size variant is the timm model it cites, field for field (built on the meta device)."""
    from vitscale.models.naflex.state_dict_adapter import config_from_timm
    from vitscale.models.registry import get_model_config
    from vitscale.models.vit.timm_registry import create_timm_meta

    tm = create_timm_meta(VARIANT_OF[ours])
    want = get_model_config(ours)
    want = dataclasses.replace(want, fc_norm=want.use_fc_norm)
    if want.class_token_length == 0:
        want = dataclasses.replace(want, class_token=True)
    assert config_from_timm(tm) == want
    meta = create_model(ours, device="meta")
    assert sum(p.numel() for p in meta.parameters()) == sum(p.numel() for p in tm.parameters())


def test_what_vitscale_cannot_express_is_refused_by_name():
    tm = timm.create_model("naflexvit_base_patch16_radio_v3", pretrained=False, **SMALL)
    with pytest.raises(ValueError, match="pos_embed_antialias=False.*pos_embed_align_corners=True"):
        from_timm(tm)
    tm = timm.create_model("naflexvit_base_patch16_gap", pretrained=False, **SMALL, global_pool="avgmax")
    with pytest.raises(ValueError, match="global_pool='avgmax'"):
        from_timm(tm)


def test_load_timm_naflex_checkpoint_from_disk(tmp_path):
    from safetensors.torch import save_file

    tm = timm.create_model("naflexvit_base_patch16_map", pretrained=False, **SMALL).eval()
    randomize(tm, seed=3)
    path = tmp_path / "naflex.safetensors"
    save_file({k: v.contiguous() for k, v in tm.state_dict().items()}, str(path))
    ours = load_timm_checkpoint(path, "naflexvit_base_patch16_map", **SMALL).eval()
    assert ours.cfg.img_h == 384 and ours.cfg.pos_embed_grid == (16, 16)  # timm's default input, its grid
    batch = _batch()
    with torch.no_grad():
        assert rel_l2(ours(batch), tm(batch)) < 1e-5
