"""DINOv2's multi-crop views and iBOT's block masks, drawn from the project's keyed randomness
(:mod:`vitscale.data.keyed`): every draw of sample ``i`` at micro-step ``s`` is keyed by
``(train.seed, s, i, stream, view)``, so a resumed run, and a run whose batch is split over another
number of ranks, draws the same crops and masks.

The views are cut on the device from the batch the loader gives (the run's ``data.*`` transform, then
its normalisation undone): the loader's code is unchanged, and its train transform should keep the
whole image (``data.rrc_scale: [1, 1]``, ``data.hflip: 0``) so that the crops below are DINOv2's.
Per view (facebookresearch/dinov2 at b8931f7, ``dinov2/data/augmentations.py``): a random resized crop
(torchvision's box, ``vitscale.data.transforms.rrc_box``; bicubic, lines 44-60) and a horizontal flip
(p 0.5, ``dino.hflip``), colour jitter (brightness 0.4, contrast 0.4, saturation 0.2, hue 0.1, in a random
order) with p 0.8 (``dino.color_jitter``) and greyscale with p 0.2 (lines 63-71), then Gaussian blur
(kernel 9, sigma in [0.1, 2]) with p 1.0 for the first global crop, 0.1 for the second, and 0.5 for the
local crops (``dino.gaussian_blur``), the second global crop solarised (threshold 128 of 255) with p 0.2
(``dino.solarization``; lines 73-82). These blur probabilities are the paper's (and DINO's,
facebookresearch/dino ``main_dino.py``); DINOv2's ``GaussianBlur`` (``dinov2/data/transforms.py`` lines
12-21) passes ``1 - p`` to ``RandomApply``, which applies the blur with that complement — we follow the
stated probabilities.
"""

from __future__ import annotations

import math
import random

import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

from vitscale.data import keyed
from vitscale.data.transforms import rrc_box

STREAM_DINO_CROP = 14  # keyed-randomness stream tags (vitscale.data.keyed 1-9, token labeling 11, MAE 12-13)
STREAM_DINO_MASK = 15
STREAM_DINO_INIT = 16

JITTER = (0.4, 0.4, 0.2, 0.1)  # augmentations.py line 66


def _view(img: torch.Tensor, rng: random.Random, size: int, scale, flip_p: float, jitter_p: float, blur_p: float,
          solarize_p: float) -> torch.Tensor:  # fmt: skip
    """One view of ``img`` (C, H, W) with values in [0, 1]: crop, flip, jitter, greyscale, blur, solarise
    (each draw made whatever its probability: the same boxes for any of them)."""
    _, h0, w0 = img.shape
    top, left, h, w = rrc_box(rng, h0, w0, scale, (3 / 4, 4 / 3))
    x = F.resized_crop(img, top, left, h, w, [size, size], interpolation=InterpolationMode.BICUBIC, antialias=True)
    x = x.clamp(0, 1)  # bicubic overshoots
    if rng.random() < flip_p:
        x = F.horizontal_flip(x)
    if rng.random() < jitter_p:  # torchvision ColorJitter: each factor uniform, the four in a random order
        b, c, s, hue = JITTER
        order = [0, 1, 2, 3]
        rng.shuffle(order)
        factors = (rng.uniform(1 - b, 1 + b), rng.uniform(1 - c, 1 + c), rng.uniform(1 - s, 1 + s), rng.uniform(-hue, hue))
        for op in order:
            if x.shape[0] != 3 and op in (2, 3):
                continue  # saturation and hue need colour
            x = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)[op](x, factors[op])
    if rng.random() < 0.2 and x.shape[0] == 3:
        x = F.rgb_to_grayscale(x, num_output_channels=3)
    if rng.random() < blur_p:
        sigma = rng.uniform(0.1, 2.0)
        x = F.gaussian_blur(x, [9, 9], [sigma, sigma])
    if rng.random() < solarize_p:
        x = F.solarize(x, 128 / 255)
    return x


