"""Per-sample train / eval transforms, keyed by (seed, epoch, index).

Train: RandomResizedCrop (torchvision's box sampling, drawn from a keyed ``random.Random``) ->
horizontal flip -> RandAugment or ColorJitter (torchvision v2, run under a keyed global RNG) on
uint8 tensors; random erasing is sampled here (box + noise seed) and applied after normalisation
by the loader. Eval: resize to ``img_size / crop_pct`` + center crop. Normalisation happens per
batch in the loader (on the device when one is given), so workers move uint8 tensors only.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from torchvision.transforms import InterpolationMode, v2
from torchvision.transforms.v2 import functional as F

from ..errors import ConfigError
from . import keyed
from .config import DataConfig
from .decode import center_crop_box, decode_resized_crop

_INTERP = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}


def rrc_box(rng: random.Random, height: int, width: int, scale, ratio) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` drawing from ``rng``: (top, left, h, w)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return top, left, h, w
    in_ratio = width / height  # fallback: central crop
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def erase_params(rng: random.Random, prob: float, height: int, width: int) -> list[int]:
    """timm RandomErasing box (area 2%..1/3, aspect 0.3..3.3): [apply, top, left, h, w, noise_seed]."""
    if prob <= 0 or rng.random() >= prob:
        return [0, 0, 0, 0, 0, 0]
    area = height * width
    log_ratio = (math.log(0.3), math.log(1 / 0.3))
    for _ in range(10):
        target_area = rng.uniform(0.02, 1 / 3) * area
        aspect = math.exp(rng.uniform(*log_ratio))
        h = int(round(math.sqrt(target_area * aspect)))
        w = int(round(math.sqrt(target_area / aspect)))
        if 0 < w < width and 0 < h < height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return [1, top, left, h, w, rng.getrandbits(62)]
    return [0, 0, 0, 0, 0, 0]


def parse_randaugment(spec: str) -> tuple[int, int] | None:
    """``"m9-n2"`` (or ``"rand-m9-n2"``) -> (num_ops=2, magnitude=9); ``""`` -> None."""
    if not spec:
        return None
    num_ops, magnitude = 2, 9
    for tok in spec.split("-"):
        if tok in ("rand", ""):
            continue
        if tok[0] == "m" and tok[1:].isdigit():
            magnitude = int(tok[1:])
        elif tok[0] == "n" and tok[1:].isdigit():
            num_ops = int(tok[1:])
        else:
            raise ConfigError(f"data.randaugment: unknown token {tok!r} in {spec!r} (expected e.g. 'm9-n2')")
    return num_ops, magnitude


@dataclass
class Augmented:
    """One transformed sample before batching."""

    image: torch.Tensor  # uint8 (C, H, W)
    crop: tuple[float, float, float, float]  # (top, left, height, width) as fractions of the original
    flip: bool
    erase: list[int]


class SampleTransform:
    """Train or eval transform of one sample; the caller supplies the source-specific crop+resize."""

    def __init__(self, cfg: DataConfig, img_size: tuple[int, int], num_channels: int, seed: int, train: bool):
        self.cfg = cfg
        self.img_size = (int(img_size[0]), int(img_size[1]))
        self.num_channels = num_channels
        self.seed = int(seed)
        self.train = train
        if cfg.interpolation not in _INTERP:
            raise ValueError(f"data.interpolation must be one of {sorted(_INTERP)}, got {cfg.interpolation!r}")
        self.interpolation = cfg.interpolation
        self.photometric = None
        if train:
            ra = parse_randaugment(cfg.randaugment)
            if ra is not None:
                self.photometric = v2.RandAugment(num_ops=ra[0], magnitude=ra[1], interpolation=_INTERP[cfg.interpolation])
            elif cfg.color_jitter > 0:
                cj = float(cfg.color_jitter)
                self.photometric = v2.ColorJitter(brightness=cj, contrast=cj, saturation=cj)

    # --- randomness -------------------------------------------------------------------------------
    def rng(self, epoch: int, index: int) -> random.Random:
        return keyed.py_rng(self.seed, epoch, index, keyed.STREAM_SAMPLE)

    def box_fn(self, rng: random.Random):
        """``(H, W) -> (top, left, h, w)`` drawing the RandomResizedCrop box from ``rng``."""
        return lambda h, w: rrc_box(rng, h, w, self.cfg.rrc_scale, self.cfg.rrc_ratio)

    # --- tensor sources (digits, synthetic) -------------------------------------------------------
    def tensor_train(self, image: torch.Tensor, epoch: int, index: int) -> Augmented:
        rng = self.rng(epoch, index)
        h0, w0 = image.shape[-2:]
        top, left, h, w = rrc_box(rng, h0, w0, self.cfg.rrc_scale, self.cfg.rrc_ratio)
        out = F.resized_crop(image, top, left, h, w, list(self.img_size), interpolation=_INTERP[self.interpolation], antialias=True)
        return self.finish(out, rng, (top / h0, left / w0, h / h0, w / w0), epoch, index)

    def tensor_eval(self, image: torch.Tensor) -> Augmented:
        from .decode import center_crop_box

        h0, w0 = image.shape[-2:]
        top, left, h, w = center_crop_box(h0, w0, self.img_size, self.cfg.crop_pct)
        oh, ow = self.img_size
        if self.cfg.crop_pct >= 1.0 and (h, w) == (h0, w0):
            out = F.resize(image, [oh, ow], interpolation=_INTERP[self.interpolation], antialias=True)
        else:  # resize so the box becomes img_size, then cut the box out
            rh, rw = round(h0 * oh / h), round(w0 * ow / w)
            out = F.resize(image, [rh, rw], interpolation=_INTERP[self.interpolation], antialias=True)
            out = F.center_crop(out, [oh, ow])
        return Augmented(out, (top / h0, left / w0, h / h0, w / w0), False, [0] * 6)

    # --- shared tail ------------------------------------------------------------------------------
    def decode(self, src, epoch: int, slot: int, fast: bool = True) -> Augmented:
        """Decode ``src`` (a path or the encoded bytes) straight to the crop this sample draws
        (train: RandomResizedCrop keyed by (epoch, slot); eval: center crop), then augment it.
        Raises ``BadImageError`` for an undecodable image."""
        if self.train:
            rng = self.rng(epoch, slot)
            box_fn = self.box_fn(rng)
        else:
            rng = None
            box_fn = lambda h, w: center_crop_box(h, w, self.img_size, self.cfg.crop_pct)  # noqa: E731
        t, (top, left, h, w), (h0, w0) = decode_resized_crop(
            src, box_fn, self.img_size, num_channels=self.num_channels, interpolation=self.interpolation, fast=fast,
            max_pixels=self.cfg.max_image_pixels,
        )
        crop = (top / h0, left / w0, h / h0, w / w0)
        if not self.train:
            return Augmented(t, crop, False, [0] * 6)
        return self.finish(t, rng, crop, epoch, slot)

    def finish(self, image: torch.Tensor, rng: random.Random, crop, epoch: int, index: int) -> Augmented:
        """Flip, photometric augmentation and the random-erasing draw of a resized uint8 crop."""
        flip = self.cfg.hflip > 0 and rng.random() < self.cfg.hflip
        if flip:
            image = image.flip(-1)
        if self.photometric is not None:
            with keyed.seeded_global_torch_rng(self.seed, epoch, index, keyed.STREAM_TORCH):
                image = self.photometric(image)
        erase = erase_params(rng, self.cfg.random_erasing, self.img_size[0], self.img_size[1])
        return Augmented(image.contiguous(), tuple(float(c) for c in crop), bool(flip), erase)
