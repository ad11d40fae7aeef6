"""Parallelize a CLIP model from outside: the ViT recipe applied to both towers.

TP + SP (the ViT ``Block`` plan; the text tower's ``CausalBlock`` is a ``Block`` whose attention is
causal, which is unaffected by gathering the token shards before attention) -> activation
checkpointing -> per-block compile -> FSDP2 with one unit per block of either tower; the root unit
holds the embeddings, final norms, projections and the logit scale.
"""

from __future__ import annotations

from torch import nn

from ...distributed.activation_checkpoint import apply_activation_checkpointing
from ...distributed.compile import apply_compile
from ...distributed.fsdp import apply_fsdp, dp_mesh_for, resolve_precision
from ..vit.parallelize import apply_tp


def parallelize_clip(model: nn.Module, parallel_dims, cfg=None) -> nn.Module:
    """Apply ``parallel_dims`` and ``cfg.parallel`` / ``cfg.train.compile`` / ``cfg.precision`` to a
    :class:`~vitscale.models.clip.CLIP` (works on the meta device; returns the same module)."""
    par = getattr(cfg, "parallel", None) if cfg is not None else None
    train = getattr(cfg, "train", None) if cfg is not None else None
    prec = getattr(cfg, "precision", None) if cfg is not None else None
    parallel_dims.validate_model(getattr(model, "cfg", None))
    towers = (model.visual, model.text)
    if parallel_dims.tp_enabled:
        for tower in towers:
            apply_tp(tower, parallel_dims.tp_mesh())
    for tower in towers:
        apply_activation_checkpointing(
            tower.blocks,
            getattr(par, "activation_checkpointing", "none") or "none",
            getattr(par, "ac_method", "block") or "block",
            int(getattr(par, "ac_num_layers", 0) or 0),
        )
        if getattr(train, "compile", False):
            apply_compile(tower.blocks)
    if parallel_dims.distributed:
        param_dtype, reduce_dtype = resolve_precision(prec, parallel_dims.device)
        blocks = list(model.visual.blocks) + list(model.text.blocks)
        apply_fsdp(model, blocks, dp_mesh_for(parallel_dims), param_dtype, reduce_dtype)
    return model


__all__ = ["parallelize_clip"]
