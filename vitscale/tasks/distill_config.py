"""Config group ``distill``: online distillation from a teacher that runs in the training process.

A group of the run configs of the tasks that distill (classification: DeiT's losses; contrastive: open_clip's
``--distill-model``: their ``config`` classes); :mod:`vitscale.tasks.distill` is the
component those tasks call. Off unless ``distill.teacher`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from vitscale.config.ranges import at_least, fraction, image_side, positive
from vitscale.config.schema import Config


@dataclass
class DistillConfig:
    """Online distillation (DeiT, Touvron et al. 2021, arXiv 2012.12877; open_clip ``--distill-model``)."""

    RANGES: ClassVar[dict[str, tuple]] = {
        "teacher_img_size": (1, 8192), "teacher_mean": (0.0, 1.0), "teacher_std": (0.0, 1.0),
        "replicate_max_mb": (0.0, float(1 << 30)), "class_map": (0, 1 << 22), "alpha": (0.0, 1.0), "tau": (0.0, 1e3),
        "clip_weight": (0.0, 1e3),
    }  # fmt: skip
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    teacher: str | None = None
    """The teacher's weights, given as ``checkpoint.init_from`` is: a vitscale run folder, checkpoint
    or ``.safetensors``; a timm / open_clip ``.safetensors`` or ``.pth`` / ``.bin``; a Hub snapshot
    folder; ``hf-hub:org/name`` from the local cache. None = no distillation."""
    teacher_format: Literal["vitscale", "timm", "open_clip"] | None = None
    """The format of ``teacher``, overriding what the file tells (as ``checkpoint.init_format``)."""
    teacher_model: str | None = None
    """The teacher's registered variant (any family: ``vitscale models``); None = the one its weights
    name (a vitscale run folder or ``.safetensors`` export names its model)."""
    teacher_overrides: dict[str, Any] = field(default_factory=dict)
    """Changes to the teacher variant's config (with ``teacher_model``); its class count comes from
    its weights."""
    teacher_weights: Literal["model", "ema"] = "model"
    """Which weights of a vitscale run folder or checkpoint: ``model`` or ``ema``."""
    teacher_img_size: int | None = None
    """The teacher's input size: the batch's images are resized to it (antialiased,
    ``teacher_interpolation``); None = what its source says (a Hub config's ``input_size``, a run's
    ``data.img_size``), else the teacher variant's own ``img_h`` / ``img_w``."""
    teacher_interpolation: Literal["bilinear", "bicubic"] | None = None
    """Resampling to ``teacher_img_size``; None = what its source says, else bicubic."""
    teacher_mean: tuple[float, ...] | None = None
    """The teacher's per-channel normalisation mean (of pixels in [0, 1]); the batch is re-normalised
    from ``data.mean`` / ``data.std`` to it. None = what its source says (a Hub config, a run's
    config, CLIP's ``image_mean``), else ``data.mean`` (a line says so)."""
    teacher_std: tuple[float, ...] | None = None
    """The teacher's per-channel normalisation std; None as ``teacher_mean``."""
    teacher_layout: Literal["auto", "sharded", "replicated"] = "auto"
    """Under torchrun: ``sharded`` lays the teacher out as the student (FSDP2 / TP of ``parallel.*``),
    ``replicated`` keeps a whole copy on every rank (no collectives in its forward); ``auto`` =
    replicated when its parameters take at most ``replicate_max_mb`` MB, else sharded."""
    replicate_max_mb: float = 1024.0
    """``teacher_layout=auto``: the largest teacher (MB of parameters, as stored) kept whole on every rank."""
    class_map: list[int] | None = None
    """Classification: the teacher's class index of each of the data's classes, in the data's order
    (the teacher's logits are taken in that order). None = the same order: when the teacher's source
    (a run's ``classnames.txt``, a Hub config's ``label_names``) and the data both name their
    classes, the names must match, or the run is refused with the map by name."""
    kind: Literal["soft", "hard"] = "hard"
    """Classification (DeiT): ``soft`` = KL divergence to the teacher's softmax at temperature ``tau``
    (scaled by tau^2); ``hard`` = cross-entropy to the teacher's argmax (DeiT's best, and its default
    recipe)."""
    alpha: float = 0.5
    """Classification (DeiT): loss = (1 - alpha) x the task's loss on the class head + alpha x the
    distillation loss on the distillation head (the class head without a distillation token)."""
    tau: float = 1.0
    """Classification, ``kind=soft``: the softmax temperature (DeiT: 1.0; Hinton et al. 2015: 3.0)."""
    clip_weight: float = 1.0
    """Contrastive (open_clip ``DistillClipLoss``): loss = contrastive + clip_weight x the cross-entropy
    of the student's image-text logits to the teacher's softmax, both directions (open_clip: 1)."""

    def __post_init__(self):
        if not self.teacher:  # off: none of the settings below is read
            return
        fraction("distill.alpha", self.alpha, "the distillation loss's share, DeiT: 0.5", closed_high=True)
        positive("distill.tau", self.tau, "the softmax temperature of soft distillation, DeiT: 1.0")
        at_least("distill.clip_weight", self.clip_weight, 0, "the weight of CLIP's distillation loss, open_clip: 1")
        image_side("distill.teacher_img_size", self.teacher_img_size)
        for i, s in enumerate(self.teacher_std or ()):
            positive(f"distill.teacher_std[{i}]", s, "the teacher's images are divided by it")

@dataclass
class ClassificationConfig(Config):
    """A whole run of ``train.task=classification``: the common groups and ``distill``."""

    distill: DistillConfig = field(default_factory=DistillConfig)
    """Online distillation from a teacher (off unless ``distill.teacher`` is set)."""
