"""Class-subset accuracy: the ``class_subset`` evaluator, for test sets of a subset of the model's classes.

ImageNet-A (Hendrycks et al., "Natural Adversarial Examples", arXiv 1907.07174) and ImageNet-R ("The
Many Faces of Robustness", arXiv 2006.16241) hold 200 of ImageNet's 1,000 classes; a 1k-class model is
scored on them with its logits restricted to those 200 classes before the argmax (their code keeps
the 200 columns of the output). The subset is given as its class indices in the model's label space
or as class names of the run's data (the ImageNet-R authors publish the 200 WordNet ids), in the list
or in a file (one per line).

The data's labels are either indices of the model's classes (``labels: model``: images of classes
outside the subset are left out) or positions in the subset (``labels: subset``: label i is the
subset's i-th class, as an image folder holding only the subset's class folders, in the same order).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from ..errors import ConfigError
from .classification import count_top1
from .evaluator import Evaluator, EvaluatorConfig, register_evaluator

MAX_CLASSES_FILE = 16 << 20  # bytes: far above a list of 21k class names


@dataclass
class ClassSubsetConfig(EvaluatorConfig):
    """``kind: class_subset``: top-1 with the logits restricted to a subset of the model's classes."""

    classes: tuple[int | str, ...] = ()
    """The subset: class indices of the model, or class names of the run's data (e.g. WordNet ids)."""
    classes_file: str | None = None
    """A text file listing the subset instead, one class index or name per line."""
    labels: Literal["model", "subset"] = "model"
    """What the data's labels are: ``model`` (indices of the model's classes; images of other classes
    are left out) or ``subset`` (label i = the subset's i-th class: an ImageNet-A/R folder)."""


def subset_indices(cfg: ClassSubsetConfig, class_names: list[str], num_classes: int) -> list[int]:
    """The subset as indices of the model's classes, checked: known, in range, no repeats."""
    items: list = list(cfg.classes)
    if cfg.classes_file:
        path = Path(cfg.classes_file)
        if path.stat().st_size > MAX_CLASSES_FILE:
            raise ConfigError(f"classes_file={path}: larger than {MAX_CLASSES_FILE >> 20} MB, not a class list")
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        items += [int(x) if x.isdigit() else x for x in lines]
    if not items:
        raise ConfigError("class_subset: the subset is empty: set classes: [...] or classes_file")
    where = {name: i for i, name in enumerate(class_names)}
    out = []
    for c in items:
        i = c if isinstance(c, int) else where.get(c)
        if i is None:
            raise ConfigError(f"class_subset: {c!r} is not a class of the run's data (its classes: {', '.join(class_names[:5])}, ...)")
        if not 0 <= i < num_classes:
            raise ConfigError(f"class_subset: class index {i} is outside the model's {num_classes} classes")
        out.append(i)
    if len(set(out)) != len(out):
        raise ConfigError("class_subset: the subset names a class twice")
    return out


def subset_hits(logits: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor, subset: torch.Tensor,
                position: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(images counted, correct) of one batch. ``subset`` (K,): model class indices; ``position``
    (C,): a model class's position in the subset, -1 outside it (None: labels already are positions);
    ``keep`` (B,): False for padding samples."""
    pred = logits.float().index_select(-1, subset).argmax(-1)  # (B,) a position in the subset
    target = labels if position is None else position[labels]  # (B,) -1: a class outside the subset
    counted = keep & (target >= 0)
    return counted.sum(), (counted & (pred == target)).sum()


class ClassSubset(Evaluator):
    config = ClassSubsetConfig
    default_name = "subset"

    def __init__(self, cfg: ClassSubsetConfig, ctx):
        super().__init__(cfg, ctx)
        self.loader = ctx.data.loader(cfg.data, cfg.split, cfg.batch_size)
        num_classes = max(len(ctx.class_names), max((c for c in cfg.classes if isinstance(c, int)), default=-1) + 1)
        idx = subset_indices(cfg, ctx.class_names, num_classes)
        self.subset = torch.tensor(idx, device=ctx.device)
        self.position = None
        if cfg.labels == "model":
            self.position = torch.full((num_classes,), -1, dtype=torch.long, device=ctx.device)
            self.position[self.subset] = torch.arange(len(idx), device=ctx.device)

    def __call__(self, model):
        return count_top1(model, self.loader, self.ctx, lambda logits, b: subset_hits(
            logits, b["label"], b["index"] >= 0, self.subset, self.position))  # fmt: skip


register_evaluator("class_subset", ClassSubset)

__all__ = ["ClassSubset", "ClassSubsetConfig", "subset_hits", "subset_indices"]
