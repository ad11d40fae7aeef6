"""``data.format=csv``: image-text pairs from a CSV / TSV file (open_clip's ``--csv-img-key filepath
--csv-caption-key title``): one row per image with its path and caption (``data.csv_img_key``,
``data.csv_caption_key``; optional integer labels in ``data.csv_label_key``). Relative image paths
are relative to the file's folder. Rows with an empty caption or an unreadable image are skipped
and counted like undecodable files.
"""

from __future__ import annotations

import csv as _csv
import os
from dataclasses import dataclass

from ..config.data import CaptionFields, DataConfig, PathFields
from .captions import CaptionSource, read_class_names
from .formats import DataFormat, Split, register_format


def read_pairs(
    path: str, img_key: str, caption_key: str, label_key: str | None = None, sep: str | None = None
):
    """-> (image paths, captions, labels) of a CSV / TSV file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no CSV/TSV file at {path!r}")
    sep = sep or ("\t" if path.lower().endswith(".tsv") else ",")
    root = os.path.dirname(os.path.abspath(path))
    images, captions, labels = [], [], []
    with open(path, newline="", encoding="utf-8") as f:
        reader = _csv.DictReader(f, delimiter=sep)
        for key in (img_key, caption_key) + ((label_key,) if label_key else ()):
            if reader.fieldnames is None or key not in reader.fieldnames:
                raise KeyError(f"{path}: no column {key!r} (columns: {reader.fieldnames})")
        for row in reader:
            p = (row.get(img_key) or "").strip()
            images.append(os.path.join(root, p) if p and not os.path.isabs(p) else (p or None))
            captions.append(row.get(caption_key))
            lab = row.get(label_key) if label_key else None
            labels.append(int(lab) if lab not in (None, "") else -1)
    return images, captions, labels


@dataclass
class CsvData(CaptionFields, PathFields, DataConfig):
    """``data.format=csv``."""

    format: str = "csv"
    csv_img_key: str = "filepath"
    """The column of image paths (relative paths are relative to the CSV file's folder)."""
    csv_caption_key: str = "title"
    """The column of captions."""
    csv_label_key: str | None = None
    """An optional column of integer class labels (for zero-shot evaluation)."""
    csv_separator: str | None = None
    """The field separator; None = tab for ``.tsv`` files, comma otherwise."""


def csv_split(cfg, name: str, *, img_size=None, num_channels: int = 3, seed: int = 0, classes=None,
              tokenize=None) -> Split | None:  # fmt: skip
    if not cfg.train_path and not cfg.val_path:
        raise ValueError("data.format=csv needs data.train_path (a .csv or .tsv file)")
    path = cfg.train_path if name == "train" else cfg.val_path
    if not path:
        return None
    keys = (cfg.csv_img_key, cfg.csv_caption_key, cfg.csv_label_key, cfg.csv_separator)
    src = CaptionSource(*read_pairs(path, *keys), fast_decode=cfg.fast_decode, tokenize=tokenize)
    names = list(classes) if classes is not None else read_class_names(path) or []
    n_cls = len(names) or (max(src.labels) + 1 if max(src.labels, default=-1) >= 0 else 0)
    return Split(src, names or [str(i) for i in range(n_cls)])


def _detect(path: str) -> bool:
    return os.path.isfile(path) and path.lower().endswith((".csv", ".tsv"))


FORMAT = register_format(DataFormat(
    "csv", csv_split, config=CsvData, captions=True, detect=_detect,
    class_names=lambda cfg: read_class_names(cfg.train_path),
    summary="a CSV / TSV file of image paths and captions (open_clip's --csv-img-key / --csv-caption-key)",
))  # fmt: skip

__all__ = ["FORMAT", "CsvData", "csv_split", "read_pairs"]
