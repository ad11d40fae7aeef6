"""Forward FLOPs per image: 2 FLOPs per multiply-add, attention matmuls included.

Every model states its own count (``model.flops(img_size)`` in the model contract): analytic for the
ViT (``vit_flops``, any config and image size without building the model), traced once on the meta
device under ``torch.utils.flop_counter.FlopCounterMode`` (``count_flops``) for CLIP and VOLO.
Training FLOPs are taken as 3x forward (backward = 2x forward) by the MFU code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..models.common.flops import count_flops
from ..models.registry import create_model, family_of
from ..models.vit.flops import vit_flops


def flops(model_or_cfg: Any, img_size: int | tuple[int, int] | None = None) -> int:
    """Forward FLOPs per sample of a model name, a variant config or a model, at ``img_size`` (None =
    the model's own size)."""
    if isinstance(model_or_cfg, str):
        model = create_model(model_or_cfg, device="meta")
    elif isinstance(model_or_cfg, nn.Module):
        model = model_or_cfg
    else:
        model = family_of(model_or_cfg).model_cls(model_or_cfg, device="meta")
    return model.flops(img_size)


def example_inputs(model: nn.Module, batch: int, device: Any = "cpu") -> tuple[torch.Tensor, ...]:
    """Random inputs of the right shapes for one forward call of a zoo model (its own
    ``example_inputs``)."""
    return tuple(model.example_inputs(batch, device))


__all__ = ["count_flops", "example_inputs", "flops", "vit_flops"]
