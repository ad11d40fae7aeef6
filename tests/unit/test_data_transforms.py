"""Transform shapes, flip / crop bookkeeping and keyed box sampling (policies: test_auto_augment.py)."""

import random

import pytest
import torch

from vitscale.data import build_loaders, data_config
from vitscale.data.transforms import SampleTransform, rrc_box


def test_rrc_box_in_bounds_and_keyed():
    for seed in range(200):
        t, lft, h, w = rrc_box(random.Random(seed), 375, 500, (0.08, 1.0), (3 / 4, 4 / 3))
        assert 0 <= t and 0 <= lft and t + h <= 375 and lft + w <= 500 and h > 0 and w > 0
    assert rrc_box(random.Random(7), 100, 100, (0.08, 1), (0.75, 1.33)) == rrc_box(random.Random(7), 100, 100, (0.08, 1), (0.75, 1.33))


@pytest.mark.parametrize("size,channels", [((24, 16), 3), ((16, 16), 1)])
def test_shapes_non_square_and_one_channel(size, channels):
    cfg = data_config(format="synthetic", synthetic_size=16, num_workers=0, val_split=0.5, num_classes=3,
                     auto_augment="3a", color_jitter=0.4, random_erasing=0.5, mean=(0.5,) * channels,
                     std=(0.5,) * channels)
    L = build_loaders(cfg, img_size=size, num_channels=channels, seed=0, micro_batch_size=4, eval_batch_size=4)
    assert next(iter(L.train))["image"].shape == (4, channels, *size)
    assert next(iter(L.val))["image"].shape == (4, channels, *size)


def test_flip_flag_matches_pixels():
    base = dict(format="synthetic", synthetic_size=32, num_workers=0, num_classes=3, rrc_scale=(0.5, 1.0))
    kw = dict(img_size=(16, 16), num_channels=3, seed=0, micro_batch_size=32, eval_batch_size=4)
    never = next(iter(build_loaders(data_config(**base, hflip=0.0), **kw).train))
    some = next(iter(build_loaders(data_config(**base, hflip=0.5), **kw).train))
    assert torch.equal(never["index"], some["index"]) and torch.equal(never["crop"], some["crop"])
    assert not never["flip"].any() and 0 < some["flip"].sum() < 32
    f = some["flip"]
    assert torch.equal(some["image"][f], never["image"][f].flip(-1))
    assert torch.equal(some["image"][~f], never["image"][~f])


def test_crop_fractions_describe_the_crop():
    cfg = data_config(format="synthetic", synthetic_size=8, num_workers=0, num_classes=3, hflip=0.0)
    tf = SampleTransform(cfg, (16, 16), 3, seed=0, train=True)
    img = torch.arange(64 * 64, dtype=torch.int32).view(1, 64, 64)
    img = torch.stack([(img // 64) * 4, (img % 64) * 4, torch.zeros_like(img)], 1)[0].to(torch.uint8)  # row/col ramps
    a = tf.tensor_train(img, epoch=0, index=3)
    t, lft, h, w = a.crop
    # the crop's top-left pixel of the output comes from the box's top-left region of the input
    assert abs(a.image[0, 0, 0].item() / 4 - t * 64) <= max(2.0, h * 64 / 16)
    assert abs(a.image[1, 0, 0].item() / 4 - lft * 64) <= max(2.0, w * 64 / 16)
