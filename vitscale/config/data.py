"""The ``data`` group of the run config, typed by ``data.format``.

:class:`DataConfig` holds the fields every format has. Each format declares its own class in its
module (``vitscale/data/digits.py``: ``DigitsData``, ``webdataset.py``: ``WebDatasetData``, ...), a
subclass of it that composes the field groups below it reads (``PathFields``, ``ValSplitField``,
``CaptionFields``, ``RemoteFields``, ``StreamFields``) and adds its own fields, and registers it as
``DataFormat.config``. The config loader builds the ``data`` mapping as the class of its ``format``
(:meth:`DataConfig.kind_config`), as it builds each ``evals:`` entry as the class of its ``kind``: a key
that format's class lacks is unknown (the error names the formats that have it). In Python,
:func:`data_config` builds the class of a format: ``data_config(format="webdataset", train_path=...)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from ..errors import ConfigError
from ..registry import FORMATS
from .kinds import unknown_kind_field
from .ranges import MAX_IMAGE_SIDE, Bound, at_least, check_ranges, finite, fraction, image_side, positive

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_PCT_MIN, CROP_PCT_MAX = 0.1, 2.0
"""``data.crop_pct``'s bounds: the evaluation resize (``img_size / crop_pct``) between half the crop and
ten times it (timm's recipes use 0.875 to 1.15); ``1e6`` resized every image to nothing (a traceback at
the final evaluation; ``eval_crop_mode=border`` skipped every image and exited 0)."""
MAX_SEQ_LEN = (MAX_IMAGE_SIDE // 16) ** 2
"""Longest NaFlex sequence a run may ask for: an image of the largest side in patches of 16."""


# Fields that were replaced: the key is refused with a line saying what to write instead.
RETIRED_FIELDS = {
    "randaugment": "data.randaugment (torchvision's RandAugment) is replaced by data.auto_augment with timm's "
    "strings: write data.auto_augment=rand-m9-n2 for 'm9-n2' (DeiT's and VOLO's: rand-m9-mstd0.5-inc1); docs/data.md",
}


@dataclass
class DataConfig:
    """Data, augmentation and loading: the fields of every format (a format's class adds its own)."""

    KIND: ClassVar[str] = "format"
    """The field whose value chooses the class (the config loader's kind mechanism)."""
    RETIRED: ClassVar[dict[str, str]] = RETIRED_FIELDS
    """Keys that were replaced, and what to write instead."""
    RANGES: ClassVar[dict[str, Bound]] = {
        "img_size": (1, MAX_IMAGE_SIDE), "num_classes": (1, 1 << 22), "mean": (0.0, 1.0), "std": (0.0, 1.0),
        "num_workers": (0, 256), "prefetch_factor": (1, 64), "max_image_pixels": (0, 1 << 36),
        "rrc_scale": (0.0, 1.0), "rrc_ratio": (0.0, 100.0), "hflip": (0.0, 1.0), "color_jitter": (0.0, 10.0),
        "random_erasing": (0.0, 1.0), "mixup_alpha": (0.0, 100.0), "cutmix_alpha": (0.0, 100.0),
        "mixup_prob": (0.0, 1.0), "mixup_switch_prob": (0.0, 1.0), "crop_pct": (CROP_PCT_MIN, CROP_PCT_MAX),
        "repeated_aug": (1, 64), "image_sizes": (1, MAX_IMAGE_SIDE), "batch_sizes": (1, 1 << 24),
        "tokens_per_batch": (0, 1 << 34), "size_stages": (0.0, 1.0), "eval_image_size": (1, MAX_IMAGE_SIDE),
        "seq_lens": (1, MAX_SEQ_LEN), "eval_seq_len": (1, MAX_SEQ_LEN),
    }  # fmt: skip
    """The bounds of the number fields (``vitscale.config.ranges``): means and stds of pixels in [0, 1]
    lie in [0, 1]; sizes in pixels up to ``MAX_IMAGE_SIDE``."""

    format: str = "digits"
    """Dataset format, one registered in ``vitscale.data.formats``: ``digits`` (scikit-learn's
    handwritten digits, no files needed), ``digits_aspect`` (the same, stretched to several aspect
    ratios: NaFlex demos), ``imagefolder`` (``<path>/<class>/<image>`` trees), ``images`` (a folder of
    images without classes, any nesting: the tasks that read no labels),
    ``synthetic`` (random images, deterministic labels), ``webdataset`` (tar shards, local or remote),
    ``csv`` (image paths + captions), ``parquet`` (image + label / caption columns); see docs/data.md."""
    img_size: int | None = None
    """Square input size in pixels; None = the model's ``img_h`` x ``img_w``."""
    num_classes: int | None = None
    """Number of classes; None = from the dataset (digits: 10, imagefolder: number of class folders,
    shards / tables: ``classnames.txt`` or the labels, synthetic: 1000)."""
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
    """Resampling for resized crops, eval resizing and the geometric ops of ``auto_augment``:
    ``bilinear`` or ``bicubic``."""
    train_interpolation: Literal["bilinear", "bicubic", "random"] | None = None
    """Training's resampling (the RandomResizedCrop's resize, the geometric ops of ``auto_augment``),
    timm's ``--train-interpolation``: ``random`` draws bilinear or bicubic per image for the crop and
    per op for ``auto_augment``, from the sample's keyed generator (timm's ``random``; the VOLO
    code's default). None = ``interpolation`` (evaluation always uses ``interpolation``)."""
    rrc_scale: tuple[float, float] = (0.08, 1.0)
    """RandomResizedCrop area range, as fractions of the image area."""
    rrc_ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    """RandomResizedCrop aspect-ratio range (width / height)."""
    hflip: float = 0.5
    """Probability of a horizontal flip (0 = never)."""
    auto_augment: str = ""
    """Augmentation policy as timm writes it (``vitscale.data.auto_augment``, docs/data.md):
    ``rand-m9-mstd0.5-inc1`` (RandAugment: magnitude of 10, ``n`` ops, ``p`` each, ``mstd`` magnitude
    noise, ``inc1`` increasing-severity ops, mean-colour fill), ``original`` (AutoAugment's ImageNet
    policy), ``3a`` (DeiT III's 3-Augment), ``ta_wide`` (TrivialAugment); ``""`` = off."""
    color_jitter: tuple[float, ...] = ()
    """Colour jitter: brightness, contrast, saturation[, hue] (one value: the first three), each
    factor drawn from U(1 - x, 1 + x) (hue: U(-h, h)) in a random order; () or 0 = off. Applies without
    ``auto_augment`` or after ``3a`` (DeiT III: 0.3); beside another policy only with
    ``force_color_jitter`` (timm turns it off there), else refused."""
    force_color_jitter: bool = False
    """Apply ``color_jitter`` after a RandAugment / AutoAugment / TrivialAugment policy too (timm's
    ``create_transform(force_color_jitter=True)``)."""
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
    """Eval: resize to ``floor(img_size / crop_pct)`` (as ``eval_crop_mode`` says), then centre-crop
    ``img_size``; above 1 the image is smaller than ``img_size`` and padded with zeros, as timm pads
    (VOLO-D4/D5's 1.15)."""
    eval_crop_mode: Literal["center", "squash", "border"] = "center"
    """Eval resize, timm's ``crop_mode`` (``timm/data/transforms_factory.py``): ``center`` (the shorter
    side to ``img_size / crop_pct``, the aspect ratio kept; with ``crop_pct: 1.0`` and ``bicubic``
    open_clip's evaluation transform), ``squash`` (the whole image to the square, the aspect ratio
    not kept: ``vit_jax``'s fine-tuning evaluation), ``border`` (the longer side, the rest padded with
    the mean colour)."""
    repeated_aug: int = 1
    """Repeated augmentation (DeiT's ``RASampler``, facebookresearch/deit ``samplers.py``): each image
    of an epoch is drawn this many times in a row, the repeats dealt to consecutive ranks, each with
    its own keyed augmentation, the epoch's length kept (so an epoch shows ``1 / repeated_aug`` of
    the images); docs/data.md. 1 = off. Indexed training data only (not ``webdataset_mode=stream`` /
    ``parquet_mode=stream``)."""
    image_sizes: tuple[int, ...] = ()
    """Multi-resolution training (docs/data.md, "Variable resolution"): square image sides in pixels,
    each a multiple of the model's patch, e.g. ``[160, 192, 224, 256]``; every optimizer step trains at
    one of them, drawn from the keyed randomness (``train.seed``, step) or per ``size_schedule``.
    () = one size (``img_size``, else the model's). Needs a model that takes several image sizes."""
    batch_sizes: tuple[int, ...] = ()
    """Images per optimizer step over all ranks, one per entry of ``image_sizes`` (or ``seq_lens``);
    () = from ``tokens_per_batch``, else ``train.batch_size`` at every size. ``train.batch_size`` stays
    the batch the learning rate is scaled for."""
    tokens_per_batch: int = 0
    """Patch-token budget per optimizer step over all ranks: each size's batch is the budget divided
    by its tokens per image (``(side / patch)^2``, or the sequence length), rounded down to a multiple
    of data-parallel ranks x ``train.grad_accum``. 0 = ``batch_sizes``; with ``seq_lens`` and neither
    set: ``train.batch_size`` x the largest sequence length."""
    size_schedule: Literal["random", "progressive"] = "random"
    """Which size a step uses: ``random`` (a keyed draw per step, every size equally likely) or
    ``progressive`` (the sizes in the order given, small to large, each from its stage on: timm's and
    FixRes's train-low-then-high, arXiv 1906.06423)."""
    size_stages: tuple[float, ...] = ()
    """``progressive``: the fraction of the run (0 to 1) at which each size starts, one per size, the
    first 0 and increasing, e.g. ``[0, 0.5, 0.8]``; () = equal shares."""
    eval_image_size: int | None = None
    """Evaluation image side with ``image_sizes``; None = the largest of ``image_sizes``."""
    seq_lens: tuple[int, ...] = ()
    """NaFlex training (a model taking NaFlex patch batches): sequence lengths in patches, e.g.
    ``[128, 256, 576, 784]``; each step draws one (as ``image_sizes``), each image is resized to fit it
    keeping its aspect ratio, patchified and padded with a validity mask (``patches``,
    ``patch_coord``, ``patch_valid``: timm's layout). () = image batches."""
    eval_seq_len: int | None = None
    """NaFlex evaluation sequence length; None = the largest of ``seq_lens``."""
    def __post_init__(self) -> None:
        finite(self, "data")
        for i, s in enumerate(self.std):
            positive(f"data.std[{i}]", s, "images are divided by it: a zero std makes every input infinite")
        lo, hi = self.rrc_scale
        if not 0 < lo <= hi <= 1:
            raise ConfigError(f"data.rrc_scale={list(self.rrc_scale)} must be 0 < low <= high <= 1 (fractions of the image "
                              "area, e.g. 0.08,1.0)")  # fmt: skip
        lo, hi = self.rrc_ratio
        if not 0 < lo <= hi:
            raise ConfigError(f"data.rrc_ratio={list(self.rrc_ratio)} must be 0 < low <= high (width / height, e.g. 0.75,1.333)")
        for key in ("hflip", "random_erasing", "mixup_prob", "mixup_switch_prob"):
            fraction(f"data.{key}", getattr(self, key), "a probability", closed_high=True)
        for key in ("mixup_alpha", "cutmix_alpha"):
            at_least(f"data.{key}", getattr(self, key), 0, "0 = off")
        at_least("data.num_workers", self.num_workers, 0, "loader processes; 0 = load in the main process")
        at_least("data.prefetch_factor", self.prefetch_factor, 1, "batches each worker prepares ahead")
        at_least("data.max_image_pixels", self.max_image_pixels, 0, "0 = no limit")
        if not CROP_PCT_MIN <= self.crop_pct <= CROP_PCT_MAX:  # 1e6 resized every image to nothing
            raise ConfigError(f"data.crop_pct={self.crop_pct} must be in [{CROP_PCT_MIN}, {CROP_PCT_MAX}] (the evaluation "
                              f"resizes to img_size / crop_pct: 1 = resize only, e.g. 0.875, VOLO-D5's 1.15)")  # fmt: skip
        if self.num_classes is not None:
            at_least("data.num_classes", self.num_classes, 1, "None = from the dataset")
        image_side("data.img_size", self.img_size)  # its own message, before the table's
        image_side("data.eval_image_size", self.eval_image_size)
        if self.repeated_aug < 1:  # as vitscale.data.build says it, now as the config loads
            raise ConfigError(f"data.repeated_aug={self.repeated_aug} must be a whole number of at least 1 (times each "
                              "image is drawn per epoch; 1 = off, DeiT: 3)")  # fmt: skip
        check_ranges(self, "data")  # every declared bound (RANGES), past the messages above
        cls = self.kind_config(self.format)
        if type(self) is not cls:
            raise ConfigError(f"data.format={self.format} is configured by {cls.__name__}, not {type(self).__name__} "
                              f"(vitscale.config.data_config(format=...) builds the right one)")  # fmt: skip

    @staticmethod
    def kind_config(name: Any, key: str = "data.format") -> type[DataConfig]:
        """The config class of data format ``name`` (its module imported on first use)."""
        return FORMATS.get(name, key=key).config or DataConfig

    @staticmethod
    def kinds() -> list[tuple[str, type[DataConfig]]]:
        """``(format, its config class)`` of every known format."""
        return [(name, fmt.config or DataConfig) for name, fmt in FORMATS.items()]


def data_config(format: str = "digits", **fields: Any) -> DataConfig:
    """The ``data`` group of ``format`` with ``fields`` set: its format's class (``DigitsData``,
    ``WebDatasetData``, ...); a field that format lacks is a :class:`ConfigError` naming the formats that
    have it."""
    cls = DataConfig.kind_config(format)
    own = {f.name for f in dataclasses.fields(cls)}
    for key in fields:
        if key in RETIRED_FIELDS:
            raise ConfigError(RETIRED_FIELDS[key])
        if key not in own:
            raise ConfigError(unknown_kind_field(DataConfig, cls, "data", key) or f"data.{key} is no field of {cls.__name__}")
    return cls(format=format, **fields)


# ------------------------------------------------------------------- fields shared by some formats
@dataclass
class PathFields:
    train_path: str | None = None
    """Training data: the image folder's root (``imagefolder``, ``images``), the shards (``webdataset``),
    the file (``csv``), the ``.parquet`` files (``parquet``)."""
    val_path: str | None = None
    """Validation data, as ``train_path``; None = no validation data (``imagefolder``: hold out
    ``val_split`` of train). ``images``: a labelled class folder (``<root>/<class>/<image>``) that the
    k-NN and probes read."""


@dataclass
class ValSplitField:
    RANGES: ClassVar[dict[str, Bound]] = {"val_split": (0.0, 1.0)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""
    val_split: float = 0.0
    """Fraction held out for validation when there is no ``val_path`` (imagefolder, by a fixed
    seed-0 stratified split) and the size of synthetic's validation set relative to ``synthetic_size``;
    0 = no validation set."""

    def __post_init__(self) -> None:
        fraction("data.val_split", self.val_split, "0 = no held-out validation")
        super().__post_init__()  # type: ignore[misc]  # composed before DataConfig, whose checks follow


@dataclass
class CaptionFields:
    RANGES: ClassVar[dict[str, Bound]] = {"caption_context_length": (1, 8192)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""
    caption_context_length: int = 77
    """Tokens per caption (open_clip's 77; longer captions are cut, ending in the end-of-text token)."""


@dataclass
class RemoteFields:
    RANGES: ClassVar[dict[str, Bound]] = {
        "remote_retries": (0, 100), "remote_backoff_s": (0.0, 3600.0), "remote_timeout_s": (0.0, 86400.0),
        "remote_deadline_s": (0.0, 7 * 86400.0),
    }  # fmt: skip
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""
    remote_retries: int = 3
    """Remote files (fsspec URLs, ``pipe:`` commands): times a transient error (connection reset,
    timeout, HTTP 5xx / 408 / 429, a failed command) is retried, each after twice the previous wait;
    a file that still fails is skipped, counted and named in the log and summary.json (or, found at
    start-up, stops the run with one line)."""
    remote_backoff_s: float = 1.0
    """Seconds before the first retry (then doubled each time)."""
    remote_timeout_s: float = 60.0
    """HTTP(S), S3 and ``pipe:``: seconds without a byte (connecting or reading) before the attempt
    counts as failed."""
    remote_deadline_s: float = 1800.0
    """Seconds one remote file (a shard, a Parquet file, a ``pipe:`` command's output) may take in
    all, from opening it to its last byte: a server or command that trickles a byte now and then
    (never ``remote_timeout_s`` silent) is cut there and the attempt counts as a timeout (retried,
    then skipped). Start-up reads (the first file, index mode's shards) are bounded the same way."""
    shard_cache: str | None = None
    """Folder of the local copies of remote files read at random (indexed shards, the validation
    split, Parquet over http(s)); reused by later runs. None = ``$VITSCALE_CACHE_DIR/shards``
    (default ``~/.cache/vitscale/shards``)."""


@dataclass
class StreamFields:
    RANGES: ClassVar[dict[str, Bound]] = {"samples_per_epoch": (1, 1 << 40), "shuffle_buffer": (0, 100_000)}
    """A shuffle buffer holds encoded samples (about 100 KB each): 100,000 is about 10 GB a worker."""
    samples_per_epoch: int | None = None
    """Stream mode: samples per epoch (all ranks), which sets the loader length and so
    ``train.epochs``; None = what the data says (shards: number of shards x samples in the first;
    Parquet: its row count)."""
    resampled: bool = False
    """Stream mode: draw shards (row groups) with replacement per (rank, worker), keyed by (seed,
    epoch) (open_clip's ``--dataset-resampled``): every worker always has data, epochs are
    ``samples_per_epoch`` long, and samples may repeat or be missed within an epoch."""
    shuffle_buffer: int = 1000
    """Stream mode: samples held by each worker's shuffle buffer (encoded, before decoding); <= 1 =
    file order."""


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "RETIRED_FIELDS", "CaptionFields", "DataConfig", "PathFields", "RemoteFields",
           "StreamFields", "ValSplitField", "data_config"]
