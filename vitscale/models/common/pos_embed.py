"""Position embeddings shared by the families: resampling a learned table (the high-resolution
fine-tuning path: ViT, ViT-22B) and the fixed 2-D sin-cos table (MAE's encoder and decoder)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_grid: tuple[int, int],
    old_grid: tuple[int, int] | None = None,
    num_prefix_tokens: int = 0,
    mode: str = "bicubic",
) -> torch.Tensor:
    """Interpolate learned 1D position embeddings laid on a 2D patch grid (bicubic, or ``mode``:
    ``bilinear``; antialiased when shrinking, ``align_corners=False``, as timm).

    ``pos_embed`` is ``(1, num_prefix_tokens + gh*gw, D)``; the prefix (class / register token)
    embeddings are kept as they are. Same grid in, same tensor out (identity).
    """
    n_patch = pos_embed.shape[1] - num_prefix_tokens
    if old_grid is None:
        side = int(round(n_patch**0.5))
        if side * side != n_patch:
            raise ValueError(f"cannot infer a square grid from {n_patch} position embeddings; pass old_grid")
        old_grid = (side, side)
    if old_grid[0] * old_grid[1] != n_patch:
        raise ValueError(f"grid {old_grid} does not match {n_patch} position embeddings")
    if tuple(new_grid) == tuple(old_grid):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    D = grid.shape[-1]
    orig_dtype = grid.dtype
    grid = grid.reshape(1, old_grid[0], old_grid[1], D).permute(0, 3, 1, 2).float()  # (1, D, gh, gw)
    grid = F.interpolate(grid, size=tuple(new_grid), mode=mode, align_corners=False, antialias=True)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], D).to(orig_dtype)  # (1, N', D)
    return torch.cat([prefix, grid], dim=1)


def sincos_2d(width: int, gh: int, gw: int, device=None) -> torch.Tensor:
    """Fixed 2-D sin-cos position embeddings ``(gh * gw, width)`` float32 of a row-major patch grid: the
    first half encodes the column, the second the row, each as ``[sin(pos * w_k), cos(pos * w_k)]`` with
    ``w_k = 10000^(-k / (width / 4))`` (facebookresearch/mae at efb2a80 ``util/pos_embed.py``
    ``get_2d_sincos_pos_embed``, after Vaswani et al. 2017, arXiv 1706.03762, section 3.5). Computed
    in float64 on ``device`` (no host-to-device copy)."""
    if width % 4:
        raise ValueError(f"sin-cos position embeddings need a width divisible by 4, got {width}")
    q = width // 4
    f64 = dict(dtype=torch.float64, device=device)
    omega = 1.0 / 10000 ** (torch.arange(q, **f64) / q)  # (W/4,)
    rows = torch.arange(gh, **f64).repeat_interleave(gw)
    cols = torch.arange(gw, **f64).repeat(gh)

    def one(pos):
        out = pos[:, None] * omega[None]  # (N, W/4)
        return torch.cat([out.sin(), out.cos()], dim=1)

    return torch.cat([one(cols), one(rows)], dim=1).float()
