"""Position embeddings of a NaFlex ViT: one learned grid, resampled to every image's own patch grid.

timm (``NaFlexEmbeds``) and big_vision (``naflex_vit.py``, ``_pos_emb_resize``) resample the learned
``(gh, gw)`` grid to each image's ``(h, w)`` patch grid and add the embedding of cell ``(row, col)``
to the patch at that coordinate. Resampling: ``F.interpolate`` bicubic or bilinear, antialiased,
``align_corners=False``; aspect-ratio preserving: to the square of ``max(h, w)``, then the top-left
``h x w`` crop. Factorized tables (a row and a column table) are resampled linearly along their
one axis and summed. Each distinct grid of a batch is resampled once; one gather then picks every
token's embedding by its coordinates (so the patches may come in any order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.pos_embed import resample_pos_embed


def learned_table(pos: torch.Tensor, hw: tuple[int, int], mode: str, ar_preserving: bool) -> torch.Tensor:
    """The learned grid ``(1, gh, gw, D)`` resampled to ``hw`` -> ``(h*w, D)``, row-major."""
    _, gh, gw, D = pos.shape
    h, w = hw
    if (h, w) == (gh, gw):
        return pos.reshape(gh * gw, D)
    size = (max(h, w), max(h, w)) if ar_preserving else (h, w)
    flat = resample_pos_embed(pos.reshape(1, gh * gw, D), size, (gh, gw), 0, mode=mode)  # (1, sh*sw, D)
    return flat.reshape(size[0], size[1], D)[:h, :w].reshape(h * w, D)


def _linear_1d(table: torch.Tensor, n: int) -> torch.Tensor:
    """``(1, L, D)`` -> ``(n, D)``, linear, ``align_corners=False`` (identity when ``n == L``)."""
    if table.shape[1] == n:
        return table[0]
    t = F.interpolate(table.permute(0, 2, 1).float(), size=n, mode="linear", align_corners=False)  # (1, D, n)
    return t[0].t().to(table.dtype)  # (n, D)


def factorized_table(pos_y: torch.Tensor, pos_x: torch.Tensor, hw: tuple[int, int], ar_preserving: bool) -> torch.Tensor:
    """Row table ``(1, gh, D)`` + column table ``(1, gw, D)`` resampled to ``hw`` -> ``(h*w, D)``."""
    h, w = hw
    ny, nx = (max(h, w), max(h, w)) if ar_preserving else (h, w)
    rows = _linear_1d(pos_y, ny)[:h]  # (h, D)
    cols = _linear_1d(pos_x, nx)[:w]  # (w, D)
    return (rows[:, None, :] + cols[None, :, :]).reshape(h * w, -1)  # (h*w, D)


def gather_by_coord(
    tables: dict[tuple[int, int], torch.Tensor],
    grids: list[tuple[int, int]],
    patch_coord: torch.Tensor,
    patch_valid: torch.Tensor,
) -> torch.Tensor:
    """Every token's embedding ``(B, N, D)``: image ``b``'s patch at ``(row, col)`` takes row
    ``row * w_b + col`` of its grid's table; padding tokens take zeros."""
    keys = list(tables)
    offsets, start = {}, 0
    for k in keys:
        offsets[k] = start
        start += k[0] * k[1]
    flat = torch.cat([tables[k] for k in keys])  # (sum of h*w, D)
    dev = patch_coord.device
    base = torch.tensor([offsets[g] for g in grids], device=dev)  # (B,)
    width = torch.tensor([g[1] for g in grids], device=dev)  # (B,)
    valid = patch_valid.bool()
    idx = base[:, None] + patch_coord[..., 0] * width[:, None] + patch_coord[..., 1]  # (B, N)
    idx = idx.masked_fill(~valid, 0)
    return flat[idx] * valid[..., None].to(flat.dtype)  # (B, N, D)


__all__ = ["factorized_table", "gather_by_coord", "learned_table"]
