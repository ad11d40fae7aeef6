"""Rows of a split computed on several ranks, gathered into one tensor in dataset order."""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather_ordered(t: torch.Tensor, index: torch.Tensor, group=None) -> torch.Tensor:
    """Every data-parallel rank's rows of ``t`` (``index``: their dataset indices), concatenated and
    sorted by index, on every rank; rows with index -1 (padding samples) are dropped. Ranks may hold
    unequal counts. ``group``: the data-parallel group (None = the world)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        keep = index >= 0
        t, index = t[keep], index[keep]
        return t[index.argsort()]
    world = dist.get_world_size(group)
    n = torch.tensor([t.shape[0]], device=t.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=group)
    m = int(max(s.item() for s in sizes))
    pad = torch.zeros((m - t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    ipad = torch.full((m - t.shape[0],), -1, dtype=index.dtype, device=t.device)
    parts = [torch.empty((m, *t.shape[1:]), dtype=t.dtype, device=t.device) for _ in range(world)]
    iparts = [torch.empty(m, dtype=index.dtype, device=t.device) for _ in range(world)]
    dist.all_gather(parts, torch.cat([t, pad]), group=group)
    dist.all_gather(iparts, torch.cat([index.to(t.device), ipad]), group=group)
    allt, alli = torch.cat(parts), torch.cat(iparts)
    keep = alli >= 0
    allt, alli = allt[keep], alli[keep]
    return allt[alli.argsort()]


__all__ = ["gather_ordered"]
