"""NaFlex ViT: variable-length patch sequences at native aspect ratio, masked attention and pooling,
per-image position-embedding resampling, classic-ViT weights, and the input-mode refusals."""

from __future__ import annotations

import pytest
import torch
from helpers import rel_l2

import vitscale
from vitscale.checkpoint.weights import load_model_weights, read_weights, write_weights
from vitscale.errors import ConfigError
from vitscale.models.common import attention_mask
from vitscale.models.contract import INPUT_MODES, check_input_mode
from vitscale.models.naflex import patchify, to_patch_batch
from vitscale.models.naflex.patches import grid_coords, image_grids
from vitscale.models.registry import get_family

SIZES = [(24, 40), (32, 32), (40, 16), (8, 8)]  # 3x5, 4x4, 5x2 and 1x1 patches of 8 px


def _images(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, h, w, generator=g) for h, w in SIZES]


def _model(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    model = vitscale.create_model("naflex_debug", **overrides).eval()
    with torch.no_grad():  # non-trivial tokens and embeddings (the init's 1e-6 tokens hide mistakes)
        for p in (model.cls_token, model.pos_embed, model.pos_embed_y, model.pos_embed_x):
            if p is not None:
                p.normal_(0, 0.5)
    return model


def test_patch_batch_layout_is_timms():
    img = torch.arange(3 * 16 * 24, dtype=torch.float32).reshape(3, 16, 24)
    p = patchify(img, 8)  # (6, 192): (ph, pw, C) order, row-major over the 2x3 grid
    assert p.shape == (6, 8 * 8 * 3)
    torch.testing.assert_close(p[4].reshape(8, 8, 3).permute(2, 0, 1), img[:, 8:16, 8:16])
    b = to_patch_batch([img, img[:, :8, :8]], 8, seq_len=7)
    assert b["patches"].shape == (2, 7, 192) and b["patch_valid"].sum(1).tolist() == [6, 1]
    assert b["patch_coord"][0, :6].tolist() == grid_coords(2, 3).tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    assert image_grids(b["patch_coord"], b["patch_valid"]) == [(2, 3), (1, 1)]
    timm_nf = pytest.importorskip("timm.data.naflex_transforms")
    tp, tc, tv = timm_nf.patchify_image(img, (8, 8))
    torch.testing.assert_close(tp, p)
    assert torch.equal(tc, grid_coords(2, 3)) and bool(tv.all())


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # one register, average pool
        dict(pool="map", class_token_length=0),
        dict(pool="token", class_token=True, class_token_length=2, layer_scale_init=0.1, qk_norm=True),
        dict(pos_embed_type="factorized", pos_embed_ar_preserving=True, pos_embed_grid=(3, 5)),
        dict(pos_embed_interp="bilinear", pos_embed_grid=(6, 6), pool="map", class_token_length=0),
        dict(parallel_block=True, qkv_bias=False, qk_norm=True, pool="map", class_token_length=0),
    ],
)
def test_a_padded_batch_equals_each_image_alone(overrides):
    """Each image of a NaFlex batch gets the logits it gets alone as a plain image: the padding is
    invisible to attention and pooling, and its grid has its own resampled position embeddings."""
    model = _model(**overrides)
    images = _images()
    batch = to_patch_batch(images, 8, seq_len=20)
    with torch.no_grad():
        out = model(batch)
        for i, img in enumerate(images):
            alone = model(img[None])
            assert rel_l2(out[i : i + 1], alone) < 1e-5, (i, img.shape)
        # the padding's content is never read: other values and coordinates, same outputs
        noisy = dict(batch)
        pad = ~batch["patch_valid"]
        noisy["patches"] = torch.where(pad[..., None], torch.randn_like(batch["patches"]) * 50, batch["patches"])
        noisy["patch_coord"] = torch.where(pad[..., None], torch.randint(0, 3, batch["patch_coord"].shape), batch["patch_coord"])
        torch.testing.assert_close(model(noisy), out, rtol=0, atol=0)
        # ... and it is masked, not merely harmless: attending to it changes the outputs
        unmasked = dict(batch, patch_valid=torch.ones_like(batch["patch_valid"]))
        assert rel_l2(model(unmasked), out) > 1e-3


def test_patch_order_within_a_sequence_does_not_matter():
    """Embeddings are picked by coordinate, so a shuffled sequence gives the same pooled output."""
    model = _model(pool="map", class_token_length=0)
    batch = to_patch_batch(_images(), 8, seq_len=16)
    perm = torch.randperm(16)
    shuffled = {k: v[:, perm] for k, v in batch.items()}
    with torch.no_grad():
        assert rel_l2(model(shuffled), model(batch)) < 1e-5


