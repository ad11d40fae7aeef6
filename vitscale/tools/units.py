"""One unit for every ratio vitscale writes: percent (0-100).

Accuracies (classification top-k, training-batch top-1, CLIP zero-shot, retrieval recall@K, linear
and few-shot probes) and MFU are percentages in ``metrics.jsonl``, ``summary.json``, ``vitscale eval``
and ``vitscale bench`` output, the terminal and the report (docs/training.md, "Units"). The keys below
are the ratios among the logged keys; the terminal and the report print them with a ``%`` sign.
"""

from __future__ import annotations

import fnmatch

# Logged keys (glob patterns) that are ratios, all in percent.
PERCENT_KEYS = (
    "val_top*", "train_top1", "train_i2t_top1", "mfu", "zeroshot_top*", "*retrieval_recall@*",
    "linear_probe_top*", "fewshot_*shot_top1", "*_top[0-9]", "*_top[0-9][0-9]",
)  # fmt: skip

# What summary.json records under "units" (a run folder written before this rule held its MFU and
# CLIP metrics as fractions and has no "units" entry; the report reads those as they were).
UNITS = {"accuracy": "%", "recall": "%", "mfu": "%"}


def is_percent(key: str) -> bool:
    """True for a logged key that is a ratio (in percent), e.g. ``val_top1``, ``mfu``, ``val_top1_ema``."""
    base = key[: -len("_ema")] if key.endswith("_ema") else key
    return any(fnmatch.fnmatchcase(base, p) for p in PERCENT_KEYS)


def percent(fraction: float) -> float:
    """A fraction of 1 as a percentage."""
    return 100.0 * fraction


__all__ = ["PERCENT_KEYS", "UNITS", "is_percent", "percent"]
