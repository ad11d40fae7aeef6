"""Multi-label accuracy in the format of the ImageNet "ReaL" labels: the ``real`` evaluator.

Beyer et al. 2020, "Are we done with ImageNet?" (arXiv 2006.07159), relabelled the ImageNet validation
images: each image has a list of the classes that are correct for it (``real.json`` of
github.com/google-research/reassessed-imagenet: one list of class indices per validation image, in the
order of the images' file names). A top-1 prediction counts as correct when it is in its image's
list; images whose list is empty (no class fits) are left out. Any split can be scored this way: the
file holds one list per image of the split, in the split's order (the batches' ``index``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError
from .classification import count_top1
from .evaluator import Evaluator, EvaluatorConfig, register_evaluator

MAX_LABELS_FILE = 256 << 20  # bytes: ImageNet's real.json is about 1 MB


@dataclass
class RealConfig(EvaluatorConfig):
    """``kind: real``: top-1 counted correct when the prediction is in the image's list of labels."""

    labels: str = ""
    """A JSON file: a list with one list of correct class indices per image of the split, in the
    split's order (ImageNet's ``real.json``); an empty list leaves its image out."""


def read_label_lists(path: str | Path, num_classes: int) -> list[list[int]]:
    """The lists of ``path``, checked: a JSON list of lists of class indices below ``num_classes``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"real: labels={str(path)!r} is not a file (a JSON list of label lists, as real.json)")
    if path.stat().st_size > MAX_LABELS_FILE:
        raise ConfigError(f"real: {path} is larger than {MAX_LABELS_FILE >> 20} MB: not a label file")
    try:
        lists = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"real: {path} is not JSON ({e})") from None
    ok = isinstance(lists, list) and all(
        isinstance(row, list) and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < num_classes for c in row)
        for row in lists
    )
    if not ok:
        raise ConfigError(f"real: {path} must be a list of lists of class indices (0 to {num_classes - 1}), one per image")
    return lists


def padded(lists: list[list[int]], device) -> torch.Tensor:
    """``(N, L)`` long: each image's classes, padded with -1 (never a prediction)."""
    width = max((len(row) for row in lists), default=0) or 1
    out = torch.full((len(lists), width), -1, dtype=torch.long)
    for i, row in enumerate(lists):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out.to(device)


def real_hits(pred: torch.Tensor, index: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(images counted, correct) of one batch: ``pred`` (B,) top-1 classes, ``index`` (B,) the images'
    rows of ``table`` (-1: a padding sample), ``table`` (N, L) from :func:`padded`."""
    rows = table[index.clamp(min=0)]  # (B, L)
    counted = (index >= 0) & (rows[:, 0] >= 0)  # an empty list has -1 first
    return counted.sum(), (counted & (rows == pred.unsqueeze(1)).any(1)).sum()


class Real(Evaluator):
    config = RealConfig
    default_name = "real"

    def __init__(self, cfg: RealConfig, ctx):
        super().__init__(cfg, ctx)
        self.loader = ctx.data.loader(cfg.data, cfg.split, cfg.batch_size)
        lists = read_label_lists(cfg.labels, max(ctx.data.classes(cfg.data)[0], len(ctx.class_names)))
        size = len(getattr(self.loader, "dataset", lists))
        if len(lists) != size:
            raise ConfigError(f"real: {cfg.labels} has {len(lists)} label lists, the {cfg.split} split {size} images")
        self.table = padded(lists, ctx.device)

    def __call__(self, model):
        return count_top1(model, self.loader, self.ctx,
                          lambda logits, b: real_hits(logits.float().argmax(-1), b["index"], self.table))  # fmt: skip

register_evaluator("real", Real)

__all__ = ["Real", "RealConfig", "padded", "read_label_lists", "real_hits"]
