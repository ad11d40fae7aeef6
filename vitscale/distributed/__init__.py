"""Scale-out on PyTorch's own engine: DeviceMesh, FSDP2, DTensor TP/SP, activation checkpointing.

``init_distributed(cfg.parallel, device) -> ParallelDims`` sets up the process group and mesh (a
world of one without torchrun); ``vitscale.models.registry.parallelize_fn(family)(model, dims, cfg)``
applies a family's plan; :mod:`vitscale.distributed.init` builds a model on meta and initialises it.
"""

from .parallel_dims import LayoutError, ParallelDims, destroy_distributed, init_distributed, resolve_device

__all__ = ["LayoutError", "ParallelDims", "destroy_distributed", "init_distributed", "resolve_device"]
