"""Image folders: ``<root>/<class>/**/<image>``, one subfolder per class (torchvision's layout).

Classes are the sorted subfolder names of ``train_path``, or the names of a ``classnames.txt`` in
the root or its parent, in its order (class folders must then be among them; a listed class may
have no images). Without that list a class folder without images is refused: it would silently
become a class no image teaches. ``val_path`` must use the same names (a subset is fine). Files are matched by extension (case-insensitive) and sorted, so the index of a
file is stable. Without ``val_path``, ``val_split > 0`` holds out that fraction of every class
(a fixed split keyed by seed 0). Decoding is done by :class:`vitscale.data.sources.FileSource`.

Symbolic links to folders are followed, but every folder is entered once and every file listed
once: a link back to a parent (a loop, which would list the same files over and over) or a second
link to a folder already read is skipped, and all of them are reported in one warning.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from ..config.data import DataConfig, PathFields, ValSplitField
from ..errors import CheckError
from .classes import CLASSNAMES_FILE, read_class_names
from .files import describe_skipped, special_kind
from .formats import DataFormat, Split, register_format
from .keyed import STREAM_SPLIT, epoch_permutation
from .sources import FileSource

log = logging.getLogger("vitscale.data")

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".pbm", ".bmp", ".tif", ".tiff", ".webp", ".gif")


def class_folders(root: str) -> list[str]:
    if not os.path.isdir(root):
        raise FileNotFoundError(f"image folder {root!r} does not exist")
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def find_classes(root: str) -> list[str]:
    """The classes of an image folder: its ``classnames.txt`` (root or parent), else its sorted folders."""
    folders = class_folders(root)
    listed = read_class_names(root)
    if listed is not None:
        extra = sorted(set(folders) - set(listed))
        if extra:
            raise CheckError(f"image folder {root}: class folder {extra[0]!r} is not in its {CLASSNAMES_FILE}: "
                             f"add it there or remove the folder")  # fmt: skip
        return listed
    if not folders:
        raise CheckError(f"image folder {root!r} has no class subfolders (<root>/<class>/<image>); a folder of images "
                         "without classes is data.format=images, for the tasks that read no labels")  # fmt: skip
    return folders


def _key(path: str) -> tuple[int, int]:
    st = os.stat(path)  # follows links: the folder / file itself
    return st.st_dev, st.st_ino


def _images(top: str, seen_dirs: set, seen_files: set, repeated: list[str], special: list | None = None,
            hidden: bool = True) -> list[str]:  # fmt: skip
    """Image files under ``top`` following folder links, each folder entered and each file listed once;
    entries that are not regular files (a FIFO named ``x.png``) go to ``special``, never opened.
    ``hidden=False``: folders and files whose names start with a dot are passed over."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        keep = []
        for d in sorted(dirnames):
            if not hidden and d.startswith("."):
                continue
            full = os.path.join(dirpath, d)
            try:
                k = _key(full)
            except OSError:  # a broken link
                continue
            if k in seen_dirs:
                repeated.append(full)
                continue
            seen_dirs.add(k)
            keep.append(d)
        dirnames[:] = keep
        for f in filenames:
            if not f.lower().endswith(IMG_EXTENSIONS) or (not hidden and f.startswith(".")):
                continue
            full = os.path.join(dirpath, f)
            try:
                st = os.stat(full)  # follows links: the file itself
                k, kind = (st.st_dev, st.st_ino), special_kind(st.st_mode)
            except OSError:  # a broken link: listed, then reported as undecodable when read
                k, kind = ("path", full), None
            if kind is not None:
                if special is not None:
                    special.append((full, kind))
                continue
            if k not in seen_files:
                seen_files.add(k)
                found.append(full)
    return sorted(found)


def scan(root: str, class_to_idx: dict[str, int]) -> tuple[list[str], list[int]]:
    """All image files under ``root/<class>/`` -> (paths, labels), sorted by class then path."""
    paths, labels = [], []
    names = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    seen_dirs = {_key(root)} | {_key(os.path.join(root, n)) for n in names}
    seen_files: set = set()
    repeated: list[str] = []
    special: list[tuple[str, str]] = []
    for name in names:
        if name not in class_to_idx:
            raise ValueError(f"class folder {name!r} in {root!r} is not a training class")
        found = _images(os.path.join(root, name), seen_dirs, seen_files, repeated, special)
        paths += found
        labels += [class_to_idx[name]] * len(found)
    report_skipped(root, repeated, special)
    return paths, labels


