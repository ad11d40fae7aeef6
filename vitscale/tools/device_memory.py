"""Measured device memory: the caching allocator's peak since the last reset, as the trainer logs it
(``mem_peak_gib``) and ``vitscale bench`` reports it (``peak_mem_gb``).

Without CUDA graphs the figure is the peak *allocated* memory: every tensor alive at the worst moment.
With CUDA graphs (``train.compile_mode=reduce-overhead`` / ``max-autotune``) a recorded graph keeps its
tensors in a private memory pool that the allocator counts as allocated only while the graph is being
recorded; replays write into the pool without allocating, so from the third step on the allocated
peak leaves out every activation the graphs hold — measured on an H100 (ViT-B/16, batch 32, bf16):
1.11 GiB allocated from step 3 on against 3.13 GiB for the same run without graphs
(``benchmarks/results/gpu_check_h100_202611.json``, run ``vit_b16/graphs``). The pools stay *reserved*
(PyTorch's notes on CUDA graph trees: docs.pytorch.org/docs/stable/torch.compiler_cudagraph_trees.html),
so under CUDA graphs the figure is the peak reserved memory: an upper bound, since it also holds the
allocator's cached free blocks.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

ALLOCATED, RESERVED = "allocated_bytes.all.peak", "reserved_bytes.all.peak"


def peak_key(cudagraphs: bool) -> str:
    """The allocator statistic that holds a step's peak memory (see the module's notes)."""
    return RESERVED if cudagraphs else ALLOCATED


def peak_bytes(stats: Mapping[str, int], cudagraphs: bool) -> int:
    """The peak from ``torch.cuda.memory_stats()``'s dictionary."""
    return int(stats.get(peak_key(cudagraphs), 0))


def read_peak(device: torch.device, cudagraphs: bool, reset: bool = True) -> int:
    """Bytes at the peak since the last reset on ``device`` (a host-side counter: no synchronisation);
    ``reset``: start the next period afresh."""
    peak = peak_bytes(torch.cuda.memory_stats(device), cudagraphs)
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
    return peak


__all__ = ["ALLOCATED", "RESERVED", "peak_bytes", "peak_key", "read_peak"]
