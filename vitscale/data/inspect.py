"""``vitscale data inspect PATH``: what a dataset holds, read through the pipeline a run would use.

The format is the one given, else the first registered format whose ``detect(PATH)`` says yes. The
report: the format, the number of samples (a stream: what its source knows without reading it all),
the classes, a few sample keys, the split's own facts (``Split.info``: shards, columns, ...) and the
decode throughput of the first images through the evaluation transform (one process, no workers), so
a dataset can be checked before a long run.
"""

from __future__ import annotations

import dataclasses
import time

from ..config.data import DataConfig
from ..errors import UserError
from .formats import FORMATS, get_format

SHOWN_KEYS = 5
SHOWN_CLASSES = 20


def detect_format(path: str) -> str:
    """The first format (built-in ones first) that recognises ``path``."""
    for name, fmt in FORMATS.items():
        if fmt.detect is not None and fmt.detect(path):
            return name
    raise UserError(f"{path}: no data format recognises it; give one with --format ({', '.join(FORMATS.names())})")


def inspect_data(cfg: DataConfig, *, samples: int = 64, img_size: int = 224, batch_size: int = 16) -> dict:
    """The report of the training split of ``cfg`` (``data.train_path`` is the path inspected)."""
    from .build import build_loader

    fmt = get_format(cfg.format)
    if fmt.check is not None:
        fmt.check(cfg)
    cfg = dataclasses.replace(cfg, num_workers=0, pin_memory=False)
    data = fmt.split(cfg, "train", img_size=(img_size, img_size), num_channels=3, seed=0, classes=None)
    if data is None:
        raise UserError(f"{getattr(cfg, 'train_path', cfg.format)}: no samples")
    src = data.source
    streamed = hasattr(src, "build_loader")
    exact = not streamed or getattr(src, "exact", False)
    report: dict = {"format": cfg.format, "path": getattr(cfg, "train_path", None), "samples": len(src) if exact else None,
                    "streamed": streamed,
                    "classes": int(data.num_classes), "class_names": list(data.class_names[:SHOWN_CLASSES])}  # fmt: skip
    report.update(data.info)
    keys = [src.key(i) for i in range(min(SHOWN_KEYS, len(src)))] if not streamed and hasattr(src, "key") else []
    loaded = build_loader(cfg, "train", img_size=(img_size, img_size), num_channels=3, seed=0,
                          batch_size=max(1, min(batch_size, samples)), augment=False, drop_last=False)  # fmt: skip
    n, skipped, labels = 0, 0, []
    t0 = time.perf_counter()
    if loaded is not None:
        for batch in loaded.loader:
            real = batch["index"] >= 0
            n += int(real.sum())
            skipped += int(batch["skipped"])
            labels += batch["label"][real].tolist()
            if streamed and len(keys) < SHOWN_KEYS and "key" in batch:
                keys += list(batch["key"])[: SHOWN_KEYS - len(keys)]
            if n >= samples:
                break
    seconds = time.perf_counter() - t0
    report["sample_keys"] = keys
    report["first_labels"] = labels[:SHOWN_KEYS]
    report["decode"] = {"images": n, "skipped": skipped, "seconds": round(seconds, 3),
                        "img_per_s": round(n / seconds, 1) if seconds > 0 else None, "img_size": img_size}  # fmt: skip
    return report


def format_report(report: dict) -> str:
    """The report as lines for a person."""
    lines = [f"{report['path']}: data.format={report['format']}"]
    samples = report["samples"]
    lines.append(f"  samples      {samples if samples is not None else 'streamed (not counted)'}"
                 + (" (streamed)" if report["streamed"] and samples is not None else ""))
    names = report["class_names"]
    more = ", ..." if report["classes"] > len(names) else ""
    lines.append(f"  classes      {report['classes']}" + (f" ({', '.join(names)}{more})" if names else ""))
    for key, value in report.items():
        if key not in ("format", "path", "samples", "streamed", "classes", "class_names", "sample_keys",
                       "first_labels", "decode"):  # fmt: skip
            lines.append(f"  {key:<12} {value}")
    if report["sample_keys"]:
        lines.append(f"  sample keys  {', '.join(map(str, report['sample_keys']))}")
        lines.append(f"  labels       {', '.join(map(str, report['first_labels']))}")
    d = report["decode"]
    rate = f"{d['img_per_s']} img/s" if d["img_per_s"] else "-"
    lines.append(f"  decode       {d['images']} images at {d['img_size']} px in {d['seconds']} s ({rate}, one process)"
                 + (f"; {d['skipped']} undecodable, skipped" if d["skipped"] else ""))  # fmt: skip
    return "\n".join(lines)


__all__ = ["detect_format", "format_report", "inspect_data"]
