"""A task's views cut by the loader's workers (vitscale.data.views): keyed by (seed, epoch, sample,
repeat, view) whatever the rank, batch position or worker count; stacked crop-major and normalised
as images are; a JPEG decoded at a DCT reduction that keeps every view's box; the data keys the views
would ignore refused in one line."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image

from vitscale.data import build_loaders, data_config
from vitscale.data.decode import decode_reduced
from vitscale.data.views import BlockMasks, Crops, Views, ViewTransform, block_mask, check_views
from vitscale.errors import ConfigError
from vitscale.tasks.dino_config import DinoConfig
from vitscale.tasks.dino_crops import dino_views

VIEWS = Views((("global", Crops(2, 16, (0.3, 1.0), blur=(1.0, 0.1), solarize=(0.0, 0.2))),
               ("local", Crops(2, 8, (0.05, 0.3)))), BlockMasks((4, 4), 0.5, (0.1, 0.5)))  # fmt: skip


def _photos(root, n=8, size=(96, 72)):
    """``n`` smooth colour JPEGs (gradients and noise, like a photo's low frequencies) in 2 classes."""
    g = np.random.default_rng(0)
    for i in range(n):
        d = root / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        y, x = np.mgrid[0 : size[1], 0 : size[0]]
        img = np.stack([x * 255 / size[0], y * 255 / size[1], (x + y + 30 * i) % 256], -1) + g.normal(0, 12, (size[1], size[0], 3))
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(d / f"{i}.jpg", quality=90)
    return root


def _loaders(root, *, micro=4, rank=0, world=1, workers=0, views=VIEWS, **kw):
    cfg = data_config(format="imagefolder", train_path=str(root), num_workers=workers, **kw)
    return build_loaders(cfg, img_size=(32, 32), num_channels=3, seed=5, micro_batch_size=micro, eval_batch_size=4,
                         rank=rank, world_size=world, views=views, task="dino")  # fmt: skip


def _by_sample(batches):
    """index -> (its global crops, its local crops, its masks) from crop-major batches."""
    out = {}
    for b in batches:
        B = b["index"].shape[0]
        for j, i in enumerate(b["index"].tolist()):
            out[i] = (b["global"][j::B], b["local"][j::B], b["masks"][j::B])
    return out


def test_views_are_keyed_by_sample_whatever_the_rank_position_or_workers(tmp_path):
    root = _photos(tmp_path / "photos")
    one = _loaders(root)
    b = next(iter(one.train))
    assert "image" not in b and b["global"].shape == (8, 3, 16, 16) and b["local"].shape == (8, 3, 8, 8)
    assert b["global"].dtype == torch.float32 and b["masks"].shape == (8, 16) and b["masks"].dtype == torch.bool
    one.train.load_state_dict({"epoch": 0, "batch_index": 0})
    ref = _by_sample(list(one.train))
    assert len(ref) == 8
    ranks = {}
    for r in (0, 1):  # two ranks of 2 images each: the same views of each sample, at other batch positions
        ranks |= _by_sample(list(_loaders(root, micro=2, rank=r, world=2).train))
    workers = _by_sample(list(_loaders(root, workers=2).train))
    for i, (g, loc, m) in ref.items():
        for other in (ranks, workers):
            assert torch.equal(other[i][0], g) and torch.equal(other[i][1], loc) and torch.equal(other[i][2], m)
        assert not torch.equal(g[0], g[1]) and not torch.equal(loc[0], loc[1])  # each view its own draw
    e1 = _by_sample(list(one.train))  # the next epoch: other views of every sample
    assert all(not torch.equal(e1[i][0], ref[i][0]) for i in ref)
    masks = torch.stack([m for _, _, m in ref.values()])
    assert 0 < int(masks.any(-1).sum()) < 16  # about half the global crops masked (probability 0.5)


def test_the_batch_is_crop_major_and_normalised_as_images_are(tmp_path):
    root = _photos(tmp_path / "photos", n=4)
    L = _loaders(root, micro=4, mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3))
    b = next(iter(L.train))
    tf = L.train.dataset.transform
    mean = torch.tensor([0.4, 0.5, 0.6]).view(3, 1, 1) * 255
    std = torch.tensor([0.2, 0.25, 0.3]).view(3, 1, 1) * 255
    for j, i in enumerate(b["index"].tolist()):
        s = L.train.dataset.source.sample(i, 0, tf).aug.image  # the sample's own views, uint8
        for k in range(2):  # crop k of sample j at row k * B + j (DINOv2's collate order)
            torch.testing.assert_close(b["global"][k * 4 + j], (s.crops["global"][k].float() - mean) / std)
            torch.testing.assert_close(b["local"][k * 4 + j], (s.crops["local"][k].float() - mean) / std)
            assert torch.equal(b["masks"][k * 4 + j], s.masks[k])


