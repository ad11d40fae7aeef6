"""NaFlex samples and batches on the data side: an image resized to fit a sequence length keeping its
aspect ratio, cut into patches with their grid coordinates, and padded to the batch's sequence length
with a validity mask — timm's layout (``timm/data/naflex_transforms.py``, ``NaFlexCollator``:
``patches``, ``patch_coord``, ``patch_valid``), big_vision's ``resize_to_sequence`` +
``patchify`` (SigLIP 2, arXiv 2502.14786).

Patches are flattened in ``(ph, pw, C)`` order (channels fastest), row-major over the patch grid:
:mod:`vitscale.patch_layout`, the one layout the NaFlex model reads too. Samples stay uint8; the loader normalises per batch (:func:`normalise_patches`) and applies
random erasing on the patch layout (:func:`erase_patches`).
"""

from __future__ import annotations

import math

import torch

from ..patch_layout import grid_coords, patchify


def fit_grid(height: float, width: float, seq_len: int, patch: int) -> tuple[int, int]:
    """The patch grid ``(rows, cols)`` an image of ``height x width`` pixels is resized to: scaled by
    the largest factor ``s`` at which ``ceil(height * s / patch) * ceil(width * s / patch)`` patches
    still fit ``seq_len``, each side rounded up to whole patches (timm's ``get_image_size_for_seq``,
    big_vision's ``resize_to_sequence``). Past the most elongated grid that fits (one patch on the
    short side) the long side is cut to ``seq_len`` patches."""
    if seq_len < 1:
        raise ValueError(f"sequence length {seq_len} must be at least 1")
    h, w = max(float(height), 1e-6), max(float(width), 1e-6)
    best: tuple[float, int, int] | None = None
    # the largest scale of each grid height (s = gh * P / h) and of each grid width: one is the optimum
    for side, other, flip in ((h, w, False), (w, h, True)):
        for g in range(1, seq_len + 1):
            o = math.ceil(g * other / side - 1e-9)
            if g * o > seq_len:
                break
            cand = (g / side, *((o, g) if flip else (g, o)))
            if best is None or cand > best:
                best = cand
    if best is None:  # even one patch on the short side is too many patches on the long one
        return (1, seq_len) if w >= h else (seq_len, 1)
    return best[1], best[2]


def pad_batch(patches: list[torch.Tensor], grids: list[tuple[int, int]], seq_len: int) -> dict[str, torch.Tensor]:
    """Samples' patches (each ``(N_i, F)``) -> one NaFlex batch padded to ``seq_len`` tokens:
    ``patches`` ``(B, L, F)``, ``patch_coord`` long ``(B, L, 2)``, ``patch_valid`` bool ``(B, L)``."""
    B, F = len(patches), patches[0].shape[-1]
    out = {
        "patches": patches[0].new_zeros(B, seq_len, F),
        "patch_coord": torch.zeros(B, seq_len, 2, dtype=torch.long),
        "patch_valid": torch.zeros(B, seq_len, dtype=torch.bool),
    }
    for i, (p, (gh, gw)) in enumerate(zip(patches, grids)):
        n = p.shape[0]
        if n > seq_len:
            raise ValueError(f"an image of {n} patches does not fit the sequence length {seq_len}")
        out["patches"][i, :n] = p
        out["patch_coord"][i, :n] = grid_coords(gh, gw)
        out["patch_valid"][i, :n] = True
    return out


def normalise_patches(batch: dict[str, torch.Tensor], mean: torch.Tensor, inv_std: torch.Tensor) -> dict[str, torch.Tensor]:
    """uint8 patches -> float ``(x - mean) / std`` per channel (``mean``, ``inv_std``: ``(1, C, 1, 1)``
    on the uint8 scale); padding patches are zeros."""
    p = batch["patches"]
    B, L, F = p.shape
    C = mean.numel()
    x = p.float().view(B, L, F // C, C)  # (B, L, P*P, C): channels fastest
    x = (x - mean.view(1, 1, 1, C)) * inv_std.view(1, 1, 1, C)
    x = x.view(B, L, F) * batch["patch_valid"][..., None]
    return {**batch, "patches": x}


def erase_patches(x: torch.Tensor, grid: tuple[int, int], patch: int, box: tuple[int, int, int, int], noise: torch.Tensor) -> None:
    """Random erasing on one NaFlex sample in place: the pixels of ``box`` (top, left, h, w) of its
    ``grid`` image become ``noise`` (``(C, h, w)``), as the image path does after normalisation."""
    gh, gw = grid
    C = noise.shape[0]
    top, left, h, w = box
    img = torch.zeros(C, gh * patch, gw * patch, device=x.device)
    mask = torch.zeros(1, gh * patch, gw * patch, dtype=torch.bool, device=x.device)
    img[:, top:top + h, left:left + w] = noise.to(x.device)
    mask[:, top:top + h, left:left + w] = True
    n = gh * gw
    flat, m = patchify(img, patch), patchify(mask.expand(C, -1, -1), patch)  # (N, P*P*C) each
    x[:n] = torch.where(m, flat.to(x.dtype), x[:n])


__all__ = ["erase_patches", "fit_grid", "grid_coords", "normalise_patches", "pad_batch", "patchify"]
