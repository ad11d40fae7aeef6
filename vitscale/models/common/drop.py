"""Stochastic depth (DropPath) and patch dropout."""

from __future__ import annotations

import torch
from torch import nn


class DropPath(nn.Module):
    """Drop the whole residual branch per sample with probability ``p`` (stochastic depth).

    Kept samples are scaled by 1/(1-p) so the expectation is unchanged.
    """

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask_shape = (x.shape[0],) + (1,) * (x.ndim - 1)  # (B, 1, 1)
        mask = x.new_empty(mask_shape).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


def kept_patches(num_patches: int, p: float) -> int:
    """How many of ``num_patches`` patch tokens patch dropout at rate ``p`` keeps (at least one)."""
    return max(1, int(num_patches * (1.0 - p))) if p > 0 else num_patches


class PatchDropout(nn.Module):
    """Randomly keep ``1 - p`` of the patch tokens during training (FLIP / open_clip patch dropout).

    The first ``num_prefix_tokens`` tokens (class / register tokens) are always kept. Applied after
    the position embedding, so the kept tokens keep their positions.
    """

    def __init__(self, p: float = 0.0, num_prefix_tokens: int = 1):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop_patch_rate must be in [0, 1), got {p}")
        self.p = float(p)
        self.num_prefix_tokens = num_prefix_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        prefix, patches = x[:, : self.num_prefix_tokens], x[:, self.num_prefix_tokens :]
        B, N, D = patches.shape
        num_keep = kept_patches(N, self.p)
        keep_idx = torch.randn(B, N, device=x.device).topk(num_keep, dim=-1).indices  # (B, K)
        patches = patches.gather(1, keep_idx.unsqueeze(-1).expand(-1, -1, D))  # (B, K, D)
        return torch.cat([prefix, patches], dim=1)

    def extra_repr(self) -> str:
        return f"p={self.p}, num_prefix_tokens={self.num_prefix_tokens}"
