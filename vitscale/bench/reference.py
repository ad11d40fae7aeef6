"""Reference implementations of the same architecture: timm for ViT variants, open_clip for CLIP.

``timm_vit(cfg)`` builds timm's ``VisionTransformer`` with the keyword arguments that reproduce a
:class:`~vitscale.models.vit.configs.ViTConfig` (the ViT state-dict adapter's ``timm_kwargs``: same
widths, depth, heads, patch, pooling, norms, biases and dropouts, so the forward FLOPs match), and
names the timm model it corresponds to for the record.
``open_clip_model(name, cfg)`` builds open_clip's CLIP of the same size (random weights, nothing
downloaded).
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

from ..models.vit.state_dict_adapter import timm_kwargs

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
        from ..interop.open_clip import create_open_clip_model

        model = create_open_clip_model(ours, load_weights=True)
        label = f"open_clip CLIP ({variant} architecture)"
    except (ImportError, ValueError):
        name = open_clip_name(variant)
        model = open_clip.create_model(name, pretrained=None)
        label = f"open_clip {name}"
    if device is not None:
        model = model.to(device)
    return model, label


__all__ = ["TIMM_NAMES", "open_clip_model", "open_clip_name", "timm_vit"]