def test_no_gradient_reaches_the_padding():
    model = _model().train()
    batch = to_patch_batch(_images(), 8, seq_len=20)
    patches = batch["patches"].clone().requires_grad_(True)
    model(dict(batch, patches=patches)).square().sum().backward()
    pad = ~batch["patch_valid"]
    assert patches.grad[pad].abs().max() == 0 and patches.grad[~pad].abs().max() > 0
    assert all(p.grad is not None for p in model.parameters())


def test_grad_checkpointing_and_pre_logits_with_a_mask():
    model = _model(pool="map", class_token_length=0)
    batch = to_patch_batch(_images(), 8)
    with torch.no_grad():
        ref = model(batch)
        feats = model(batch, pre_logits=True)
        model.set_grad_checkpointing(True)
        torch.testing.assert_close(model(batch), ref)
    assert feats.shape == (len(SIZES), model.num_features)
    tokens = model.forward_features(batch)
    torch.testing.assert_close(model.forward_head(tokens, patch_valid=batch["patch_valid"]), ref)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_gives_the_sdpa_outputs(monkeypatch):
    """attn_impl=flex runs FlexAttention with a block mask; its outputs are SDPA's. (Eager
    ``flex_attention`` here: the compiled kernel takes ~40 s to build on this CPU; the benchmark
    ``benchmarks/naflex_attention.py`` checks the compiled one against SDPA.)"""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    monkeypatch.setattr(attention_mask, "_compiled_flex", lambda: flex.flex_attention)
    sdpa_model = _model(pool="map", class_token_length=0)
    flex_model = _model(pool="map", class_token_length=0, attn_impl="flex")
    flex_model.load_state_dict(sdpa_model.state_dict())
    batch = to_patch_batch(_images(), 8, seq_len=20)
    mask = attention_mask.key_padding_mask(batch["patch_valid"], 0, "flex")
    assert not isinstance(mask, torch.Tensor)  # a BlockMask
    with torch.no_grad():
        assert rel_l2(flex_model(batch), sdpa_model(batch)) < 1e-5
    with pytest.raises(ValueError, match="cannot train on CPU"):  # PyTorch's FlexAttention: no CPU backward
        flex_model(batch)


