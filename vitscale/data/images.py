"""A folder of images without classes (``data.format=images``): what a person with "their own images"
has, for the tasks that read no labels (:attr:`vitscale.tasks.Task.reads_labels`: DINO, MAE, feature
distillation).

``data.train_path``: every image file below the folder, at any depth (the extensions of
:data:`vitscale.data.imagefolder.IMG_EXTENSIONS`, case-insensitive), in the sorted order of their
paths, so the index of a file — which keys its crops, masks and the epoch's order — is the same in
every run. Folders and files whose names start with a dot (``.thumbnails``, macOS's ``._IMG_0001.jpg``)
are passed over; folder links are followed as in an image folder, each folder entered once and each
file listed once. Its samples carry no label (``-1``) and the split no class.

``data.val_path`` (optional): a labelled split, a class folder as ``imagefolder`` reads it
(``<root>/<class>/**/<image>``, ``classnames.txt`` optional). The evaluations that read labels (the
``knn`` and ``linear_probe`` a self-supervised run ends with, ``vitscale eval … eval.probe=linear``)
read it in place of the training folder (:attr:`DataFormat.labelled`, :mod:`vitscale.run.evaldata`):
``data.val_fit_fraction`` of each of its classes is their fit split (the k-NN's bank, the probe's
training set) and they score the rest — imagefolder's stratified seed-0 holdout
(``data.val_split = 1 - val_fit_fraction``), so the two parts are the same in every run. Without
``val_path`` the run evaluates nothing (a line says so) and reports its training signals only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from ..config.data import DataConfig, PathFields
from ..errors import CheckError, ConfigError
from .formats import DataFormat, Split, register_format
from .imagefolder import IMG_EXTENSIONS, _images, _key, class_folders, imagefolder_split, report_skipped
from .sources import FileSource


def list_images(root: str) -> list[str]:
    """Every image file below ``root`` (any depth, no hidden entries), sorted by path."""
    if not os.path.isdir(root):
        what = "is not a folder" if os.path.exists(root) else "does not exist"
        raise CheckError(f"data.train_path={root} {what}: data.format=images reads a folder of images (any nesting)")
    repeated: list[str] = []
    special: list[tuple[str, str]] = []
    paths = _images(root, {_key(root)}, set(), repeated, special, hidden=False)
    report_skipped(root, repeated, special)
    return sorted(paths)


def labelled_data(cfg: DataConfig) -> dict | None:
    """The ``data:`` changes that make ``cfg`` its labelled split (``val_path`` as an ``imagefolder``,
    ``val_fit_fraction`` of each class the fit split), or None without ``val_path``."""
    if not cfg.val_path:
        return None
    return {"format": "imagefolder", "train_path": cfg.val_path, "val_path": None,
            "val_split": round(1.0 - cfg.val_fit_fraction, 12)}  # fmt: skip


def images_split(cfg: DataConfig, name: str, *, img_size=None, num_channels: int = 3, seed: int = 0,
                 classes: list[str] | None = None) -> Split | None:  # fmt: skip
    """``train``: the images of ``data.train_path``, unlabelled; ``val``: the scored part of the labelled
    ``data.val_path`` (None without it)."""
    if name == "train":
        if not cfg.train_path:
            raise CheckError("data.format=images needs data.train_path (a folder of images, any nesting)")
        paths = list_images(cfg.train_path)
        if not paths:
            raise CheckError(f"data.train_path={cfg.train_path}: no images ({', '.join(IMG_EXTENSIONS)}) below it")
        return Split(FileSource(paths, [-1] * len(paths), cfg.fast_decode), [])
    changes = labelled_data(cfg)
    if changes is None:
        return None
    from ..config import replace_fields

    return imagefolder_split(replace_fields(cfg, changes, "data."), "val", classes=classes or None)


def _check(cfg: DataConfig) -> None:
    if cfg.val_path and os.path.isdir(cfg.val_path) and not class_folders(cfg.val_path):
        raise CheckError(f"data.val_path={cfg.val_path} has no class subfolders: with data.format=images it is the "
                         "labelled split the k-NN and probes read (<root>/<class>/<image>); leave it out to "
                         "evaluate nothing")  # fmt: skip


def _detect(path: str) -> bool:
    """A folder holding image files itself (a folder of class folders is ``imagefolder``'s)."""
    try:
        return any(e.is_file() and e.name.lower().endswith(IMG_EXTENSIONS) and not e.name.startswith(".")
                   for e in os.scandir(path))  # fmt: skip
    except OSError:
        return False


@dataclass
class ImagesData(PathFields, DataConfig):
    """``data.format=images``."""

    RANGES: ClassVar[dict[str, tuple]] = {"val_fit_fraction": (0.0, 1.0)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``); the ends themselves are
    refused below (a part would be empty)."""

    format: str = "images"
    val_fit_fraction: float = 0.5
    """The fraction of each class of ``val_path`` (the labelled split) the evaluations fit on — the
    k-NN's bank, the linear probe's training set — scoring the rest; strictly between 0 and 1. 0.5:
    this project's choice (a small labelled folder split in halves)."""

    def __post_init__(self) -> None:
        f = self.val_fit_fraction
        if not isinstance(f, bool) and isinstance(f, (int, float)) and not 0.0 < f < 1.0:
            raise ConfigError(f"data.val_fit_fraction={f} must lie strictly between 0 and 1 (the part of each class of "
                              "data.val_path the k-NN and probes fit on; they score the rest)")  # fmt: skip
        super().__post_init__()


FORMAT = register_format(DataFormat(
    "images", images_split, config=ImagesData, check=_check, detect=_detect, labels=False, labelled=labelled_data,
    summary="<root>/**/<image>: a folder of images without classes (the tasks that read no labels)",
))  # fmt: skip

__all__ = ["FORMAT", "ImagesData", "images_split", "labelled_data", "list_images"]
