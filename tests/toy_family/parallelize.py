"""The toy family's parallel plan: its tensor-parallel plan, the check a layout must pass, its blocks."""

from __future__ import annotations

from torch import nn

from vitscale.distributed.parallelize import ParallelPlan, indivisible
from vitscale.distributed.tensor_parallel import apply_plan, colwise, rowwise


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Megatron MLP: ``fc1`` column parallel, ``fc2`` row parallel (all-reduced output)."""
    for block in model.blocks:
        apply_plan(block, tp_mesh, {"fc1": colwise(), "fc2": rowwise(sequence_parallel_output=False)})


def check_tp(cfg, tp: int) -> list[str]:
    """fc1's columns (and fc2's rows) split over the ranks: the MLP width must divide by ``tp``."""
    return indivisible({"mlp_hidden_size": cfg.mlp_hidden_size}, tp)


PLAN = ParallelPlan(apply_tp=apply_tp, blocks=lambda model: [model.blocks], check_tp=check_tp)
