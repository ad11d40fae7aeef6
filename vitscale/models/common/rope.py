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
- ``mixed`` (RoPE-Mixed: Heo et al. 2024, "Rotary Position Embedding for Vision Transformer", arXiv
  2403.13298; naver-ai/rope-vit; timm ``RotaryEmbeddingMixed``): each head of each block
  learns its own ``Dh/2`` 2D frequency vectors ``(fx, fy)``, the angle of pair ``j`` at patch ``(row,
  col)`` being ``col * fx_j + row * fy_j`` — axes mixed, one angle per pair across both halves. The
  frequencies are parameters of the attention layer (``attn.rope_freqs``, ``(H, 2, Dh/2)``: the heads
  first, as the QKV rows, so tensor parallelism gives each rank its heads' frequencies); the model
  hands the blocks the patch positions (:func:`rope_positions`) and each attention layer turns them
  into its own angles (:func:`mixed_rope_sin_cos`).

Nothing but the mixed frequencies is stored: the angles are recomputed from the grid at every forward (``Dh/4`` values
per axis), so a model built on the meta device, sharded or cast needs no buffer handling.
"""

from __future__ import annotations

import math

import torch

ROPE_TYPES = ("axial", "dinov3", "mixed")


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
    if rope_type == "mixed":
        raise ValueError("rope_type='mixed' has angles per head and block: rope_positions, then mixed_rope_sin_cos")
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


# ----------------------------------------------------------------------------- mixed (learned) frequencies


def rope_positions(grid: tuple[int, int], grid_offset: float = 0.0, device=None) -> torch.Tensor:
    """``(gh*gw, 2)`` float32: each patch's ``(column, row)`` index (plus ``grid_offset``) in row-major
    order, the positions RoPE-Mixed turns into angles (arXiv 2403.13298; timm's
    ``'xy'`` grid, ``timm/layers/pos_embed_sincos.py`` ``get_mixed_grid``)."""
    gh, gw = grid
    rows = torch.arange(gh, device=device, dtype=torch.float32) + grid_offset
    cols = torch.arange(gw, device=device, dtype=torch.float32) + grid_offset
    return torch.stack([cols[None, :].expand(gh, gw), rows[:, None].expand(gh, gw)], dim=-1).reshape(gh * gw, 2)


def mixed_rope_sin_cos(
    pos: torch.Tensor, freqs: torch.Tensor, rotate_half: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE-Mixed's ``(sin, cos)`` of one attention layer: ``pos`` ``(N, 2)`` (or ``(B, N, 2)``, each
    image's kept patches) of :func:`rope_positions`, ``freqs`` ``(H, 2, Dh/2)`` its heads' ``(fx, fy)``;
    each ``(H, N, Dh)`` (``(B, H, N, Dh)``), float32: the angle of pair ``j`` is ``x fx_j + y fy_j``
    (arXiv 2403.13298), computed by elementwise products (no matmul, so autocast leaves it in
    float32)."""
    f = freqs.float()
    x = pos[..., None, :, 0:1].float()  # (..., 1, N, 1)
    y = pos[..., None, :, 1:2].float()
    angles = x * f[:, None, 0] + y * f[:, None, 1]  # (..., H, N, Dh/2)
    angles = torch.cat([angles, angles], dim=-1) if rotate_half else angles.repeat_interleave(2, dim=-1)
    return angles.sin(), angles.cos()


@torch.no_grad()
def init_mixed_freqs(freqs: torch.Tensor, temperature: float = 10.0) -> torch.Tensor:
    """RoPE-Mixed's initial frequencies, in place, ``freqs`` ``(H, 2, Dh/2)`` (a local shard's heads
    under tensor parallelism): the axial magnitudes ``temperature ** (-f / (Dh/4))``, ``f < Dh/4``, laid
    twice along a direction turned by a random angle per head, ``theta`` and ``theta + pi/2`` (arXiv
    2403.13298; naver-ai/rope-vit ``init_random_2d_freqs``, as timm 1.0.31 ``timm/layers/pos_embed_sincos.py`` line 951 draws them: ``theta`` uniform in [0, 2 pi)
    per head; the paper's temperature for RoPE-Mixed is 10)."""
    H, _, half = freqs.shape
    n = half // 2
    mag = temperature ** (-torch.arange(n, dtype=torch.float32, device=freqs.device) / n)  # (Dh/4,)
    theta = torch.rand(H, 1, dtype=torch.float32, device=freqs.device) * (2 * math.pi)  # (H, 1)
    angle = torch.cat([theta.expand(H, n), (theta + math.pi / 2).expand(H, n)], dim=-1)  # (H, Dh/2)
    mags = torch.cat([mag, mag])[None]  # (1, Dh/2)
    return freqs.copy_(torch.stack([mags * angle.cos(), mags * angle.sin()], dim=1))  # (H, 2, Dh/2)


def gather_rope(rope, keep: torch.Tensor):
    """The rotary input of each image's kept patches ``keep`` ``(B, K)``: ``(sin, cos)`` rows as
    ``(B, 1, K, Dh)`` each, or mixed RoPE's positions as ``(B, K, 2)``."""
    if isinstance(rope, torch.Tensor):
        return rope[keep]
    return tuple(r[keep][:, None] for r in rope)


__all__ = [
    "ROPE_TYPES", "apply_rope", "gather_rope", "init_mixed_freqs", "mixed_rope_sin_cos", "rope_positions", "rope_sin_cos",
]  # fmt: skip
