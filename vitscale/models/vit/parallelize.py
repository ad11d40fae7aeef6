"""Parallelize a ViT from outside the model: TP + SP -> activation checkpointing -> compile -> FSDP2.

The order is torchtitan's: tensor parallelism first (it swaps parameters for DTensors on the ``tp``
mesh), activation checkpointing and per-block compile next (they wrap the blocks' forward, so they
see the DTensor code), FSDP2 last (it shards whatever parameters it finds, DTensors included, over
the data-parallel mesh: a 2-D FSDP x TP layout).

Tensor parallel plans (Megatron style), one readable dict per block type:

- ``Block``: norm1 / norm2 / LayerScale run sequence parallel on token shards; attention and MLP
  inputs are all-gathered; ``attn.qkv`` and ``mlp.fc1`` are column parallel (whole heads per rank
  thanks to the ``(H, 3, Dh)`` QKV row layout); ``attn.proj`` and ``mlp.fc2`` row parallel with a
  reduce-scatter back onto token shards; QK-norms see their heads' shard.
- ``ParallelBlock`` (ViT-22B): ``in_proj`` (QKV + fc1 fused, rows grouped per head) column parallel,
  ``out_proj`` row parallel, its per-head ``mlp_bias (H, F/H)`` sharded on dim 0.
- MAP head: ``q`` / ``kv`` / ``mlp.fc1`` column parallel, ``proj`` / ``mlp.fc2`` row parallel (its
  single query token is not worth sequence-sharding).

Patch / position embeddings, the final norm and the classifier are replicated across TP ranks.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ...distributed.activation_checkpoint import apply_activation_checkpointing
from ...distributed.compile import apply_compile
from ...distributed.fsdp import apply_fsdp, dp_mesh_for, resolve_precision
from ...distributed.tensor_parallel import (
    ShardedLocalParams,
    apply_plan,
    colwise,
    enter_sequence_parallel,
    exit_sequence_parallel,
    gather_sequence_input,
    head_parallel_norm,
    rowwise,
    sequence_parallel,
)
from .model import ParallelBlock


def block_plan() -> dict[str, Any]:
    """TP + SP plan of the standard pre-norm ``Block`` (paths relative to the block)."""
    return {
        "norm1": sequence_parallel(),
        "attn": gather_sequence_input(),
        "attn.qkv": colwise(),
        "attn.q_norm": head_parallel_norm(1),  # q: (B, H/tp, N, Dh)
        "attn.k_norm": head_parallel_norm(1),
        "attn.proj": rowwise(),
        "ls1": sequence_parallel(),
        "norm2": sequence_parallel(),
        "mlp": gather_sequence_input(),
        "mlp.fc1": colwise(),
        "mlp.fc2": rowwise(),
        "ls2": sequence_parallel(),
    }


def parallel_block_plan() -> dict[str, Any]:
    """TP + SP plan of the ViT-22B ``ParallelBlock``."""
    return {
        "norm": sequence_parallel(),
        "in_proj": colwise(input_sharded_on_tokens=True),  # all-gather tokens, then QKV + fc1 columns
        "q_norm": head_parallel_norm(1),
        "k_norm": head_parallel_norm(1),
        "out_proj": rowwise(),
        "ls": sequence_parallel(),
        "": ShardedLocalParams({"mlp_bias": 0}),  # (H, F/H): this rank's heads
    }


def map_head_plan() -> dict[str, Any]:
    """TP plan of the multihead attention pooling head (paths relative to ``attn_pool``)."""
    return {
        "q": colwise(),
        "kv": colwise(),  # rows (H, 2, Dh): whole heads per rank
        "q_norm": head_parallel_norm(1),
        "k_norm": head_parallel_norm(1),
        "proj": rowwise(sequence_parallel_output=False),
        "mlp.fc1": colwise(),
        "mlp.fc2": rowwise(sequence_parallel_output=False),
    }


def apply_tp(model: nn.Module, tp_mesh) -> None:
    blocks = list(model.blocks)
    for block in blocks:
        apply_plan(block, tp_mesh, parallel_block_plan() if isinstance(block, ParallelBlock) else block_plan())
    apply_plan(model.blocks[0], tp_mesh, {"": enter_sequence_parallel()})
    apply_plan(model.blocks[-1], tp_mesh, {"": exit_sequence_parallel()})
    if getattr(model, "attn_pool", None) is not None:
        apply_plan(model.attn_pool, tp_mesh, map_head_plan())


def _section(cfg, name):
    return getattr(cfg, name, None) if cfg is not None else None


def parallelize_vit(model: nn.Module, parallel_dims, cfg=None) -> nn.Module:
    """Apply the layout of ``parallel_dims`` and the ``cfg.parallel`` / ``cfg.train.compile`` /
    ``cfg.precision`` options to a ViT (or any module with ``.blocks`` of ViT blocks, e.g. CLIP's
    vision tower). Works on a meta-device model; returns the same module."""
    par, train, prec = _section(cfg, "parallel"), _section(cfg, "train"), _section(cfg, "precision")
    parallel_dims.validate_model(getattr(model, "cfg", None))
    if parallel_dims.tp_enabled:
        apply_tp(model, parallel_dims.tp_mesh())
    apply_activation_checkpointing(
        model.blocks,
        getattr(par, "activation_checkpointing", "none") or "none",
        getattr(par, "ac_method", "block") or "block",
        int(getattr(par, "ac_num_layers", 0) or 0),
    )
    if getattr(train, "compile", False):
        apply_compile(model.blocks)
    if parallel_dims.distributed:
        param_dtype, reduce_dtype = resolve_precision(prec, parallel_dims.device)
        apply_fsdp(
            model, model.blocks, dp_mesh_for(parallel_dims), param_dtype, reduce_dtype,
            extra_units=[getattr(model, "attn_pool", None)],
        )  # fmt: skip
    return model


__all__ = ["apply_tp", "block_plan", "map_head_plan", "parallel_block_plan", "parallelize_vit"]
