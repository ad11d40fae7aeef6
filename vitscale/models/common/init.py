"""Weight initialisers that behave the same in every dtype and torch version."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def trunc_normal_(t: torch.Tensor, std: float = 1.0, mean: float = 0.0, a: float = -2.0, b: float = 2.0) -> torch.Tensor:
    """``nn.init.trunc_normal_`` (cut at the absolute values ``a``, ``b``, as timm and big_vision use
    it), drawn in fp32 for low-precision tensors.

    PyTorch's version runs its inverse-CDF sampling in the tensor's own dtype; in bfloat16 about 0.4%
    of the uniform draws round to exactly ±1, whose inverse error function is infinite, so those
    weights land on the cut (±2: with std 0.02, a hundred standard deviations out) — torch 2.11 gave
    std 0.128 instead of 0.02 for a bf16 ViT-22B built straight in bf16. fp32 / fp64 tensors take
    PyTorch's draw unchanged (same numbers as before). Works on DTensors (the temporary is sharded
    like the parameter) and on plain local shards.
    """
    if t.dtype in (torch.float32, torch.float64):
        return nn.init.trunc_normal_(t, mean=mean, std=std, a=a, b=b)
    tmp = torch.empty_like(t, dtype=torch.float32)
    nn.init.trunc_normal_(tmp, mean=mean, std=std, a=a, b=b)
    return t.copy_(tmp)


@torch.no_grad()
def init_vit_layers(model: nn.Module) -> None:
    """The ViT scheme for every layer of ``model`` (timm's ``init_weights_vit_timm``): linear and
    convolution weights truncated normal, std 0.02, biases zero; norms one and zero; then each
    submodule's own ``init_weights`` (LayerScale, attention pools …), in module order. The model's
    own tokens and position tables are the caller's."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.RMSNorm):
            nn.init.ones_(m.weight)
    for m in model.modules():
        if m is not model and hasattr(m, "init_weights"):
            m.init_weights()


__all__ = ["init_vit_layers", "trunc_normal_"]
