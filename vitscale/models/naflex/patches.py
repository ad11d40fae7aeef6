"""NaFlex batches: images as variable-length patch sequences (timm's and big_vision's layout).

A NaFlex batch is a dict of three tensors (timm ``NaFlexCollator``; open_clip's NaFlex towers take the
same through timm; big_vision passes the same as ``(patches, ptype, yabs, xabs)``):

- ``patches`` ``(B, N, P*P*C)``: each image's patches, flattened in ``(ph, pw, C)`` order (channels
  fastest: timm ``patchify_channels_last=True``, big_vision's ``(hw3)``), row-major over the patch grid,
  then padding up to the batch's sequence length ``N``;
- ``patch_coord`` ``(B, N, 2)``: each patch's ``(row, column)`` on its image's patch grid (integers);
- ``patch_valid`` ``(B, N)``: True for a real patch, False for padding (big_vision's ``ptype == 1``).

An image's grid is read back from its coordinates, ``max + 1`` per axis over its valid patches (as
timm and big_vision do), so a batch needs nothing else. Other keys of the dict are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...patch_layout import grid_coords, patchify

PATCH_KEYS = ("patches", "patch_coord", "patch_valid")


def is_patch_batch(x: Any) -> bool:
    """Whether ``x`` is a NaFlex batch (a mapping with ``patches``) rather than an image tensor."""
    return isinstance(x, Mapping)


def to_patch_batch(images: Sequence[torch.Tensor], patch: int, seq_len: int | None = None) -> dict[str, torch.Tensor]:
    """Images of any sizes (each ``(C, H, W)``, sides multiples of ``patch``) -> one padded NaFlex
    batch of sequence length ``seq_len`` (None: the longest image's patch count)."""
    seqs = []
    for img in images:
        gh, gw = img.shape[-2] // patch, img.shape[-1] // patch
        seqs.append((patchify(img, patch), grid_coords(gh, gw, img.device)))
    n = max(p.shape[0] for p, _ in seqs) if seq_len is None else seq_len
    longest = max(p.shape[0] for p, _ in seqs)
    if longest > n:
        raise ValueError(f"an image has {longest} patches, more than the sequence length {n}")
    ref = seqs[0][0]
    B = len(seqs)
    out = {
        "patches": ref.new_zeros(B, n, ref.shape[-1]),
        "patch_coord": torch.zeros(B, n, 2, dtype=torch.long, device=ref.device),
        "patch_valid": torch.zeros(B, n, dtype=torch.bool, device=ref.device),
    }
    for i, (p, c) in enumerate(seqs):
        k = p.shape[0]
        out["patches"][i, :k] = p
        out["patch_coord"][i, :k] = c
        out["patch_valid"][i, :k] = True
    return out


def image_grids(patch_coord: torch.Tensor, patch_valid: torch.Tensor) -> list[tuple[int, int]]:
    """Each image's patch grid ``(rows, columns)`` read from its valid coordinates (one host sync).

    ValueError naming the image when one has no valid patch or a negative coordinate.
    """
    valid = patch_valid.bool()[..., None]  # (B, N, 1)
    hi = patch_coord.masked_fill(~valid, -1).amax(dim=1) + 1  # (B, 2)
    lo = patch_coord.masked_fill(~valid, 0).amin(dim=1)  # (B, 2)
    rows = torch.cat([hi, lo], dim=1).tolist()  # (B, 4): one sync for the whole batch
    grids = []
    for i, (h, w, y0, x0) in enumerate(rows):
        if h <= 0 or w <= 0:
            raise ValueError(f"NaFlex batch: image {i} has no valid patch (patch_valid is all False)")
        if y0 < 0 or x0 < 0:
            raise ValueError(f"NaFlex batch: image {i} has a negative patch coordinate")
        grids.append((int(h), int(w)))
    return grids


def check_patch_batch(batch: Mapping[str, torch.Tensor], patch_features: int) -> None:
    """ValueError (one line) for a batch that is not a NaFlex batch of ``patch_features``-long patches."""
    missing = [k for k in PATCH_KEYS if k not in batch]
    if missing:
        raise ValueError(f"NaFlex batch lacks {', '.join(missing)} (needs {', '.join(PATCH_KEYS)})")
    p, c, v = (batch[k] for k in PATCH_KEYS)
    if p.ndim != 3 or p.shape[-1] != patch_features:
        raise ValueError(f"NaFlex patches must be (B, N, {patch_features}) (P*P*C), got {tuple(p.shape)}")
    if tuple(c.shape) != (*p.shape[:2], 2) or tuple(v.shape) != tuple(p.shape[:2]):
        raise ValueError(
            f"NaFlex patch_coord {tuple(c.shape)} / patch_valid {tuple(v.shape)} do not match patches {tuple(p.shape)}"
        )


__all__ = ["PATCH_KEYS", "check_patch_batch", "grid_coords", "image_grids", "is_patch_batch", "patchify", "to_patch_batch"]
