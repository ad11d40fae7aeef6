"""Image -> sequence of patch embeddings."""

from __future__ import annotations

import torch
from torch import nn


class PatchEmbed(nn.Module):
    """Non-overlapping ``patch x patch`` patches, linearly embedded (a strided convolution)."""

    def __init__(self, patch: int, in_chans: int, dim: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.patch = patch
        self.proj = nn.Conv2d(in_chans, dim, patch, stride=patch, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, W = x.shape[-2:]
        if H % self.patch or W % self.patch:
            raise ValueError(f"image size {H}x{W} is not divisible by the patch size {self.patch}")
        x = self.proj(x)  # (B, D, H/p, W/p)
        return x.flatten(2).transpose(1, 2)  # (B, N, D)
