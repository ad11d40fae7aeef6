"""Initialise a parallelized, ``to_empty``-ed model (built by :func:`vitscale.run.build_model`).

Two ways to initialise, chosen by ``init``:

- ``"reference"``: every rank builds the full model on the CPU from ``seed`` and copies its own
  shard out of it. The weights are bit-identical to a one-process run under any layout (what the
  equivalence tests and small models use), at the cost of one full CPU copy per rank for a moment.
- ``"sharded"``: ``init_weights()`` runs directly on the sharded parameters: nothing is ever
  materialised whole (ViT-22B). The weights are a valid draw from the same distributions but differ
  between layouts (see :func:`sharded_init`).
- ``"auto"``: on several processes ``reference`` up to ``REFERENCE_INIT_MAX_PARAMS`` parameters, else
  ``sharded``; in one process ``init_weights()`` on the model itself, on its device (the one-process
  weights ``reference`` reproduces).

Either way, resuming from a checkpoint (which loads under any layout) continues identically.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

REFERENCE_INIT_MAX_PARAMS = 700_000_000  # up to ViT-H; a full fp32 CPU copy is <= 2.8 GB per rank


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def copy_full_state_dict(model: nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Copy full (unsharded) tensors into a possibly sharded model, each rank keeping its shard.

    Every rank must hold the same ``full`` tensors; ``distribute_tensor`` then only slices
    (it scatters from the mesh's first rank, which holds identical data).
    """
    from .tensor_parallel import DTensor, distribute_tensor

    own = dict(model.named_parameters())
    own.update(dict(model.named_buffers()))
    missing = sorted(set(own) - set(full))
    if missing:
        raise KeyError(f"reference state dict lacks {missing[:5]}")
    for name, t in own.items():
        src = full[name].to(dtype=t.dtype)
        if isinstance(t, DTensor):
            local = distribute_tensor(src.to(t.device), t.device_mesh, t.placements).to_local()
            t.to_local().copy_(local)
        else:
            t.copy_(src)


def is_tp_sharded(p) -> bool:
    """Whether ``p`` is a DTensor sharded over the ``tp`` mesh dimension."""
    from .tensor_parallel import DTensor

    if not isinstance(p, DTensor) or "tp" not in (p.device_mesh.mesh_dim_names or ()):
        return False
    return p.placements[p.device_mesh.mesh_dim_names.index("tp")].is_shard()


@contextlib.contextmanager
def _local_views(model: nn.Module):
    """Let every module see its DTensor parameters as their local shards (views: in-place writes
    land in the shards). DTensor random ops on a CPU mesh fall back to building the full tensor;
    on the local views nothing bigger than a shard is ever allocated. The ViT family initialises
    from constants (std 0.02, width**-0.5), not from the tensor shapes, so the draws keep their
    distribution."""
    from .tensor_parallel import DTensor

    swapped = []
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if isinstance(p, DTensor):
                m._parameters[name] = p.to_local()
                swapped.append((m, name, p))
    try:
        yield
    finally:
        for m, name, p in swapped:
            m._parameters[name] = p


@torch.no_grad()
def sharded_init(model: nn.Module, parallel_dims, seed: int) -> None:
    """``init_weights()`` on the local shards only.

    On GPU, DTensor's offset-based RNG gives every shard its own part of one random stream. CPU
    meshes have no such tracker (DTensor random ops there would draw the same numbers on every
    rank, i.e. identical shards, and build each full tensor first); there each rank initialises
    its local shards (:func:`_local_views`) from ``seed + rank``, and the parameters that are
    replicated across the TP group (embeddings, head, norms) are then broadcast from the group's
    first rank.
    """
    import torch.distributed as dist

    if not parallel_dims.distributed or parallel_dims.device.type != "cpu":
        torch.manual_seed(seed)
        model.init_weights()
        return
    torch.manual_seed(seed + 1_000_003 * parallel_dims.rank)
    with _local_views(model):
        model.init_weights()
    if parallel_dims.tp_enabled:
        tp_mesh = parallel_dims.tp_mesh()
        group = tp_mesh.get_group()
        src = dist.get_global_rank(group, 0)
        for p in list(model.parameters()) + list(model.buffers()):
            if not is_tp_sharded(p):
                dist.broadcast(p.to_local() if hasattr(p, "to_local") else p, src=src, group=group)


@torch.no_grad()
def init_weights(model: nn.Module, parallel_dims, seed: int, reference_factory=None, init: str = "auto") -> str:
    """Initialise a parallelized, ``to_empty``-ed model; returns the method used.

    ``reference_factory()`` builds the same, unparallelized model (on meta or CPU). The reference
    weights are what one process gets from ``torch.manual_seed(seed); model.init_weights()`` on the
    CPU, so a run on any layout starts from exactly the one-process weights.
    """
    if init == "auto":
        small = count_params(model) <= REFERENCE_INIT_MAX_PARAMS
        init = "reference" if parallel_dims.distributed and small and reference_factory is not None else "sharded"
    if init == "reference":
        if reference_factory is None:
            raise ValueError("init='reference' needs a reference_factory")
        ref = reference_factory()
        if any(p.is_meta for p in ref.parameters()):
            ref.to_empty(device="cpu")
        torch.manual_seed(seed)
        ref.init_weights()
        # buffers too: non-persistent ones (masks, index tables) are not in state_dict() and
        # to_empty() left them uninitialised on the sharded model
        copy_full_state_dict(model, {**ref.state_dict(), **dict(ref.named_buffers())})
        del ref
    elif init == "sharded":
        sharded_init(model, parallel_dims, seed)
    else:
        raise ValueError(f"init must be auto, reference or sharded, got {init!r}")
    return init


__all__ = ["REFERENCE_INIT_MAX_PARAMS", "copy_full_state_dict", "count_params", "init_weights", "is_tp_sharded", "sharded_init"]
