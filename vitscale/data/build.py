"""The loaders of a run: :func:`build_loader` (one split of any format) and :func:`build_loaders` (a
run's train and val loaders), the entry points of the trainer, evaluation and labeling (docs/data.md).

The format (``data.format``, :mod:`vitscale.data.formats`) gives the samples of a split; everything
else is shared: keyed sampling and augmentation, sharding over ranks, resume, bad-file counting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..config.data import DataConfig
from ..errors import CheckError
from .dataset import KeyedDataset
from .formats import SPLITS, get_format
from .loader import BadFileReporter, ResumableLoader, skip_summary
from .sampler import EvalShardSampler, ShardedBatchSampler
from .sizes import SizePlan, eval_size, size_plan
from .sizesampler import SizedBatchSampler
from .transforms import SampleTransform
from .views import Views, ViewTransform, check_views


@dataclass
class Loaders:
    train: ResumableLoader
    """This rank's training batches (resumable; see :class:`ResumableLoader`)."""
    val: ResumableLoader | None
    """This rank's validation shard (whole batches ``rank::world_size`` of the split in order:
    :class:`EvalShardSampler`), or None."""
    num_classes: int
    class_names: list[str]
    sizes: SizePlan | None = None
    """Variable resolution: the size and batch of each training step (None: one size);
    ``sizes.total_steps`` is set by the run assembly (progressive stages are fractions of the run)."""

    def skips(self, group=None) -> dict:
        """The run's skipped files and shards, training and validation, over the ranks (every rank
        calls it): ``{"skipped_files": n, "skipped_shards": [...]}`` (:func:`skip_summary`)."""
        return skip_summary(self.train.reporter, group)


class SplitLoader(NamedTuple):
    loader: ResumableLoader
    """This rank's batches of the split."""
    class_names: list[str]
    """The split's classes (``classes`` when they were given)."""
    num_classes: int


def _size(cfg_data: DataConfig, img_size, augment: bool = False) -> tuple[int, int]:
    side = eval_size(cfg_data) if not cfg_data.seq_lens else None
    if side:  # multi-resolution: evaluation at data.eval_image_size; training starts there, then per step
        side = max(cfg_data.image_sizes) if augment else side
        return side, side
    if cfg_data.img_size:
        return int(cfg_data.img_size), int(cfg_data.img_size)
    return int(img_size[0]), int(img_size[1])


def _check_repeated_aug(cfg_data: DataConfig, *, streamed: bool) -> None:
    """``data.repeated_aug``: a whole number of repeats, on a training split read by index."""
    r = cfg_data.repeated_aug
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise CheckError(f"data.repeated_aug={r} must be a whole number of at least 1 (times each image is drawn "
                         "per epoch; 1 = off, DeiT: 3)")  # fmt: skip
    if r == 1:
        return
    if streamed:
        mode = {"webdataset": "webdataset_mode", "parquet": "parquet_mode"}.get(cfg_data.format)
        how = f"with data.{mode}=stream " if mode else ""
        fix = f"set data.{mode}=index" if mode else "use an indexed format (an image folder, indexed shards)"
        raise CheckError(f"data.repeated_aug={r}: data.format={cfg_data.format} {how}streams its training samples, "
                         f"with no index to repeat: {fix}, or data.repeated_aug=1")  # fmt: skip


