"""Counting the FLOPs of one forward call with PyTorch's ``FlopCounterMode`` (any model, on meta)."""

from __future__ import annotations

from typing import Any

from torch import nn


def count_flops(model: nn.Module, *inputs: Any, **kwargs: Any) -> int:
    """FLOPs of one forward call ``model(*inputs, **kwargs)`` as counted by PyTorch's FlopCounterMode.

    Works on the meta device (no memory, no compute). Divide by the batch size for per-image FLOPs.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:  # (grad mode on: module_tracker trips over no_grad views of parameters)
        model(*inputs, **kwargs)
    return int(counter.get_total_flops())


def traced_flops(model_cls: type, cfg: Any, training: bool = False) -> int:
    """Forward FLOPs of one sample of ``model_cls(cfg)``, built and run on the meta device in training
    mode (``training``: patch dropout and the like apply) or in eval mode."""
    meta = model_cls(cfg, device="meta").train(training)
    return count_flops(meta, *meta.example_inputs(1, "meta"))


def image_hw(img_size: int | tuple[int, int]) -> tuple[int, int]:
    """``224`` or ``(224, 224)`` -> ``(224, 224)``."""
    return (img_size, img_size) if isinstance(img_size, int) else (int(img_size[0]), int(img_size[1]))


__all__ = ["count_flops", "image_hw", "traced_flops"]
