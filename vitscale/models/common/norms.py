"""Normalisation layers: LayerNorm with or without bias (ViT-22B), LayerScale."""

from __future__ import annotations

import torch
from torch import nn


def make_norm(dim: int, eps: float = 1e-6, bias: bool = True, device=None, dtype=None) -> nn.LayerNorm:
    """A LayerNorm; ``bias=False`` gives the bias-free LayerNorm of ViT-22B."""
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
