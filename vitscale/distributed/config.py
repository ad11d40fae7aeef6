"""The ``parallel`` and ``precision`` groups of the run config (fields of ``vitscale.config.Config``).

They live here, beside the code that applies them (:mod:`vitscale.distributed.parallelize`), as the
``data`` group lives in ``vitscale.data.config``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ParallelConfig:
    """Parallel layout (implemented in vitscale.distributed); the product of the sizes = world size."""

    dp_replicate: int = 1
    """Data-parallel replicas (DDP / HSDP outer dimension)."""
    dp_shard: int = -1
    """FSDP shard group size; -1 = the rest of the world."""
    tp: int = 1
    """Tensor-parallel size (Megatron-style column/row sharding within each block)."""
    activation_checkpointing: str = "none"
    """none | full | selective."""
    ac_method: str = "block"
    """block | uniform: how blocks are picked for checkpointing."""
    ac_num_layers: int = 0
    """Blocks to checkpoint; 0 = all."""


@dataclass
class PrecisionConfig:
    """Numerics."""

    param_dtype: str | None = None
    """Compute dtype of parameters (FSDP mixed precision / autocast): None = bf16 on GPU, fp32 on CPU."""
    reduce_dtype: str = "float32"
    """Gradient reduction dtype."""
    autocast: str = "auto"
    """auto (bf16 autocast on GPU, none on CPU) | bf16 | fp16 | none."""


__all__ = ["ParallelConfig", "PrecisionConfig"]
