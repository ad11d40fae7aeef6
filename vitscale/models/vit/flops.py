"""Analytic forward FLOPs of a ViT (2 FLOPs per multiply-add, attention matmuls included)."""

from __future__ import annotations

from ..common.drop import kept_patches
from ..common.flops import image_hw
from .configs import ViTConfig


def vit_flops(cfg: ViTConfig, img_size: int | tuple[int, int] | None = None, training: bool = False) -> int:
    """Forward FLOPs for one image through a ViT described by a ``ViTConfig``.

    Counts every matmul (patch embedding, QKV, attention scores, attention x values, output
    projection, MLP, MAP head, pre-logits, classifier); elementwise ops are ignored, as in the
    usual MFU convention. ``training``: as a training step runs it — patch dropout
    (``drop_patch_rate``) keeps only its share of the patch tokens after the patch embedding;
    inference sees every patch. Equal to PyTorch's FlopCounterMode in both modes
    (``tests/unit/test_vit.py``).
    """
    h, w = (cfg.img_h, cfg.img_w) if img_size is None else image_hw(img_size)
    p, D, F, C = cfg.patch_dim, cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_channels
    n_patch = (h // p) * (w // p)
    n_keep = kept_patches(n_patch, cfg.drop_patch_rate) if training else n_patch
    T = cfg.num_prefix_tokens + n_keep
    flops = 2 * n_patch * (p * p * C) * D  # patch embedding
    per_block = 2 * T * D * 3 * D  # QKV
    per_block += 2 * 2 * T * T * D  # scores + attention x values
    per_block += 2 * T * D * D  # output projection
    per_block += 2 * (3 if cfg.mlp_type == "swiglu" else 2) * T * D * F  # MLP fc1 (SwiGLU: gate and value) + fc2
    flops += cfg.num_layers * per_block
    if cfg.pool == "map":
        flops += 2 * D * D + 2 * n_keep * D * 2 * D  # query, keys/values (of the patch tokens)
        flops += 2 * 2 * n_keep * D  # one query's scores and weighted sum
        flops += 2 * D * D + 2 * 2 * D * F  # output projection + MLP
    if cfg.pre_logits:
        flops += 2 * D * D
    if cfg.num_classes:
        flops += 2 * D * cfg.num_classes * (2 if cfg.distill_token else 1)  # and the distillation head
    return int(flops)


__all__ = ["vit_flops"]