def multi_crop(images: torch.Tensor, index: list[int], step: int, seed: int, mean, std, cfg) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The views of a normalised batch ``images`` (B, C, H, W): ``(global, local)``, the global crops
    ``(2B, C, G, G)`` (crop 1 of every sample, then crop 2: DINOv2's collate order,
    ``dinov2/data/collate.py`` line 16) and the local crops ``(L*B, C, S, S)`` (None without), normalised
    as the input. ``index``: the samples' dataset indices (the keys); ``cfg``: the ``dino`` group."""
    m = torch.tensor(mean, device=images.device, dtype=torch.float32).view(-1, 1, 1)
    s = torch.tensor(std, device=images.device, dtype=torch.float32).view(-1, 1, 1)
    raw = (images.float() * s + m).clamp(0, 1)
    n_local = cfg.local_crops_number
    aug = (cfg.hflip, cfg.color_jitter)
    blur, sol = cfg.gaussian_blur, (0.0, cfg.solarization)
    glob: list[list[torch.Tensor]] = [[], []]
    loc: list[list[torch.Tensor]] = [[] for _ in range(n_local)]
    for b, i in enumerate(index):
        for v in range(2):
            rng = keyed.py_rng(seed, step, i, STREAM_DINO_CROP, v)
            glob[v].append(_view(raw[b], rng, cfg.global_crops_size, cfg.global_crops_scale, *aug, blur[v], sol[v]))
        for v in range(n_local):
            rng = keyed.py_rng(seed, step, i, STREAM_DINO_CROP, 2 + v)
            loc[v].append(_view(raw[b], rng, cfg.local_crops_size, cfg.local_crops_scale, *aug, blur[2], 0.0))
    g = (torch.stack([x for v in glob for x in v]) - m) / s
    lc = (torch.stack([x for v in loc for x in v]) - m) / s if n_local else None
    return g.to(images.dtype), (lc.to(images.dtype) if lc is not None else None)


# ------------------------------------------------------------------------------------------ iBOT masks
def block_mask(rng: random.Random, gh: int, gw: int, num_masking: int, min_num: int = 4, max_num: int | None = None,
               min_aspect: float = 0.3) -> torch.Tensor:  # fmt: skip
    """A ``(gh, gw)`` bool mask of about ``num_masking`` patches in rectangular blocks (BEiT's block
    masking as ``dinov2/data/masking.py`` ``MaskingGenerator`` lines 11-86 implements it: blocks of
    ``min_num``..``max_num`` patches, aspect ratio in [min_aspect, 1/min_aspect] (log-uniform), added
    while each adds a new patch; ``max_num`` defaults to half the grid, ``dinov2/train/train.py``
    line 172), drawn from ``rng``."""
    max_num = int(0.5 * gh * gw) if max_num is None else max_num
    log_aspect = (math.log(min_aspect), math.log(1 / min_aspect))
    mask = torch.zeros(gh, gw, dtype=torch.bool)
    count = 0
    while count < num_masking:
        max_mask = min(num_masking - count, max_num)
        delta = 0
        for _ in range(10):
            target = rng.uniform(min_num, max_mask)
            aspect = math.exp(rng.uniform(*log_aspect))
            h = int(round(math.sqrt(target * aspect)))
            w = int(round(math.sqrt(target / aspect)))
            if w < gw and h < gh:
                top = rng.randint(0, gh - h)
                left = rng.randint(0, gw - w)
                block = mask[top : top + h, left : left + w]
                if 0 < h * w - int(block.sum()) <= max_mask:
                    delta = h * w - int(block.sum())
                    block.fill_(True)
                if delta > 0:
                    break
        if delta == 0:
            break
        count += delta
    return mask


def ibot_masks(index: list[int], step: int, seed: int, grid: tuple[int, int], probability: float,
               ratio: tuple[float, float]) -> torch.Tensor:  # fmt: skip
    """``(2B, gh*gw)`` bool: the iBOT masks of the 2 global crops of each sample (rows in the global
    crops' order). Of each sample's crops, each is masked with ``probability``, its ratio uniform in
    ``ratio`` (``dinov2/data/collate.py`` lines 20-36 spread the ratios over the batch by a linspace and
    shuffle them; a per-crop draw keeps a sample's masks independent of its batch, as the keyed crops)."""
    gh, gw = grid
    n = gh * gw
    rows = [[], []]
    for i in index:
        for v in range(2):
            rng = keyed.py_rng(seed, step, i, STREAM_DINO_MASK, v)
            k = int(n * rng.uniform(*ratio)) if rng.random() < probability else 0
            rows[v].append(block_mask(rng, gh, gw, k).flatten())
    return torch.stack(rows[0] + rows[1])


__all__ = ["block_mask", "ibot_masks", "multi_crop"]