def build_loader(
    cfg_data: DataConfig,
    split: str = "val",
    *,
    img_size: tuple[int, int],
    num_channels: int,
    seed: int,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    augment: bool = False,
    drop_last: bool = True,
    device: torch.device | str | None = None,
    classes: list[str] | None = None,
    reporter: BadFileReporter | None = None,
    tokenize: Callable[[list[str]], torch.Tensor] | None = None,
    patch: int = 0,
    sizes: SizePlan | None = None,
    views: Views | None = None,
    grad_accum: int = 1,
) -> SplitLoader | None:
    """This rank's loader of ``split`` (``train`` / ``val``) of the data ``cfg_data`` points at (any
    format and path), or None when the dataset has no such split.

    ``augment``: shuffled keyed epochs with the training augmentation, ``batch_size`` images per rank
    (``drop_last``); otherwise the split in order, unaugmented, in whole batches of ``batch_size`` dealt
    to the ranks (:class:`EvalShardSampler`). ``classes``: the class names the labels must be mapped
    to (a trained model's, or the training split's), None to take the split's own. ``tokenize``: texts
    -> token ids ``(N, L)``, the model family's tokenizer (``FamilySpec.create_tokenizer``, handed over
    by the run assembly): a format with captions puts the ids in ``batch["text"]``; None = no caption
    tokens (a run that reads no text). ``patch``: the model's patch size (NaFlex batches, variable
    resolution); ``sizes``: the training steps' sizes and batches (``augment``; :mod:`.sizes`), which
    then replace ``batch_size``. With ``data.seq_lens`` batches are NaFlex batches (``batch["image"]``
    is the dict of ``patches``, ``patch_coord``, ``patch_valid``; ``batch["grid"]`` each image's grid).
    ``views`` (``augment``; a task's, :mod:`.views`): each sample's crops and masks cut by the workers
    instead of the loader's crop and augmentation; the batches hold them (``global``, ``local``,
    ``masks``) and no ``image``; with a mixture of views (:attr:`.views.Views.mixture`) each optimizer
    step of ``grad_accum`` micro-batches cuts one choice.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    fmt = get_format(cfg_data.format)
    if fmt.check is not None:
        fmt.check(cfg_data)
    for key, needs in (("eval_seq_len", "seq_lens"), ("eval_image_size", "image_sizes")):  # an evaluator's data: too
        if getattr(cfg_data, key) is not None and not getattr(cfg_data, needs):
            raise CheckError(f"data.{key} is the evaluation size of a run with data.{needs}, which this data has not: "
                             f"set data.{needs}, or leave data.{key} out")  # fmt: skip
    size = _size(cfg_data, img_size, augment)
    naflex = {"patch": patch, "seq_len": eval_size(cfg_data)} if cfg_data.seq_lens else {}
    if naflex and not patch:
        raise ValueError("data.seq_lens: build_loader needs the model's patch size (patch=)")
    text = {"tokenize": tokenize} if fmt.captions else {}
    data = fmt.split(cfg_data, split, img_size=size, num_channels=num_channels, seed=seed, classes=classes, **text)
    if data is None or (not hasattr(data.source, "build_loader") and len(data.source) == 0):
        return None
    reporter = reporter or BadFileReporter()
    common = dict(
        mean=cfg_data.mean, std=cfg_data.std, device=device, reporter=reporter,
        num_workers=cfg_data.num_workers, pin_memory=cfg_data.pin_memory,
        persistent_workers=cfg_data.persistent_workers, prefetch_factor=cfg_data.prefetch_factor,
    )  # fmt: skip
    if augment and views is not None:
        tf: SampleTransform = ViewTransform(cfg_data, size, num_channels, seed, views)
    else:
        tf = SampleTransform(cfg_data, size, num_channels, seed, train=augment, **naflex)
    src = data.source
    if not augment and hasattr(src, "leave_out_bad"):  # an evaluation leaves bad files out, never duplicates
        src.leave_out_bad = True
    if hasattr(src, "build_loader") and (cfg_data.image_sizes or cfg_data.seq_lens):
        raise CheckError(f"data.format={cfg_data.format} streams its samples, which variable resolution (data.image_sizes, "
                         "data.seq_lens) does not read yet: use an indexed source (an image folder, indexed shards)")  # fmt: skip
    mixture = views.weights if augment and views is not None else ()
    if mixture and hasattr(src, "build_loader"):
        raise CheckError(f"data.format={cfg_data.format} streams its samples, which a mixture of crop sizes (a task's "
                         "views, e.g. dino.global_local_crop_pairs_ratios) does not read yet: use an indexed source "
                         "(an image folder, indexed shards)")  # fmt: skip
    if augment:
        _check_repeated_aug(cfg_data, streamed=hasattr(src, "build_loader"))
    if hasattr(src, "build_loader"):  # streaming sources build their own loader (in stream order)
        loader = src.build_loader(tf, micro_batch_size=batch_size, rank=rank, world_size=world_size,
                                  drop_last=drop_last, **common)  # fmt: skip
    elif augment and sizes is not None:  # a size and a batch per step (vitscale.data.sizes)
        sampler = SizedBatchSampler(len(src), sizes, rank=rank, world_size=world_size, repeats=cfg_data.repeated_aug)
        loader = ResumableLoader(KeyedDataset(src, tf), sampler, **common, across_epochs=cfg_data.prefetch_across_epochs)
    elif augment:
        sampler = ShardedBatchSampler(len(src), batch_size, seed=seed, rank=rank, world_size=world_size,
                                      shuffle=True, drop_last=drop_last, repeats=cfg_data.repeated_aug, mixture=mixture,
                                      accum=grad_accum)  # fmt: skip
        loader = ResumableLoader(KeyedDataset(src, tf), sampler, **common, across_epochs=cfg_data.prefetch_across_epochs)
    else:
        sampler = EvalShardSampler(len(src), batch_size, rank=rank, world_size=world_size)
        loader = ResumableLoader(KeyedDataset(src, tf), sampler, **common)
    return SplitLoader(loader, list(data.class_names), int(data.num_classes))


def build_loaders(
    cfg_data: DataConfig,
    *,
    img_size: tuple[int, int],
    num_channels: int,
    seed: int,
    micro_batch_size: int,
    eval_batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = True,
    device: torch.device | str | None = None,
    train_augment: bool = True,
    classes: list[str] | None = None,
    tokenize: Callable[[list[str]], torch.Tensor] | None = None,
    patch: int = 0,
    grad_accum: int = 1,
    views: Views | None = None,
    task: str = "",
) -> Loaders:
    """Build this rank's train and val loaders (:func:`build_loader` of each split).

    ``img_size`` is the model's (H, W) unless ``cfg_data.img_size`` overrides it. Batches are dicts
    ``{"image": float (B, C, H, W) normalised, "label": long (B,), "index": long (B,), "skipped": int,
    "crop": float (B, 4), "flip": bool (B,)}``. With ``device``, batches are moved there and
    normalised there (uint8 crosses the host->device copy). ``train_augment=False`` reads the train
    split like val: in order, unaugmented, ``micro_batch_size`` images a batch (``label-tokens``,
    probes; a streaming source: in stream order). ``classes``: a trained model's class names, which
    the labels of both splits are mapped to (None: the training split's). ``tokenize``: the model
    family's tokenizer for formats with captions (see :func:`build_loader`). ``patch``: the model's
    patch size and ``grad_accum`` the micro-steps per optimizer step, for variable resolution
    (``data.image_sizes``, ``data.seq_lens``: :mod:`.sizes`). ``views``: the views task ``task``
    declares (:meth:`vitscale.tasks.base.Task.views`), which the training loader cuts instead of its
    own crop and augmentation (:func:`.views.check_views` first: one-line refusals); the evaluation
    loaders are unchanged.
    """
    if views is not None and train_augment:
        check_views(views, cfg_data, _size(cfg_data, img_size), task)
    else:
        views = None
    reporter = BadFileReporter()  # shared by train and val: one warning per bad file per run
    common = dict(img_size=img_size, num_channels=num_channels, seed=seed, rank=rank, world_size=world_size,
                  device=device, reporter=reporter, tokenize=tokenize, patch=patch)  # fmt: skip
    sizes = None
    if train_augment:
        sizes = size_plan(cfg_data, patch=patch, batch_size=micro_batch_size * world_size * grad_accum,
                          parts=world_size * grad_accum, seed=seed, accum=grad_accum)  # fmt: skip
    train = build_loader(cfg_data, "train", batch_size=micro_batch_size, augment=train_augment, drop_last=drop_last,
                         classes=classes, sizes=sizes, views=views, grad_accum=grad_accum, **common)  # fmt: skip
    if train is None:
        raise CheckError(f"data.format={cfg_data.format}: the training split has no samples "
                         f"(data.train_path={getattr(cfg_data, 'train_path', None)})")  # fmt: skip
    val = build_loader(cfg_data, "val", batch_size=eval_batch_size, classes=train.class_names, **common)
    num_classes = train.num_classes
    if cfg_data.num_classes:
        if cfg_data.num_classes < num_classes:
            raise CheckError(
                f"data.num_classes={cfg_data.num_classes} but the dataset has {num_classes} classes: leave data.num_classes "
                f"out to take the count from the data, or set it to at least {num_classes}"
            )
        num_classes = cfg_data.num_classes
    return Loaders(train=train.loader, val=val.loader if val is not None else None, num_classes=num_classes,
                   class_names=train.class_names, sizes=sizes)  # fmt: skip


__all__ = ["Loaders", "SplitLoader", "build_loader", "build_loaders"]