def report_skipped(root: str, repeated: list[str], special: list[tuple[str, str]]) -> None:
    """One warning for the folder links :func:`_images` passed over, one for the entries that are not
    regular files."""
    if repeated:
        shown = ", ".join(f"{p} -> {os.path.realpath(p)}" for p in repeated[:3]) + (", ..." if len(repeated) > 3 else "")
        log.warning(
            "image folder %s: %d folder link(s) lead to a folder already read (a symlink loop or a repeated link) and "
            "were skipped, so each file is listed once: %s", root, len(repeated), shown,
        )  # fmt: skip
    if special:
        log.warning("%s", describe_skipped(f"image folder {root}", special))


def _split(paths, labels, fraction: float):
    """Hold out ``round(n_c * fraction)`` files of every class, chosen by a seed-0 permutation."""
    by_class: dict[int, list[int]] = {}
    for i, y in enumerate(labels):
        by_class.setdefault(y, []).append(i)
    val = set()
    for y, idx in sorted(by_class.items()):
        k = int(round(len(idx) * fraction))
        perm = epoch_permutation(len(idx), seed=0, epoch=STREAM_SPLIT * 1000 + y).tolist()
        val.update(idx[p] for p in perm[:k])
    tr = [i for i in range(len(paths)) if i not in val]
    va = sorted(val)
    return ([paths[i] for i in tr], [labels[i] for i in tr]), ([paths[i] for i in va], [labels[i] for i in va])


def _holdout(cfg: DataConfig, paths, labels, name: str):
    """The ``name`` part of the ``data.val_split`` holdout of the training files."""
    train, val = _split(paths, labels, cfg.val_split)
    return train if name == "train" else val


def imagefolder_split(cfg: DataConfig, name: str, *, img_size=None, num_channels: int = 3, seed: int = 0,
                      classes: list[str] | None = None) -> Split | None:  # fmt: skip
    """The ``train`` / ``val`` split: ``data.train_path`` / ``data.val_path``, or the ``data.val_split``
    holdout of the training folder when there is no ``val_path``."""
    if not cfg.train_path and not (name == "val" and cfg.val_path):
        raise ValueError("data.format=imagefolder needs data.train_path")
    root = cfg.train_path if name == "train" or not cfg.val_path else cfg.val_path
    if name == "val" and not cfg.val_path and cfg.val_split <= 0:
        return None
    names = list(classes) if classes is not None else find_classes(root)
    paths, labels = scan(root, {c: i for i, c in enumerate(names)})
    if name == "train" and not paths:
        raise FileNotFoundError(f"no images ({', '.join(IMG_EXTENSIONS)}) under {root!r}")
    if classes is None and read_class_names(root) is None:
        empty = sorted(set(class_folders(root)) - {names[y] for y in labels})
        if empty:
            raise CheckError(f"image folder {root}: class folder {empty[0]!r} has no images ({', '.join(IMG_EXTENSIONS)}): "
                             f"remove it, or list the classes in {CLASSNAMES_FILE} to keep a class without images")  # fmt: skip
    if not cfg.val_path and cfg.val_split > 0:
        paths, labels = _holdout(cfg, paths, labels, name)
    return Split(FileSource(paths, labels, cfg.fast_decode), names)


def _class_names(cfg: DataConfig) -> list[str] | None:
    return find_classes(cfg.train_path) if cfg.train_path else None


def _detect(path: str) -> bool:
    try:
        return bool(class_folders(path))
    except OSError:
        return False


@dataclass
class ImageFolderData(ValSplitField, PathFields, DataConfig):
    """``data.format=imagefolder``."""

    format: str = "imagefolder"


FORMAT = register_format(DataFormat(
    "imagefolder", imagefolder_split, config=ImageFolderData, class_names=_class_names, detect=_detect,
    summary="<root>/<class>/**/<image> folders (torchvision's layout)",
))  # fmt: skip

__all__ = ["FORMAT", "IMG_EXTENSIONS", "ImageFolderData", "find_classes", "imagefolder_split", "scan"]
