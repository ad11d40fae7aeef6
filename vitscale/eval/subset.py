"""Class-subset accuracy: the ``class_subset`` evaluator, for test sets of a subset of the model's classes.

ImageNet-A (Hendrycks et al., "Natural Adversarial Examples", arXiv 1907.07174) and ImageNet-R ("The
Many Faces of Robustness", arXiv 2006.16241) hold 200 of ImageNet's 1,000 classes; a 1k-class model is
scored on them with its logits restricted to those 200 classes before the argmax (their code keeps
the 200 columns of the output). The subset is given as its class indices in the model's label space
or as class names of the run's data (the ImageNet-R authors publish the 200 WordNet ids), in the list
or in a file (one per line).

Every class of the evaluation data is matched to the model's class of the same name, never by
its position: an ImageNet-R folder's labels are the places of its 200 class folders in sorted
order, which need not be the order the subset is listed in. ``labels`` says what the data is:
``model`` (any of the model's classes; images of classes outside the subset are left out) or
``subset`` (the subset's classes and only those, as an ImageNet-A/R folder). A data class the model
does not have, or (``subset``) one outside the subset or a subset class the data lacks, is refused
before anything is evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import torch

from ..errors import ConfigError
from .classification import count_top1
from .evaluator import Evaluator, EvaluatorConfig, register_evaluator

MAX_CLASSES_FILE = 16 << 20  # bytes: far above a list of 21k class names


@dataclass
class ClassSubsetConfig(EvaluatorConfig):
    """``kind: class_subset``: top-1 with the logits restricted to a subset of the model's classes."""

    RANGES: ClassVar[dict[str, tuple]] = {"classes": (0, 1 << 22)}  # a class index (a name passes)
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    classes: tuple[int | str, ...] = ()
    """The subset: class indices of the model, or class names of the run's data (e.g. WordNet ids)."""
    classes_file: str | None = None
    """A text file listing the subset instead, one class index or name per line."""
    labels: Literal["model", "subset"] = "model"
    """What the data holds (its classes matched to the model's by name): ``model`` (any of the model's
    classes; images of classes outside the subset are left out) or ``subset`` (exactly the subset's
    classes: an ImageNet-A/R folder; another class is refused)."""


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


def data_positions(cfg: ClassSubsetConfig, idx: list[int], data_names: list[str], model_names: list[str]) -> list[int]:
    """Each class of the evaluation data (``data_names``, in label order) as its place in the subset
    ``idx`` (model class indices), matched by name; -1 for a class outside it (``labels: model``)."""
    where = {name: i for i, name in enumerate(model_names)}
    place = {c: k for k, c in enumerate(idx)}
    out = []
    for name in data_names:
        if name not in where:
            raise ConfigError(f"class_subset: the evaluation data's class {name!r} is not a class of the model "
                              f"(its classes: {', '.join(model_names[:5])}, ...): name the data's class folders as the model's classes")  # fmt: skip
        k = place.get(where[name], -1)
        if k < 0 and cfg.labels == "subset":
            raise ConfigError(f"class_subset: the evaluation data's class {name!r} is not in the subset: labels: subset "
                              "reads data of the subset's classes only (labels: model leaves other classes out)")  # fmt: skip
        out.append(k)
    if cfg.labels == "subset" and len(set(out)) < len(idx):
        missing = next(model_names[c] for k, c in enumerate(idx) if k not in out)
        raise ConfigError(f"class_subset: the subset's class {missing!r} is not a class of the evaluation data: "
                          "labels: subset reads data of every class of the subset (labels: model for part of it)")  # fmt: skip
    return out


def subset_hits(logits: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor, subset: torch.Tensor,
                position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(images counted, correct) of one batch. ``subset`` (K,): model class indices; ``position``
    (C,): a data label's place in the subset, -1 outside it; ``keep`` (B,): False for padding samples."""
    pred = logits.float().index_select(-1, subset).argmax(-1)  # (B,) a position in the subset
    target = position[labels]  # (B,) -1: a class outside the subset
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
        model_names = list(ctx.class_names) or [str(i) for i in range(num_classes)]
        data_names = ctx.data.classes(cfg.data)[1]
        self.subset = torch.tensor(idx, device=ctx.device)
        self.position = torch.tensor(data_positions(cfg, idx, data_names, model_names), dtype=torch.long, device=ctx.device)

    def __call__(self, model):
        return count_top1(model, self.loader, self.ctx, lambda logits, b: subset_hits(
            logits, b["label"], b["index"] >= 0, self.subset, self.position))  # fmt: skip


register_evaluator("class_subset", ClassSubset)

__all__ = ["ClassSubset", "ClassSubsetConfig", "data_positions", "subset_hits", "subset_indices"]
