"""Forward FLOPs per sample: 2 FLOPs per multiply-add, attention matmuls included.

The count is the model family's (``FamilySpec.forward_flops``: analytic for the ViT, traced once on
the meta device under ``torch.utils.flop_counter.FlopCounterMode`` for the others), the one count
behind ``vitscale models``, the trainer's TFLOP/s and MFU and ``vitscale bench``. ``training=True``
counts the forward as a training step runs it (patch dropout keeps only its share of the patches);
training FLOPs are taken as 3x that forward by the MFU code (``vitscale.tools.mfu``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..models.common.flops import count_flops
from ..models.registry import forward_flops


def flops(model_or_cfg: Any, img_size: int | tuple[int, int] | None = None, *, training: bool = False) -> int:
    """Forward FLOPs per sample of a model name, a variant config or a model, at ``img_size`` (None =
    the model's own size), as inference (or, ``training``, a training step) runs it."""
    return forward_flops(model_or_cfg, img_size, training=training)


def example_inputs(model: nn.Module, batch: int, device: Any = "cpu") -> tuple[torch.Tensor, ...]:
    """Random inputs of the right shapes for one forward call of a zoo model (its own
    ``example_inputs``)."""
    return tuple(model.example_inputs(batch, device))


__all__ = ["count_flops", "example_inputs", "flops"]
