"""Views: the crops (and block masks) a task asks of each training sample, cut by the loader's workers.

A task that trains on several views of an image (DINO's 2 global and ``L`` local crops, iBOT's masks)
declares them (:meth:`vitscale.tasks.base.Task.views` returns a :class:`Views`); the training loader
then applies no crop or augmentation of its own (a ``data.*`` augmentation key that would be ignored
or stacked is refused, :func:`check_views`) and its workers cut every view from the decoded image at
the file's own resolution — a JPEG decoded at the largest DCT reduction that keeps every view's box
at least its output size (:func:`vitscale.data.decode.decode_reduced`), as DINOv2 and DINOv3 cut
theirs from the decoded file in the loader (facebookresearch/dinov2 at b8931f7,
``dinov2/data/augmentations.py``; facebookresearch/dinov3 ``dinov3/train/train.py``,
``collate_data_and_cast``).

Every draw is keyed by ``(train.seed, epoch, sample index, stream, repeat, view)``
(:mod:`vitscale.data.keyed`; ``repeat``: which repeat of its image in the epoch, ``data.repeated_aug``;
``view``: the crop's number over all groups in order): the same views of a sample on any rank, at any
batch position, with any number of workers, after a resume; others in every epoch, view and repeat.

Per crop, on the PIL image (the order and operations of DINOv2's ``DataAugmentationDINO``,
augmentations.py lines 44-82): torchvision's RandomResizedCrop box (:func:`~vitscale.data.transforms.rrc_box`)
resized bicubic (PIL's antialiased resampling); a horizontal flip; the data layer's colour jitter
(:class:`vitscale.data.auto_augment.ColorJitter`: brightness, contrast, saturation, hue in a random
order); greyscale; a Gaussian blur of radius U(0.1, 2) (the data layer's blur,
:func:`vitscale.data.augment_ops.gaussian_blur`, PIL's as DINO's ``utils.GaussianBlur``); solarisation
at 128. Each probability is drawn whatever its value (the same boxes for any of them).

The collate stacks them crop-major (every sample's crop 0, then every sample's crop 1: DINOv2's
``dinov2/data/collate.py`` line 16) into the batch's keys — a crop group's name (``global``
``(2B, C, G, G)``, ``local`` ``(L*B, C, S, S)``), and ``masks`` ``(n*B, gh*gw)`` bool of the masked
group's crops — uint8 until the loader normalises them as it normalises ``image`` (on the device when
it has one: :meth:`vitscale.data.loader.ResumableLoader.postprocess`). Such a batch has no ``image``.

A group may be cut from another group's boxes (:attr:`Crops.like`: DINOv3's Gram teacher's crops of the
global crops, larger): crop for crop the same box at its own size, with the other group's flip, and its
distortions or none (:attr:`Crops.distort`); it draws nothing of its own, so the other groups' draws,
and their view numbers, are those of a run without it.

A mixture (:attr:`Views.mixture`: the same groups at other sizes, DINOv3's crop-size pairs) cuts one
choice per optimizer step, drawn from ``(train.seed, epoch, step)`` (:func:`mixture_index`) and handed
to the workers with each sample by the sampler (:class:`vitscale.data.sampler.ShardedBatchSampler`);
a sample's boxes and augmentation are the same whichever choice its step cuts.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from ..errors import ConfigError
from . import augment_ops as ops
from . import keyed
from .auto_augment import ColorJitter
from .decode import decode_reduced, draft_factor, pil_to_uint8_tensor
from .transforms import Augmented, SampleTransform, rrc_box

MAX_CROPS = 64
"""Most crops of one group per sample (DINOv2: 2 global, 8 local; DINOv3: 2 + 8): past it one
sample's views outgrow any step."""
MAX_CROP_SIDE = 1024
"""Largest crop side in pixels (DINOv3's high-resolution adaptation: 512-768)."""
MAX_LIKE_SIDE = 2048
"""Largest side of a group cut from another group's boxes (:attr:`Crops.like`: DINOv3's Gram teacher's
crops, 768-1152 in its high-resolution stage, ``dinov3_vit7b16_high_res_adapt.yaml`` lines 180-185)."""


