"""Honest speed: ``vitscale bench`` (img/s, TFLOP/s, MFU, peak memory, against timm / open_clip) of
the training fast path (``vitscale.train.fastpath``), and the input-pipeline benchmark."""

from .harness import BenchSettings, run_bench

__all__ = ["BenchSettings", "run_bench"]
