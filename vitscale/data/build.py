"""``build_loaders``: the one entry point the trainer uses (see docs/data.md)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import CheckError, ConfigError
from . import digits as digits_mod
from .config import FORMATS, DataConfig
from .dataset import KeyedDataset
from .loader import BadFileReporter, ResumableLoader
from .sampler import EvalShardSampler, ShardedBatchSampler
from .sources import SyntheticSource, TensorSource
from .transforms import SampleTransform

SYNTHETIC_DEFAULT_CLASSES = 1000

# Formats added by other modules: name -> fn(cfg, img_size, num_channels, seed) returning
# (train_source, val_source or None, num_classes, class_names); a format registered with
# ``captions=True`` also gets ``tokenize=`` (texts -> token ids, or None: the model family's
# tokenizer). A source has ``__len__`` and ``sample(index, epoch, transform) ->
# vitscale.data.sources.Sample`` (``Sample.extra`` adds batch fields, e.g. caption tokens).
# ``vitscale.data.<format>`` is imported on first use to register it.
_FORMATS: dict = {}


def register_format(name: str, sources_fn, captions: bool = False) -> None:
    """Add ``data.format=<name>`` (see ``_FORMATS``); the keyed sampler / transforms / loader are reused.
    ``captions``: its samples carry captions, and ``sources_fn`` takes ``tokenize=`` to turn them into ids."""
    _FORMATS[name] = (sources_fn, captions)


@dataclass
class Loaders:
    train: ResumableLoader
    """This rank's training batches (resumable; see :class:`ResumableLoader`)."""
    val: ResumableLoader | None
    """This rank's validation shard (whole batches ``rank::world_size`` of the split in order:
    :class:`EvalShardSampler`), or None."""
    num_classes: int
    class_names: list[str]


def _sources(cfg: DataConfig, img_size, num_channels: int, seed: int, tokenize=None):
    """-> (train_source, val_source or None, num_classes, class_names)."""
    fmt = cfg.format
    if fmt == "digits":
        tr = TensorSource(*digits_mod.load_digits_split("train", num_channels))
        va = TensorSource(*digits_mod.load_digits_split("val", num_channels))
        return tr, va, digits_mod.NUM_CLASSES, list(digits_mod.CLASS_NAMES)
    if fmt == "synthetic":
        nc = cfg.num_classes or SYNTHETIC_DEFAULT_CLASSES
        tr = SyntheticSource(cfg.synthetic_size, nc, img_size, num_channels, seed)
        n_val = int(round(cfg.synthetic_size * cfg.val_split))
        # the val set uses another key so its images differ from the training images
        va = SyntheticSource(n_val, nc, img_size, num_channels, seed + 1_000_003) if n_val > 0 else None
        return tr, va, nc, [str(i) for i in range(nc)]
    if fmt == "imagefolder":
        from .imagefolder import imagefolder_sources

        return imagefolder_sources(cfg)
    check_format(fmt)
    fn, captions = _FORMATS[fmt]
    return fn(cfg, img_size, num_channels, seed, **({"tokenize": tokenize} if captions else {}))


def check_format(fmt: str) -> None:
    """Raise :class:`ConfigError` (exit code 2) unless ``data.format=fmt`` is a format: built in,
    registered, or registered by importing ``vitscale.data.<fmt>``. The config loader calls it, so an
    unknown format fails before anything runs."""
    if fmt in ("digits", "synthetic", "imagefolder"):
        return
    if fmt not in _FORMATS and isinstance(fmt, str) and fmt.isidentifier():
        try:
            importlib.import_module(f"vitscale.data.{fmt}")
        except ModuleNotFoundError as e:
            if e.name != f"vitscale.data.{fmt}":
                raise
    if fmt not in _FORMATS:
        known = sorted(set(FORMATS) | set(_FORMATS))
        raise ConfigError(f"unknown data.format {fmt!r}; choose one of {', '.join(known)}")


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
    tokenize: Callable[[list[str]], torch.Tensor] | None = None,
) -> Loaders:
    """Build this rank's train and val loaders.

    ``img_size`` is the model's (H, W) unless ``cfg_data.img_size`` overrides it. Batches are dicts
    ``{"image": float (B, C, H, W) normalised, "label": long (B,), "index": long (B,), "skipped": int,
    "crop": float (B, 4), "flip": bool (B,)}``. With ``device``, batches are moved there and
    normalised there (uint8 crosses the host->device copy). ``train_augment=False`` reads the train
    split like val: in order, unaugmented, ``micro_batch_size`` images a batch (``label-tokens``,
    probes; a streaming source: in stream order). ``tokenize``: texts -> token ids ``(N, L)``, the
    model family's tokenizer (``FamilySpec.create_tokenizer``, handed over by the run assembly):
    formats with captions put the ids in ``batch["text"]``; None = no caption tokens.
    """
    if cfg_data.img_size:
        img_size = (int(cfg_data.img_size), int(cfg_data.img_size))
    img_size = (int(img_size[0]), int(img_size[1]))
    train_src, val_src, num_classes, class_names = _sources(cfg_data, img_size, num_channels, seed, tokenize)
    if cfg_data.num_classes and cfg_data.format != "synthetic":
        if cfg_data.num_classes < num_classes:
            raise CheckError(
                f"data.num_classes={cfg_data.num_classes} but the dataset has {num_classes} classes: leave data.num_classes "
                f"out to take the count from the data, or set it to at least {num_classes}"
            )
        num_classes = cfg_data.num_classes
    reporter = BadFileReporter()  # shared by train and val: one warning per bad file per run
    common = dict(
        mean=cfg_data.mean, std=cfg_data.std, device=device, reporter=reporter,
        num_workers=cfg_data.num_workers, pin_memory=cfg_data.pin_memory,
        persistent_workers=cfg_data.persistent_workers, prefetch_factor=cfg_data.prefetch_factor,
    )
    train_tf = SampleTransform(cfg_data, img_size, num_channels, seed, train=train_augment)
    if hasattr(train_src, "build_loader"):  # streaming sources build their own loader (in stream order)
        train = train_src.build_loader(train_tf, micro_batch_size=micro_batch_size, rank=rank,
                                       world_size=world_size, drop_last=drop_last, **common)
    elif not train_augment:
        train_sampler = EvalShardSampler(len(train_src), micro_batch_size, rank=rank, world_size=world_size)
        train = ResumableLoader(KeyedDataset(train_src, train_tf), train_sampler, **common)
    else:
        train_sampler = ShardedBatchSampler(len(train_src), micro_batch_size, seed=seed, rank=rank,
                                            world_size=world_size, shuffle=True, drop_last=drop_last)
        train = ResumableLoader(KeyedDataset(train_src, train_tf), train_sampler, **common,
                                across_epochs=cfg_data.prefetch_across_epochs)
    val = None
    if val_src is not None and len(val_src) > 0:
        val_ds = KeyedDataset(val_src, SampleTransform(cfg_data, img_size, num_channels, seed, train=False))
        val_sampler = EvalShardSampler(len(val_src), eval_batch_size, rank=rank, world_size=world_size)
        val = ResumableLoader(val_ds, val_sampler, **common)
    return Loaders(train=train, val=val, num_classes=num_classes, class_names=class_names)
