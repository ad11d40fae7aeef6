"""Where a step's time goes: each operator's self time per step under ``torch.profiler`` — device
(kernel) time on CUDA, CPU time on a CPU. Used by ``vitscale bench --profile-top`` (the top kernels of
each implementation, in its JSON) and ``benchmarks/profile_ops.py`` (operator tables side by side)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def op_times(step: Callable[[], None], device: torch.device, steps: int = 1) -> dict[str, float]:
    """``{operator: self milliseconds per step}`` over ``steps`` calls of ``step`` (already warm)."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    ops: dict[str, float] = {}
    for e in prof.key_averages():
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            ops[e.key] = ops.get(e.key, 0.0) + us / 1e3 / steps
    return ops


def top(ops: dict[str, float], k: int) -> list[tuple[str, float]]:
    """The ``k`` operators with the most time, ``(name, ms per step)``, largest first."""
    return sorted(ops.items(), key=lambda kv: -kv[1])[:k]


__all__ = ["op_times", "top"]