@dataclass(frozen=True)
class Crops:
    """``count`` crops of ``size`` x ``size`` pixels of each sample, and the augmentation of each."""

    count: int
    size: int
    scale: tuple[float, float]
    """Area range of the crop box, a fraction of the image."""
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    """Aspect-ratio range (width / height) of the box (torchvision's default)."""
    flip: float = 0.5
    """Probability of a horizontal flip."""
    jitter: float = 0.8
    """Probability of the colour jitter."""
    jitter_strength: tuple[float, float, float, float] = (0.4, 0.4, 0.2, 0.1)
    """Brightness, contrast, saturation, hue of the jitter (torchvision's ``ColorJitter`` arguments)."""
    grey: float = 0.2
    """Probability of greyscale (RGB images)."""
    blur: tuple[float, ...] = (0.5,)
    """Probability of the Gaussian blur of each crop of the group (one value: every crop)."""
    solarize: tuple[float, ...] = (0.0,)
    """Probability of solarising each crop of the group (one value: every crop)."""
    like: str | None = None
    """Another group whose boxes this one cuts, crop for crop, at its own ``size`` (``count`` the same;
    no draws of its own): DINOv3's Gram teacher crops of the global crops (facebookresearch/dinov3 at
    6876159, ``dinov3/data/augmentations.py`` lines 66-108, 193-201). Its own augmentation fields are
    unused: with ``distort`` it shares that group's flip and distortions (both cut at the larger of the
    two sizes, distorted once, each resized from it: lines 98-103, 174-176, 199-200), without only its
    flip (the box resized and flipped, undistorted: lines 89-96, 196-197)."""
    distort: bool = True
    """With ``like``: share the other group's distortions (True) or only its flip (False)."""

    def p(self, values: tuple[float, ...], k: int) -> float:
        return float(values[k] if len(values) > 1 else values[0])


@dataclass(frozen=True)
class BlockMasks:
    """iBOT's block masks (BEiT's block masking) of the crops of group ``crops``: each crop is masked
    with ``probability``, a fraction of its ``grid`` patches drawn uniformly in ``ratio``."""

    grid: tuple[int, int]
    probability: float
    ratio: tuple[float, float]
    crops: str = "global"


@dataclass(frozen=True)
class Views:
    """The views each training sample yields: named crop groups (their order numbers the views) and
    the block masks of one of them; or, with ``mixture``, one of several such views per optimizer step
    (:func:`mixture_index`: the same crop groups at other sizes, e.g. DINOv3's pairs of global and
    local crop sizes), ``crops`` and ``masks`` then being the first choice's."""

    crops: tuple[tuple[str, Crops], ...]
    masks: BlockMasks | None = None
    mixture: tuple[tuple[float, Views], ...] = ()
    """``(weight, views)`` of each choice (weights summing to 1); empty: these views at every step."""

    def group(self, name: str) -> Crops:
        return dict(self.crops)[name]

    def choices(self) -> list[Views]:
        """Every views a step may cut: the mixture's, else these."""
        return [v for _, v in self.mixture] or [self]

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(w for w, _ in self.mixture)


def mixture_index(weights: tuple[float, ...], seed: int, epoch: int, step: int) -> int:
    """Which choice of a mixture of views (``weights``, :attr:`Views.mixture`) optimizer step ``step``
    of ``epoch`` (0-based, within the epoch) cuts: a weighted draw keyed by ``(seed, epoch, step)``,
    so every rank, micro-batch and resume of that step cuts the same sizes. DINOv3 draws one of its
    loaders per batch by the pairs' ratios, the same on every rank (facebookresearch/dinov3
    ``dinov3/data/meta_loaders.py`` ``CombinedDataLoader``, ``GLOBAL_HOMOGENEOUS``, lines 46-66)."""
    if len(weights) < 2:
        return 0
    u, acc = keyed.py_rng(seed, epoch, step, keyed.STREAM_VIEW_PAIR).random() * sum(weights), 0.0
    for k, w in enumerate(weights):
        acc += w
        if u < acc:
            return k
    return len(weights) - 1


