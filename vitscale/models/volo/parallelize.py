"""VOLO's parallel plan (``PLAN``): its tensor-parallel plan and its blocks.

Blocks: one stack of every outlooker, transformer and class-attention block, in order; FSDP2 shards
each as its own unit (one all-gather per block), then the root (stem, patch merging, position
embedding, class token, final norm, class and aux heads).

Tensor parallelism (Megatron column / row pairs, no sequence parallelism — the coarse token grid,
e.g. 14 x 14 = 196 tokens, rarely splits evenly, and the fine grid is channels-last 2-D):

- outlooker: ``attn.v`` and ``attn.attn`` column parallel (rows are head-major, ``(H, Dh)`` and
  ``(H, K^2, K^2)``, so each rank gets whole heads with their window weights; unfold / fold run on
  the local channels), ``attn.proj`` row parallel; ``mlp.fc1`` column, ``mlp.fc2`` row parallel;
- transformer block: ``attn.qkv_per_head`` column parallel (rows ``(H, 3, Dh)``), ``attn.proj`` row;
  MLP as above;
- class attention: ``attn.q`` and ``attn.kv_per_head`` (rows ``(H, 2, Dh)``) column, ``attn.proj`` row; MLP as above.

LayerNorms, the convolutional stem, patch merging, embeddings and heads are replicated over TP ranks.
Under ``train.compile`` the stem is compiled too (``compile_units``), beside the blocks.
Head counts and MLP widths of both stages must divide by ``tp``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ...distributed.parallelize import ParallelPlan, indivisible
from ...distributed.tensor_parallel import apply_plan, colwise, rowwise


def _mlp_plan() -> dict[str, Any]:
    return {"mlp.fc1": colwise(), "mlp.fc2": rowwise(sequence_parallel_output=False)}


def outlooker_plan() -> dict[str, Any]:
    return {"attn.v": colwise(), "attn.attn": colwise(), "attn.proj": rowwise(sequence_parallel_output=False), **_mlp_plan()}


def transformer_plan() -> dict[str, Any]:
    return {"attn.qkv_per_head": colwise(), "attn.proj": rowwise(sequence_parallel_output=False), **_mlp_plan()}


def class_block_plan() -> dict[str, Any]:
    return {"attn.q": colwise(), "attn.kv_per_head": colwise(), "attn.proj": rowwise(sequence_parallel_output=False), **_mlp_plan()}


def check_tp(cfg, tp: int) -> list[str]:
    """Every sharded dimension splits evenly over ``tp`` ranks: both stages' heads and MLP widths."""
    return indivisible({
        "outlook_heads": cfg.outlook_heads,
        "num_heads": cfg.num_heads,
        "outlook MLP width (outlook_dim x outlook_mlp_ratio)": int(cfg.outlook_dim * cfg.outlook_mlp_ratio),
        "MLP width (hidden_size x mlp_ratio)": int(cfg.hidden_size * cfg.mlp_ratio),
    }, tp)  # fmt: skip


def apply_tp(model: nn.Module, tp_mesh) -> None:
    for blk in model.outlookers:
        apply_plan(blk, tp_mesh, outlooker_plan())
    for blk in model.blocks:
        apply_plan(blk, tp_mesh, transformer_plan())
    for blk in model.class_blocks:
        apply_plan(blk, tp_mesh, class_block_plan())


def all_blocks(model: nn.Module) -> list[list[nn.Module]]:
    """One stack: outlookers, transformer blocks, class-attention blocks."""
    return [[*model.outlookers, *model.blocks, *model.class_blocks]]


def stem(model: nn.Module) -> list[nn.Module]:
    """The convolutional stem, compiled on its own under ``train.compile`` (its eager BatchNorms took
    about 13 ms of a 59 ms VOLO-D1 step on an H100: benchmarks/README.md "GPU speed table"); none with
    ``stem_fast=False``."""
    return [model.patch_embed] if model.cfg.stem_fast else []


PLAN = ParallelPlan(apply_tp=apply_tp, blocks=all_blocks, check_tp=check_tp, compile_units=stem)

__all__ = ["PLAN", "all_blocks", "apply_tp", "check_tp", "class_block_plan", "outlooker_plan", "stem", "transformer_plan"]
