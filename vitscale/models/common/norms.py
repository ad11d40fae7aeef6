"""Normalisation layers: LayerNorm with or without bias (ViT-22B), RMSNorm, LayerScale."""

from __future__ import annotations

import torch
from torch import nn


def make_norm(
    dim: int, eps: float = 1e-6, bias: bool = True, device=None, dtype=None, kind: str = "layernorm"
) -> nn.Module:
    """A LayerNorm (``bias=False``: the bias-free LayerNorm of ViT-22B) or, with ``kind="rmsnorm"``,
    an RMSNorm (a scale, never a bias: ``x / sqrt(mean(x^2) + eps) * weight``)."""
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps, device=device, dtype=dtype)
    if kind != "layernorm":
        raise ValueError(f"unknown norm {kind!r}: use layernorm or rmsnorm")
    return nn.LayerNorm(dim, eps=eps, bias=bias, device=device, dtype=dtype)


class LayerScale(nn.Module):
    """Per-channel learnable scale of a residual branch (CaiT); ``init_values`` is its start value."""

    def __init__(self, dim: int, init_values: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.init_values = init_values
        self.gamma = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))

    def init_weights(self) -> None:
        nn.init.constant_(self.gamma, self.init_values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma
