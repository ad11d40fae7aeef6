"""2D rotary position embeddings (RoPE) for patch tokens: the angles, and their rotation of q and k.

Each head's ``Dh`` channels are split in two halves, one per grid axis (height, then width); each half
holds ``Dh/4`` frequencies, each frequency one rotated pair of channels. The pair of a frequency is
two neighbouring channels (``interleaved``: ``(x0, x1), (x2, x3), ...``) or a channel and the one
``Dh/2`` further (``rotate_half``). Two position schemes, as timm implements them
(``timm/layers/pos_embed_sincos.py``):

- ``axial`` (timm ``RotaryEmbeddingCat`` with ``in_pixels=False``, EVA-02 and timm's ``*_rope_*``
  ViTs): integer patch indices ``0 .. s-1`` (plus an offset), optionally rescaled onto a reference
  grid (``ref_grid``: index * ref / s, EVA's ``ref_feat_shape``); frequencies
  ``temperature ** (-f / (Dh/4))``.
- ``dinov3`` (timm ``RotaryEmbeddingDinoV3``; DINOv3, Siméoni et al. 2025, arXiv 2508.10104,
  facebookresearch/dinov3 ``dinov3/layers/rope_position_encoding.py``): patch centres normalised
  per axis to ``[-1, 1]``, ``2 * ((i + 0.5 + offset) / s) - 1``; angles ``2 pi * coord / period``
  with periods ``temperature ** (f / (Dh/4))``.

Nothing here is stored: the angles are recomputed from the grid at every forward (``Dh/4`` values
per axis), so a model built on the meta device, sharded or cast needs no buffer handling.
"""

from __future__ import annotations

import math

import torch

ROPE_TYPES = ("axial", "dinov3")


def rope_sin_cos(
    grid: tuple[int, int],
    head_dim: int,
    rope_type: str = "axial",
    temperature: float = 10000.0,
    rotate_half: bool = False,
    grid_offset: float = 0.0,
    ref_grid: tuple[int, int] | None = None,
    device=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sin, cos)``, each ``(gh*gw, Dh)`` float32, for the patch tokens of a ``grid`` in row-major order."""
    if head_dim % 4:
        raise ValueError(f"RoPE needs a head dimension divisible by 4, got {head_dim}")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type must be one of {ROPE_TYPES}, got {rope_type!r}")
    n_freq = head_dim // 4
    exponent = torch.arange(n_freq, device=device, dtype=torch.float32) / n_freq  # (F,)
    axes = []
    for a, s in enumerate(grid):
        if rope_type == "dinov3":
            c = (torch.arange(s, device=device, dtype=torch.float32) + 0.5 + grid_offset) / s
            c = 2.0 * c - 1.0  # centres in [-1, 1]
            angle = (2 * math.pi * c)[:, None] / (temperature**exponent)  # (s, F)
        else:
            c = torch.arange(s, device=device, dtype=torch.float32) + grid_offset
            if ref_grid is not None:
                c = c / s * ref_grid[a]
            angle = c[:, None] * (1.0 / (temperature**exponent))  # (s, F)
        axes.append(angle)
    gh, gw = grid
    h = axes[0][:, None, :].expand(gh, gw, n_freq)  # (gh, gw, F)
    w = axes[1][None, :, :].expand(gh, gw, n_freq)
    angles = torch.cat([h, w], dim=-1).reshape(gh * gw, 2 * n_freq)  # (N, Dh/2): height, then width
    angles = torch.cat([angles, angles], dim=-1) if rotate_half else angles.repeat_interleave(2, dim=-1)  # (N, Dh)
    return angles.sin(), angles.cos()


def _rotated(x: torch.Tensor, rotate_half: bool) -> torch.Tensor:
    """Each channel pair ``(a, b)`` -> ``(-b, a)``: the 90-degree turn of the rotation formula."""
    if rotate_half:
        a, b = x.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([-b, a], dim=-1).reshape(x.shape)


def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], rotate_half: bool) -> torch.Tensor:
    """Rotate the last ``N`` tokens of ``x`` ``(B, H, T, Dh)`` by ``rope = (sin, cos)`` of shape
    ``(N, Dh)`` (or ``(B, 1, N, Dh)``: per-sample positions); the ``T - N`` prefix tokens (class,
    register tokens) stay as they are. Computed in float32 at least, returned in ``x``'s dtype."""
    sin, cos = rope
    n = sin.shape[-2]
    prefix, patches = x[:, :, : x.shape[2] - n], x[:, :, x.shape[2] - n :]
    rotated = (patches * cos + _rotated(patches, rotate_half) * sin).to(x.dtype)
    return torch.cat([prefix, rotated], dim=2)


__all__ = ["ROPE_TYPES", "apply_rope", "rope_sin_cos"]
