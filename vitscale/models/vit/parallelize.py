"""The ViT's parallel plan: its tensor-parallel plan and its blocks (``PLAN``); the shared tail
:func:`vitscale.distributed.parallelize.parallelize` applies TP -> activation checkpointing ->
per-block compile -> FSDP2 with them. Each block is one FSDP2 unit, the MAP head one more.

Tensor parallel plans (Megatron style), one readable dict per block type:

- ``Block``: norm1 / norm2 / LayerScale run sequence parallel on token shards; attention and MLP
  inputs are all-gathered; ``attn.qkv_per_head`` and ``mlp.fc1`` are column parallel (whole heads per rank
  thanks to the ``(H, 3, Dh)`` QKV row layout; without a key bias, ``attn.q_bias`` / ``v_bias`` are
  sharded alike, whole heads); RoPE's angles are recomputed each forward, replicated, nothing to
  shard (RoPE-Mixed's learned ``attn.rope_freqs`` ``(H, 2, Dh/2)``: whole heads, as the q / v biases); ``attn.proj`` and ``mlp.fc2`` row parallel with a
  reduce-scatter back onto token shards; QK-norms see their heads' shard.
- ``ParallelBlock`` (ViT-22B): ``in_proj_per_head`` (QKV + fc1 fused, rows grouped per head) column parallel,
  ``out_proj_per_head`` row parallel, its ``mlp_bias_per_head (H, F/H)`` sharded on dim 0.
- MAP head: ``q`` / ``kv_per_head`` / ``mlp.fc1`` column parallel, ``proj`` / ``mlp.fc2`` row parallel (its
  single query token is not worth sequence-sharding).

Patch / position embeddings, the final norm and the classifier are replicated across TP ranks.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ...distributed.parallelize import ParallelPlan, indivisible
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
from .model import ParallelBlock, VisionTransformer


def _styles(style: Any) -> list[Any]:
    return list(style) if isinstance(style, (list, tuple)) else [style]


def block_plan() -> dict[str, Any]:
    """TP + SP plan of the standard pre-norm ``Block`` (paths relative to the block)."""
    return {
        "norm1": sequence_parallel(),
        # q / v biases (H*Dh,), RoPE-Mixed's frequencies (H, 2, Dh/2): this rank's heads
        "attn": [*_styles(gather_sequence_input()), ShardedLocalParams({"q_bias": 0, "v_bias": 0, "rope_freqs": 0})],
        "attn.qkv_per_head": colwise(),
        "attn.q_norm": head_parallel_norm(1),  # q: (B, H/tp, N, Dh)
        "attn.k_norm": head_parallel_norm(1),
        "attn.proj": rowwise(),
        "ls1": sequence_parallel(),
        "norm2": sequence_parallel(),
        "mlp": gather_sequence_input(),
        "mlp.fc1": colwise(),
        "mlp.fc1_g": colwise(),  # SwiGLU: gate and value columns alike, the product stays local
        "mlp.fc1_x": colwise(),
        "mlp.fc2": rowwise(),
        "ls2": sequence_parallel(),
    }


def parallel_block_plan() -> dict[str, Any]:
    """TP + SP plan of the ViT-22B ``ParallelBlock``."""
    return {
        "norm": sequence_parallel(),
        "in_proj_per_head": colwise(input_sharded_on_tokens=True),  # all-gather tokens, then QKV + fc1 columns
        "q_norm": head_parallel_norm(1),
        "k_norm": head_parallel_norm(1),
        "out_proj_per_head": rowwise(),
        "ls": sequence_parallel(),
        "": ShardedLocalParams({"mlp_bias_per_head": 0}),  # (H, F/H): this rank's heads
    }


def map_head_plan() -> dict[str, Any]:
    """TP plan of the multihead attention pooling head (paths relative to ``attn_pool``)."""
    return {
        "q": colwise(),
        "kv_per_head": colwise(),  # rows (H, 2, Dh): whole heads per rank
        "q_norm": head_parallel_norm(1),
        "k_norm": head_parallel_norm(1),
        "proj": rowwise(sequence_parallel_output=False),
        "mlp.fc1": colwise(),
        "mlp.fc2": rowwise(sequence_parallel_output=False),
    }


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """TP + SP over every block (the first enters sequence parallelism, the last leaves it) and the
    MAP head; also CLIP's vision and text towers (modules with ``.blocks`` of ViT blocks)."""
    for block in model.blocks:
        apply_plan(block, tp_mesh, parallel_block_plan() if isinstance(block, ParallelBlock) else block_plan())
    apply_plan(model.blocks[0], tp_mesh, {"": enter_sequence_parallel()})
    apply_plan(model.blocks[-1], tp_mesh, {"": exit_sequence_parallel()})
    if isinstance(model, VisionTransformer) and model.attn_pool is not None:
        apply_plan(model.attn_pool, tp_mesh, map_head_plan())


def map_head(model: VisionTransformer) -> list[nn.Module]:
    """The MAP head gets an FSDP2 unit of its own (it is as large as a block)."""
    return [model.attn_pool] if model.attn_pool is not None else []


def tower_problems(cfg: Any, tp: int, where: str = "") -> list[str]:
    """A transformer tower's heads and MLP width split over ``tp`` ranks (column-parallel QKV and
    fc1 give each rank whole heads and its share of the hidden units; the ViT-22B block's config
    already groups its MLP units per head). ``where``: the tower's prefix (``vision.``)."""
    return indivisible({f"{where}num_attention_heads": cfg.num_attention_heads, f"{where}ffn_hidden_size": cfg.ffn_hidden_size}, tp)


def check_tp(cfg: Any, tp: int) -> list[str]:
    return tower_problems(cfg, tp) + inner_norm_problems(cfg, tp)


def inner_norm_problems(cfg: Any, tp: int, where: str = "") -> list[str]:
    """EVA-02's norms inside the attention (over every head's output) and inside the SwiGLU (over every
    hidden unit) need what tensor parallelism splits across ranks: refused with ``tp > 1``."""
    if tp <= 1:
        return []
    spans = {"attn_inner_norm": "every head's output", "mlp_inner_norm": "every hidden unit"}
    return [f"{where}{k}=true normalises over {what}, which tensor parallelism splits" for k, what in spans.items()
            if getattr(cfg, k, False)]  # fmt: skip


PLAN = ParallelPlan(apply_tp=apply_tp, blocks=lambda model: [model.blocks], fsdp_units=map_head, check_tp=check_tp)

__all__ = ["PLAN", "apply_tp", "block_plan", "check_tp", "inner_norm_problems", "map_head_plan", "parallel_block_plan", "tower_problems"]
