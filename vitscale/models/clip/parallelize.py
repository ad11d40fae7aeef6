"""CLIP's parallel plan: the ViT recipe applied to both towers (``PLAN``).

TP + SP: the ViT ``Block`` plan on each tower (the text tower's ``CausalBlock`` is a ``Block`` whose
attention is causal, which is unaffected by gathering the token shards before attention). Blocks:
one stack per tower (activation checkpointing picks its blocks within each), one FSDP2 unit per block
of either tower; the root unit holds the embeddings, final norms, projections and the logit scale.
"""

from __future__ import annotations

from torch import nn

from ...distributed.parallelize import ParallelPlan
from ..vit.parallelize import apply_tp as apply_vit_tp
from ..vit.parallelize import inner_norm_problems, tower_problems


def apply_tp(model: nn.Module, tp_mesh) -> None:
    for tower in (model.visual, model.text):
        apply_vit_tp(tower, tp_mesh)


def tower_blocks(model: nn.Module) -> list[nn.ModuleList]:
    return [model.visual.blocks, model.text.blocks]


def check_tp(cfg, tp: int) -> list[str]:
    """Both towers' heads and MLP widths split over ``tp`` ranks."""
    return [*tower_problems(cfg.vision, tp, "vision."), *tower_problems(cfg.text, tp, "text."),
            *inner_norm_problems(cfg.vision, tp, "vision.")]  # fmt: skip


PLAN = ParallelPlan(apply_tp=apply_tp, blocks=tower_blocks, check_tp=check_tp)

__all__ = ["PLAN", "apply_tp", "check_tp", "tower_blocks"]
