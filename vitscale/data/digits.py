"""scikit-learn's handwritten digits: 1,797 real 8x8 images (17 gray levels, 0..16), 10 classes.

Ships with scikit-learn, so no download. The split is fixed: stratified, ``random_state=0``,
300 validation images (30 per class, give or take one) and 1,497 training images. Images are
stored as uint8 (value * 255 / 16, rounded) and upsampled to the model size by the transforms
(RandomResizedCrop for training, resize for eval), replicated to 3 channels for RGB models.
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import ClassVar

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


# The validation split: the 300 indices scikit-learn's ``train_test_split(np.arange(1797), test_size=300,
# stratify=target, random_state=0, shuffle=True)`` picks (sorted). Kept here, so that reading the digits
# imports neither scikit-learn's model selection nor its datasets package (scipy and pandas: ~1.7 s of
# every run's start); tests/unit/test_digits_data.py checks both against scikit-learn itself.
VAL_INDICES = (
    21, 24, 28, 34, 35, 37, 39, 42, 45, 51, 57, 77, 78, 81, 87, 96, 99, 102, 103, 105, 110, 117, 119,
    131, 132, 134, 148, 159, 170, 186, 188, 197, 198, 202, 204, 205, 211, 214, 227, 240, 243, 245, 252,
    254, 264, 275, 279, 283, 286, 293, 305, 307, 308, 312, 326, 335, 339, 344, 346, 364, 372, 374, 376,
    386, 393, 397, 403, 405, 407, 413, 417, 420, 430, 433, 440, 442, 452, 454, 481, 496, 499, 500, 520,
    538, 553, 556, 565, 567, 568, 569, 573, 587, 593, 608, 610, 619, 637, 639, 641, 649, 652, 666, 667,
    675, 694, 700, 701, 702, 704, 705, 716, 719, 738, 741, 749, 760, 766, 767, 768, 770, 772, 783, 786,
    787, 788, 789, 800, 802, 805, 806, 808, 811, 812, 820, 822, 854, 855, 860, 865, 876, 885, 888, 890,
    899, 900, 908, 918, 926, 929, 937, 943, 945, 960, 973, 985, 989, 992, 997, 1002, 1003, 1005, 1006,
    1009, 1014, 1023, 1030, 1035, 1037, 1038, 1049, 1053, 1073, 1081, 1088, 1090, 1096, 1107, 1108,
    1116, 1118, 1121, 1123, 1136, 1141, 1148, 1151, 1152, 1159, 1161, 1162, 1167, 1168, 1173, 1180,
    1187, 1192, 1204, 1220, 1221, 1232, 1233, 1242, 1261, 1262, 1264, 1268, 1270, 1292, 1296, 1302,
    1312, 1319, 1330, 1331, 1332, 1340, 1350, 1351, 1352, 1364, 1371, 1372, 1375, 1395, 1404, 1405,
    1406, 1415, 1435, 1440, 1442, 1450, 1455, 1466, 1467, 1470, 1474, 1476, 1482, 1484, 1487, 1497,
    1505, 1509, 1512, 1513, 1520, 1530, 1532, 1541, 1542, 1551, 1558, 1566, 1567, 1582, 1592, 1596,
    1602, 1606, 1608, 1610, 1614, 1617, 1626, 1628, 1629, 1634, 1637, 1645, 1650, 1655, 1660, 1664,
    1666, 1668, 1673, 1680, 1688, 1691, 1696, 1703, 1706, 1716, 1717, 1726, 1728, 1734, 1742, 1745,
    1750, 1755, 1767, 1770, 1771, 1772, 1781, 1787, 1789, 1791,
)


def _csv() -> Path | None:
    """scikit-learn's ``datasets/data/digits.csv.gz`` (what ``sklearn.datasets.load_digits`` reads),
    found without importing scikit-learn; None where the installed release keeps it elsewhere."""
    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


@lru_cache(maxsize=1)
def _load() -> tuple[np.ndarray, np.ndarray]:
    """(images float (1797, 8, 8) in 0..16, targets int (1797,)): ``load_digits().images, .target``."""
    path = _csv()
    if path is None:  # another layout: scikit-learn's own reader
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.images, d.target
    with gzip.open(path, "rt") as f:  # 1797 rows of 64 gray levels and the digit, comma-separated
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


@lru_cache(maxsize=1)
def _split_indices() -> tuple[np.ndarray, np.ndarray]:
    val = np.asarray(VAL_INDICES, dtype=np.int64)
    return np.setdiff1d(np.arange(len(_load()[1])), val), val


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

    RANGES: ClassVar[dict[str, tuple]] = {"digits_sizes": (1, 512)}  # MAX_DIGITS_SIDE: held in memory
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    format: str = "digits_aspect"
    digits_sizes: tuple[tuple[int, int], ...] = ((24, 40), (32, 32), (40, 24))
    """The ``(height, width)`` sizes in pixels the images are stored at, one drawn per image (keyed by
    its split and index, the same in every run), stretched from 8x8 with bicubic resampling."""


def stretched(images: torch.Tensor, sizes, split: str) -> list[torch.Tensor]:
    """``images`` uint8 ``(N, C, 8, 8)``, each resized to one of ``sizes`` ((H, W)) drawn by its index."""
    from .decode import resize

    tag = SPLITS.index(split)
    out = []
    for i, img in enumerate(images):
        h, w = sizes[keyed.py_rng(tag, i, keyed.STREAM_SPLIT).randrange(len(sizes))]
        out.append(resize(img, (h, w), "bicubic"))
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
