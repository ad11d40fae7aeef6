"""The evaluation transform against its references on real photos, through vitscale's own decode path.

``data.eval_crop_mode`` (``center`` / ``squash`` / ``border``) and ``data.crop_pct`` (above 1: the
image padded with zeros) against timm's ``create_transform(is_training=False, crop_mode=...)``
(``timm/data/transforms_factory.py``), and the CLIP recipe's evaluation against open_clip's
``image_transform(224, is_train=False)`` (resize the shorter side to 224 bicubic, centre crop), on
scikit-learn's two sample photos (427 x 640) written as PNG files (lossless: the decoders agree) and
read by ``SampleTransform.decode`` (the file path of every image-file format) and
``SampleTransform.tensor_eval`` (in-memory images, the export's check): within 1 grey level (but for
at most 4 values within 2: the two libraries' uint8 bicubic rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vitscale.config import load_config
from vitscale.data import DataConfig, data_config
from vitscale.data.decode import eval_resize_size, pil_to_uint8_tensor
from vitscale.data.transforms import SampleTransform

timm_data = pytest.importorskip("timm.data")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from sklearn.datasets import load_sample_images

    folder = tmp_path_factory.mktemp("photos")
    paths = []
    for name, a in zip(("china", "flower"), load_sample_images().images):
        paths.append(folder / f"{name}.png")
        Image.fromarray(a).save(paths[-1])
    return paths


def _close(ours: torch.Tensor, ref: np.ndarray, what: str) -> None:
    ref = ref.transpose(2, 0, 1) if ref.shape[-1] == 3 else ref  # PIL: (H, W, C)
    assert tuple(ours.shape) == ref.shape, what
    diff = np.abs(ours.numpy().astype(np.int16) - ref.astype(np.int16))
    # within 1 grey level; torchvision's uint8 bicubic (vitscale's resampler) and PIL's (the references')
    # round a few values apart: at 384 px squash, 1 or 2 of 442,368 values are 2 levels apart
    assert diff.max() <= 2 and (diff > 1).sum() <= 4, f"{what}: {int((diff > 1).sum())} values more than 1 grey level apart"


def _ours(cfg: DataConfig, size, path):
    tf = SampleTransform(cfg, size, 3, 0, train=False)
    from_file = tf.decode(str(path), 0, 0, fast=False).image
    in_memory = tf.tensor_eval(pil_to_uint8_tensor(Image.open(path).convert("RGB"))).image
    return from_file, in_memory


def test_eval_resize_size_by_hand():
    # 100 x 200, out 87, crop_pct 0.875: scale floor(87 / 0.875) = 99
    assert eval_resize_size(100, 200, (87, 87), 0.875, "center") == (99, 198)  # short side 99, long int(99 x 2)
    assert eval_resize_size(100, 200, (87, 87), 0.875, "squash") == (99, 99)  # the whole image to the square
    assert eval_resize_size(100, 300, (87, 87), 0.875, "border") == (33, 99)  # the long side to 99
    # VOLO-D4 at 224 px, crop_pct 1.15: the short side of a 427 x 640 photo to floor(224 / 1.15) = 194
    assert eval_resize_size(427, 640, (224, 224), 1.15, "center") == (194, 290)
    assert eval_resize_size(8, 8, (32, 32), 1.0, "center") == (32, 32)


@pytest.mark.parametrize("mode", ["center", "squash", "border"])
@pytest.mark.parametrize("crop_pct,interpolation,size", [(0.875, "bilinear", (224, 224)), (1.0, "bicubic", (224, 224)),
                                                         (1.15, "bicubic", (224, 224)), (0.9, "bilinear", (160, 200))])  # fmt: skip
def test_eval_transform_matches_timm(mode, crop_pct, interpolation, size, photos):
    cfg = data_config(crop_pct=crop_pct, interpolation=interpolation, eval_crop_mode=mode)
    ref_tf = timm_data.create_transform((3, *size), is_training=False, crop_pct=crop_pct, crop_mode=mode,
                                        interpolation=interpolation, use_prefetcher=True)  # uint8, unnormalised  # fmt: skip
    for path in photos:
        ref = np.asarray(ref_tf(Image.open(path).convert("RGB")))
        for ours, how in zip(_ours(cfg, size, path), ("decode", "tensor_eval")):
            _close(ours, ref, f"{path.name} {mode} crop_pct={crop_pct} {interpolation} {size} ({how})")


def test_crop_pct_above_one_pads_with_zeros_as_timm(photos):
    # VOLO-D4/D5's evaluation: the short side to 194, the centre 224 of the long side, 15 rows of zeros
    # above and below (timm's transforms; sail-sg/volo validate.py builds them) — not a stretched image
    cfg = load_config("imagenet_volo_d4").data
    assert (cfg.crop_pct, cfg.eval_crop_mode) == (1.15, "center")
    ours = _ours(cfg, (224, 224), photos[0])[0]
    assert ours[:, :15].eq(0).all() and ours[:, -15:].eq(0).all() and ours[:, 15:-15].float().mean() > 40
    ref_tf = timm_data.create_transform(224, is_training=False, crop_pct=cfg.crop_pct, interpolation=cfg.interpolation,
                                        use_prefetcher=True)  # fmt: skip
    _close(ours, np.asarray(ref_tf(Image.open(photos[0]).convert("RGB"))), "imagenet_volo_d4")
    # the batch's "crop": the output's window on the 194 x 290 resized photo, as fractions: 15 rows
    # above it (padding), the columns from round((290 - 224) / 2) = 33
    aug = SampleTransform(cfg, (224, 224), 3, 0, train=False).decode(str(photos[0]), 0, 0, fast=False)
    assert aug.crop == pytest.approx((-15 / 194, 33 / 290, 224 / 194, 224 / 290))


def test_the_vit_fine_tune_evaluates_the_whole_image_squashed(photos):
    cfg = load_config("imagenet21k_vit_b16_ft384").data
    assert (cfg.crop_pct, cfg.eval_crop_mode) == (1.0, "squash")
    ref_tf = timm_data.create_transform(384, is_training=False, crop_pct=1.0, crop_mode="squash",
                                        interpolation=cfg.interpolation, use_prefetcher=True)  # fmt: skip
    for path in photos:
        _close(_ours(cfg, (384, 384), path)[0], np.asarray(ref_tf(Image.open(path).convert("RGB"))), path.name)


@pytest.mark.parametrize("recipe", ["laion400m_clip_b32", "clip_b32_locked_image"])
def test_the_clip_recipes_evaluate_as_open_clip(recipe, photos):
    open_clip_transform = pytest.importorskip("open_clip.transform")
    cfg = load_config(recipe).data
    ref_tf = open_clip_transform.image_transform(224, is_train=False, mean=cfg.mean, std=cfg.std)
    mean, std = torch.tensor(cfg.mean).view(3, 1, 1), torch.tensor(cfg.std).view(3, 1, 1)
    for path in photos:
        ref = ref_tf(Image.open(path)) * std + mean  # (3, 224, 224) in [0, 1]
        ref = (ref * 255).round().clamp(0, 255).to(torch.uint8).numpy()
        for ours, how in zip(_ours(cfg, (224, 224), path), ("decode", "tensor_eval")):
            _close(ours, ref, f"{path.name} ({how})")


def test_an_unknown_mode_is_refused_in_one_line():
    from vitscale.config import ConfigError

    with pytest.raises(ConfigError, match="data.eval_crop_mode: 'squish' is not one of center, squash, border"):
        load_config("digits_vit", ["data.eval_crop_mode=squish"])
