"""Config group ``dino`` of DINOv2-style self-distillation (``train.task=dino``, :mod:`vitscale.tasks.dino`).

A field of the DINO task's run config (:class:`DinoPretrainingConfig`, ``DinoTask.config``). The
defaults are DINOv2's (Oquab et al. 2023, arXiv 2304.07193) as its reference code sets them:
facebookresearch/dinov2 at b8931f7, ``dinov2/configs/ssl_default_config.yaml`` (line numbers below);
a small recipe sets its own (``configs/digits_dino.yaml``). Durations are in epochs, as the reference's,
converted to optimizer steps with the run's epoch length.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

from vitscale.config.ranges import COUNT_MAX
from vitscale.config.schema import Config
from vitscale.data.views import MAX_CROP_SIDE, MAX_CROPS, MAX_LIKE_SIDE

CENTERINGS = ("softmax", "sinkhorn_knopp")
LAST_LAYERS = ("weight_norm", "normalized", "linear")
"""The forms of the heads' last layer, the prototypes (:mod:`vitscale.tasks.dino_head`)."""
GRAM_TOKENS = ("all", "masked", "unmasked")
GRAM_RESIZES = ("bicubic", "bilinear")
"""The resizes of the Gram teacher's patch features to the student's grid: ``F.interpolate``'s modes that
take DINOv3's ``align_corners=False`` and ``antialias`` (``ssl_meta_arch.py`` lines 500-506)."""
MAX_PROTOTYPES = 262144
"""Most prototypes of a head (DINOv3's ViT-7B: 262,144): past it the heads' last layers alone outgrow a step."""


def _pair(key: str, v, lo: float, hi: float, closed_lo: bool = False) -> tuple[float, float]:
    if len(v) != 2 or not (v[0] <= v[1]) or not ((lo <= v[0]) if closed_lo else (lo < v[0])) or v[1] > hi:
        raise ValueError(f"{key}={list(v)} must be [min, max] with {lo} {'<=' if closed_lo else '<'} min <= max <= {hi}")
    return float(v[0]), float(v[1])


def check_weight_schedule(key: str, v) -> None:
    """``[start, peak, end, warmup_steps(, cosine_steps)]``: weights finite and >= 0, whole step counts >= 0."""
    if not v:
        return
    if len(v) not in (4, 5):
        raise ValueError(f"{key}={list(v)} must be [start, peak, end, warmup_steps] or [start, peak, end, warmup_steps, "
                         "cosine_steps] (DINOv3's {start, peak, end, warmup_epochs, cosine_epochs}, epochs as steps), or [] for none")  # fmt: skip
    if not all(0 <= w < float("inf") for w in v[:3]):
        raise ValueError(f"{key}={list(v)}: the weights (start, peak, end) must be finite numbers >= 0")
    if not all(0 <= n <= COUNT_MAX and float(n).is_integer() for n in v[3:]):
        raise ValueError(f"{key}={list(v)}: warmup_steps and cosine_steps must be whole optimizer steps >= 0")


