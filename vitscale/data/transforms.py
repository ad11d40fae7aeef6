"""Per-sample train / eval transforms, keyed by (seed, epoch, index) — and the repeat, for the second
and later repeats of an image in an epoch (``data.repeated_aug``; :meth:`SampleTransform.repeated`).

Train: RandomResizedCrop (torchvision's box sampling, drawn from a keyed ``random.Random``) ->
horizontal flip -> ``data.auto_augment`` then ``data.color_jitter`` (:mod:`vitscale.data.auto_augment`,
drawn from their own keyed ``random.Random``); random erasing is sampled here (box + noise seed) and
applied after normalisation by the loader. Eval (``data.eval_crop_mode``, timm's ``crop_mode``): the
whole image resized (``center``: the shorter side to ``img_size / crop_pct``; ``squash``: both sides;
``border``: the longer side), then the centre ``img_size`` cut out, padded where the image is smaller
(``crop_pct`` > 1: zeros; ``border``: the mean colour) — in the order timm's and open_clip's
evaluation transforms take, so a pixel lands where theirs does.
Normalisation happens per batch in the loader (on the device when one is given), so workers move
uint8 tensors only.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass

import torch
from ..config.data import DataConfig
from . import keyed
from .auto_augment import build_augment
from .decode import INTERPOLATIONS, crop_or_pad, decode_resized_crop, eval_resize_size, resize, resized_crop
from .naflex import fit_grid

EVAL_CROP_MODES = ("center", "squash", "border")


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


@dataclass
class Augmented:
    """One transformed sample before batching."""

    image: torch.Tensor  # uint8 (C, H, W)
    crop: tuple[float, float, float, float]  # (top, left, height, width) as fractions of the original
    flip: bool
    erase: list[int]


class SampleTransform:
    """Train or eval transform of one sample; the caller supplies the source-specific crop+resize."""

    def __init__(self, cfg: DataConfig, img_size: tuple[int, int], num_channels: int, seed: int, train: bool,
                 *, patch: int = 0, seq_len: int = 0):  # fmt: skip
        self.cfg = cfg
        self.img_size = (int(img_size[0]), int(img_size[1]))
        # NaFlex (seq_len > 0): each image is resized to the patch grid that fits seq_len keeping its
        # aspect ratio (vitscale.data.naflex.fit_grid) instead of to img_size
        self.patch, self.seq_len = int(patch), int(seq_len)
        self.num_channels = num_channels
        self.seed = int(seed)
        self.train = train
        self.repeat = 0  # which repeat of its image in the epoch a sample is (data.repeated_aug)
        if cfg.interpolation not in INTERPOLATIONS:
            raise ValueError(f"data.interpolation must be one of {sorted(INTERPOLATIONS)}, got {cfg.interpolation!r}")
        self.interpolation = cfg.interpolation  # evaluation's
        self.train_interpolation = cfg.train_interpolation or cfg.interpolation  # may be "random"
        if cfg.eval_crop_mode not in EVAL_CROP_MODES:
            raise ValueError(f"data.eval_crop_mode must be one of {', '.join(EVAL_CROP_MODES)}, got {cfg.eval_crop_mode!r}")
        self.augment = None
        if train:  # a ConfigError naming the key for a bad policy string or jitter
            self.augment = build_augment(cfg.auto_augment, cfg.color_jitter, mean=cfg.mean, interpolation=self.train_interpolation,
                                         force_color_jitter=cfg.force_color_jitter)  # fmt: skip

    def at(self, size: int) -> SampleTransform:
        """This transform at another size: a square image side (multi-resolution) or, for NaFlex, a
        sequence length (a step's size, :mod:`vitscale.data.sizes`)."""
        other = copy.copy(self)
        if self.seq_len:
            other.seq_len = int(size)
        else:
            other.img_size = (int(size), int(size))
        return other

    def out_size(self, h: float, w: float) -> tuple[int, int]:
        """The output (H, W) of a crop of ``h x w`` pixels: ``img_size``, or for NaFlex the grid that
        fits the sequence length at the crop's aspect ratio, in pixels."""
        if not self.seq_len:
            return self.img_size
        gh, gw = fit_grid(h, w, self.seq_len, self.patch)
        return gh * self.patch, gw * self.patch

    def ratio(self, h0: int, w0: int) -> tuple[float, float]:
        """RandomResizedCrop's aspect-ratio range for an ``h0 x w0`` image: ``rrc_ratio``; NaFlex
        keeps the image's own aspect ratio, so the range is relative to it (``rrc_ratio`` x w0 / h0)."""
        lo, hi = self.cfg.rrc_ratio
        return (lo * w0 / h0, hi * w0 / h0) if self.seq_len else (lo, hi)

    def repeated(self, repeat: int) -> SampleTransform:
        """This transform for repeat ``repeat`` of an image in its epoch (``data.repeated_aug``): every
        draw keyed by ``(seed, epoch, index, stream, repeat)``, so each repeat gets its own crop, flip,
        policy and erasing; repeat 0 keeps the keys without it, the same draws as without repeats."""
        other = copy.copy(self)
        other.repeat = int(repeat)
        return other

    # --- randomness -------------------------------------------------------------------------------
    def _key(self, epoch: int, index: int, stream: int) -> tuple[int, ...]:
        parts = (self.seed, epoch, index, stream)
        return parts + (self.repeat,) if self.repeat else parts

    def rng(self, epoch: int, index: int) -> random.Random:
        return keyed.py_rng(*self._key(epoch, index, keyed.STREAM_SAMPLE))

    def crop_interpolation(self, epoch: int, index: int) -> str:
        """The training crop's resampling: ``train_interpolation``, or for ``random`` bilinear or bicubic
        drawn from its own key (so the crop box is the same as with a fixed filter)."""
        if self.train_interpolation != "random":
            return self.train_interpolation
        return keyed.py_rng(*self._key(epoch, index, keyed.STREAM_INTERPOLATION)).choice(("bilinear", "bicubic"))

    def box_fn(self, rng: random.Random):
        """``(H, W) -> (top, left, h, w)`` drawing the RandomResizedCrop box from ``rng``."""
        return lambda h, w: rrc_box(rng, h, w, self.cfg.rrc_scale, self.ratio(h, w))

    # --- tensor sources (digits, synthetic) -------------------------------------------------------
    def tensor_train(self, image: torch.Tensor, epoch: int, index: int) -> Augmented:
        rng = self.rng(epoch, index)
        h0, w0 = image.shape[-2:]
        top, left, h, w = rrc_box(rng, h0, w0, self.cfg.rrc_scale, self.ratio(h0, w0))
        out = resized_crop(image, top, left, h, w, self.out_size(h, w), self.crop_interpolation(epoch, index))
        return self.finish(out, rng, (top / h0, left / w0, h / h0, w / w0), epoch, index)

    def tensor_eval(self, image: torch.Tensor) -> Augmented:
        h0, w0 = image.shape[-2:]
        if self.seq_len:  # NaFlex: the whole image at its aspect ratio, fitted to the sequence length
            out = resize(image, self.out_size(h0, w0), self.interpolation)
            return Augmented(out, (0.0, 0.0, 1.0, 1.0), False, [0] * 6)
        size = self.eval_size(h0, w0)
        out = resize(image, size, self.interpolation)
        return self.eval_crop(out)

    # --- evaluation: resize the whole image, then crop / pad the centre ----------------------------
    def eval_size(self, height: int, width: int) -> tuple[int, int]:
        """The size the whole image is resized to before :meth:`eval_crop` (``eval_crop_mode``, ``crop_pct``)."""
        return eval_resize_size(height, width, self.img_size, self.cfg.crop_pct, self.cfg.eval_crop_mode)

    def eval_crop(self, image: torch.Tensor) -> Augmented:
        """The centre ``img_size`` of the resized image, padded where it is smaller: zeros (torchvision's
        ``CenterCrop``, which timm's ``center`` / ``squash`` end with), or for ``border`` the mean colour
        ``round(255 x mean)`` (timm's ``CenterCropOrPad(fill=...)``)."""
        fill: list[int] | int = 0
        if self.cfg.eval_crop_mode == "border":
            mean = list(self.cfg.mean)
            mean = [sum(mean) / len(mean)] if self.num_channels == 1 and len(mean) != 1 else mean
            fill = [round(255 * m) for m in mean]
        _, h, w = image.shape
        out, (top, left, oh, ow) = crop_or_pad(image, self.img_size, fill)
        # the output's window as fractions of the original (the resize scales the whole image): past
        # [0, 1] where it was padded
        return Augmented(out.contiguous(), (top / h, left / w, oh / h, ow / w), False, [0] * 6)

    # --- shared tail ------------------------------------------------------------------------------
    def decode(self, src, epoch: int, slot: int, fast: bool = True) -> Augmented:
        """Decode ``src`` (a path or the encoded bytes) straight to the crop this sample draws
        (train: RandomResizedCrop keyed by (epoch, slot), then augmented; eval: the whole image resized
        to :meth:`eval_size`, then :meth:`eval_crop`).
        Raises ``BadImageError`` for an undecodable image."""
        if not self.train and not self.seq_len:  # the whole image, resized as eval_size says, then cut / padded
            t, _, _ = decode_resized_crop(
                src, lambda h, w: (0, 0, h, w), self.eval_size, num_channels=self.num_channels,
                interpolation=self.interpolation, fast=fast, max_pixels=self.cfg.max_image_pixels,
            )  # fmt: skip
            return self.eval_crop(t)
        interpolation = self.interpolation
        if self.train:
            rng = self.rng(epoch, slot)
            box_fn = self.box_fn(rng)
            interpolation = self.crop_interpolation(epoch, slot)
        else:  # NaFlex: the whole image
            rng = None
            box_fn = lambda h, w: (0, 0, h, w)  # noqa: E731
        t, (top, left, h, w), (h0, w0) = decode_resized_crop(
            src, box_fn, self.out_size if self.seq_len else self.img_size, num_channels=self.num_channels, interpolation=interpolation, fast=fast,
            max_pixels=self.cfg.max_image_pixels,
        )
        crop = (top / h0, left / w0, h / h0, w / w0)
        if not self.train:
            return Augmented(t, crop, False, [0] * 6)
        return self.finish(t, rng, crop, epoch, slot)

    def finish(self, image: torch.Tensor, rng: random.Random, crop, epoch: int, index: int) -> Augmented:
        """Flip, ``auto_augment`` / colour jitter and the random-erasing draw of a resized uint8 crop."""
        flip = self.cfg.hflip > 0 and rng.random() < self.cfg.hflip
        if flip:
            image = image.flip(-1)
        if self.augment is not None:
            image = self.augment(image, keyed.py_rng(*self._key(epoch, index, keyed.STREAM_AUGMENT)))
        erase = erase_params(rng, self.cfg.random_erasing, image.shape[-2], image.shape[-1])
        return Augmented(image.contiguous(), tuple(float(c) for c in crop), bool(flip), erase)
