"""Image folders: ``<root>/<class>/**/<image>``, one subfolder per class (torchvision's layout).

Classes are the sorted subfolder names of ``train_path``; ``val_path`` must use the same names
(a subset is fine). Files are matched by extension (case-insensitive) and sorted, so the index of a
file is stable. Without ``val_path``, ``val_split > 0`` holds out that fraction of every class
(a fixed split keyed by seed 0). Decoding is done by :class:`vitscale.data.sources.FileSource`.
"""

from __future__ import annotations

import os

from .config import DataConfig
from .keyed import STREAM_SPLIT, epoch_permutation
from .sources import FileSource

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".pbm", ".bmp", ".tif", ".tiff", ".webp", ".gif")


def find_classes(root: str) -> list[str]:
    if not os.path.isdir(root):
        raise FileNotFoundError(f"image folder {root!r} does not exist")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise FileNotFoundError(f"image folder {root!r} has no class subfolders (<root>/<class>/<image>)")
    return classes


def scan(root: str, class_to_idx: dict[str, int]) -> tuple[list[str], list[int]]:
    """All image files under ``root/<class>/`` -> (paths, labels), sorted by class then path."""
    paths, labels = [], []
    for name in sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")):
        if name not in class_to_idx:
            raise ValueError(f"class folder {name!r} in {root!r} is not a training class")
        found = []
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, name), followlinks=True):
            dirnames.sort()
            found += [os.path.join(dirpath, f) for f in filenames if f.lower().endswith(IMG_EXTENSIONS)]
        found.sort()
        paths += found
        labels += [class_to_idx[name]] * len(found)
    return paths, labels


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


def imagefolder_sources(cfg: DataConfig):
    """-> (train FileSource, val FileSource or None, num_classes, class_names)."""
    if not cfg.train_path:
        raise ValueError("data.format=imagefolder needs data.train_path")
    classes = find_classes(cfg.train_path)
    class_to_idx = {c: i for i, c in enumerate(classes)}
    paths, labels = scan(cfg.train_path, class_to_idx)
    if not paths:
        raise FileNotFoundError(f"no images ({', '.join(IMG_EXTENSIONS)}) under {cfg.train_path!r}")
    val = None
    if cfg.val_path:
        vp, vl = scan(cfg.val_path, class_to_idx)
        val = FileSource(vp, vl, cfg.fast_decode)
    elif cfg.val_split > 0:
        (paths, labels), (vp, vl) = _split(paths, labels, cfg.val_split)
        val = FileSource(vp, vl, cfg.fast_decode)
    return FileSource(paths, labels, cfg.fast_decode), val, len(classes), classes
