"""Reference implementations of the same architecture: timm for ViT variants, open_clip for CLIP.

``timm_vit(cfg)`` builds timm's ``VisionTransformer`` with the keyword arguments that reproduce a
:class:`~vitscale.models.vit.configs.ViTConfig` (same widths, depth, heads, patch, pooling, norms and
biases, so the forward FLOPs match), and names the timm model it corresponds to for the record.
``open_clip_model(name, cfg)`` builds open_clip's CLIP of the same size (random weights, nothing
downloaded).
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from torch import nn

# Our variant -> timm's registered model of the same architecture (for the record; we build the
# model from the config so that debug sizes and overrides work too).
TIMM_NAMES = {
    "vit_ti16": "vit_tiny_patch16_224",
    "vit_s16": "vit_small_patch16_224",
    "vit_b32": "vit_base_patch32_224",
    "vit_b16": "vit_base_patch16_224",
    "vit_l16": "vit_large_patch16_224",
    "vit_h16": "vit_huge_patch16_224",
    "vit_h14": "vit_huge_patch14_224",
    "vit_g14": "vit_giant_patch14_224",
    "vit_bigg14": "vit_gigantic_patch14_224",
}

_TIMM_ACT = {
    "gelu": nn.GELU,
    "gelu_tanh": partial(nn.GELU, approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
}


def timm_kwargs(cfg: Any) -> dict[str, Any]:
    """timm ``VisionTransformer`` keyword arguments for a ``ViTConfig``; ValueError if timm's ViT
    cannot express it (ViT-22B parallel blocks, quick_gelu, bias-free norms)."""
    if cfg.parallel_block:
        raise ValueError("timm's VisionTransformer has no ViT-22B parallel block with this layout")
    if cfg.activation not in _TIMM_ACT:
        raise ValueError(f"no timm activation for {cfg.activation!r}")
    if not cfg.norm_bias or not cfg.mlp_bias or not cfg.patch_bias or cfg.pre_logits:
        raise ValueError("timm's VisionTransformer cannot drop norm / MLP / patch biases or add pre-logits")
    pool = {"token": "token", "avg": "avg", "map": "map", "none": ""}[cfg.pool]
    return dict(
        img_size=(cfg.img_h, cfg.img_w),
        patch_size=cfg.patch_dim,
        in_chans=cfg.num_channels,
        num_classes=cfg.num_classes,
        global_pool=pool,
        embed_dim=cfg.hidden_size,
        depth=cfg.num_layers,
        num_heads=cfg.num_attention_heads,
        mlp_ratio=cfg.ffn_hidden_size / cfg.hidden_size,
        qkv_bias=cfg.qkv_bias,
        qk_norm=cfg.qk_norm,
        proj_bias=cfg.proj_bias,
        init_values=cfg.layer_scale_init,
        class_token=cfg.class_token_length > 0,
        reg_tokens=max(cfg.class_token_length - 1, 0),
        no_embed_class=not cfg.pos_embed_prefix,
        pre_norm=cfg.pre_norm,
        final_norm=cfg.final_norm,
        fc_norm=cfg.fc_norm,
        drop_path_rate=cfg.drop_path_rate,
        norm_layer=partial(nn.LayerNorm, eps=cfg.norm_eps),
        act_layer=_TIMM_ACT[cfg.activation],
    )


def timm_vit(cfg: Any, variant: str | None = None, device=None) -> tuple[nn.Module, str]:
    """timm's VisionTransformer matching ``cfg`` and a label naming it (``timm:vit_small_patch16_224``)."""
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(**timm_kwargs(cfg))
    if device is not None:
        model = model.to(device)
    name = TIMM_NAMES.get(variant or "", "VisionTransformer")
    return model, f"timm {name}"


def open_clip_name(variant: str) -> str:
    """``clip_b32`` -> ``ViT-B-32``, ``clip_bigg14`` -> ``ViT-bigG-14``, ``clip_l14`` -> ``ViT-L-14``."""
    m = re.fullmatch(r"clip_([a-z]+)(\d+)(.*)", variant)
    if not m:
        raise ValueError(f"no open_clip model name for {variant!r}")
    size = {"b": "B", "l": "L", "h": "H", "g": "g", "bigg": "bigG", "e": "e", "s": "S", "m": "M"}.get(
        m.group(1)
    )
    if size is None:
        raise ValueError(f"no open_clip model name for {variant!r}")
    return f"ViT-{size}-{m.group(2)}{m.group(3).replace('_', '-')}"


def open_clip_model(ours: nn.Module, variant: str, device=None) -> tuple[nn.Module, str]:
    """open_clip's CLIP of the same architecture as our CLIP ``ours`` (nothing downloaded).

    Built by ``vitscale.interop.open_clip.create_open_clip_model`` (exact architecture, our weights
    copied, debug sizes included); where that cannot express the model, open_clip's registered
    model of the same name (``clip_b32`` -> ``ViT-B-32``) with random weights.
    """
    import open_clip

    try:
        from ..interop.open_clip import create_open_clip_model  # owned by the CLIP engineer

        model = create_open_clip_model(ours, load_weights=True)
        label = f"open_clip CLIP ({variant} architecture)"
    except (ImportError, ValueError):
        name = open_clip_name(variant)
        model = open_clip.create_model(name, pretrained=None)
        label = f"open_clip {name}"
    if device is not None:
        model = model.to(device)
    return model, label


__all__ = ["TIMM_NAMES", "open_clip_model", "open_clip_name", "timm_kwargs", "timm_vit"]
