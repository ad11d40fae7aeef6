"""Where a step's time goes under ``torch.profiler``: on CUDA each kernel's device time per step (the
kernels alone: an operator's self device time is its kernels' time again, so counting both would
count the step twice — as the first ``--profile-top`` lists of ``benchmarks/results/table_*_h100_202611.json``
did, their operators beside their kernels); on a CPU each operator's self CPU time. Used by ``vitscale bench --profile-top`` (the top kernels of
each implementation, in its JSON) and ``benchmarks/profile_ops.py`` (operator tables side by side)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def op_times(step: Callable[[], None], device: torch.device, steps: int = 1) -> dict[str, float]:
    """``{kernel (CUDA) or operator (CPU): milliseconds per step}`` over ``steps`` calls of ``step``
    (already warm)."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    ops: dict[str, float] = {}
    for e in prof.key_averages():
        if cuda and e.device_type != DeviceType.CUDA:
            continue  # an operator on the host: its kernels are counted as device events
        us = e.device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            ops[e.key] = ops.get(e.key, 0.0) + us / 1e3 / steps
    return ops


def top(ops: dict[str, float], k: int) -> list[tuple[str, float]]:
    """The ``k`` operators with the most time, ``(name, ms per step)``, largest first."""
    return sorted(ops.items(), key=lambda kv: -kv[1])[:k]


__all__ = ["op_times", "top"]
