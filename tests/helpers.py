"""Helpers shared by the tests (importable from any test as ``helpers``: ``pythonpath`` in pyproject).

Errors name their norm: :func:`rel_l2` (relative L2 of the whole tensor), :func:`rel_max` (largest
absolute difference over the largest reference magnitude), :func:`rel_each` (largest element-wise
relative difference, for short sequences such as loss curves). All compute in float64.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch


def _f64(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64)
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def rel_l2(a, b) -> float:
    """``‖a − b‖₂ / ‖b‖₂`` (``b`` the reference)."""
    a, b = _f64(a), _f64(b)
    return ((a - b).norm() / b.norm()).item()


def rel_max(a, b) -> float:
    """``max |a − b| / max |b|`` (``b`` the reference)."""
    a, b = _f64(a), _f64(b)
    return ((a - b).abs().max() / b.abs().max()).item()


def rel_each(a: Iterable[float], b: Iterable[float]) -> float:
    """``max_i |a_i − b_i| / |b_i|`` over paired values (``b`` the reference)."""
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def randomize(model: torch.nn.Module, seed: int = 0, scale: float = 0.2) -> None:
    """Every parameter replaced by ``scale`` x a standard normal draw (the init's zeros and ones hide
    layout mistakes in a conversion)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def read_metrics(run: Path | str) -> list[dict]:
    """Every record of a run folder's ``metrics.jsonl``, in order."""
    lines = (Path(run) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def read_losses(run: Path | str) -> dict[int, float]:
    """``{step: loss}`` of a run folder's training records (the records that have a loss)."""
    return {r["step"]: r["loss"] for r in read_metrics(run) if "loss" in r}


__all__ = ["randomize", "read_losses", "read_metrics", "rel_each", "rel_l2", "rel_max"]
