"""``data.format=synthetic``: random uint8 images of the model size keyed by (seed, index), with
deterministic labels (``data.num_classes``, default 1000), through the same transforms as real
images (recipe tests, benchmarks). ``data.val_split`` sizes a separate validation set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config.data import DataConfig, ValSplitField
from .formats import DataFormat, Split, register_format
from .sources import SyntheticSource

DEFAULT_CLASSES = 1000
VAL_KEY = 1_000_003  # the val set is keyed apart, so its images differ from the training images


@dataclass
class SyntheticData(ValSplitField, DataConfig):
    """``data.format=synthetic``."""

    RANGES: ClassVar[dict[str, tuple]] = {"synthetic_size": (1, 1 << 30)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    format: str = "synthetic"
    synthetic_size: int = 1024
    """Number of training images (the validation set has ``round(synthetic_size * data.val_split)``)."""


def _classes(cfg) -> list[str]:
    return [str(i) for i in range(cfg.num_classes or DEFAULT_CLASSES)]


def synthetic_split(cfg, name: str, *, img_size, num_channels: int, seed: int, classes=None) -> Split | None:
    names = _classes(cfg)
    if name == "train":
        return Split(SyntheticSource(cfg.synthetic_size, len(names), img_size, num_channels, seed), names)
    n_val = int(round(cfg.synthetic_size * cfg.val_split))
    if n_val <= 0:
        return None
    return Split(SyntheticSource(n_val, len(names), img_size, num_channels, seed + VAL_KEY), names)


FORMAT = register_format(DataFormat(
    "synthetic", synthetic_split, config=SyntheticData, class_names=_classes,
    summary="random images keyed by (seed, index), deterministic labels",
))  # fmt: skip

__all__ = ["FORMAT", "SyntheticData", "synthetic_split"]
