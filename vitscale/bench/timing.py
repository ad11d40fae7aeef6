"""Timing of alternatives in alternating rounds (for the micro-benchmarks in ``benchmarks/``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def time_alternating(
    fns: dict[str, Callable[[], object]],
    device: torch.device,
    steps: int = 10,
    rounds: int = 5,
    warmup: int = 2,
) -> dict[str, dict[str, float]]:
    """Run each callable ``warmup`` times, then ``steps`` timed calls split over ``rounds`` rounds,
    alternating the callables round by round (order reversed every other round).

    Returns ``{name: {"ms": mean ms per call, "median_round_ms": ..., "rounds_ms": [...]}}`` and, on
    CPU, ``cpu_ms``: process CPU milliseconds per call.
    CUDA is timed with events (one synchronisation per round), CPU with ``perf_counter``.
    """
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    rounds = max(1, min(rounds, steps))
    per_round = [steps // rounds + (1 if r < steps % rounds else 0) for r in range(rounds)]
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r, n_calls in enumerate(per_round):
        for name in names if r % 2 == 0 else names[::-1]:
            fn = fns[name]
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(device)
                start.record()
                for _ in range(n_calls):
                    fn()
                end.record()
                end.synchronize()
                dt = start.elapsed_time(end) / 1e3
            else:
                c0 = time.process_time()
                t0 = time.perf_counter()
                for _ in range(n_calls):
                    fn()
                dt = time.perf_counter() - t0
                cpu[name].append((time.process_time() - c0) / n_calls * 1e3)
            times[name].append(dt / n_calls * 1e3)
    out = {}
    for name in names:
        ms = times[name]
        total_calls = sum(per_round)
        mean = sum(t * c for t, c in zip(ms, per_round)) / total_calls
        out[name] = {"ms": mean, "median_round_ms": statistics.median(ms), "rounds_ms": ms}
        if cpu[name]:  # CPU seconds of the process per call (less sensitive to competing processes)
            out[name]["cpu_ms"] = sum(t * c for t, c in zip(cpu[name], per_round)) / total_calls
    return out


__all__ = ["time_alternating"]
