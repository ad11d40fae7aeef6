"""The NaFlex patch layout, in one leaf module that the data side and the models both import (neither
imports the other): an image cut into ``P x P`` patches flattened in ``(ph, pw, C)`` order (channels
fastest: timm's ``patchify_channels_last=True``, big_vision's ``(hw3)``), row-major over its patch
grid, and each patch's ``(row, column)`` on that grid."""

from __future__ import annotations

from typing import Any

import torch


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """Images ``(B, C, H, W)`` (or one ``(C, H, W)``) -> patches ``(B, N, P*P*C)`` (or ``(N, P*P*C)``)
    in ``(ph, pw, C)`` order, row-major over the ``(H/P, W/P)`` grid; any dtype (uint8 on the data side)."""
    one = images.ndim == 3
    x = images[None] if one else images
    B, C, H, W = x.shape
    if H % patch or W % patch:
        raise ValueError(f"image size {H}x{W} is not divisible by the patch size {patch}")
    gh, gw = H // patch, W // patch
    x = x.reshape(B, C, gh, patch, gw, patch).permute(0, 2, 4, 3, 5, 1)  # (B, gh, gw, ph, pw, C)
    x = x.reshape(B, gh * gw, patch * patch * C)  # (B, N, P*P*C)
    return x[0] if one else x


def grid_coords(gh: int, gw: int, device: Any = None) -> torch.Tensor:
    """``(gh*gw, 2)`` integer ``(row, column)`` coordinates of a patch grid, row-major."""
    rows = torch.arange(gh, device=device).repeat_interleave(gw)
    cols = torch.arange(gw, device=device).repeat(gh)
    return torch.stack([rows, cols], dim=1)


__all__ = ["grid_coords", "patchify"]
