"""scikit-learn's handwritten digits: 1,797 real 8x8 images (17 gray levels, 0..16), 10 classes.

Ships with scikit-learn, so no download. The split is fixed: stratified, ``random_state=0``,
300 validation images (30 per class, give or take one) and 1,497 training images. Images are
stored as uint8 (value * 255 / 16, rounded) and upsampled to the model size by the transforms
(RandomResizedCrop for training, resize for eval), replicated to 3 channels for RGB models.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from ..config.data import DataConfig
from ..errors import CheckError
from . import keyed
from .formats import SPLITS, DataFormat, Split, register_format
from .sizes import check_seq_lens, min_patches_for

NUM_CLASSES = 10
VAL_SIZE = 300
# Class i is the digit i, named as a word: the same names for data.format=digits, the image folder
# `vitscale data digits` writes (with a classnames.txt keeping this order) and an exported model's labels.
CLASS_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

# Captions of digit images (CLIP): the captioned shards ``vitscale data digits-captions`` writes and
# the CLIP task's templates for the labelled digits; ``{}`` = the class name.
DIGIT_CAPTION_TEMPLATES = (
    "a photo of the number {}.",
    "a drawing of the number {}.",
    "a handwritten {}.",
    "a blurry photo of the digit {}.",
    "the number {}, written by hand.",
    "a low resolution image of a {}.",
)
# Prompts of the zero-shot classifier on the digits (the text embedding is averaged over them).
DIGIT_ZEROSHOT_TEMPLATES = (
    "a photo of the number {}.",
    "a handwritten {}.",
    "a blurry photo of the digit {}.",
)


@lru_cache(maxsize=1)
def _load() -> tuple[np.ndarray, np.ndarray]:
    """(images float (1797, 8, 8) in 0..16, targets int (1797,))."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target


@lru_cache(maxsize=1)
def _split_indices() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    y = _load()[1]
    train_idx, val_idx = train_test_split(
        np.arange(len(y)), test_size=VAL_SIZE, stratify=y, random_state=0, shuffle=True
    )
    return np.sort(train_idx), np.sort(val_idx)


def load_digits_split(split: str, num_channels: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images uint8 (N, C, 8, 8), labels long (N,))`` of the ``train`` or ``val`` split."""
    images, targets = _load()
    train_idx, val_idx = _split_indices()
    idx = {"train": train_idx, "val": val_idx}[split]
    x = np.rint(images[idx] * (255.0 / 16.0)).astype(np.uint8)  # (N, 8, 8), 0..16 -> 0..255
    images = torch.from_numpy(x)[:, None].expand(-1, num_channels, -1, -1).contiguous()  # (N, C, 8, 8)
    labels = torch.from_numpy(targets[idx].astype(np.int64))
    return images, labels


def write_digits_folders(out_dir: str, size: int = 32) -> dict[str, int]:
    """Write the digits split as PNG image folders ``out_dir/{train,val}/<class>/<n>.png`` (bicubic
    upsampling to ``size``; 8 = native), class folders ``zero`` ... ``nine``, and
    ``out_dir/classnames.txt`` listing them in digit order (an image folder's class order); returns
    {split: number of images}."""
    import os

    from PIL import Image

    from .classes import CLASSNAMES_FILE

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, CLASSNAMES_FILE), "w") as f:
        f.write("\n".join(CLASS_NAMES) + "\n")
    counts = {}
    for split in ("train", "val"):
        images, labels = load_digits_split(split, num_channels=1)  # (N, 1, 8, 8) uint8
        for name in CLASS_NAMES:
            os.makedirs(os.path.join(out_dir, split, name), exist_ok=True)
        for n, (img, y) in enumerate(zip(images, labels.tolist())):
            pil = Image.fromarray(img[0].numpy(), mode="L")
            if size and size != 8:
                pil = pil.resize((size, size), Image.Resampling.BICUBIC)
            pil.save(os.path.join(out_dir, split, CLASS_NAMES[y], f"{n:04d}.png"))
        counts[split] = len(labels)
    return counts


# ----------------------------------------------------------------------------- data.format=digits
def digits_split(cfg, name: str, *, img_size, num_channels: int, seed: int, classes=None) -> Split:
    from .sources import TensorSource

    return Split(TensorSource(*load_digits_split(name, num_channels)), list(CLASS_NAMES))


@dataclass
class DigitsData(DataConfig):
    """``data.format=digits``: the common fields only (the digits have their fixed 1,497 / 300 split)."""

    format: str = "digits"


FORMAT = register_format(DataFormat(
    "digits", digits_split, config=DigitsData, class_names=lambda cfg: list(CLASS_NAMES),
    summary="scikit-learn's handwritten digits (1,497 train / 300 val, 8x8), no files needed",
))  # fmt: skip


# ---------------------------------------------------------------------- data.format=digits_aspect
@dataclass
class DigitsAspectData(DataConfig):
    """``data.format=digits_aspect``."""

    format: str = "digits_aspect"
    digits_sizes: tuple[tuple[int, int], ...] = ((24, 40), (32, 32), (40, 24))
    """The ``(height, width)`` sizes in pixels the images are stored at, one drawn per image (keyed by
    its split and index, the same in every run), stretched from 8x8 with bicubic resampling."""


def stretched(images: torch.Tensor, sizes, split: str) -> list[torch.Tensor]:
    """``images`` uint8 ``(N, C, 8, 8)``, each resized to one of ``sizes`` ((H, W)) drawn by its index."""
    from torchvision.transforms.v2 import functional as F

    tag = SPLITS.index(split)
    out = []
    for i, img in enumerate(images):
        h, w = sizes[keyed.py_rng(tag, i, keyed.STREAM_SPLIT).randrange(len(sizes))]
        out.append(F.resize(img, [int(h), int(w)], interpolation=F.InterpolationMode.BICUBIC, antialias=True))
    return out


def digits_aspect_split(cfg, name: str, *, img_size, num_channels: int, seed: int, classes=None) -> Split:
    from .sources import TensorSource

    images, labels = load_digits_split(name, num_channels)
    return Split(TensorSource(stretched(images, cfg.digits_sizes, name), labels), list(CLASS_NAMES))


MAX_DIGITS_SIDE = 512


def _check_aspect(cfg) -> None:
    if not cfg.digits_sizes:
        raise CheckError("data.digits_sizes is empty: give the (height, width) sizes, e.g. [[24, 40], [32, 32], [40, 24]]")
    for hw in cfg.digits_sizes:
        if len(hw) != 2 or min(hw) < 1:
            raise CheckError(f"data.digits_sizes: {list(hw)} is not a (height, width) in pixels, e.g. [24, 40]")
        if max(hw) > MAX_DIGITS_SIDE:  # every image is held in memory at its size: 1,797 x h x w x 3 bytes
            raise CheckError(f"data.digits_sizes: {list(hw)} is larger than the demo holds in memory: sides up to "
                             f"{MAX_DIGITS_SIDE} px (the digits are 8x8 scans)")  # fmt: skip
    check_seq_lens(cfg, min_patches_for(cfg.digits_sizes))


ASPECT = register_format(DataFormat(
    "digits_aspect", digits_aspect_split, config=DigitsAspectData, check=_check_aspect,
    class_names=lambda cfg: list(CLASS_NAMES),
    summary="the digits stretched to several aspect ratios (data.digits_sizes, default 24x40, 32x32, 40x24 px): NaFlex demos",
))  # fmt: skip
