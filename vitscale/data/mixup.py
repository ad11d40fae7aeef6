"""Mixup / CutMix with label smoothing, applied by the trainer per batch, keyed by (seed, step).

As timm's batch mode: with probability ``prob`` the batch is mixed with its reverse (``x.flip(0)``);
CutMix is chosen with probability ``switch_prob`` when both are enabled; the mixing weight ``lam``
~ Beta(alpha, alpha) (CutMix corrects it to the pasted box's area). Targets are soft:
``lam * smooth(y) + (1 - lam) * smooth(y.flip(0))``, rows summing to 1. Every rank draws the same
``lam`` and box for a step (same key); each rank mixes within its own micro-batch.
"""

from __future__ import annotations

import math

import torch

from .keyed import STREAM_MIXUP, py_rng


def smooth_one_hot(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    off = smoothing / num_classes
    out = torch.full((labels.shape[0], num_classes), off, device=labels.device, dtype=torch.float32)
    return out.scatter_(1, labels.long().view(-1, 1), 1.0 - smoothing + off)


class Mixup:
    def __init__(self, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0, prob: float = 1.0,
                 switch_prob: float = 0.5, label_smoothing: float = 0.0, num_classes: int = 1000,
                 seed: int = 0):
        self.mixup_alpha, self.cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)
        self.prob, self.switch_prob = float(prob), float(switch_prob)
        self.label_smoothing, self.num_classes, self.seed = float(label_smoothing), int(num_classes), int(seed)

    @property
    def enabled(self) -> bool:
        return (self.mixup_alpha > 0 or self.cutmix_alpha > 0) and self.prob > 0

    def params(self, step: int, height: int, width: int) -> tuple[str, float, tuple[int, int, int, int] | None]:
        """(mode in {"none", "mixup", "cutmix"}, lam, cutmix box (y1, y2, x1, x2)) for ``step``."""
        rng = py_rng(self.seed, step, STREAM_MIXUP)
        if not self.enabled or rng.random() >= self.prob:
            return "none", 1.0, None
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            use_cutmix = rng.random() < self.switch_prob
        else:
            use_cutmix = self.cutmix_alpha > 0
        alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
        lam = rng.betavariate(alpha, alpha)
        if not use_cutmix:
            return "mixup", float(lam), None
        cut = math.sqrt(1.0 - lam)
        ch, cw = int(height * cut), int(width * cut)
        cy, cx = rng.randrange(height), rng.randrange(width)
        y1, y2 = max(cy - ch // 2, 0), min(cy + ch // 2, height)
        x1, x2 = max(cx - cw // 2, 0), min(cx + cw // 2, width)
        lam = 1.0 - (y2 - y1) * (x2 - x1) / float(height * width)
        return "cutmix", float(lam), (y1, y2, x1, x2)

    def __call__(self, images, labels: torch.Tensor, step: int, grid: torch.Tensor | None = None):
        """-> (mixed images (B, C, H, W), soft targets float (B, num_classes), rows summing to 1).
        ``images`` may be a NaFlex batch (a dict of ``patches``, ``patch_coord``, ``patch_valid``) with
        ``grid`` ``(B, 2)`` each image's patch grid: see :meth:`mix_patches`."""
        if isinstance(images, dict):
            return self.mix_patches(images, labels, step, grid)
        mode, lam, box = self.params(step, images.shape[-2], images.shape[-1])
        y = smooth_one_hot(labels, self.num_classes, self.label_smoothing)
        if mode == "none":
            return images, y
        if mode == "mixup":
            images = images * lam + images.flip(0) * (1.0 - lam)
        else:
            y1, y2, x1, x2 = box
            images = images.clone()
            images[:, :, y1:y2, x1:x2] = images.flip(0)[:, :, y1:y2, x1:x2]
        return images, y * lam + y.flip(0) * (1.0 - lam)


    def mix_patches(self, x: dict, labels: torch.Tensor, step: int, grid: torch.Tensor):
        """Mixup / CutMix of a NaFlex batch, each image with its partner in the reversed batch, as
        timm's ``NaFlexMixup`` (``timm/data/naflex_mixup.py``): images of different grids mix only over
        their central overlap (in whole patches here), and each image's target weight is the share of
        its own tokens it keeps (``lam`` differs per image). The step's draw (mode, ``lam``, the CutMix
        box's centre as a fraction of the overlap) is the image path's, keyed by (seed, step). No host
        sync: everything is computed on the batch's device."""
        mode, lam, _ = self.params(step, 1 << 20, 1 << 20)  # the box centre below, as a fraction
        y = smooth_one_hot(labels, self.num_classes, self.label_smoothing)
        if mode == "none":
            return x, y
        rng = py_rng(self.seed, step, STREAM_MIXUP, 1)
        centre = torch.tensor([rng.random(), rng.random()], device=y.device)
        p, coord, valid = x["patches"], x["patch_coord"], x["patch_valid"]
        B, L, F = p.shape
        g = grid.to(p.device).long()  # (B, 2) rows, columns of each image
        gj = g.flip(0)  # the partner's grid
        o = torch.minimum(g, gj)  # (B, 2) the central overlap
        off_i, off_j = (g - o) // 2, (gj - o) // 2
        rel = coord - off_i[:, None, :]  # (B, L, 2) position in the overlap
        sel = valid & (rel >= 0).all(-1) & (rel < o[:, None, :]).all(-1)
        area = o.prod(-1)
        if mode == "cutmix":
            side = (o.float() * math.sqrt(1.0 - lam)).floor().long()  # (B, 2) the box, in patches
            start = ((o - side).float() * centre).floor().long()
            sel = sel & (rel >= start[:, None, :]).all(-1) & (rel < (start + side)[:, None, :]).all(-1)
            area = side.prod(-1)
        pc = rel + off_j[:, None, :]  # (B, L, 2) the partner's patch at the same place
        idx = (pc[..., 0] * gj[:, None, 1] + pc[..., 1]).clamp(0, L - 1)  # its token (row-major)
        partner = p.flip(0).gather(1, idx[..., None].expand(-1, -1, F))  # (B, L, F)
        if mode == "mixup":
            mixed = torch.where(sel[..., None], p * lam + partner * (1.0 - lam), p)
            taken = (1.0 - lam) * area / g.prod(-1)
        else:
            mixed = torch.where(sel[..., None], partner, p)
            taken = area / g.prod(-1)
        keep = (1.0 - taken.float())[:, None]  # (B, 1) each image's own share
        return {**x, "patches": mixed}, y * keep + y.flip(0) * (1.0 - keep)


def build_mixup(cfg_data, label_smoothing: float, num_classes: int, seed: int) -> Mixup | None:
    """A :class:`Mixup` from the data config, or None when mixup and cutmix are off."""
    m = Mixup(cfg_data.mixup_alpha, cfg_data.cutmix_alpha, cfg_data.mixup_prob, cfg_data.mixup_switch_prob,
              label_smoothing, num_classes, seed)
    return m if m.enabled else None
