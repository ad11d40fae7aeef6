"""Gradient-norm clipping on any layout: over DTensors that live on different meshes (FSDP-only
parameters next to FSDP x TP ones), and a DTensor's local shard."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch
import torch.distributed as dist

try:  # torch >= 2.5
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - older torch
    from torch.distributed._tensor import DTensor


def _sharded_mesh_dims(t) -> tuple[int, ...]:
    return tuple(i for i, p in enumerate(t.placements) if p.is_shard())


@torch.no_grad()
def grad_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """L2 norm of all gradients, every shard counted once, on any layout.

    ``torch.nn.utils.clip_grad_norm_`` stacks per-parameter norms, which fails when DTensors sit on
    different meshes (FSDP x TP). Here each gradient's local squared sum is added up per
    ``(mesh, sharded mesh dims)`` group and all-reduced over exactly the mesh dimensions it is
    sharded on (replicated dimensions already hold the full value). Returns the global norm (a plain
    float32 tensor, identical on every rank).
    """
    from .tensor_parallel import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    groups: dict = defaultdict(list)
    for g in grads:
        if isinstance(g, DTensor):
            groups[(g.device_mesh, _sharded_mesh_dims(g))].append(g.to_local())
        else:
            groups[None].append(g)
    device = (grads[0].to_local() if isinstance(grads[0], DTensor) else grads[0]).device
    total = torch.zeros((), device=device, dtype=torch.float32)
    for key, local in groups.items():
        sq = torch.stack([torch.linalg.vector_norm(x.float()) ** 2 for x in local]).sum()
        if key is not None:
            mesh, dims = key
            for d in dims:  # one all-reduce per sharded mesh dimension
                dist.all_reduce(sq, group=mesh.get_group(d))
        total += sq
    return total.sqrt()


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float = float("inf")) -> torch.Tensor:
    """:func:`grad_norm`, and the gradients scaled in place to at most ``max_norm`` (as
    ``torch.nn.utils.clip_grad_norm_``: by ``min(1, max_norm / (norm + 1e-6))``). Returns the norm
    before clipping."""
    from .tensor_parallel import DTensor

    params = [p for p in parameters if p.grad is not None]
    norm = grad_norm(params)
    if params and max_norm != float("inf"):
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_([p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params], coef)
    return norm


@torch.no_grad()
def grad_norms(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """Each parameter's gradient L2 norm, ``(P,)`` float32 in the order given (every parameter with a
    gradient), every shard counted once, on any layout: as :func:`grad_norm`, the local squared sums
    of one ``(mesh, sharded mesh dims)`` group all-reduced together, one all-reduce per sharded mesh
    dimension and group, not one per parameter."""
    grads = [p.grad for p in parameters]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    if not local:
        return torch.zeros(0)
    sq = torch.stack([torch.linalg.vector_norm(x.float()) ** 2 for x in local])
    groups: dict = defaultdict(list)
    for i, g in enumerate(grads):
        if isinstance(g, DTensor):
            groups[(g.device_mesh, _sharded_mesh_dims(g))].append(i)
    for (mesh, dims), idx in groups.items():
        if not dims:
            continue
        at = torch.tensor(idx, device=sq.device)
        part = sq.index_select(0, at)
        for d in dims:
            dist.all_reduce(part, group=mesh.get_group(d))
        sq.index_copy_(0, at, part)
    return sq.sqrt()


@torch.no_grad()
def clip_grad_norms_(parameters: Iterable[torch.Tensor], groups: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The gradients of each group of ``parameters`` (``groups``: a group number per parameter with a
    gradient) scaled in place to a norm of at most ``max_norm``, each group on its own, by
    ``min(1, max_norm / (norm + 1e-6))`` (``torch.nn.utils.clip_grad_norm_``'s factor, and DINO's
    per-parameter ``utils.clip_gradients``, facebookresearch/dino ``utils.py`` lines 132-141). Returns the
    global norm of all of them before clipping (what the run logs)."""
    params = [p for p in parameters if p.grad is not None]
    norms = grad_norms(params)
    if not params:
        return torch.zeros(())
    groups = groups.to(norms.device)
    sq = torch.zeros(int(groups.max()) + 1, device=norms.device).index_add_(0, groups, norms.square())
    coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0).index_select(0, groups)
    for p, c in zip(params, coef.unbind(), strict=True):
        local_shard(p.grad).mul_(c.to(p.grad.dtype))
    return sq.sum().sqrt()


__all__ = ["clip_grad_norm_", "clip_grad_norms_", "grad_norm", "grad_norms", "local_shard", "move_towards"]


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (the same storage), a plain tensor as it is."""
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def move_towards(targets: Iterable[torch.Tensor], sources: Iterable[torch.Tensor], weight: float,
                 ok: torch.Tensor | None = None) -> None:  # fmt: skip
    """``target += weight (source - target)`` for each pair — an exponential moving average of
    ``sources`` (the run's EMA: ``weight = 1 - decay``; an EMA teacher: ``1 - momentum``) — in one
    foreach call on the local shards (both sides sharded alike: no communication; DTensor has no
    sharding rule for every foreach op). ``ok``: a device scalar that scales the weight (0.0 = a
    skipped step: nothing moves), so the host never waits for it."""
    t = [local_shard(x) for x in targets]
    s = [local_shard(x.detach()) for x in sources]
    if not t:
        return
    if ok is None:
        torch._foreach_lerp_(t, s, weight)
    else:
        w = ok * weight
        torch._foreach_lerp_(t, s, [w.to(x.device) for x in t])
