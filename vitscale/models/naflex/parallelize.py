"""The NaFlex ViT's parallel plan: the ViT's tensor-parallel plans for its blocks and MAP head
(``vitscale/models/vit/parallelize.py``), each block one FSDP2 unit, the MAP head one more.

The attention mask of a NaFlex batch reaches every block as a keyword argument (``attn_mask``): it
covers the whole sequence, is read only after the attention input is all-gathered from the token
shards, and broadcasts over the heads, so tensor (+ sequence) parallelism leaves it as it is.
"""

from __future__ import annotations

from torch import nn

from ...distributed.parallelize import ParallelPlan
from ...distributed.tensor_parallel import apply_plan
from ..vit.parallelize import apply_tp as apply_vit_tp
from ..vit.parallelize import check_tp, map_head_plan
from .model import NaFlexViT


def apply_tp(model: NaFlexViT, tp_mesh) -> None:
    """The ViT's TP + SP plan over the blocks, and its MAP-head plan."""
    apply_vit_tp(model, tp_mesh)
    if model.attn_pool is not None:
        apply_plan(model.attn_pool, tp_mesh, map_head_plan())


def map_head(model: NaFlexViT) -> list[nn.Module]:
    return [model.attn_pool] if model.attn_pool is not None else []


PLAN = ParallelPlan(apply_tp=apply_tp, blocks=lambda model: [model.blocks], fsdp_units=map_head, check_tp=check_tp)

__all__ = ["PLAN", "apply_tp"]
