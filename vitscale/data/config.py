"""``DataConfig``: the ``data`` group of the run config (imported by ``vitscale.config.schema``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

FORMATS = ("digits", "imagefolder", "synthetic", "webdataset", "csv")


@dataclass
class DataConfig:
    format: str = "digits"
    """Dataset format: ``digits`` (scikit-learn's handwritten digits, no files needed), ``imagefolder``
    (``<path>/<class>/<image>`` trees) or ``synthetic`` (random images, deterministic labels).
    ``webdataset`` / ``csv`` are added by the CLIP data modules."""
    train_path: str | None = None
    """Root of the training image folder (``imagefolder``; shards for ``webdataset``)."""
    val_path: str | None = None
    """Root of the validation image folder; None = hold out ``val_split`` of train (or no validation)."""
    img_size: int | None = None
    """Square input size in pixels; None = the model's ``img_h`` x ``img_w``."""
    num_classes: int | None = None
    """Number of classes; None = from the dataset (digits: 10, imagefolder: number of class folders,
    synthetic: 1000)."""
    mean: tuple[float, ...] = IMAGENET_MEAN
    """Per-channel mean subtracted from images scaled to [0, 1] (applied per batch, on the device)."""
    std: tuple[float, ...] = IMAGENET_STD
    """Per-channel standard deviation images are divided by after subtracting ``mean``."""
    num_workers: int = 2
    """DataLoader worker processes per rank (0 = load in the main process)."""
    pin_memory: bool = True
    """Pin host batches for asynchronous copies (only when CUDA is available)."""
    persistent_workers: bool = True
    """Keep worker processes alive across epochs (only when ``num_workers > 0``)."""
    prefetch_factor: int = 2
    """Batches each worker prepares ahead (only when ``num_workers > 0``)."""
    prefetch_across_epochs: bool = True
    """Training loader: one DataLoader iterator runs on through the epochs, so the workers load the
    next epoch's first batches while the last ones of the current epoch are consumed (no stall at
    epoch boundaries); batches and resume positions are the same either way. False: a new iterator
    per epoch (the workers idle at every boundary until the next epoch's iteration starts)."""
    max_image_pixels: int = 89_478_485
    """Largest image (width x height, read from the file's header before decoding) that is decoded;
    a larger file is skipped and counted like an undecodable one (a 12000x12000 PNG would take 432
    MB to decode for a 224-px sample). The default is Pillow's own warning threshold
    (``PIL.Image.MAX_IMAGE_PIXELS``); 0 = no limit."""
    fast_decode: bool = True
    """JPEG fast path: choose the RandomResizedCrop box first, then decode at the smallest DCT scale
    (1/2, 1/4, 1/8; PIL ``Image.draft``) that still covers the output resolution for that box."""
    interpolation: Literal["bilinear", "bicubic"] = "bilinear"
    """Resampling for resized crops and eval resizing: ``bilinear`` or ``bicubic``."""
    rrc_scale: tuple[float, float] = (0.08, 1.0)
    """RandomResizedCrop area range, as fractions of the image area."""
    rrc_ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    """RandomResizedCrop aspect-ratio range (width / height)."""
    hflip: float = 0.5
    """Probability of a horizontal flip (0 = never)."""
    randaugment: str = ""
    """RandAugment policy, e.g. ``"m9-n2"`` (magnitude 9, 2 ops; a ``rand-`` prefix is accepted);
    ``""`` = off."""
    color_jitter: float = 0.0
    """Brightness / contrast / saturation jitter strength (0 = off; ignored when RandAugment is on)."""
    random_erasing: float = 0.0
    """Probability of erasing one random rectangle per image with per-pixel normal noise
    (after normalisation, as timm's ``mode='pixel'``); 0 = off."""
    mixup_alpha: float = 0.0
    """Mixup Beta(alpha, alpha) parameter (0 = off); applied by the trainer per batch."""
    cutmix_alpha: float = 0.0
    """CutMix Beta(alpha, alpha) parameter (0 = off); applied by the trainer per batch."""
    mixup_prob: float = 1.0
    """Probability of applying mixup or cutmix to a batch (when either alpha > 0)."""
    mixup_switch_prob: float = 0.5
    """Probability of cutmix instead of mixup when both are enabled."""
    crop_pct: float = 0.875
    """Eval: resize to ``img_size / crop_pct`` then center-crop ``img_size`` (1.0 = resize only)."""
    synthetic_size: int = 1024
    """Number of training images of the ``synthetic`` format."""
    val_split: float = 0.0
    """Fraction held out for validation when there is no ``val_path`` (imagefolder, by a fixed
    seed-0 stratified split) and the size of synthetic's validation set relative to ``synthetic_size``;
    0 = no validation set. Digits always use their fixed 1,497 / 300 split."""
    # --- image-text pairs (CLIP; read by vitscale/data/{webdataset,csv}.py) ---
    csv_img_key: str = "filepath"
    """``csv`` format: the column of image paths (relative paths are relative to the CSV file's folder)."""
    csv_caption_key: str = "title"
    """``csv`` format: the column of captions."""
    csv_label_key: str | None = None
    """``csv`` format: an optional column of integer class labels (for zero-shot evaluation)."""
    csv_separator: str | None = None
    """``csv`` format: the field separator; None = tab for ``.tsv`` files, comma otherwise."""
    caption_context_length: int = 77
    """``webdataset`` / ``csv``: tokens per caption (open_clip's 77; longer captions are cut, ending in
    the end-of-text token)."""
    webdataset_mode: str = "index"
    """``webdataset``: ``index`` (read every shard's tar headers at start-up, then seek samples: exact
    keyed epochs, same batches for any rank / worker count; up to millions of samples) or ``stream``
    (``vitscale/data/webdataset_stream.py``: shards read sequentially through the ``webdataset`` package,
    split by rank then DataLoader worker or resampled, with a shuffle buffer; nothing read at start-up,
    for LAION-400M-scale data). See docs/clip.md."""
    samples_per_epoch: int | None = None
    """``webdataset`` stream mode: samples per epoch (all ranks), which sets the loader length and so
    ``train.epochs``; None = number of shards x samples in the first shard (reads one shard)."""
    resampled: bool = False
    """``webdataset`` stream mode: draw shards with replacement per (rank, worker), keyed by (seed,
    epoch) (open_clip's ``--dataset-resampled``): every worker always has data, epochs are
    ``samples_per_epoch`` long, and samples may repeat or be missed within an epoch."""
    webdataset_shuffle_buffer: int = 1000
    """``webdataset`` stream mode: samples held by each worker's shuffle buffer (raw bytes, before
    decoding); <= 1 = shard order."""


# Fields that only some formats read: a run's config.yaml leaves them out for the other formats
# (vitscale.config.run_config_dict), so it holds what the run used.
FORMAT_FIELDS: dict[str, tuple[str, ...]] = {
    "synthetic_size": ("synthetic",),
    "csv_img_key": ("csv",),
    "csv_caption_key": ("csv",),
    "csv_label_key": ("csv",),
    "csv_separator": ("csv",),
    "caption_context_length": ("csv", "webdataset"),
    "webdataset_mode": ("webdataset",),
    "samples_per_epoch": ("webdataset",),
    "resampled": ("webdataset",),
    "webdataset_shuffle_buffer": ("webdataset",),
}
