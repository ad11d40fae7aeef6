"""DINOv3's Gram anchoring (Siméoni et al. 2025, "DINOv3", arXiv 2508.10104, section 4; reference code
facebookresearch/dinov3 at 6876159: ``dinov3/loss/gram_loss.py``, ``dinov3/train/ssl_meta_arch.py``
``get_gram_teacher_output`` / ``gram_load_ema_teacher`` / ``update_gram``, ``dinov3/train/train.py``
lines 441-544, the ``gram`` group of ``dinov3/configs/ssl_default_config.yaml`` lines 45-63).

The student's patch features are pulled towards the *pairwise similarities* of a Gram teacher's:
``|| P_s P_s^T - P_g P_g^T ||^2`` (mean over the entries), each row L2-normalised first
(``gram.normalized``), per image (``img_level``: a ``(N, N)`` matrix for each crop) or over the batch's
patches (a ``(B N, B N)`` one), optionally with negative similarities set to 0 on both sides
(``remove_neg``) or where the teacher's are negative (``remove_only_teacher_neg``). The Gram teacher is
a frozen copy of the EMA teacher's backbone, loaded from it after update ``dino.gram_it_load_ema_teacher``
and, with ``rep_update``, refreshed from it every ``update_frequency`` updates from update
``it_first_update`` on, at most ``max_updates`` times (``train.py`` lines 535-544) — or the EMA teacher
itself (``gram.ema_teacher``). With crops of its own (``dino.gram_teacher_crops_size``: the global crops'
boxes again, larger, :mod:`vitscale.tasks.dino_crops`) its patch features are resized to the student's
grid (:func:`resize_patches`). Held by the DINO task's training module (:class:`vitscale.tasks.dino.DinoModule`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gram_loss(student: torch.Tensor, teacher: torch.Tensor, *, normalized: bool = True, img_level: bool = True,
              remove_neg: bool = False, remove_only_teacher_neg: bool = False) -> torch.Tensor:  # fmt: skip
    """The mean squared difference of the Gram matrices of ``student`` and ``teacher`` patch features,
    each ``(B, N, D)`` (``img_level``: one ``N x N`` matrix per image) or ``(M, D)`` / ``(B, N, D)``
    flattened to the ``M x M`` matrix of all patches (``gram_loss.py`` ``GramLoss.forward``); float32."""
    if remove_neg and remove_only_teacher_neg:
        raise ValueError("gram: remove_neg and remove_only_teacher_neg are exclusive")
    s, t = student.float(), teacher.float()
    if img_level and (s.ndim != 3 or t.ndim != 3):
        raise ValueError(f"gram: image-level Gram matrices need (B, N, D) features, got {tuple(s.shape)} and {tuple(t.shape)}")
    if normalized:
        s, t = F.normalize(s, dim=-1), F.normalize(t, dim=-1)
    if not img_level:
        s, t = s.reshape(-1, s.shape[-1]), t.reshape(-1, t.shape[-1])  # (B N, D)
    g_t = t @ t.transpose(-1, -2)
    g_s = s @ s.transpose(-1, -2)
    if remove_neg:
        g_t, g_s = g_t.clamp(min=0), g_s.clamp(min=0)
    elif remove_only_teacher_neg:
        # the reference clamps the teacher's, then zeroes the student's where both are negative: with the
        # teacher's already clamped that is nowhere, so only the teacher's negatives go (gram_loss.py 81-84)
        g_t = g_t.clamp(min=0)
    return F.mse_loss(g_s, g_t)


def resize_patches(patches: torch.Tensor, grid: tuple[int, int], to: tuple[int, int], mode: str = "bicubic",
                   antialias: bool = False) -> torch.Tensor:  # fmt: skip
    """The Gram teacher's patch features ``(B, gh gw, D)`` on its crops' ``grid`` resized to the student's
    grid ``to``: as ``(B, D, gh, gw)`` maps by ``F.interpolate`` (``mode``, ``align_corners=False``,
    ``antialias``), back to ``(B, th tw, D)`` (``dinov3/train/ssl_meta_arch.py`` lines 493-510); in
    float32 (the Gram loss's precision)."""
    b, n, d = patches.shape
    if n != grid[0] * grid[1]:
        raise ValueError(f"gram: {n} patch features are not a {grid[0]}x{grid[1]} grid")
    maps = patches.float().transpose(1, 2).reshape(b, d, *grid)
    maps = F.interpolate(maps, size=tuple(to), mode=mode, align_corners=False, antialias=antialias)
    return maps.flatten(2).transpose(1, 2)


def refreshes_after(step: int, *, load_at: int, rep_update: bool, every: int, first: int, most: int | None) -> bool:
    """Whether the Gram teacher takes the EMA teacher's weights after optimizer update ``step``
    (1-based; update ``step`` is DINOv3's iteration ``step - 1``): the first load "before iteration
    ``load_at``" (``train.py`` line 471: after update ``load_at``; ``load_at=0`` is before the first),
    then with ``rep_update`` every ``every`` updates from update ``first`` on (lines 535-541: ``it + 1 >=
    first`` and ``(it + 1) % every == 0``), at most ``most`` of those (None: no limit)."""
    if step == load_at:
        return True
    if not rep_update or step < max(first, 1) or step % every:
        return False
    return most is None or refreshes_before(step, first=first, every=every) < most


def refreshes_before(step: int, *, first: int, every: int) -> int:
    """The repeated refreshes made after updates ``first .. step - 1`` (DINOv3 counts them on a resume
    the same way: ``train.py`` line 451)."""
    start = max(first, 1)
    if step <= start:
        return 0
    return (step - 1) // every - (start - 1) // every


__all__ = ["gram_loss", "refreshes_after", "refreshes_before", "resize_patches"]
