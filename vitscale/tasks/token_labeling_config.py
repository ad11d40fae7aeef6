"""Config groups of token labeling: ``token_label`` (the training loss) and ``teacher`` (``vitscale
label-tokens``). Imported by ``vitscale.config.schema`` as fields of the root ``Config``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from vitscale.config.ranges import at_least, fraction, image_side
from vitscale.config.schema import Config
from vitscale.errors import ConfigError


@dataclass
class TokenLabelConfig:
    """Token labeling (Jiang et al. 2021): dense teacher labels + MixToken (``train.task=token_labeling``)."""

    RANGES: ClassVar[dict[str, tuple]] = {
        "beta": (0.0, 1e3), "cls_weight": (0.0, 1e3), "mix_token_alpha": (0.0, 100.0), "mix_token_prob": (0.0, 1.0),
        "sampling_ratio": (0, 1 << 10),
    }  # fmt: skip
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    path: str | None = None
    """Label folder: one ``vitscale label-tokens`` wrote (``token_labels.json`` + memmapped arrays), or
    TokenLabeling's (``<class>/<image>.pt`` files: the published NFNet-F6 maps; image folders only)."""
    format: Literal["auto", "vitscale", "tokenlabeling"] = "auto"
    """What ``path`` holds: ``auto`` (a ``token_labels.json`` -> ``vitscale``, else class folders of
    ``.pt`` files -> ``tokenlabeling``) or either by name."""
    split: str = "train"
    """Which split of a vitscale label folder matches the training set (rows = the batches' ``index``)."""
    beta: float = 0.5
    """Weight of the token-level loss: loss = cls_weight * CE(class token) + beta * mean token soft CE
    (sail-sg/volo main.py ``--dense-weight``, default 0.5)."""
    cls_weight: float = 1.0
    """Weight of the class-token cross-entropy (main.py ``--cls-weight``, default 1.0)."""
    cls_target: Literal["crop", "ground_truth", "teacher"] = "crop"
    """Class-token target: ``crop`` (the reference's: the dense map pooled over the training crop,
    soft-maxed, smoothed by train.label_smoothing), ``ground_truth`` (the label, smoothed) or
    ``teacher`` (the teacher's own class-token prediction, vitscale label folders only)."""
    ground_truth_mix: bool = False
    """Mix the class target with the smoothed label as TokenLabeling's / VOLO's ``--ground-truth``:
    ``target * r + label * (1 - r)``, ``r = 0.9 - 0.4 * [their top classes agree]``."""
    reference_box: bool = False
    """Cut the crop out of the label maps as TokenLabeling's code does: its box
    transposed (``(top, left, bottom, right)`` in roi_align's ``(x1, y1, x2, y2)``) and the map flipped
    before it (docs/volo.md). False: the crop's own geometry."""
    mix_token: bool = True
    """MixToken: a CutMix box on the token grid swaps tokens (and their dense labels) with the
    reversed batch; the class target mixes by the box's area."""
    mix_token_alpha: float = 1.0
    """MixToken box area ratio ~ Beta(alpha, alpha)."""
    mix_token_prob: float = 1.0
    """Probability of MixToken per micro-batch."""
    sampling_ratio: int = 0
    """RoIAlign samples per output cell side when cropping the dense maps to the student grid;
    0 = adaptive (ceil(crop cells / output cells), torchvision's default, as the reference)."""

    def __post_init__(self):
        for key in ("beta", "cls_weight", "mix_token_alpha"):
            at_least(f"token_label.{key}", getattr(self, key), 0, "a weight")
        if self.ground_truth_mix and self.cls_target == "ground_truth":
            raise ConfigError("token_label.ground_truth_mix mixes the label into a crop or teacher class target: "
                              "with token_label.cls_target=ground_truth there is nothing to mix; set cls_target=crop")  # fmt: skip
        fraction("token_label.mix_token_prob", self.mix_token_prob, "a probability", closed_high=True)


@dataclass
class TeacherConfig:
    """The teacher of ``vitscale label-tokens``: any vitscale model, or a timm model converted."""

    RANGES: ClassVar[dict[str, tuple]] = {"topk": (1, 1 << 10), "batch_size": (1, 1 << 20), "img_size": (1, 8192)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    # Read by ``vitscale label-tokens`` only: a resumed training run accepts any change to it
    # (vitscale.run.folder.neutral_key).
    resume_neutral: ClassVar[bool] = True

    checkpoint: str | None = None
    """Teacher weights: a ``.safetensors`` file, a run folder or a DCP checkpoint (vitscale models);
    a timm ``.safetensors``/``.pth`` file when ``teacher.timm`` is set."""
    model: str | None = None
    """Registered variant of the teacher; None = ``model.name`` with ``model.overrides`` of this config."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Changes to the teacher variant's config (with ``teacher.model``), or keyword arguments of
    ``timm.create_model`` (with ``teacher.timm``, e.g. ``{img_size: 32, num_classes: 10}``)."""
    timm: str | None = None
    """A timm architecture name (ViT or VOLO): build it without weights, load ``checkpoint`` into it,
    convert with ``vitscale.interop.from_timm``."""
    weights: Literal["model", "ema"] = "model"
    """Which weights of a vitscale checkpoint: ``model`` or ``ema``."""
    topk: int = 5
    """Scores kept per location (float16 value + int16 class index each)."""
    batch_size: int = 256
    """Images per teacher forward."""
    splits: tuple[str, ...] = ("train",)
    """Dataset splits to label (``train``, ``val``)."""
    img_size: int | None = None
    """Teacher input size; None = the teacher model's img_h/img_w."""

    def __post_init__(self):
        at_least("teacher.batch_size", self.batch_size, 1, "images per teacher batch")
        image_side("teacher.img_size", self.img_size)

@dataclass
class TokenLabelingConfig(Config):
    """A whole run of ``train.task=token_labeling``: the common groups, ``token_label`` and ``teacher``."""

    token_label: TokenLabelConfig = field(default_factory=TokenLabelConfig)
    """Token labeling's loss and its stored labels (VOLO / LV-ViT)."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """The teacher whose dense top-k token labels ``vitscale label-tokens`` writes."""
