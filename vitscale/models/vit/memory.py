"""The ViT's memory model (its ``FamilySpec.memory``), analytic from the config; CLIP uses it for its
image tower (``MEMORY_IMAGE_TOWER``).

Parameters: counted on the meta-device model; the TP-sharded ones are everything in a block but its
norms and LayerScale, plus the MAP head's linear layers; the largest FSDP unit is the largest block
(or the MAP head). Activations per image are those autograd saves for backward
(:func:`block_activation_elems`), checked against the tensors it actually saves in
``tests/unit/test_memory.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from .configs import ViTConfig
from .model import Block, ParallelBlock, VisionTransformer


def block_activation_elems(cfg: ViTConfig, tokens: int, tp: int = 1, ac: str = "none") -> float:
    """Elements autograd saves per image for one block (checked against autograd's saved tensors).

    Standard block, per token: LayerNorm inputs ``2D`` (sequence-sharded under TP: ``/tp``),
    LayerNorm outputs ``2D`` (the all-gathered matmul inputs: full), the QKV output and the
    attention output ``4D / tp``, fc1 and activation outputs ``2F / tp``; QK-norm adds the
    normalised q and k, ``2D / tp``, and RoPE the rotated ones, ``2D / tp``; a SwiGLU MLP its second
    input projection and the gated product, ``2F / tp``; EVA-02's norms inside the attention and the
    SwiGLU their outputs, ``D`` and ``F``. ViT-22B parallel block: LayerNorm input ``D / tp`` and output
    ``D``, then ``(5D + 3F) / tp`` (in_proj_per_head output, attention output, the MLP pre-activation and
    the concatenated out_proj_per_head input), ``+ 2D / tp`` with QK-norm.
    ``selective``: the block input, the matmul and attention outputs are kept, LayerNorms and
    activations are recomputed.
    """
    D, F = cfg.hidden_size, cfg.ffn_hidden_size
    qk = 2 * D if cfg.qk_norm else 0
    qk += 2 * D if cfg.pos_embed == "rope" else 0  # the rotated q and k
    glu = 2 * F if cfg.mlp_type == "swiglu" else 0  # the second input projection's output and the product
    inner = (D if cfg.attn_inner_norm else 0) + (F if cfg.mlp_inner_norm else 0)  # EVA-02's inner norms' outputs
    if cfg.parallel_block:
        none = D / tp + D + (5 * D + 3 * F + qk) / tp
        selective = D / tp + (3 * D + F + D + D) / tp  # input, in_proj_per_head out, attention out, out_proj_per_head out
    else:
        none = 2 * D / tp + 2 * D + (4 * D + 2 * F + qk + glu + inner) / tp
        selective = D / tp + (3 * D + D + D + F + glu // 2 + D) / tp  # input, qkv, attention, proj, fc1(s), fc2 outputs
    return tokens * (min(selective, none) if ac == "selective" else none)


def _norm_params(block: nn.Module) -> int:
    norms = (nn.LayerNorm, nn.RMSNorm)
    n = sum(p.numel() for m in block.modules() if isinstance(m, norms) for p in m.parameters())
    return n + sum(p.numel() for name, p in block.named_parameters() if name.startswith(("ls", "ls1", "ls2")))


@dataclass(frozen=True)
class ViTMemory:
    """:class:`vitscale.models.spec.MemoryModel` of a ViT, or of the ViT tower ``tower(cfg)`` of
    another family's config (CLIP: its image tower; the text tower's activations are not counted)."""

    tower: Callable[[Any], ViTConfig] = lambda cfg: cfg
    """The ViT config inside the family's config whose activations are estimated."""

    def param_counts(self, model: nn.Module, plan: Any) -> tuple[int, int, int]:
        total, tp, biggest = sum(p.numel() for p in model.parameters()), 0, 0
        for m in model.modules():
            if isinstance(m, (Block, ParallelBlock)):  # also a CLIP's text blocks (CausalBlock is a Block)
                n = sum(p.numel() for p in m.parameters())
                biggest = max(biggest, n)
                tp += n - _norm_params(m)  # everything but the norms / LayerScale of a block is sharded by TP
        pool = model.attn_pool if isinstance(model, VisionTransformer) else None  # (a CLIP's stays in its root)
        if pool is not None:
            for lin in (pool.q, pool.kv_per_head, pool.proj, pool.mlp.fc1, pool.mlp.fc2):
                tp += sum(p.numel() for p in lin.parameters())
            biggest = max(biggest, sum(p.numel() for p in pool.parameters()))
        return total, tp, biggest

    def activation_elems(self, model: nn.Module, plan: Any, tp: int, ac: str) -> tuple[float, float]:
        cfg = self.tower(model.cfg)
        tokens = cfg.num_patches + cfg.num_prefix_tokens
        per_block = block_activation_elems(cfg, tokens, tp, ac)
        D, L = cfg.hidden_size, cfg.num_layers
        if ac == "full":
            held, recompute = L * tokens * D / tp, per_block  # each block's input only; one block rebuilt
        else:
            held, recompute = L * per_block, 0.0
        # around the blocks: the input image (patch-embedding conv), the final LayerNorm's input and
        # output; the pooled features and logits are negligible
        held += 2 * tokens * D + cfg.num_channels * cfg.img_h * cfg.img_w
        return held, recompute


MEMORY = ViTMemory()
MEMORY_IMAGE_TOWER = ViTMemory(tower=lambda cfg: cfg.vision)

__all__ = ["MEMORY", "MEMORY_IMAGE_TOWER", "ViTMemory", "block_activation_elems"]