@dataclass
class ViewSample:
    """One sample's views, uint8 (C, S, S) per crop of each group, and its masks ``(n, gh*gw)`` bool."""

    crops: dict[str, list[torch.Tensor]]
    masks: torch.Tensor | None


# ----------------------------------------------------------------------------------- the checks
IGNORED_KEYS = ("rrc_scale", "rrc_ratio", "hflip", "train_interpolation", "auto_augment", "color_jitter",
                "force_color_jitter", "random_erasing", "mixup_alpha", "cutmix_alpha", "image_sizes", "seq_lens")  # fmt: skip
"""The ``data.*`` keys of the loader's own crop and augmentation: ignored (or stacked under the
views) by a run whose task declares views, so refused when not at their defaults."""


def check_views(views: Views, cfg_data, img_size: tuple[int, int], task: str) -> None:
    """One-line :class:`ConfigError` for a run whose views cannot be cut as asked: a ``data.*``
    augmentation key off its default (:data:`IGNORED_KEYS`), a crop group without a bound, a crop
    larger than the loader's image ``img_size`` (``data.img_size``, else the model's; a group cut from
    another's boxes, :attr:`Crops.like`, at most :data:`MAX_LIKE_SIDE`: the teacher's larger view of
    the same box), or a group cut from the boxes of a group that is not there."""
    defaults = {f.name: f.default for f in dataclasses.fields(type(cfg_data)) if f.default is not dataclasses.MISSING}
    for f in dataclasses.fields(type(cfg_data)):
        if f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    for key in IGNORED_KEYS:
        value, default = getattr(cfg_data, key, None), defaults.get(key)
        same = value == default or (isinstance(value, (list, tuple)) and isinstance(default, (list, tuple))
                                    and [float(v) for v in value] == [float(v) for v in default])  # fmt: skip
        if not same:
            shown = list(value) if isinstance(value, (list, tuple)) else value
            raise ConfigError(f"data.{key}={shown} with train.task={task}: the task's views are cut and augmented by the "
                              f"loader's workers as the task declares them (docs/data.md \"Views\"), so the loader's own "
                              f"crop and augmentation are not applied: leave data.{key} out")  # fmt: skip
    side = min(img_size)
    for v in views.choices():
        groups = dict(v.crops)
        for name, c in v.crops:
            if c.like is not None and (c.like not in groups or groups[c.like].like is not None or c.count != groups[c.like].count):
                raise ConfigError(f"the {name} crops of train.task={task} are cut from the {c.like} crops' boxes: {c.like} must be "
                                  f"a group of its own with as many crops ({c.count})")  # fmt: skip
            if c.like is not None and c.count and not 1 <= c.size <= MAX_LIKE_SIDE:
                raise ConfigError(f"the {name} crops of train.task={task} are {c.size} px: at most {MAX_LIKE_SIDE} px")
    for name, c in (item for v in views.choices() for item in v.crops if item[1].like is None):
        if c.count and not 1 <= c.size <= min(side, MAX_CROP_SIDE):
            raise ConfigError(f"the {name} crops of train.task={task} are {c.size} px, larger than the loader's image "
                              f"({img_size[0]}x{img_size[1]}, data.img_size or the model's): at most {min(side, MAX_CROP_SIDE)} px")  # fmt: skip
        if not 0 <= c.count <= MAX_CROPS:
            raise ConfigError(f"{c.count} {name} crops a sample (train.task={task}): use 0 to {MAX_CROPS}")


# ----------------------------------------------------------------------------------- iBOT masks
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


