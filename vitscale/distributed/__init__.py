"""Scale-out on PyTorch's own engine: DeviceMesh, FSDP2, DTensor TP/SP, activation checkpointing.

``init_distributed(cfg.parallel, device) -> ParallelDims`` sets up the process group and mesh (a
world of one without torchrun); :func:`vitscale.distributed.parallelize.parallelize` applies a
family's :class:`~vitscale.distributed.parallelize.ParallelPlan` (fp8 -> TP -> activation
checkpointing -> compile -> FSDP2); :mod:`vitscale.distributed.init` initialises the sharded model. This package
imports nothing from ``vitscale.models``: the families' ``parallelize.py`` import it.
"""

from .parallel_dims import LayoutError, ParallelDims, destroy_distributed, init_distributed, resolve_device

__all__ = ["LayoutError", "ParallelDims", "destroy_distributed", "init_distributed", "resolve_device"]
