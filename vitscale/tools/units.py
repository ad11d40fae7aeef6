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
    "linear_probe_top*", "fewshot_*shot_top1", "*_top[0-9]", "*_top[0-9][0-9]", "*_time_pct", "data_wait",
)  # fmt: skip

# What summary.json records under "units" (a run folder written before this rule held its MFU and
# CLIP metrics as fractions and has no "units" entry; the report reads those as they were).
UNITS = {"accuracy": "%", "recall": "%", "mfu": "%"}


# Suffixes of the metrics of other weights evaluated beside the model's: its EMA (``_ema``) and a training
# module's evaluated weight sets (``_<name>``: vitscale.tasks.module.TrainModule.evaluated, DINO's teacher).
WEIGHT_SET_SUFFIXES = ("_ema", "_teacher")


def base_key(key: str) -> str:
    """The metric a key is of, whichever weights it was evaluated on: ``knn_top1_teacher`` -> ``knn_top1``."""
    for suffix in WEIGHT_SET_SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)]
    return key


def is_percent(key: str) -> bool:
    """True for a logged key that is a ratio (in percent), e.g. ``val_top1``, ``mfu``, ``val_top1_ema``,
    ``knn_top1_teacher``."""
    base = base_key(key)
    return any(fnmatch.fnmatchcase(base, p) for p in PERCENT_KEYS)


def count(n: int) -> str:
    """A parameter count for people: ``312.3K``, ``86.57M``, ``1.84B`` (exact below 1,000)."""
    for size, unit, digits in ((1e9, "B", 2), (1e6, "M", 2), (1e3, "K", 1)):
        if n >= size:
            return f"{n / size:.{digits}f}{unit}"
    return str(n)


def percent(fraction: float) -> float:
    """A fraction of 1 as a percentage."""
    return 100.0 * fraction


__all__ = ["PERCENT_KEYS", "UNITS", "WEIGHT_SET_SUFFIXES", "base_key", "count", "is_percent", "percent"]
