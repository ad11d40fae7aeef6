"""Forward FLOPs per image: 2 FLOPs per multiply-add, attention matmuls included.

``vit_flops`` is analytic (works for any ViT config and image size without building the model);
``count_flops`` runs a model once under ``torch.utils.flop_counter.FlopCounterMode`` (any family).
Training FLOPs are taken as 3x forward (backward = 2x forward) by the MFU code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def vit_flops(cfg: Any, img_size: int | tuple[int, int] | None = None) -> int:
    """Forward FLOPs for one image through a ViT described by a ``ViTConfig``.

    Counts every matmul (patch embedding, QKV, attention scores, attention x values, output
    projection, MLP, MAP head, pre-logits, classifier); elementwise ops are ignored, as in the
    usual MFU convention.
    """
    if img_size is None:
        h, w = cfg.img_h, cfg.img_w
    elif isinstance(img_size, int):
        h = w = img_size
    else:
        h, w = img_size
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


def count_flops(model: nn.Module, *inputs: Any, **kwargs: Any) -> int:
    """FLOPs of one forward call ``model(*inputs, **kwargs)`` as counted by PyTorch's FlopCounterMode.

    Works on the meta device (no memory, no compute). Divide by the batch size for per-image FLOPs.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:  # (grad mode on: module_tracker trips over no_grad views of parameters)
        model(*inputs, **kwargs)
    return int(counter.get_total_flops())


def flops(model_or_cfg: Any, img_size: int | tuple[int, int] | None = None) -> int:
    """Forward FLOPs per sample for a model name, a config or a model.

    ViT configs are counted analytically; other families (CLIP: image + text tower, VOLO) are traced
    once on the meta device at ``img_size`` when their config can change it.
    """
    from ..models.registry import families, get_model_config
    from ..models.vit.configs import ViTConfig

    model = model_or_cfg if isinstance(model_or_cfg, nn.Module) else None
    if isinstance(model_or_cfg, str):
        cfg = get_model_config(model_or_cfg)
    elif model is not None:
        cfg = getattr(model, "cfg", None)
    else:
        cfg = model_or_cfg
    if isinstance(cfg, ViTConfig):
        return vit_flops(cfg, img_size)
    if img_size is not None and cfg is not None and hasattr(cfg, "with_image_size"):
        h, w = (img_size, img_size) if isinstance(img_size, int) else img_size
        cfg, model = cfg.with_image_size(h, w), None
    if model is None:
        family = next((f for f in families().values() if any(type(v) is type(cfg) for v in f.variants.values())), None)
        if family is None:
            raise TypeError(f"cannot count FLOPs of {type(model_or_cfg).__name__}: pass a model, a config or a name")
        model = family.model_cls(cfg, device="meta")
    return count_flops(model, *example_inputs(model, 1, "meta"))


def example_inputs(model: nn.Module, batch: int, device: Any = "cpu") -> tuple[torch.Tensor, ...]:
    """Random inputs of the right shapes for one forward call of any zoo model.

    A model may define ``example_inputs(batch, device)`` itself; otherwise CLIP-like configs (a
    ``vision`` tower and a ``text`` tower) get images and token ids, image models get images.
    """
    own = getattr(model, "example_inputs", None)
    if own is not None:
        return tuple(own(batch, device=device))
    cfg = getattr(model, "cfg", None)
    vision, text = getattr(cfg, "vision", None), getattr(cfg, "text", None)
    if vision is not None and text is not None:
        images = torch.randn(batch, vision.num_channels, vision.img_h, vision.img_w, device=device)
        tokens = torch.randint(0, text.vocab_size, (batch, text.encoder_seq_length), device=device)
        return images, tokens
    if all(hasattr(cfg, a) for a in ("img_h", "img_w", "num_channels")):
        return (torch.randn(batch, cfg.num_channels, cfg.img_h, cfg.img_w, device=device),)
    raise TypeError(f"{type(model).__name__} has no example_inputs(batch, device) and no image size in its config")
