"""The one parallelize tail: fp8 -> block numerics -> TP -> activation checkpointing -> per-block compile -> FSDP2.

fp8 comes first: torchao's ``Float8Linear`` swapped in for the blocks' linear layers
(:mod:`vitscale.distributed.float8`), as torchtitan converts before it parallelizes. The order of
the rest is torchtitan's (``torchtitan/models/llama3/infra/parallelize.py``): tensor parallelism
first (it swaps parameters for DTensors on the ``tp`` mesh), activation checkpointing and per-block
compile next (they wrap the blocks' forward, so they see the DTensor code), FSDP2 last (it shards
whatever parameters it finds, DTensors included, over the data-parallel mesh: a 2-D FSDP x TP
layout). A family contributes only its :class:`ParallelPlan` — its TP plan and its blocks — from its
``parallelize.py``. A task's training module lays out its own parts (heads, a decoder) through the same
tail: :func:`parallelize_parts` applies a :class:`PartsPlan` (TP, then FSDP2 units).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .activation_checkpoint import apply_activation_checkpointing
from .compile import apply_compile
from .config import ParallelConfig, PrecisionConfig
from .epilogue import apply_block_numerics
from .float8 import apply_float8, fsdp_float8_all_gather
from .fsdp import apply_fsdp, dp_mesh_for, resolve_precision
from .parallel_dims import LayoutError, ParallelDims


def no_extra_units(model: nn.Module) -> list[nn.Module]:
    return []


def no_tp_constraints(cfg: Any, tp: int) -> list[str]:
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
    compile_units: Callable[[nn.Module], Sequence[nn.Module]] = no_extra_units
    """Modules besides the blocks that per-block compile compiles on their own (VOLO's convolutional
    stem, whose BatchNorms would otherwise run eager)."""
    check_tp: Callable[[Any, int], list[str]] = no_tp_constraints
    """``check_tp(cfg, tp)``: what keeps the TP plan from splitting a model of variant config ``cfg``
    over ``tp`` ranks, one phrase per field (``"num_attention_heads=12 is not divisible by 8"``);
    empty when it splits. Asked before anything is built (:func:`check_layout`) and by ``vitscale memory``."""


def indivisible(fields: dict[str, int], tp: int) -> list[str]:
    """:attr:`ParallelPlan.check_tp`'s phrases for the ``fields`` (name -> value) that ``tp`` must
    divide: ``"num_attention_heads=12 is not divisible by 8 (tp that divide it: 1, 2, 3, 4, 6, 12)"``
    (the divisors up to 64)."""
    out = []
    for name, n in fields.items():
        if n % tp:
            divisors = [d for d in range(1, min(n, 64) + 1) if n % d == 0]
            more = ", ..." if any(n % d == 0 for d in range(65, n + 1)) else ""
            out.append(f"{name}={n} is not divisible by {tp} (tp that divide it: {', '.join(map(str, divisors))}{more})")
    return out


def check_layout(plan: ParallelPlan, cfg: Any, tp: int, model: str = "the model") -> None:
    """:class:`LayoutError` naming every field of ``cfg`` that ``parallel.tp=tp`` does not split."""
    problems = plan.check_tp(cfg, tp) if tp > 1 else []
    if problems:
        raise LayoutError(f"parallel.tp={tp} does not split {model}: {'; '.join(problems)}")


def parallelize(
    model: nn.Module,
    plan: ParallelPlan,
    dims: ParallelDims,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    compile: bool,
    compile_mode: str = "default",
    compile_backend: str = "inductor",
) -> nn.Module:
    """Apply fp8 (``precision.fp8``), the layout of ``dims``, the activation checkpointing of
    ``parallel``, per-block ``torch.compile`` (in ``compile_mode``, by ``compile_backend``) and FSDP2 with the mixed precision
    of ``precision`` to a model of the family whose ``plan`` is given. Works on the meta device;
    returns the same module."""
    check_layout(plan, model.cfg, dims.tp)
    stacks = plan.blocks(model)
    # fp8 first: torchao's Float8Linear must be in place before TP, compile and FSDP2 see the blocks
    apply_float8(
        model, [block for stack in stacks for block in stack], precision.fp8, device=dims.device,
        fp8_filter=precision.fp8_filter, fsdp_all_gather=fsdp_float8_all_gather(precision, dims),
    )  # fmt: skip
    # the blocks' residual dtype and MLP epilogues (precision.residual / mlp_epilogue): attributes their
    # forwards read, set before TP and compile trace them
    apply_block_numerics(
        [block for stack in stacks for block in stack], residual=precision.residual, mlp_epilogue=precision.mlp_epilogue,
        autocast=resolve_precision(precision, dims.device).autocast, device=dims.device, fp8=precision.fp8, tp=dims.tp,
    )  # fmt: skip
    if dims.tp_enabled:
        plan.apply_tp(model, dims.tp_mesh())
    for stack in stacks:  # each stack counts its own first / every k-th blocks
        apply_activation_checkpointing(stack, parallel.activation_checkpointing, parallel.ac_method, parallel.ac_num_layers)
    if compile:
        for stack in stacks:
            apply_compile(stack, mode=compile_mode, backend=compile_backend)
        apply_compile(plan.compile_units(model), mode=compile_mode, backend=compile_backend)
    if dims.distributed:
        p = resolve_precision(precision, dims.device)
        blocks = [block for stack in stacks for block in stack]
        apply_fsdp(model, blocks, dp_mesh_for(dims), p.param_dtype, p.reduce_dtype, extra_units=plan.fsdp_units(model))
    return model


@dataclass
class PartsPlan:
    """The layout of a training module's parts under torchrun (:mod:`vitscale.tasks.module`), applied by
    :func:`parallelize_parts` in this order: ``tp`` — ``(module, plan, row_sharded)``: the module's
    tensor-parallel plan (styles of :mod:`vitscale.distributed.tensor_parallel`, paths relative to it)
    and the names of its parameters split on their rows over the TP ranks (whole rows per rank); then
    ``fsdp`` — modules made FSDP2 units of their own on the data-parallel mesh, with the run's mixed
    precision, resharded after their forward. Nothing applies in one process."""

    tp: list[tuple[nn.Module, dict, tuple[str, ...]]] = field(default_factory=list)
    fsdp: list[nn.Module] = field(default_factory=list)


def parallelize_parts(plan: PartsPlan, dims: ParallelDims, precision: PrecisionConfig) -> None:
    """Lay out a training module's parts as ``plan`` says on the layout ``dims`` (TP with
    ``parallel.tp > 1``, then FSDP2 under torchrun, in ``precision``); nothing in one process."""
    if not dims.distributed:
        return
    if dims.tp_enabled and plan.tp:
        from .tensor_parallel import Shard, apply_plan, distribute_tensor

        mesh = dims.tp_mesh()
        for module, tp_plan, rows in plan.tp:
            apply_plan(module, mesh, tp_plan)
            for name in rows:
                q = getattr(module, name)
                module.register_parameter(name, nn.Parameter(distribute_tensor(q.data, mesh, [Shard(0)]), q.requires_grad))
    from .fsdp import fully_shard, mixed_precision_policy

    p = resolve_precision(precision, dims.device)
    mp = mixed_precision_policy(p.param_dtype, p.reduce_dtype)
    for unit in plan.fsdp:
        # resharded after each forward, as a unit below a root: an EMA copy then gathers its new values
        fully_shard(unit, mesh=dp_mesh_for(dims), mp_policy=mp, reshard_after_forward=True)


__all__ = ["ParallelPlan", "PartsPlan", "check_layout", "indivisible", "no_extra_units", "no_tp_constraints", "parallelize",
           "parallelize_parts"]