# ----------------------------------------------------------------------------------- the cutting
class ViewTransform(SampleTransform):
    """The training transform of a run with views: :meth:`decode` (files) and :meth:`tensor_train`
    (in-memory images) give an :class:`Augmented` whose ``image`` is the sample's :class:`ViewSample`."""

    def __init__(self, cfg, img_size, num_channels: int, seed: int, views: Views):
        super().__init__(cfg, img_size, num_channels, seed, train=True)
        self.views = views
        self.augment = None  # the loader's own augmentation is not applied (check_views refuses its keys)
        self.jitter = {name: ColorJitter(*c.jitter_strength) for name, c in views.crops}
        self._likes = _likes(views)

    def variant(self, k: int) -> ViewTransform:
        """This transform cutting choice ``k`` of the views' mixture (:func:`mixture_index`, a step's,
        given with the sample by the sampler): the same draws, other sizes."""
        if not self.views.mixture:
            return self
        other = copy.copy(self)
        other.views = self.views.mixture[int(k)][1]
        other._likes = _likes(other.views)
        return other

    def _rngs(self, epoch: int, index: int) -> list[tuple[str, int, Crops, random.Random]]:
        out, v = [], 0
        for name, c in self.views.crops:
            if c.like is not None:  # cut from another group's boxes: no draws of its own
                continue
            for k in range(c.count):
                out.append((name, k, c, keyed.py_rng(self.seed, epoch, index, keyed.STREAM_VIEW_CROP, self.repeat, v)))
                v += 1
        return out

    def grid(self, h: int, w: int) -> tuple[int, int]:
        """The size the boxes are drawn on for an ``h x w`` image: its own, or for an image whose shorter
        side is under the loader's image (``img_size``: digits' 8 px) that side upsampled to it once
        (bicubic), so that a box keeps sub-pixel precision instead of whole source pixels."""
        side = min(self.img_size)
        if min(h, w) >= side:
            return h, w
        f = side / min(h, w)
        return max(side, round(h * f)), max(side, round(w * f))

    def decode(self, src, epoch: int, slot: int, fast: bool = True) -> Augmented:
        draws = self._rngs(epoch, slot)
        boxes: list = []
        size: list = []

        def factor(h: int, w: int) -> int:  # every box from the header's size, then the DCT scale that keeps them all
            size.extend(self.grid(h, w))
            boxes.extend(rrc_box(rng, *size, c.scale, c.ratio) for _, _, c, rng in draws)
            if tuple(size) != (h, w):
                return 1
            side = {name: max([c.size] + [o.size for _, o in self._likes.get(name, ())]) for name, c in self.views.crops}
            return min((draft_factor(b[2], b[3], side[name], side[name]) for b, (name, _, _, _) in zip(boxes, draws)),
                       default=8)  # fmt: skip

        t, scale, _ = decode_reduced(src, factor, num_channels=self.num_channels, fast=fast, max_pixels=self.cfg.max_image_pixels)
        return self._cut(t, scale, tuple(size), boxes, draws, epoch, slot)

    def tensor_train(self, image: torch.Tensor, epoch: int, index: int) -> Augmented:
        draws = self._rngs(epoch, index)
        size = self.grid(*image.shape[-2:])
        boxes = [rrc_box(rng, *size, c.scale, c.ratio) for _, _, c, rng in draws]
        return self._cut(image, 1.0, size, boxes, draws, epoch, index)

    def _cut(self, t: torch.Tensor, scale: float, size, boxes, draws, epoch: int, index: int) -> Augmented:
        arr = np.ascontiguousarray(t.permute(1, 2, 0).numpy())  # (h, w, C) uint8
        img = Image.fromarray(arr[:, :, 0], mode="L") if arr.shape[2] == 1 else Image.fromarray(arr, mode="RGB")
        if tuple(size) != tuple(arr.shape[:2]):  # a small image, upsampled once to the boxes' grid
            img, scale = img.resize((size[1], size[0]), Image.Resampling.BICUBIC), 1.0
        crops: dict[str, list[torch.Tensor]] = {name: [] for name, _ in self.views.crops}
        bicubic = Image.Resampling.BICUBIC
        for (top, left, h, w), (name, k, c, rng) in zip(boxes, draws, strict=True):
            box = (left / scale, top / scale, min(img.width, (left + w) / scale), min(img.height, (top + h) / scale))
            likes = self._likes.get(name, ())
            state = rng.getstate() if likes else None  # after the box: the flip is the next draw
            shared = [(o_name, o) for o_name, o in likes if o.distort]
            side = max([c.size] + [o.size for _, o in shared])  # with groups that share the distortions: cut at
            x = self._augment(img.resize((side, side), bicubic, box=box), rng, name, k, c)  # the largest, distorted once
            for o_name, o in ((name, c), *shared):  # and each resized from it (DINOv3, augmentations.py lines 98-103)
                crops[o_name].append(pil_to_uint8_tensor(x if o.size == side else x.resize((o.size, o.size), bicubic)))
            for o_name, o in likes:
                if not o.distort:  # the same box and flip, undistorted (augmentations.py lines 89-96, 196-197)
                    again = random.Random()
                    again.setstate(state)
                    crops[o_name].append(pil_to_uint8_tensor(self._augment(img.resize((o.size, o.size), bicubic, box=box),
                                                                           again, name, k, c, flip_only=True)))  # fmt: skip
        return Augmented(ViewSample(crops, self._masks(epoch, index)), (0.0, 0.0, 1.0, 1.0), False, [0] * 6)

    def _augment(self, x: Image.Image, rng: random.Random, name: str, k: int, c: Crops, flip_only: bool = False) -> Image.Image:
        if rng.random() < c.flip:
            x = x.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if flip_only:
            return x
        if rng.random() < c.jitter:
            jitter = self.jitter[name]
            x = jitter.apply(x, jitter.draw(rng))
        if rng.random() < c.grey and x.mode == "RGB":
            x = x.convert("L").convert("RGB")
        if rng.random() < c.p(c.blur, k):
            x = ops.gaussian_blur(x, rng.uniform(0.1, 2.0))
        if rng.random() < c.p(c.solarize, k):
            x = ops.solarize(x, 128)
        return x

    def _masks(self, epoch: int, index: int) -> torch.Tensor | None:
        m = self.views.masks
        if m is None:
            return None
        first = 0  # the masked group's first view number
        for name, c in self.views.crops:
            if name == m.crops:
                break
            first += c.count if c.like is None else 0
        gh, gw = m.grid
        rows = []
        for k in range(self.views.group(m.crops).count):
            rng = keyed.py_rng(self.seed, epoch, index, keyed.STREAM_VIEW_MASK, self.repeat, first + k)
            n = int(gh * gw * rng.uniform(*m.ratio)) if rng.random() < m.probability else 0
            rows.append(block_mask(rng, gh, gw, n).flatten())
        return torch.stack(rows)


def _likes(views: Views) -> dict[str, tuple[tuple[str, Crops], ...]]:
    """The groups cut from each group's boxes (:attr:`Crops.like`), by that group's name."""
    out: dict[str, list] = {}
    for name, c in views.crops:
        if c.like is not None:
            out.setdefault(c.like, []).append((name, c))
    return {k: tuple(v) for k, v in out.items()}


def collate_views(samples: list[ViewSample]) -> dict[str, torch.Tensor]:
    """The views of a batch, crop-major: each group ``(count*B, C, S, S)`` uint8 (none for a group of
    0 crops), ``masks`` ``(count*B, gh*gw)`` bool."""
    out: dict[str, torch.Tensor] = {}
    for name, first in samples[0].crops.items():
        if first:
            out[name] = torch.stack([s.crops[name][k] for k in range(len(first)) for s in samples])
    if samples[0].masks is not None:
        out["masks"] = torch.stack([s.masks[k] for k in range(samples[0].masks.shape[0]) for s in samples])
    return out


__all__ = ["IGNORED_KEYS", "BlockMasks", "Crops", "ViewSample", "ViewTransform", "Views", "block_mask", "check_views",
           "collate_views", "mixture_index"]  # fmt: skip
