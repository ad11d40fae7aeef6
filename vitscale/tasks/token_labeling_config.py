"""Config groups of token labeling: ``token_label`` (the training loss) and ``teacher`` (``vitscale
label-tokens``). Imported by ``vitscale.config.schema`` as fields of the root ``Config``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from vitscale.ranges import at_least, fraction, image_side


@dataclass
class TokenLabelConfig:
    """Token labeling (Jiang et al. 2021): dense teacher labels + MixToken (``train.task=token_labeling``)."""

    path: str | None = None
    """Label folder written by ``vitscale label-tokens`` (``token_labels.json`` + memmapped arrays)."""
    split: str = "train"
    """Which split of the label folder matches the training set (rows = the batches' ``index``)."""
    beta: float = 0.5
    """Weight of the token-level loss: loss = cls_weight * CE(class token) + beta * mean token soft CE."""
    cls_weight: float = 1.0
    """Weight of the class-token cross-entropy."""
    cls_target: Literal["ground_truth", "teacher"] = "ground_truth"
    """Class-token target: ``ground_truth`` (the label, smoothed by train.label_smoothing) or
    ``teacher`` (the teacher's class-token top-k distribution)."""
    mix_token: bool = True
    """MixToken: a CutMix box on the token grid swaps tokens (and their dense labels) with the
    reversed batch; the class target mixes by the box's area."""
    mix_token_alpha: float = 1.0
    """MixToken box area ratio ~ Beta(alpha, alpha)."""
    mix_token_prob: float = 1.0
    """Probability of MixToken per micro-batch."""
    sampling_ratio: int = 0
    """RoIAlign samples per output cell side when cropping the dense maps to the student grid;
    0 = adaptive (ceil(crop cells / output cells): one bilinear sample per cell when upsampling)."""

    def __post_init__(self):
        for key in ("beta", "cls_weight", "mix_token_alpha"):
            at_least(f"token_label.{key}", getattr(self, key), 0, "a weight")
        fraction("token_label.mix_token_prob", self.mix_token_prob, "a probability", closed_high=True)


@dataclass
class TeacherConfig:
    """The teacher of ``vitscale label-tokens``: any vitscale model, or a timm model converted."""

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
