"""DINOv2's multi-crop views and iBOT's block masks, declared for the data layer
(:func:`dino_views`, which :meth:`vitscale.tasks.dino.DinoTask.views` returns): the loader's workers
cut them from the decoded image and key every draw by (``train.seed``, epoch, sample index, repeat,
view) (:mod:`vitscale.data.views`), so a resumed run, and a run whose batch is split over another
number of ranks, draws the same crops and masks.

Per view (facebookresearch/dinov2 at b8931f7, ``dinov2/data/augmentations.py``): a random resized crop
(torchvision's box; bicubic, lines 44-60) and a horizontal flip (p 0.5, ``dino.hflip``), colour jitter
(brightness 0.4, contrast 0.4, saturation 0.2, hue 0.1, in a random order) with p 0.8
(``dino.color_jitter``) and greyscale with p 0.2 (lines 63-71), then Gaussian blur (sigma in [0.1, 2])
with p 1.0 for the first global crop, 0.1 for the second, and 0.5 for the local crops
(``dino.gaussian_blur``), the second global crop solarised (threshold 128 of 255) with p 0.2
(``dino.solarization``; lines 73-82). These blur probabilities are the paper's (and DINO's,
facebookresearch/dino ``main_dino.py``); DINOv2's ``GaussianBlur`` (``dinov2/data/transforms.py`` lines
12-21) passes ``1 - p`` to ``RandomApply``, which applies the blur with that complement — we follow the
stated probabilities. DINOv3's Gram teacher reads crops of its own (``dino.gram_teacher_crops_size``):
each global crop's box and flip cut again, larger, undistorted or with the global crop's distortions
(facebookresearch/dinov3 at 6876159, ``dinov3/data/augmentations.py`` lines 66-108, 193-201). iBOT's masks (BEiT's blocks, :func:`vitscale.data.views.block_mask`) are drawn per
global crop: masked with ``dino.ibot_mask_sample_probability``, a ratio uniform in
``dino.ibot_mask_ratio_min_max`` (``dinov2/data/collate.py`` lines 20-36 spread the ratios over the
batch by a linspace and shuffle them; a per-crop draw keeps a sample's masks independent of its batch).
"""

from __future__ import annotations

from vitscale.data.keyed import STREAM_DINO_INIT
from vitscale.data.views import BlockMasks, Crops, Views

JITTER = (0.4, 0.4, 0.2, 0.1)  # augmentations.py line 66


def dino_views(dc, patch: int) -> Views:
    """The views of ``dc`` (the ``dino`` group) for a backbone of ``patch``-pixel patches: ``global``
    (2 crops), ``local`` (``dc.local_crops_number``), with the Gram teacher's own crops ``gram`` (each
    global crop's box at ``dc.gram_teacher_crops_size``: :attr:`vitscale.data.views.Crops.like`), and
    with iBOT the global crops' masks; with
    DINOv3's mixture of crop sizes (``dc.global_local_crop_pairs_ratios``) one such views per pair,
    a step cutting one pair (:attr:`vitscale.data.views.Views.mixture`)."""
    choices = [(w, _views(dc, g, loc, patch, gram)) for (g, loc, w), gram in zip(dc.pairs(), dc.gram_crops(), strict=True)]
    if len(choices) == 1:
        return choices[0][1]
    first = choices[0][1]
    return Views(first.crops, first.masks, mixture=tuple(choices))


def _views(dc, global_size: int, local_size: int, patch: int, gram_size: int | None = None) -> Views:
    aug = dict(flip=dc.hflip, jitter=dc.color_jitter, jitter_strength=JITTER, grey=0.2)
    glob = Crops(2, global_size, tuple(dc.global_crops_scale), blur=tuple(dc.gaussian_blur[:2]),
                 solarize=(0.0, dc.solarization), **aug)  # fmt: skip
    loc = Crops(dc.local_crops_number, local_size, tuple(dc.local_crops_scale), blur=(dc.gaussian_blur[2],),
                solarize=(0.0,), **aug)  # fmt: skip
    g = global_size // patch
    masks = None
    if dc.ibot_loss_weight > 0:
        masks = BlockMasks((g, g), dc.ibot_mask_sample_probability, tuple(dc.ibot_mask_ratio_min_max), crops="global")
    groups = [("global", glob), ("local", loc)]
    if gram_size is not None:  # DINOv3's Gram teacher's crops: each global crop's box again, larger (dinov3 augmentations.py 193-201)
        groups.append(("gram", Crops(2, gram_size, glob.scale, like="global", distort=not dc.gram_teacher_no_distortions)))
    return Views(tuple(groups), masks)


__all__ = ["STREAM_DINO_INIT", "dino_views"]
