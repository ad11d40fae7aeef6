"""The training targets of token labeling, as the reference code computes them.

TokenLabeling (github.com/zihangJiang/TokenLabeling, the code sail-sg/volo trains with):

- ``tlt/data/mixup.py`` ``get_featuremaps`` (lines 9-19): each location's top-k teacher **logits**
  are scattered into a ``(C, H, W)`` map whose every other class is 0;
- ``get_label`` (lines 21-46): that map is RoIAligned over the training crop onto the student's
  token grid (``--token-label-size``) and, for the class token, onto 1x1 (the whole crop pooled);
  both are soft-maxed over all C classes;
- ``get_labelmaps_with_coords`` (line 72) and ``mixup_target`` (lines 86-87): label smoothing as
  ``target * on + off`` with ``off = smoothing / C`` and ``on = 1 - smoothing + off``, applied to the
  dense and the class targets alike (so a target sums to ``1 + smoothing / C``, as there);
- ``tlt/loss/cross_entropy.py`` lines 67-72 (``--ground-truth``; sail-sg/volo ``loss/cross_entropy.py``
  ``TokenLabelGTCrossEntropy`` lines 72-77): the class target mixed with the smoothed one-hot label,
  ``ratio = 0.9 - 0.4 * [argmax agree]``, ``target * ratio + label * (1 - ratio)``.

The crop box (:func:`roi_boxes`): vitscale's crop is ``(top, left, h, w)`` in fractions of the
image the map covers, the flip applied after the crop. By default the box goes to RoIAlign as
``(x1, y1, x2, y2) = (left, top, left + w, top + h) * grid - 0.5`` and a flipped crop's targets are
flipped: the geometry of the image. ``reference=True`` runs the reference's computation: it
flips the whole label map (``label_transforms_factory.py`` line 81: the flip precedes the crop
there, so the crop's left edge is ``1 - left - w`` of the flipped map) and passes
``(top, left, top + h, left + w) * W - 0.5`` in roi_align's ``(x1, y1, x2, y2)`` slots
(``label_transforms_factory.py`` lines 60-66, ``mixup.py`` lines 54-55 and 27-32): the crop mirrored
about the map's diagonal.
"""

from __future__ import annotations

import torch

from .mixup import smooth_one_hot


def scatter_logits(values: torch.Tensor, indices: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``(B, k, gh, gw)`` top-k logits + class indices -> ``(B, C, gh, gw)`` maps, 0 for every other class."""
    B, _, gh, gw = values.shape
    return values.new_zeros(B, num_classes, gh, gw).scatter_(1, indices.long(), values)


def roi_boxes(crop: torch.Tensor, flip: torch.Tensor, map_hw: tuple[int, int], view: torch.Tensor | None = None,
              reference: bool = False) -> torch.Tensor:  # fmt: skip
    """``(B, 5)`` RoIAlign boxes (batch index, x1, y1, x2, y2 in map cells, centre-of-cell origin) of
    the crops ``(top, left, h, w)`` (fractions of the image; with ``view`` (B, 4), of the image of
    which the map covers ``view``)."""
    gh, gw = map_hw
    crop = crop.float()
    top, left, h, w = crop.unbind(1)
    if view is not None:  # express the crop in the teacher's view
        vt, vl, vh, vw = view.to(crop.device, torch.float32).unbind(1)
        top, left, h, w = (top - vt) / vh, (left - vl) / vw, h / vh, w / vw
    idx = torch.arange(crop.shape[0], device=crop.device, dtype=torch.float32)
    if reference:
        left = torch.where(flip.to(crop.device), 1.0 - left - w, left)  # the crop in the flipped image
        coords = torch.stack([top, left, top + h, left + w], 1) * gw - 0.5
    else:
        coords = torch.stack([left * gw, top * gh, (left + w) * gw, (top + h) * gh], 1) - 0.5
    return torch.cat([idx[:, None], coords], 1)


def token_label_targets(values: torch.Tensor, indices: torch.Tensor, num_classes: int, crop: torch.Tensor,
                        flip: torch.Tensor, grid: tuple[int, int], *, view: torch.Tensor | None = None,
                        smoothing: float = 0.0, reference_box: bool = False,
                        sampling_ratio: int = 0) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The crop's class target ``(B, C)`` and dense targets ``(B, oh, ow, C)`` at the student's token
    ``grid`` from the top-k logit maps ``values`` / ``indices`` ``(B, k, gh, gw)`` (module docstring)."""
    from torchvision.ops import roi_align

    B = values.shape[0]
    dense = scatter_logits(values.float(), indices, num_classes)
    flip = flip.to(dense.device).bool()
    if reference_box:
        dense = torch.where(flip.view(B, 1, 1, 1), dense.flip(-1), dense)
    boxes = roi_boxes(crop.to(dense.device), flip, tuple(dense.shape[-2:]), view, reference_box)
    tok = roi_align(dense, boxes, tuple(grid), 1.0, sampling_ratio, aligned=False)  # (B, C, oh, ow)
    cls = roi_align(dense, boxes, (1, 1), 1.0, sampling_ratio, aligned=False).view(B, num_classes)
    if not reference_box:
        tok = torch.where(flip.view(B, 1, 1, 1), tok.flip(-1), tok)
    off = smoothing / num_classes
    on = 1.0 - smoothing + off
    return cls.softmax(1) * on + off, (tok.softmax(1) * on + off).permute(0, 2, 3, 1)


def teacher_class_target(values: torch.Tensor, indices: torch.Tensor, num_classes: int,
                         smoothing: float = 0.0) -> torch.Tensor:  # fmt: skip
    """The teacher's own class-token prediction ``(B, C)`` from its top-k logits ``(B, k)``: the same
    rule as the dense maps (scattered on zeros, soft-maxed, smoothed)."""
    out = values.new_zeros(values.shape[0], num_classes).scatter_(1, indices.long(), values.float())
    off = smoothing / num_classes
    return out.softmax(1) * (1.0 - smoothing + off) + off


def mix_ground_truth(cls_target: torch.Tensor, labels: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """``--ground-truth``: ``cls_target * r + onehot * (1 - r)``, ``r = 0.9 - 0.4 * [argmax agree]``
    (the smoothed one-hot label; no host read)."""
    gt = smooth_one_hot(labels, cls_target.shape[1], smoothing).to(cls_target.device)
    agree = (gt.argmax(-1) == cls_target.argmax(-1)).to(cls_target.dtype)
    ratio = (0.9 - 0.4 * agree).unsqueeze(-1)
    return cls_target * ratio + gt * (1.0 - ratio)


__all__ = ["mix_ground_truth", "roi_boxes", "scatter_logits", "teacher_class_target", "token_label_targets"]