@pytest.mark.parametrize("B, T", [(3, 17), (4, 256), (2, 300)])
def test_key_padding_block_mask_has_create_block_masks_blocks(B, T):
    """The block mask built from per-block key counts has the blocks PyTorch's ``create_block_mask``
    finds by evaluating the mask everywhere: every query block visits the same key blocks, split alike
    into partial and full ones (in a last, short query block PyTorch calls every block partial)."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    g = torch.Generator().manual_seed(T)
    valid = torch.rand(B, T, generator=g) > 0.4
    valid[0] = True  # an all-valid sequence
    valid[1, T // 2 :] = False  # a padded tail
    ref = flex.create_block_mask(lambda b, h, q, k: valid[b, k], B, None, T, T, device="cpu")
    mine = attention_mask.key_padding_mask(valid, 0, "flex")

    def blocks(num, idx):
        return [[sorted(idx[b, 0, i, : num[b, 0, i]].tolist()) for i in range(num.shape[-1])] for b in range(B)]

    got = blocks(mine.kv_num_blocks, mine.kv_indices), blocks(mine.full_kv_num_blocks, mine.full_kv_indices)
    want = blocks(ref.kv_num_blocks, ref.kv_indices), blocks(ref.full_kv_num_blocks, ref.full_kv_indices)
    whole = T // 128  # query blocks inside the sequence
    for b in range(B):
        for i in range(-(-T // 128)):
            assert sorted(got[0][b][i] + got[1][b][i]) == sorted(want[0][b][i] + want[1][b][i])
            if i < whole:
                assert (got[0][b][i], got[1][b][i]) == (want[0][b][i], want[1][b][i])
    assert tuple(mine.seq_lengths) == (T, T)


def test_bad_batches_are_refused_in_one_line():
    model = _model()
    batch = to_patch_batch(_images(), 8)
    empty = dict(batch, patch_valid=batch["patch_valid"].clone())
    empty["patch_valid"][1] = False
    with pytest.raises(ValueError, match="image 1 has no valid patch"):
        model(empty)
    with pytest.raises(ValueError, match=r"\(B, N, 192\)"):
        model(dict(batch, patches=batch["patches"][..., :48]))
    with pytest.raises(ValueError, match="lacks patch_coord"):
        model({"patches": batch["patches"], "patch_valid": batch["patch_valid"]})
    with pytest.raises(ValueError, match="not divisible by the patch size 8"):
        model(torch.randn(1, 3, 20, 32))
    with pytest.raises(NotImplementedError, match="NaFlexViT"):
        model(torch.randn(1, 3, 32, 32), dense=True)
    with pytest.raises(ValueError, match="attention dropout"):
        vitscale.create_model("naflex_debug", attn_impl="flex", attention_dropout=0.1)
    with pytest.raises(ValueError, match="pos_embed_prefix"):
        vitscale.create_model("naflex_debug", pos_embed_prefix=True)


@pytest.mark.parametrize(
    "vit_overrides, naflex_overrides",
    [
        # class token with its own position embedding (folded into the token), token pool
        (dict(), dict(pool="token", class_token=True, class_token_length=1)),
        # registers without position embeddings, average pool, LayerScale
        (
            dict(class_token=False, class_token_length=2, pool="avg", pos_embed_prefix=False, layer_scale_init=0.1),
            dict(class_token_length=2, layer_scale_init=0.1),
        ),
        # MAP head, no prefix; the 4x4 grid resampled to the NaFlex model's 6x6 one
        (dict(pool="map", class_token_length=0), dict(pool="map", class_token_length=0)),
    ],
)
def test_a_classic_vit_checkpoint_loads_into_the_naflex_variant(tmp_path, vit_overrides, naflex_overrides):
    """A fixed-size run's weights continue at native aspect ratio: the file a ViT run exports loads
    (``checkpoint.init_from``'s path) and computes the same on its images, as images or NaFlex batches."""
    torch.manual_seed(0)
    vit = vitscale.create_model("vit_debug", **vit_overrides).eval()
    with torch.no_grad():
        vit.cls_token.normal_(0, 0.5) if vit.cls_token is not None else None
        vit.pos_embed.normal_(0, 0.5)
    path = tmp_path / "model.safetensors"
    write_weights(vit.state_dict(), path)
    naflex = vitscale.create_model("naflex_debug", **naflex_overrides).eval()
    report = load_model_weights(naflex, read_weights(path, "model"), strict=True, source=str(path))
    assert {k: report[k] for k in ("missing", "unexpected", "skipped")} == {"missing": [], "unexpected": [], "skipped": []}
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ref = vit(x)
        assert rel_l2(naflex(x), ref) < 1e-5
        assert rel_l2(naflex(to_patch_batch(list(x), 8, seq_len=20)), ref) < 1e-5
        other = torch.randn(1, 3, 24, 40)  # another size: both resample the same grid the same way
        assert rel_l2(naflex(other), vit(other)) < 1e-5
    # another grid: resampled on loading, as a ViT's position embeddings are
    wide = vitscale.create_model("naflex_debug", pos_embed_grid=(6, 6), **naflex_overrides)
    load_model_weights(wide, read_weights(path, "model"), strict=True, source=str(path))
    assert wide.pos_embed.shape == (1, 6, 6, 64)


def test_factorized_embeddings_refuse_a_classic_checkpoint_by_name(tmp_path):
    vit = vitscale.create_model("vit_debug", pool="avg", class_token_length=0)
    naflex = vitscale.create_model("naflex_debug", pos_embed_type="factorized", class_token_length=0)
    from vitscale.checkpoint.integrity import CheckpointError

    with pytest.raises(CheckpointError, match="pos_embed"):
        load_model_weights(naflex, vit.state_dict(), source="vit")


def test_input_modes_are_asked_before_building_and_refused_in_one_line():
    assert set(INPUT_MODES) == {"fixed", "multi", "naflex"}
    for family, modes in (("vit", {"fixed", "multi"}), ("clip", {"fixed", "multi"}), ("volo", {"fixed"}),
                          ("naflex", {"fixed", "multi", "naflex"})):  # fmt: skip
        assert set(get_family(family).model_cls.input_modes) == modes
    check_input_mode(get_family("naflex_debug").model_cls, "naflex", "data.seq_lens")
    check_input_mode(vitscale.create_model("vit_debug"), "multi", "data.image_sizes")
    with pytest.raises(ConfigError) as e:
        check_input_mode(get_family("volo_d1").model_cls, "multi", "data.image_sizes", name="volo_d1")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("data.image_sizes needs images of another size")
    assert "volo_d1 (VOLO)" in msg and "images of one size per run" in msg and msg.endswith("clip, naflex, vit")
    with pytest.raises(ConfigError, match="families that can: naflex$"):
        check_input_mode(get_family("vit_debug").model_cls, "naflex", "data.seq_lens", name="vit_debug")