@dataclass
class DinoConfig:
    """DINOv2: the crops, the heads, the teacher and its targets, the losses and their weights."""

    RANGES: ClassVar[dict[str, tuple]] = {
        "global_crops_scale": (0.0, 1.0), "local_crops_scale": (0.0, 1.0), "global_crops_size": (1, MAX_CROP_SIDE),
        "local_crops_size": (1, MAX_CROP_SIDE), "local_crops_number": (0, MAX_CROPS), "hflip": (0.0, 1.0),
        "global_crops_sizes": (1, MAX_CROP_SIDE), "local_crops_sizes": (1, MAX_CROP_SIDE),
        "global_local_crop_pairs_ratios": (0.0, 1.0),
        "color_jitter": (0.0, 1.0), "gaussian_blur": (0.0, 1.0), "solarization": (0.0, 1.0),
        "head_n_prototypes": (2, MAX_PROTOTYPES), "head_bottleneck_dim": (1, 1 << 16), "head_nlayers": (1, 64),
        "head_hidden_dim": (1, 1 << 17), "loss_weight": (0.0, 1e6), "koleo_loss_weight": (0.0, 1e6),
        "ibot_loss_weight": (0.0, 1e6), "ibot_mask_sample_probability": (0.0, 1.0), "ibot_mask_ratio_min_max": (0.0, 1.0),
        "center_momentum": (0.0, 1.0), "student_temp": (1e-6, 1e3), "teacher_temp": (1e-6, 1e3),
        "warmup_teacher_temp": (1e-6, 1e3), "warmup_teacher_temp_epochs": (0.0, 1e6), "momentum_teacher": (0.0, 1.0),
        "final_momentum_teacher": (0.0, 1.0), "weight_decay_end": (0.0, 1e3), "freeze_last_layer_epochs": (0.0, 1e6),
        "patch_embed_lr_mult": (0.0, 1e3), "freeze_backbone_steps": (0, COUNT_MAX), "gram_loss_weight": (0.0, 1e6),
        "gram_it_load_ema_teacher": (0, COUNT_MAX), "gram_update_frequency": (1, COUNT_MAX),
        "gram_it_first_update": (0, COUNT_MAX), "gram_max_updates": (0, COUNT_MAX),
        "gram_teacher_crops_size": (1, MAX_LIKE_SIDE), "gram_teacher_crops_sizes": (1, MAX_LIKE_SIDE),
        "local_loss_weight_schedule": (0.0, COUNT_MAX), "gram_loss_weight_schedule": (0.0, COUNT_MAX),
    }  # fmt: skip
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    # ---- multi-crop (dinov2/data/augmentations.py; ssl_default_config.yaml lines 107-116)
    global_crops_scale: list[float] = field(default_factory=lambda: [0.32, 1.0])
    """Area range of the two global crops, a fraction of the image (``crops.global_crops_scale`` ssl_default_config.yaml line 108)."""
    global_crops_size: int = 224
    """Side of the global crops in pixels (ssl_default_config.yaml line 115); a multiple of the patch, 1 to 1024, at most
    the loader's image (``data.img_size``, else the model's)."""
    local_crops_number: int = 8
    """Local crops per image, seen by the student only (ssl_default_config.yaml line 111); 0 = none, at most 64."""
    local_crops_scale: list[float] = field(default_factory=lambda: [0.05, 0.32])
    """Area range of the local crops (ssl_default_config.yaml line 112)."""
    local_crops_size: int = 96
    """Side of the local crops in pixels (ssl_default_config.yaml line 116); a multiple of the patch, at least one patch,
    at most ``global_crops_size``."""
    # ---- DINOv3's mixture of crop sizes (facebookresearch/dinov3 at 6876159, ``crops`` group of
    # dinov3/configs/train/dinov3_vit7b16_high_res_adapt.yaml lines 162-179; dinov3/train/train.py
    # ``build_multi_resolution_data_loader_from_cfg`` lines 334-377)
    global_crops_sizes: list[int] = field(default_factory=list)
    """The global crops' side of each pair of a mixture (``crops.global_crops_size`` as a list, lines
    162-167: [512, 768, 768, 768, 768] in the high-resolution stage); each a multiple of the patch.
    Empty: one pair, (``global_crops_size``, ``local_crops_size``), at every step. With a mixture those
    two keys are left at their defaults or set to the first pair."""
    local_crops_sizes: list[int] = field(default_factory=list)
    """The local crops' side of each pair (``crops.local_crops_size`` as a list, lines 168-173: [112,
    112, 168, 224, 336]); at most the pair's global side."""
    global_local_crop_pairs_ratios: list[float] = field(default_factory=list)
    """The share of optimizer steps that cut each pair (``crops.global_local_crop_pairs_ratios``, lines
    174-179: [0.3, 0.3, 0.3, 0.05, 0.05]); each in (0, 1], summing to 1. Each step draws one pair by
    these weights, keyed by (``train.seed``, epoch, step): the same on every rank, micro-batch and
    resume (DINOv3 draws one of its per-pair loaders per batch, the same on every rank, from an
    unkeyed generator seeded once: ``dinov3/data/meta_loaders.py`` lines 46-66)."""
    hflip: float = 0.5
    """Probability of a horizontal flip of each crop (``RandomHorizontalFlip(p=0.5)``, dinov2/data/augmentations.py
    lines 44-60); 0 where a mirrored image is another thing (digits, text)."""
    color_jitter: float = 0.8
    """Probability of the colour jitter of each crop (``RandomApply([ColorJitter(...)], p=0.8)``, augmentations.py lines 63-71)."""
    gaussian_blur: list[float] = field(default_factory=lambda: [1.0, 0.1, 0.5])
    """Probability of the Gaussian blur of the first global crop, the second, and each local crop
    (augmentations.py lines 73-82; the paper's and DINO's probabilities, see :mod:`vitscale.tasks.dino_crops`)."""
    solarization: float = 0.2
    """Probability of solarising the second global crop (``RandomSolarize(threshold=128, p=0.2)``, augmentations.py lines 73-82)."""

    # ---- the DINO head (dinov2/layers/dino_head.py; lines 43-49)
    head_n_prototypes: int = 65536
    """Prototypes: the width of the weight-normalised last layer (``dino.head_n_prototypes`` ssl_default_config.yaml line 45);
    2 to 262,144."""
    head_bottleneck_dim: int = 256
    """Width of the L2-normalised bottleneck before the prototypes (ssl_default_config.yaml line 46)."""
    head_nlayers: int = 3
    """Linear layers of the MLP before the bottleneck (ssl_default_config.yaml line 47)."""
    head_hidden_dim: int = 2048
    """Hidden width of the MLP (ssl_default_config.yaml line 48)."""
    head_last_layer: str = "weight_norm"
    """The prototypes' layer (:mod:`vitscale.tasks.dino_head`): ``weight_norm`` (``g * V / ||V||``, ``g``
    trained from 1: DINOv2's ``dinov2/layers/dino_head.py`` lines 27-28, DINO v1's ``--norm_last_layer
    false``), ``normalized`` (``V / ||V||``, ``g`` held at 1: DINO v1's default ``--norm_last_layer true``,
    facebookresearch/dino ``main_dino.py`` lines 57-60, ``vision_transformer.py`` lines 276-279) or
    ``linear`` (a plain linear layer: DINOv3's ``dinov3/layers/dino_head.py`` line 32)."""
    head_use_bn: bool = False
    """A batch norm after each hidden linear layer of the heads' MLP (DINO v1's ``--use_bn_in_head``,
    ``main_dino.py`` line 64, ``vision_transformer.py`` lines 265-271): the student's head normalises over
    every crop's class token of the micro-batch in one pass, the teacher's over the global crops', by the
    batch's statistics (DINO v1's teacher is never put in eval mode). One process only (DINO v1
    synchronises them over the GPUs, ``SyncBatchNorm``, ``main_dino.py`` lines 196-201), and without iBOT."""
    loss_weight: float = 1.0
    """Weight of the DINO class-token loss (ssl_default_config.yaml line 44)."""
    koleo_loss_weight: float = 0.1
    """Weight of the KoLeo regulariser on the student's class tokens (ssl_default_config.yaml line 49); 0 = off."""

    # ---- iBOT (ssl_default_config.yaml lines 50-60)
    ibot_loss_weight: float = 1.0
    """Weight of the iBOT masked-patch loss (``ibot.loss_weight`` ssl_default_config.yaml line 51); 0 = off (no masking)."""
    ibot_mask_sample_probability: float = 0.5
    """Fraction of the global crops that are masked (ssl_default_config.yaml line 52)."""
    ibot_mask_ratio_min_max: list[float] = field(default_factory=lambda: [0.1, 0.5])
    """Range of the fraction of a masked crop's patches that are masked (ssl_default_config.yaml line 53); within (0, 1)."""
    ibot_separate_head: bool = False
    """A head of its own for the patch tokens (ssl_default_config.yaml line 56); False: the DINO head is shared, as DINOv2's
    default. The separate head has the DINO head's sizes."""

    # ---- teacher and targets (ssl_default_config.yaml lines 70, 86-91; dinov2/loss/dino_clstoken_loss.py)
    centering: str = "softmax"
    """``softmax`` (a running centre subtracted before the teacher's softmax, momentum
    ``center_momentum``) or ``sinkhorn_knopp`` (3 Sinkhorn-Knopp iterations, sums over the data-parallel
    ranks) — ``train.centering`` ssl_default_config.yaml line 70 (the reference's ``centering`` is ``softmax`` here)."""
    center_momentum: float = 0.9
    """Momentum of the running centre (``DINOLoss(center_momentum=0.9)``, dino_clstoken_loss.py line 17)."""
    student_temp: float = 0.1
    """Temperature of the student's softmax (dino_clstoken_loss.py line 16)."""
    teacher_temp: float = 0.07
    """Teacher temperature after its warm-up (ssl_default_config.yaml line 90)."""
    warmup_teacher_temp: float = 0.04
    """Teacher temperature at the first step, rising linearly to ``teacher_temp`` (ssl_default_config.yaml line 89)."""
    warmup_teacher_temp_epochs: float = 30
    """Length of that warm-up in epochs (ssl_default_config.yaml line 91)."""
    momentum_teacher: float = 0.992
    """EMA momentum of the teacher at the first step, rising to ``final_momentum_teacher`` along a cosine
    over the run (ssl_default_config.yaml lines 87-88; dinov2/train/train.py lines 79-83)."""
    final_momentum_teacher: float = 1.0
    """EMA momentum at the end of the run (ssl_default_config.yaml line 88)."""
    weight_decay_end: float | None = None
    """The weight decay at the end of the run, reached along a cosine from the run's ``optim.weight_decay``
    (``optim.weight_decay_end`` ssl_default_config.yaml line 95: 0.04 -> 0.4; dinov2/train/train.py
    ``build_schedulers`` lines 74-78, ``apply_optim_scheduler``); the groups without decay
    (norms, biases, tokens) keep none. None: ``optim.weight_decay`` throughout."""
    freeze_last_layer_epochs: float = 1
    """Epochs during which the heads' last layers (the prototypes) get no gradient (``optim.
    freeze_last_layer_epochs`` ssl_default_config.yaml line 101; dinov2/train/train.py lines 98-100)."""

    # ---- continued pretraining and the backbone's learning rate
    patch_embed_lr_mult: float = 0.2
    """Learning-rate multiplier of the backbone's patch embedding (``optim.patch_embed_lr_mult``
    ssl_default_config.yaml line 103; applied on top of ``optim.layer_decay``, as
    ``dinov2/utils/param_groups.py`` lines 83-84 do); 1 = the backbone's rate."""
    freeze_backbone_steps: int = 0
    """Optimizer updates during which the student's backbone gets learning rate 0 and only the heads
    train: the head warm-up of a run continued from pretrained weights (``checkpoint.init_from``;
    LightlyTrain's ``student_freeze_backbone_epochs``, docs.lightly.ai "DINOv2" method page; DINOv3's
    two-stage freeze). 0 = none. The run's own ``schedule.*`` goes on underneath: a warm-up longer than
    the freeze ramps the backbone's rate up after it."""

    student_from_teacher: bool = False
    """A stage started from the previous stage's teacher (``checkpoint.init_parts`` keeping ``teacher``):
    the student's backbone and heads start as the kept teacher's, instead of the previous stage's
    student (``checkpoint.init_from``'s backbone, ``student`` of ``init_parts``) — DINOv3's stages
    (``student.resume_from_teacher_chkpt``: the student loads the previous teacher's backbone and
    heads, then the EMA teacher copies the student, ``dinov3/train/ssl_meta_arch.py`` lines 328-337)."""

    evaluate_teacher: bool = True
    """Run the run's evaluations (``knn``, ``linear_probe``, ...) on the EMA teacher's backbone too, logged
    beside the student's as ``<eval>_<key>_teacher`` (DINOv2 and DINOv3 evaluate the teacher)."""

    # ---- DINOv3's Gram anchoring (arXiv 2508.10104 section 4; facebookresearch/dinov3 at 6876159,
    # ``gram`` group of dinov3/configs/ssl_default_config.yaml lines 45-63; :mod:`vitscale.tasks.gram`)
    gram_loss_weight: float = 0.0
    """Weight of the Gram loss on the student's patch features of the global crops (``gram.loss_weight``,
    line 48; ``gram.use_loss`` line 46 is ``gram_loss_weight > 0``); 0 = off (DINOv2), 1.0 in DINOv3's
    Gram-anchoring stage (``dinov3_vit7b16_gram_anchor.yaml`` line 49)."""
    gram_ema_teacher: bool = False
    """The EMA teacher itself is the Gram teacher (``gram.ema_teacher`` line 49); False: a frozen copy
    of it, loaded and refreshed on the schedule below."""
    gram_it_load_ema_teacher: int = 0
    """The optimizer update after which the EMA teacher is first copied into the Gram teacher
    (``gram.it_load_ema_teacher`` line 51: "before iteration N"); 0 = before the first step (the
    teacher's starting weights, e.g. ``checkpoint.init_from``'s)."""
    gram_rep_update: bool = True
    """Refresh the Gram teacher from the EMA teacher every ``gram_update_frequency`` updates
    (``gram.rep_update`` line 52)."""
    gram_update_frequency: int = 50000
    """Updates between refreshes (``gram.update_frequency`` line 53; 10,000 in the 7B Gram-anchoring stage)."""
    gram_it_first_update: int = 0
    """The first update after which the repeated refreshes start (``gram.it_first_update`` line 54)."""
    gram_max_updates: int | None = None
    """At most this many repeated refreshes (``gram.max_updates`` line 55; 3 in the 7B stage); None = no limit."""
    gram_normalized: bool = True
    """L2-normalise each patch feature before the Gram matrices (``gram.normalized`` line 56)."""
    gram_img_level: bool = False
    """One Gram matrix per crop (True: ``gram.img_level`` line 57, True in the 7B stage) or one over all
    patches of the rank's batch (False, the default config's)."""
    gram_remove_neg: bool = False
    """Negative similarities set to 0 on both sides (``gram.remove_neg`` line 58)."""
    gram_remove_only_teacher_neg: bool = False
    """The teacher's negative similarities set to 0 (``gram.remove_only_teacher_neg`` line 59)."""
    gram_tokens_used: str = "all"
    """Which of the global crops' patches enter the loss: ``all``, ``masked`` or ``unmasked`` (by the iBOT
    masks; ``gram.tokens_used`` line 60; the last two need ``gram_img_level: false``)."""

    gram_teacher_crops_size: int | None = None
    """The side of the Gram teacher's own crops (``crops.gram_teacher_crops_size``, default 159: null;
    512 in ``dinov3_vit7b16_gram_anchor.yaml`` line 165, against global crops of 256): each global crop's
    box and flip cut again at this side (``dinov3/data/augmentations.py`` lines 66-108, 193-201), read by
    the Gram teacher, whose patch features are then resized to the student's grid
    (``gram_global_teacher_resize_method``). A multiple of the patch, at most 2048. None: the Gram teacher
    reads the student's global crops themselves (DINOv3 refuses a Gram teacher without crops of its own,
    ``dinov3/train/ssl_meta_arch.py`` lines 248-249; its crops at the global side with distortions are
    those crops). Not with ``gram_ema_teacher`` (lines 250-251)."""
    gram_teacher_crops_sizes: list[int] = field(default_factory=list)
    """With a mixture of crop sizes, the Gram teacher's side of each pair (``crops.gram_teacher_crops_size``
    as a list, ``dinov3_vit7b16_high_res_adapt.yaml`` lines 180-185: [768, 1152, 1152, 1152, 1152]; its
    lengths asserted equal to the pairs', ``dinov3/train/train.py`` line 356). Empty: as
    ``gram_teacher_crops_size`` at every pair (None: the global crops)."""
    gram_teacher_no_distortions: bool = False
    """The Gram teacher's crops undistorted: only the box and the flip of their global crop, no colour
    jitter, greyscale, blur or solarisation (``crops.gram_teacher_no_distortions``, default 163: false;
    true in both 7B stages, ``dinov3_vit7b16_gram_anchor.yaml`` line 169, ``high_res_adapt`` line 189;
    ``augmentations.py`` lines 89-96, 195-197). False: the global crop's own distortions, both crops
    distorted once at the larger side and resized from it (lines 98-103, 174-176, 198-200)."""
    gram_global_teacher_resize_method: str = "bicubic"
    """How the Gram teacher's patch features, on the grid of its larger crops, are resized to the
    student's (``gram.global_teacher_resize_method``, default line 61; ``ssl_meta_arch.py`` lines 493-510:
    ``F.interpolate`` of the ``(D, N, N)`` feature maps, ``align_corners=False``): ``bicubic`` or
    ``bilinear``."""
    gram_global_teacher_resize_antialias: bool = False
    """Antialias that resize (``gram.global_teacher_resize_antialias``, default line 62: false)."""
    local_loss_weight_schedule: list[float] = field(default_factory=list)
    """A weight of the DINO loss's local-crop terms by optimizer update, ``[start, peak, end, warmup_steps]``
    or ``[start, peak, end, warmup_steps, cosine_steps]`` (``dino.reweight_dino_local_loss`` and
    ``dino.local_loss_weight_schedule`` {start, peak, end, warmup_epochs, cosine_epochs}, default lines
    25-30; DINOv3's epochs are ``OFFICIAL_EPOCH_LENGTH`` iterations, given here as steps): linear from
    ``start`` to ``peak`` over the warm-up, a cosine from ``peak`` to ``end`` over ``cosine_steps`` (the
    rest of the run when not given), then ``end`` (``dinov3/train/cosine_lr_scheduler.py``
    ``linear_warmup_cosine_decay`` lines 54-85, applied in ``ssl_meta_arch.py`` lines 149-163, 617-624: the
    local terms' share of the loss times the weight; 0.5 throughout in the high-resolution stage,
    ``high_res_adapt`` lines 25-30; 1 to 0.5 in the Gram-anchoring stage). Empty: weight 1 (default 25:
    ``reweight_dino_local_loss`` false)."""
    gram_loss_weight_schedule: list[float] = field(default_factory=list)
    """The Gram loss's weight by optimizer update, in place of ``gram_loss_weight`` (which still turns the
    loss on), as ``local_loss_weight_schedule`` (``gram.loss_weight_schedule``, default line 63: null;
    ``ssl_meta_arch.py`` lines 187-203, 659-665; 1.5 throughout in ``high_res_adapt`` lines 63-68, 0 for
    1,000 epochs then a one-epoch cosine to 2.0 in ``gram_anchor`` lines 64-69). Empty: ``gram_loss_weight``."""

    def __post_init__(self):
        self.global_crops_scale = list(_pair("global_crops_scale", self.global_crops_scale, 0.0, 1.0))
        self.local_crops_scale = list(_pair("local_crops_scale", self.local_crops_scale, 0.0, 1.0))
        lo, hi = self.ibot_mask_ratio_min_max if len(self.ibot_mask_ratio_min_max) == 2 else (-1, -1)
        if not (0.0 < lo <= hi < 1.0):
            raise ValueError(f"ibot_mask_ratio_min_max={list(self.ibot_mask_ratio_min_max)} must be [min, max] within "
                             "(0, 1): the fraction of a masked crop's patches that are masked (DINOv2: [0.1, 0.5])")  # fmt: skip
        if len(self.gaussian_blur) != 3:
            raise ValueError(f"gaussian_blur={list(self.gaussian_blur)} must be 3 probabilities: the first global crop, "
                             "the second, each local crop (DINOv2: [1.0, 0.1, 0.5])")  # fmt: skip
        self.gaussian_blur = [float(p) for p in self.gaussian_blur]
        for key, ps in (("hflip", [self.hflip]), ("color_jitter", [self.color_jitter]),
                        ("solarization", [self.solarization]), ("gaussian_blur", self.gaussian_blur)):  # fmt: skip
            if not all(0.0 <= p <= 1.0 for p in ps):
                raise ValueError(f"{key}={getattr(self, key)} must be probabilities within [0, 1]")
        if not 0.0 <= self.ibot_mask_sample_probability <= 1.0:
            raise ValueError(f"ibot_mask_sample_probability={self.ibot_mask_sample_probability} must lie in [0, 1]")
        if self.head_last_layer not in LAST_LAYERS:
            raise ValueError(f"head_last_layer={self.head_last_layer!r}: choose one of {', '.join(LAST_LAYERS)} "
                             "(DINOv2: weight_norm, DINO v1: normalized, DINOv3: linear)")  # fmt: skip
        if self.head_use_bn and self.ibot_loss_weight > 0:
            raise ValueError("head_use_bn=true with iBOT (ibot_loss_weight > 0): a batch-normalised head (DINO v1's) "
                             "would normalise the masked patches by a batch of as few as one row; set "
                             "ibot_loss_weight=0, as DINO v1 has no iBOT")  # fmt: skip
        if self.centering not in CENTERINGS:
            raise ValueError(f"centering={self.centering!r}: choose one of {', '.join(CENTERINGS)}")
        for key in ("global_crops_size", "local_crops_size", "head_n_prototypes", "head_bottleneck_dim",
                    "head_nlayers", "head_hidden_dim"):  # fmt: skip
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 1")
        if not 0 <= self.local_crops_number <= MAX_CROPS:
            raise ValueError(f"local_crops_number={self.local_crops_number} must be 0 to {MAX_CROPS} (DINOv2: 8; each "
                             "local crop is another forward pass of the student)")  # fmt: skip
        for key in ("global_crops_size", "local_crops_size"):
            if getattr(self, key) > MAX_CROP_SIDE:
                raise ValueError(f"{key}={getattr(self, key)} must be at most {MAX_CROP_SIDE} pixels (DINOv2: 224 and 96)")
        self._check_pairs()
        if self.local_crops_number and self.local_crops_size > self.global_crops_size:
            raise ValueError(f"local_crops_size={self.local_crops_size} is larger than global_crops_size="
                             f"{self.global_crops_size}: the local crops are the small views (DINOv2: 96 of 224)")  # fmt: skip
        if not 2 <= self.head_n_prototypes <= MAX_PROTOTYPES:
            raise ValueError(f"head_n_prototypes={self.head_n_prototypes} must be 2 to {MAX_PROTOTYPES} (one prototype "
                             "makes every target 1 and both losses 0; DINOv2: 65536, DINOv3: 262144)")  # fmt: skip
        for key, top in (("head_bottleneck_dim", 8192), ("head_hidden_dim", 65536), ("head_nlayers", 16)):
            if getattr(self, key) > top:
                raise ValueError(f"{key}={getattr(self, key)} must be at most {top} (DINOv2: 256, 2048, 3)")
        for key in ("loss_weight", "koleo_loss_weight", "ibot_loss_weight", "warmup_teacher_temp_epochs",
                    "freeze_last_layer_epochs", "weight_decay_end"):  # fmt: skip
            if getattr(self, key) is not None and getattr(self, key) < 0:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 0")
        for key in ("student_temp", "teacher_temp", "warmup_teacher_temp"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key}={getattr(self, key)} must be > 0")
        for key in ("center_momentum", "momentum_teacher", "final_momentum_teacher"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"{key}={getattr(self, key)} must lie in [0, 1]")
        if not (0.0 <= self.patch_embed_lr_mult < float("inf")):
            raise ValueError(f"patch_embed_lr_mult={self.patch_embed_lr_mult} must be a finite number >= 0 (DINOv2: 0.2)")
        if self.freeze_backbone_steps < 0:
            raise ValueError(f"freeze_backbone_steps={self.freeze_backbone_steps} must be >= 0 (0 = the backbone trains from the start)")
        self._check_gram()

    def gram_crops(self) -> list[int | None]:
        """The Gram teacher's crop side of each pair of :meth:`pairs` (None: it reads the global crops)."""
        own = self.gram_loss_weight > 0 and not self.gram_ema_teacher
        if not own:
            return [None] * len(self.pairs())
        if self.gram_teacher_crops_sizes:
            return list(self.gram_teacher_crops_sizes)
        return [self.gram_teacher_crops_size] * len(self.pairs())

    def pairs(self) -> list[tuple[int, int, float]]:
        """``(global side, local side, share of the steps)`` of each crop-size pair: the mixture's, else
        the one pair of ``global_crops_size`` and ``local_crops_size``."""
        if not self.global_local_crop_pairs_ratios:
            return [(self.global_crops_size, self.local_crops_size, 1.0)]
        return list(zip(self.global_crops_sizes, self.local_crops_sizes, self.global_local_crop_pairs_ratios))

    def _check_pairs(self) -> None:
        """The mixture's three lists (DINOv3 asserts their lengths equal: ``train.py`` line 356)."""
        gs, ls, rs = self.global_crops_sizes, self.local_crops_sizes, self.global_local_crop_pairs_ratios
        if not (gs or ls or rs):
            return
        if not (len(gs) == len(ls) == len(rs) >= 1):
            raise ValueError(f"global_crops_sizes={list(gs)}, local_crops_sizes={list(ls)} and global_local_crop_pairs_ratios="
                             f"{list(rs)} must have one entry per crop-size pair each (DINOv3's high-resolution stage: "
                             "[512, 768, 768, 768, 768], [112, 112, 168, 224, 336], [0.3, 0.3, 0.3, 0.05, 0.05])")  # fmt: skip
        if not all(0.0 < r <= 1.0 for r in rs) or abs(sum(rs) - 1.0) > 1e-6:
            raise ValueError(f"global_local_crop_pairs_ratios={list(rs)} must be shares in (0, 1] summing to 1 (the "
                             "fraction of steps that cut each pair)")  # fmt: skip
        for key, sizes in (("global_crops_sizes", gs), ("local_crops_sizes", ls)):
            if not all(1 <= v <= MAX_CROP_SIDE for v in sizes):
                raise ValueError(f"{key}={list(sizes)} must be sides of 1 to {MAX_CROP_SIDE} pixels")
        if self.local_crops_number and any(loc > g for g, loc in zip(gs, ls)):
            g, loc = next((g, loc) for g, loc in zip(gs, ls) if loc > g)
            raise ValueError(f"local_crops_sizes: a pair's local side {loc} is larger than its global side {g}: the local "
                             "crops are the small views")  # fmt: skip
        defaults = {f.name: f.default for f in fields(type(self)) if f.name in ("global_crops_size", "local_crops_size")}
        for key, first in (("global_crops_size", gs[0]), ("local_crops_size", ls[0])):
            if getattr(self, key) not in (defaults[key], first):
                raise ValueError(f"{key}={getattr(self, key)} with a mixture of crop sizes ({key}s={list(gs if key[0] == 'g' else ls)}): "
                                 f"the mixture sets the sizes; leave {key} out or set it to the first pair's, {first}")  # fmt: skip

    def _check_gram(self) -> None:
        """The Gram keys (DINOv3's own assertions, ``dinov3/train/ssl_meta_arch.py`` lines 218-231, and ranges)."""
        if not (self.gram_loss_weight >= 0 and self.gram_loss_weight < float("inf")):
            raise ValueError(f"gram_loss_weight={self.gram_loss_weight} must be a finite number >= 0 (0 = no Gram anchoring)")
        if self.gram_update_frequency < 1:
            raise ValueError(f"gram_update_frequency={self.gram_update_frequency} must be >= 1 (updates between refreshes)")
        for key in ("gram_it_load_ema_teacher", "gram_it_first_update"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 0 (an optimizer update)")
        if self.gram_max_updates is not None and self.gram_max_updates < 0:
            raise ValueError(f"gram_max_updates={self.gram_max_updates} must be >= 0, or null for no limit")
        if self.gram_tokens_used not in GRAM_TOKENS:
            raise ValueError(f"gram_tokens_used={self.gram_tokens_used!r}: choose one of {', '.join(GRAM_TOKENS)}")
        if self.gram_tokens_used != "all" and self.gram_img_level:
            raise ValueError(f"gram_tokens_used={self.gram_tokens_used} selects patches across the batch: set gram_img_level=false")
        if self.gram_remove_neg and self.gram_remove_only_teacher_neg:
            raise ValueError("gram_remove_neg and gram_remove_only_teacher_neg are exclusive: set one")
        if self.gram_ema_teacher and self.gram_rep_update and self.gram_loss_weight > 0:
            raise ValueError("gram_ema_teacher=true uses the EMA teacher itself: there is no copy to refresh, set "
                             "gram_rep_update=false (DINOv3 asserts the same)")  # fmt: skip
        if self.gram_global_teacher_resize_method not in GRAM_RESIZES:
            raise ValueError(f"gram_global_teacher_resize_method={self.gram_global_teacher_resize_method!r}: choose one of "
                             f"{', '.join(GRAM_RESIZES)} (DINOv3: bicubic)")  # fmt: skip
        size, sizes = self.gram_teacher_crops_size, list(self.gram_teacher_crops_sizes)
        if size is not None and not 1 <= size <= MAX_LIKE_SIDE:
            raise ValueError(f"gram_teacher_crops_size={size} must be 1 to {MAX_LIKE_SIDE} pixels (DINOv3: 512 for global "
                             "crops of 256), or null for the global crops")  # fmt: skip
        if not all(1 <= v <= MAX_LIKE_SIDE for v in sizes):
            raise ValueError(f"gram_teacher_crops_sizes={sizes} must be sides of 1 to {MAX_LIKE_SIDE} pixels (DINOv3: 768 "
                             "and 1152 for global crops of 512 and 768)")  # fmt: skip
        if sizes and not self.global_local_crop_pairs_ratios:
            raise ValueError(f"gram_teacher_crops_sizes={sizes} lists one side per crop-size pair of a mixture "
                             "(dino.global_local_crop_pairs_ratios): without one set gram_teacher_crops_size")  # fmt: skip
        if sizes and len(sizes) != len(self.global_local_crop_pairs_ratios):
            raise ValueError(f"gram_teacher_crops_sizes={sizes} must have one entry per crop-size pair ("
                             f"{len(self.global_local_crop_pairs_ratios)}; DINOv3 asserts the same, train.py line 356)")  # fmt: skip
        if sizes and size not in (None, sizes[0]):
            raise ValueError(f"gram_teacher_crops_size={size} with gram_teacher_crops_sizes={sizes}: the mixture sets the "
                             f"sizes; leave gram_teacher_crops_size out or set it to the first pair's, {sizes[0]}")  # fmt: skip
        if self.gram_ema_teacher and (size is not None or sizes) and self.gram_loss_weight > 0:
            raise ValueError("gram_ema_teacher=true reads the EMA teacher's own output on the global crops: leave "
                             "gram_teacher_crops_size(s) out (DINOv3 refuses the same, ssl_meta_arch.py lines 250-251)")  # fmt: skip
        for key in ("local_loss_weight_schedule", "gram_loss_weight_schedule"):
            check_weight_schedule(key, getattr(self, key))
        for key in ("gram_loss_weight_schedule", "gram_teacher_crops_size", "gram_teacher_crops_sizes"):
            v = getattr(self, key)
            if self.gram_loss_weight == 0 and v not in (None, []):
                raise ValueError(f"{key}={v} is for the Gram loss, which is off: set gram_loss_weight > 0 (DINOv3's "
                                 "gram.use_loss) or leave it out")  # fmt: skip


@dataclass
class DinoPretrainingConfig(Config):
    """A whole run of ``train.task=dino``: the common groups and ``dino``."""

    dino: DinoConfig = field(default_factory=DinoConfig)
    """DINOv2-style self-distillation: crops, head, centring, iBOT, KoLeo, teacher schedules."""
