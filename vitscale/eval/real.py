"""Multi-label accuracy in the format of the ImageNet "ReaL" labels: the ``real`` evaluator.

Beyer et al. 2020, "Are we done with ImageNet?" (arXiv 2006.07159), relabelled the ImageNet validation
images: each image has a list of the classes that are correct for it (``real.json`` of
github.com/google-research/reassessed-imagenet: one list of class indices per validation image, the
i-th for the file ``ILSVRC2012_val_{i+1:08d}.JPEG``). A top-1 prediction counts as correct when it is
in its image's list; images whose list is empty (no class fits) are left out.

Each sample of the split is matched to its list by its file's name, never by its position: an image
folder's val split is ordered by class folder, not by file name (timm's ``timm/data/real_labels.py``
keys ``real.json`` by file name the same way). A sample's name is the last part of its file path or
shard key without the extension (``.../n01440764/ILSVRC2012_val_00000293.JPEG`` ->
``ILSVRC2012_val_00000293``). The label file is ImageNet's list, or, for any other split, a JSON
object ``{name: [class, ...]}``. A split that holds a file the label file does not name, or lacks
one it names, is refused before anything is evaluated.
"""

from __future__ import annotations

import json
import os
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
    """A JSON file: ImageNet's ``real.json`` (a list, the i-th entry for ``ILSVRC2012_val_{i+1:08d}``)
    or an object ``{file name: [class indices]}``; each sample is matched by its file name (without
    the extension); an empty list leaves its image out."""


def imagenet_val_name(i: int) -> str:
    """The file name (without extension) of ImageNet validation image ``i`` (0-based): real.json's i-th entry."""
    return f"ILSVRC2012_val_{i + 1:08d}"


def sample_name(key: str) -> str:
    """A sample's name: the last part of its path or key, without the extension."""
    return os.path.splitext(os.path.basename(str(key).replace("\\", "/")))[0]


def label_file_limit(num_images: int | None, num_classes: int) -> int:
    """The most bytes a label file of ``num_images`` images and ``num_classes`` classes can need: each
    image named once (a name and its brackets, 64 bytes) with every class at most once (its digits, a
    comma and a space), capped at :data:`MAX_LABELS_FILE`. A file past it is not this split's (a 20 MB
    file of one long row once asked for a 24 GB table)."""
    if num_images is None:
        return MAX_LABELS_FILE
    return min(MAX_LABELS_FILE, 4096 + num_images * (64 + num_classes * (len(str(max(num_classes - 1, 0))) + 2)))


def _no_key_twice(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise _Twice(k)
        seen[k] = v
    return seen


class _Twice(ValueError):
    pass


def read_label_lists(path: str | Path, num_classes: int, num_images: int | None = None) -> dict[str, list[int]]:
    """The lists of ``path`` by image name, checked: ImageNet's list of lists (named
    :func:`imagenet_val_name`), or an object of name -> list of class indices below ``num_classes``,
    each class at most once a list, each image named once (a key twice, or two keys of one sample
    name such as ``a.JPEG`` and ``a.png``, kept the last list silently). ``num_images``: the split's
    size, which bounds the file's (:func:`label_file_limit`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"real: labels={str(path)!r} is not a file (a JSON list of label lists, as real.json)")
    limit = label_file_limit(num_images, num_classes)
    size = path.stat().st_size
    if size > limit:
        raise ConfigError(f"real: {path} is {size} bytes, more than a label file of {num_images} images and {num_classes} "
                          f"classes can need ({limit}): not this split's label file")  # fmt: skip
    try:
        lists = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_key_twice)
    except _Twice as e:
        raise ConfigError(f"real: {path} names {e.args[0]!r} twice: each image once") from None
    except RecursionError:
        raise ConfigError(f"real: {path} is nested too deeply: a list of lists of class indices, one per image") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"real: {path} is not JSON ({e})") from None
    if isinstance(lists, list):
        lists = {imagenet_val_name(i): row for i, row in enumerate(lists)}
    elif isinstance(lists, dict):
        by_name: dict[str, list] = {}
        for k, row in lists.items():
            name = sample_name(k)
            if name in by_name:
                raise ConfigError(f"real: {path} names the image {name!r} twice ({k!r} and an earlier key of the same "
                                  f"name): each image once")  # fmt: skip
            by_name[name] = row
        lists = by_name
    ok = isinstance(lists, dict) and all(
        isinstance(row, list) and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < num_classes for c in row)
        for row in lists.values()
    )
    if not ok:
        raise ConfigError(f"real: {path} must be a list of lists of class indices (0 to {num_classes - 1}), one per image "
                          "(or an object of file name -> such a list)")  # fmt: skip
    for name, row in lists.items():
        if len(set(row)) != len(row):
            raise ConfigError(f"real: {path}: the list of {name!r} names a class twice ({row[:8]}): each class once")
    if lists and not any(lists.values()):
        raise ConfigError(f"real: every list of {path} is empty: no image has a class to count (an empty list leaves "
                          f"its image out)")  # fmt: skip
    return lists


def split_names(loader, split: str) -> list[str]:
    """The names of the samples of ``loader``'s split, in its order (its batches' ``index``)."""
    source = getattr(getattr(loader, "dataset", None), "source", None)
    if source is None or not hasattr(source, "key"):
        raise ConfigError(f"real: the {split} split's samples have no file names to match with the label file: "
                          "evaluate an indexed split (an image folder, indexed shards)")  # fmt: skip
    return [sample_name(source.key(i)) for i in range(len(source))]


def lists_by_name(lists: dict[str, list[int]], names: list[str], labels: str, split: str) -> list[list[int]]:
    """The lists of the samples ``names`` in their order: a one-line :class:`ConfigError` naming the
    first file the label file lacks, a file named twice, or an entry the split has no file of."""
    seen: set[str] = set()
    for name in names:
        if name not in lists:
            raise ConfigError(f"real: the {split} split holds {name!r}, which {labels} has no entry for "
                              f"(its entries: {', '.join(list(lists)[:2])}, ...): point labels at this split's label file")  # fmt: skip
        if name in seen:
            raise ConfigError(f"real: the {split} split holds two files named {name!r}: each image once")
        seen.add(name)
    if len(seen) != len(lists):
        missing = next(n for n in lists if n not in seen)
        raise ConfigError(f"real: {labels} has an entry for {missing!r}, which the {split} split has no file of "
                          f"({len(seen)} of its {len(lists)} images): evaluate the whole split the label file describes")  # fmt: skip
    return [lists[name] for name in names]


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
        names = split_names(self.loader, cfg.split)
        lists = read_label_lists(cfg.labels, max(ctx.data.classes(cfg.data)[0], len(ctx.class_names)), len(names))
        rows = lists_by_name(lists, names, cfg.labels, cfg.split)
        self.table = padded(rows, ctx.device)  # row j: the list of the split's sample j, matched by name

    def __call__(self, model):
        return count_top1(model, self.loader, self.ctx,
                          lambda logits, b: real_hits(logits.float().argmax(-1), b["index"], self.table))  # fmt: skip


register_evaluator("real", Real)

__all__ = ["Real", "RealConfig", "imagenet_val_name", "label_file_limit", "lists_by_name", "padded", "read_label_lists", "real_hits", "sample_name",
           "split_names"]
