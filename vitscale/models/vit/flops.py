"""Analytic forward FLOPs of a ViT (2 FLOPs per multiply-add, attention matmuls included)."""

from __future__ import annotations

from ..common.flops import image_hw
from .configs import ViTConfig


def vit_flops(cfg: ViTConfig, img_size: int | tuple[int, int] | None = None) -> int:
    """Forward FLOPs for one image through a ViT described by a ``ViTConfig``.

    Counts every matmul (patch embedding, QKV, attention scores, attention x values, output
    projection, MLP, MAP head, pre-logits, classifier); elementwise ops are ignored, as in the
    usual MFU convention.
    """
    h, w = (cfg.img_h, cfg.img_w) if img_size is None else image_hw(img_size)
    p, D, F, C = cfg.patch_dim, cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_channels
    n_patch = (h // p) * (w // p)
    n_keep = n_patch  # patch dropout is training-only; FLOPs are quoted without it
    T = cfg.class_token_length + n_keep
    flops = 2 * n_patch * (p * p * C) * D  # patch embedding
    per_block = 2 * T * D * 3 * D  # QKV
    per_block += 2 * 2 * T * T * D  # scores + attention x values
    per_block += 2 * T * D * D  # output projection
    per_block += 2 * 2 * T * D * F  # MLP fc1 + fc2
    flops += cfg.num_layers * per_block
    if cfg.pool == "map":
        flops += 2 * D * D + 2 * n_patch * D * 2 * D  # query, keys/values
        flops += 2 * 2 * n_patch * D  # one query's scores and weighted sum
        flops += 2 * D * D + 2 * 2 * D * F  # output projection + MLP
    if cfg.pre_logits:
        flops += 2 * D * D
    if cfg.num_classes:
        flops += 2 * D * cfg.num_classes
    return int(flops)


__all__ = ["vit_flops"]
