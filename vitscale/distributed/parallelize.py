"""The one parallelize tail: fp8 -> TP -> activation checkpointing -> per-block compile -> FSDP2.

fp8 comes first: torchao's ``Float8Linear`` swapped in for the blocks' linear layers
(:mod:`vitscale.distributed.float8`), as torchtitan converts before it parallelizes. The order of
the rest is torchtitan's (``torchtitan/models/llama3/infra/parallelize.py``): tensor parallelism
first (it swaps parameters for DTensors on the ``tp`` mesh), activation checkpointing and per-block
compile next (they wrap the blocks' forward, so they see the DTensor code), FSDP2 last (it shards
whatever parameters it finds, DTensors included, over the data-parallel mesh: a 2-D FSDP x TP
layout). A family contributes only its :class:`ParallelPlan` — its TP plan and its blocks — from its
``parallelize.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from .activation_checkpoint import apply_activation_checkpointing
from .compile import apply_compile
from .config import ParallelConfig, PrecisionConfig
from .float8 import apply_float8, fsdp_float8_all_gather
from .fsdp import apply_fsdp, dp_mesh_for, resolve_precision
from .parallel_dims import ParallelDims


def no_extra_units(model: nn.Module) -> list[nn.Module]:
    return []


@dataclass(frozen=True)
class ParallelPlan:
    """What a model family contributes to :func:`parallelize` (``PLAN`` in its ``parallelize.py``,
    named by its registry entry's ``parallel_plan``)."""

    apply_tp: Callable[[nn.Module, Any], None]
    """``apply_tp(model, tp_mesh)``: the family's tensor (+ sequence) parallel plan, applied in place."""
    blocks: Callable[[nn.Module], Sequence[Sequence[nn.Module]]]
    """The model's repeated blocks, as stacks (CLIP: one per tower): each block is one activation
    checkpointing, compile and FSDP2 unit; ``parallel.ac_num_layers`` counts within a stack."""
    fsdp_units: Callable[[nn.Module], Sequence[nn.Module]] = no_extra_units
    """Modules besides the blocks that get an FSDP2 unit of their own (e.g. a large MAP head)."""


def parallelize(
    model: nn.Module,
    plan: ParallelPlan,
    dims: ParallelDims,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    compile: bool,
    compile_mode: str = "default",
) -> nn.Module:
    """Apply fp8 (``precision.fp8``), the layout of ``dims``, the activation checkpointing of
    ``parallel``, per-block ``torch.compile`` (in ``compile_mode``) and FSDP2 with the mixed precision
    of ``precision`` to a model of the family whose ``plan`` is given. Works on the meta device;
    returns the same module."""
    dims.validate_model(model.cfg)
    stacks = plan.blocks(model)
    # fp8 first: torchao's Float8Linear must be in place before TP, compile and FSDP2 see the blocks
    apply_float8(
        model, [block for stack in stacks for block in stack], precision.fp8, device=dims.device,
        fp8_filter=precision.fp8_filter, fsdp_all_gather=fsdp_float8_all_gather(precision, dims),
    )  # fmt: skip
    if dims.tp_enabled:
        plan.apply_tp(model, dims.tp_mesh())
    for stack in stacks:  # each stack counts its own first / every k-th blocks
        apply_activation_checkpointing(stack, parallel.activation_checkpointing, parallel.ac_method, parallel.ac_num_layers)
    if compile:
        for stack in stacks:
            apply_compile(stack, mode=compile_mode)
    if dims.distributed:
        p = resolve_precision(precision, dims.device)
        blocks = [block for stack in stacks for block in stack]
        apply_fsdp(model, blocks, dp_mesh_for(dims), p.param_dtype, p.reduce_dtype, extra_units=plan.fsdp_units(model))
    return model


__all__ = ["ParallelPlan", "no_extra_units", "parallelize"]
