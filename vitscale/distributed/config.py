"""The ``parallel`` and ``precision`` groups of the run config (fields of ``vitscale.config.Config``).

They live here, beside the code that applies them (:mod:`vitscale.distributed.parallelize`), as the
``data`` group's formats declare their classes beside their readers (``vitscale/data/*.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

ACMode = Literal["none", "full", "selective"]
"""``parallel.activation_checkpointing``."""
ACMethod = Literal["block", "uniform"]
"""``parallel.ac_method``."""
CompileMode = Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
"""``train.compile_mode`` (``vitscale.distributed.compile``)."""
CompileBackend = Literal["inductor", "aot_eager", "eager"]
"""``train.compile_backend`` (``vitscale.distributed.compile``)."""
Fp8Recipe = Literal["none", "tensorwise", "rowwise", "rowwise_with_gw_hp"]
"""``precision.fp8`` (``vitscale.distributed.float8``)."""
Fp8Filter = Literal["auto", "all", "torchao"]
"""``precision.fp8_filter``."""
ResidualDtype = Literal["fp32", "bf16"]
"""``precision.residual`` (``vitscale.distributed.epilogue``)."""
MlpEpilogue = Literal["none", "cublaslt", "cublaslt_tanh"]
"""``precision.mlp_epilogue`` (``vitscale.distributed.epilogue``)."""


@dataclass
class ParallelConfig:
    """Parallel layout (implemented in vitscale.distributed); the product of the sizes = world size."""

    RANGES: ClassVar[dict[str, tuple]] = {"dp_replicate": (1, 1 << 20), "dp_shard": (-1, 1 << 20), "tp": (1, 1 << 10), "ac_num_layers": (0, 1 << 16), "timeout": (1.0, 7 * 86400.0)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    dp_replicate: int = 1
    """Data-parallel replicas (DDP / HSDP outer dimension)."""
    dp_shard: int = -1
    """FSDP shard group size; -1 = the rest of the world."""
    tp: int = 1
    """Tensor-parallel size (Megatron-style column/row sharding within each block)."""
    activation_checkpointing: ACMode = "none"
    """none | full | selective."""
    ac_method: ACMethod = "block"
    """block | uniform: how blocks are picked for checkpointing."""
    ac_num_layers: int = 0
    """Blocks to checkpoint; 0 = all."""
    timeout: float = 1800.0
    """Seconds a collective (and the process group's start) may wait for the other ranks before it
    fails with an error (PyTorch's process-group timeout; its default is 30 minutes)."""


@dataclass
class PrecisionConfig:
    """Numerics."""

    param_dtype: str | None = None
    """Compute dtype of parameters (FSDP mixed precision / autocast): None = bf16 on GPU, fp32 on CPU."""
    reduce_dtype: str = "float32"
    """Gradient reduction dtype."""
    autocast: Literal["auto", "bf16", "fp16", "none"] = "auto"
    """auto (bf16 autocast on GPU, none on CPU) | bf16 | fp16 | none."""
    fp8: Fp8Recipe = "none"
    """Linear layers of the transformer blocks in float8 with torchao (``pip install 'vitscale[fp8]'``;
    docs/training.md "fp8 training"): none | tensorwise | rowwise | rowwise_with_gw_hp. Needs a GPU
    with fp8 tensor cores (H100, L40, ...); emulated on CPU (same numerics, no speed-up)."""
    fp8_filter: Fp8Filter = "auto"
    """Which block linears go to float8: auto (those whose features are multiples of 16 and whose
    shape is large enough for the recipe to pay on an H100, per torchao's tables) | all (every one
    whose features are multiples of 16) | torchao (the layers torchao's own shape filter,
    ``torchao.float8._auto_filter_for_recipe``, keeps: tensorwise and rowwise only). The patch
    embedding and the heads always stay in bf16."""
    residual: ResidualDtype = "fp32"
    """The residual stream between the ViT blocks under bf16 autocast: fp32 (as today: the float32
    position embedding promotes it) | bf16 (held in bfloat16, as Megatron-core's default
    ``fp32_residual_connection=False``; half the bytes of each add and LayerNorm read). Needs bf16
    autocast; stays fp32 until a GPU measurement shows bf16 paying (docs/distributed.md)."""
    mlp_epilogue: MlpEpilogue = "none"
    """The ViT blocks' GELU MLP with GELU and the bias gradients inside cuBLASLt's matmul epilogues
    (nvmath-python; CUDA, bf16 autocast): none | cublaslt (models whose activation is gelu_tanh) |
    cublaslt_tanh (also exact-GELU models, which then compute the tanh approximation instead: not
    timm's function any more). docs/distributed.md "Block numerics"."""
    fp8_all_gather: bool = True
    """tensorwise under FSDP2 (dp_shard > 1): all-gather the weights in float8 (half the bytes of
    bf16), their scales computed for all weights at once after each optimizer step."""


__all__ = [
    "ACMethod", "ACMode", "CompileMode", "Fp8Filter", "Fp8Recipe", "MlpEpilogue", "ParallelConfig", "PrecisionConfig",
    "ResidualDtype",
]  # fmt: skip
