"""``data.format=csv``: image-text pairs from a CSV / TSV file (open_clip's ``--csv-img-key filepath
--csv-caption-key title``): one row per image with its path and caption (``data.csv_img_key``,
``data.csv_caption_key``; optional integer labels in ``data.csv_label_key``). Relative image paths
are relative to the file's folder. Rows with an empty caption or an unreadable image are skipped
and counted like undecodable files.
"""

from __future__ import annotations

import csv as _csv
import os

from .build import register_format
from .captions import CaptionSource, read_class_names


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


def csv_sources(cfg, img_size, num_channels: int, seed: int, tokenize=None):
    """-> (train CaptionSource, val CaptionSource or None, num_classes, class_names)."""
    if not cfg.train_path:
        raise ValueError("data.format=csv needs data.train_path (a .csv or .tsv file)")
    keys = (cfg.csv_img_key, cfg.csv_caption_key, cfg.csv_label_key, cfg.csv_separator)
    kw = dict(fast_decode=cfg.fast_decode, tokenize=tokenize)
    train = CaptionSource(*read_pairs(cfg.train_path, *keys), **kw)
    val = CaptionSource(*read_pairs(cfg.val_path, *keys), **kw) if cfg.val_path else None
    names = read_class_names(cfg.train_path) or []
    n_cls = len(names) or (max(train.labels) + 1 if max(train.labels, default=-1) >= 0 else 0)
    return train, val, n_cls, names or [str(i) for i in range(n_cls)]


register_format("csv", csv_sources, captions=True)

__all__ = ["csv_sources", "read_pairs"]
