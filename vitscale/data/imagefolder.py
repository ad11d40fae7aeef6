"""Image folders: ``<root>/<class>/**/<image>``, one subfolder per class (torchvision's layout).

Classes are the sorted subfolder names of ``train_path``; ``val_path`` must use the same names
(a subset is fine). Files are matched by extension (case-insensitive) and sorted, so the index of a
file is stable. Without ``val_path``, ``val_split > 0`` holds out that fraction of every class
(a fixed split keyed by seed 0). Decoding is done by :class:`vitscale.data.sources.FileSource`.

Symbolic links to folders are followed, but every folder is entered once and every file listed
once: a link back to a parent (a loop, which would list the same files over and over) or a second
link to a folder already read is skipped, and all of them are reported in one warning.
"""

from __future__ import annotations

import logging
import os

from .config import DataConfig
from .files import describe_skipped, special_kind
from .keyed import STREAM_SPLIT, epoch_permutation
from .sources import FileSource

log = logging.getLogger("vitscale.data")

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".pbm", ".bmp", ".tif", ".tiff", ".webp", ".gif")


def find_classes(root: str) -> list[str]:
    if not os.path.isdir(root):
        raise FileNotFoundError(f"image folder {root!r} does not exist")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise FileNotFoundError(f"image folder {root!r} has no class subfolders (<root>/<class>/<image>)")
    return classes


def _key(path: str) -> tuple[int, int]:
    st = os.stat(path)  # follows links: the folder / file itself
    return st.st_dev, st.st_ino


def _images(top: str, seen_dirs: set, seen_files: set, repeated: list[str], special: list | None = None) -> list[str]:
    """Image files under ``top`` following folder links, each folder entered and each file listed once;
    entries that are not regular files (a FIFO named ``x.png``) go to ``special``, never opened."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        keep = []
        for d in sorted(dirnames):
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
            if not f.lower().endswith(IMG_EXTENSIONS):
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
    if repeated:
        shown = ", ".join(f"{p} -> {os.path.realpath(p)}" for p in repeated[:3]) + (", ..." if len(repeated) > 3 else "")
        log.warning(
            "image folder %s: %d folder link(s) lead to a folder already read (a symlink loop or a repeated link) and "
            "were skipped, so each file is listed once: %s", root, len(repeated), shown,
        )  # fmt: skip
    if special:
        log.warning("%s", describe_skipped(f"image folder {root}", special))
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