def test_each_repeat_draws_its_own_views(tmp_path):
    """``data.repeated_aug=4``: the four repeats of an image, one after another in the stream, are four
    different sets of views and masks (their keys hold the repeat)."""
    root = _photos(tmp_path / "photos")
    b = next(iter(_loaders(root, micro=8, repeated_aug=4).train))
    assert b["index"][:4].unique().numel() == 1  # one image's four repeats
    g = b["global"].view(2, 8, -1)[0, :4]
    assert all(not torch.equal(g[a], g[c]) for a in range(4) for c in range(a + 1, 4))


def test_a_jpeg_is_decoded_reduced_when_every_view_keeps_its_pixels(tmp_path):
    root = _photos(tmp_path / "big", n=1, size=(640, 480))
    path = next(root.rglob("*.jpg"))
    for fast, want in ((True, (3, 120, 160)), (False, (3, 480, 640))):
        t, scale, hw = decode_reduced(str(path), lambda h, w: 4, fast=fast)
        assert tuple(t.shape) == want and hw == (480, 640) and scale == pytest.approx(640 / want[2])
    cfg = data_config(format="imagefolder", train_path=str(root))
    tf = ViewTransform(cfg, (32, 32), 3, 0, VIEWS)
    fast = tf.decode(str(path), 0, 0, fast=True).image.crops["global"][0].float()
    full = tf.decode(str(path), 0, 0, fast=False).image.crops["global"][0].float()
    assert (fast - full).abs().mean() < 6  # the same box and augmentation, from the reduced decode


def test_an_image_smaller_than_the_loaders_is_upsampled_once_for_its_boxes():
    tf = ViewTransform(data_config(format="digits"), (32, 32), 3, 0, VIEWS)
    assert tf.grid(8, 8) == (32, 32) and tf.grid(8, 12) == (32, 48) and tf.grid(96, 72) == (96, 72)
    digit = torch.zeros(3, 8, 8, dtype=torch.uint8)
    digit[:, 2:6, 3:5] = 255
    views = tf.tensor_train(digit, 0, 0).image
    assert views.crops["global"][0].shape == (3, 16, 16) and views.crops["local"][0].shape == (3, 8, 8)


def test_dino_views_follow_the_dino_group():
    dc = DinoConfig(global_crops_size=32, local_crops_number=3, local_crops_size=16, gaussian_blur=[1.0, 0.1, 0.5])
    v = dino_views(dc, 4)
    g, loc = v.group("global"), v.group("local")
    assert (g.count, g.size, loc.count, loc.size) == (2, 32, 3, 16)
    assert g.blur == (1.0, 0.1) and g.solarize == (0.0, 0.2) and loc.blur == (0.5,)
    assert v.masks.grid == (8, 8) and v.masks.crops == "global"
    assert dino_views(DinoConfig(ibot_loss_weight=0.0), 16).masks is None


def test_block_masks_cover_at_most_the_asked_patches_in_blocks():
    for seed in range(20):
        m = block_mask(random.Random(seed), 14, 14, 60)
        assert m.shape == (14, 14) and 0 < int(m.sum()) <= 60
    assert int(block_mask(random.Random(0), 8, 8, 0).sum()) == 0


@pytest.mark.parametrize("key, value", [
    ("auto_augment", "rand-m9-mstd0.5-inc1"), ("rrc_scale", (1.0, 1.0)), ("hflip", 0.0), ("color_jitter", (0.4,)),
    ("mixup_alpha", 0.8), ("cutmix_alpha", 1.0), ("random_erasing", 0.25), ("train_interpolation", "bicubic"),
])  # fmt: skip
def test_a_data_augmentation_key_the_views_would_ignore_is_refused(key, value):
    cfg = data_config(format="digits", **{key: value})
    shown = list(value) if isinstance(value, tuple) else value
    with pytest.raises(ConfigError, match=rf"^data\.{key}=.*train\.task=dino.*leave data\.{key} out$") as e:
        check_views(VIEWS, cfg, (32, 32), "dino")
    assert str(e.value).startswith(f"data.{key}={shown} ") and "\n" not in str(e.value)
    check_views(VIEWS, data_config(format="digits", repeated_aug=4), (32, 32), "dino")  # repeats are keyed: accepted
    with pytest.raises(ConfigError, match=r"^the global crops of train.task=dino are 16 px, larger than the loader's image"):
        check_views(VIEWS, data_config(format="digits"), (8, 8), "dino")
