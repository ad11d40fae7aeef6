"""Forward FLOPs of a VOLO from its config, without building or tracing it (``vitscale models`` traced
every VOLO through PyTorch's FlopCounterMode). The layers are :mod:`vitscale.models.volo.model`'s."""

from __future__ import annotations

import math

from ..common.flops import image_hw
from .configs import VOLOConfig


def volo_flops(cfg: VOLOConfig, img_size=None, training: bool = False) -> int:
    """One image: the convolutional stem and patchifying convolution, the outlookers (value, attention
    weights at every ``outlook_stride``-th location, the K^2 x K^2 weighting of each head's values, output
    projection, MLP), the patch merge, the transformer blocks, the class-attention blocks (one query)
    and the class and aux heads; 2 FLOPs per multiply-add, as FlopCounterMode counts
    (``tests/unit/test_flops.py``). ``training`` changes nothing (no patch dropout)."""
    h, w = (cfg.img_h, cfg.img_w) if img_size is None else image_hw(img_size)
    s, Ch, C = cfg.stem_stride, cfg.stem_hidden, cfg.num_channels
    hs, ws = math.ceil(h / s), math.ceil(w / s)  # the stride-s 7x7 convolution, padding 3
    flops = 2 * C * 49 * Ch * hs * ws + 2 * 2 * Ch * 9 * Ch * hs * ws
    p = cfg.patch_dim // s
    H0, W0 = hs // p, ws // p
    Do = cfg.outlook_dim
    flops += 2 * Ch * p * p * Do * H0 * W0
    N0, K, nH = H0 * W0, cfg.outlook_kernel, cfg.outlook_heads
    st = cfg.outlook_stride
    nc = math.ceil(H0 / st) * math.ceil(W0 / st)
    Fo = int(Do * cfg.outlook_mlp_ratio)
    per = 2 * N0 * Do * Do + 2 * nc * Do * nH * K**4 + nc * nH * 2 * K * K * K * K * (Do // nH) + 2 * N0 * Do * Do
    per += 2 * 2 * N0 * Do * Fo
    flops += cfg.layers[0] * per
    ps, D = cfg.pooling_scale, cfg.hidden_size
    gh, gw = H0 // ps, W0 // ps
    N = gh * gw
    flops += 2 * Do * ps * ps * D * N
    F = int(D * cfg.mlp_ratio)
    flops += cfg.num_transformer_layers * (2 * N * D * 3 * D + 2 * 2 * N * N * D + 2 * N * D * D + 2 * 2 * N * D * F)
    flops += cfg.num_class_layers * (2 * D * D + 2 * (N + 1) * D * 2 * D + 2 * 2 * (N + 1) * D + 2 * D * D + 2 * 2 * D * F)
    if cfg.num_classes > 0:
        flops += 2 * D * cfg.num_classes
        if cfg.aux_head:
            flops += 2 * N * D * cfg.num_classes
    return int(flops)


__all__ = ["volo_flops"]
