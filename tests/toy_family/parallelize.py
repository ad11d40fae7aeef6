"""The toy family's parallel plan: its tensor-parallel plan and its blocks, nothing else."""

from __future__ import annotations

from torch import nn

from vitscale.distributed.parallelize import ParallelPlan
from vitscale.distributed.tensor_parallel import apply_plan, colwise, rowwise


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Megatron MLP: ``fc1`` column parallel, ``fc2`` row parallel (all-reduced output)."""
    for block in model.blocks:
        apply_plan(block, tp_mesh, {"fc1": colwise(), "fc2": rowwise(sequence_parallel_output=False)})


PLAN = ParallelPlan(apply_tp=apply_tp, blocks=lambda model: [model.blocks])
