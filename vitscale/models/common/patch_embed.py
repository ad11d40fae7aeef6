"""Image -> sequence of patch embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PatchEmbed(nn.Module):
    """Non-overlapping ``patch x patch`` patches, linearly embedded.

    The parameters are those of a strided ``Conv2d`` (``proj``: timm / open_clip layout), but the
    forward runs as one matmul over the flattened ``(C, p, p)`` patches when ``matmul`` is True: the
    same result, faster for a training step on CPU (``benchmarks/patch_embed.py``:
    ``benchmarks/results/patch_embed_cpu_*.json``; the GPU comparison is in ``benchmarks/run_gpu.sh``).
    """

    matmul: bool = True
    """Class-wide switch: run the projection as a matmul (True) or as the strided convolution."""

    def __init__(self, patch: int, in_chans: int, dim: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.patch = patch
        self.proj = nn.Conv2d(in_chans, dim, patch, stride=patch, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        p = self.patch
        if H % p or W % p:
            raise ValueError(f"image size {H}x{W} is not divisible by the patch size {p}")
        if not self.matmul:
            x = self.proj(x)  # (B, D, H/p, W/p)
            return x.flatten(2).transpose(1, 2)  # (B, N, D)
        x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, C, p, p)
        x = x.reshape(B, (H // p) * (W // p), C * p * p)  # (B, N, C*p*p)
        w = self.proj.weight
        return F.linear(x, w.reshape(w.shape[0], -1), self.proj.bias)  # (B, N, D)
