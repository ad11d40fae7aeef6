"""Config group ``clip`` of contrastive image-text training (``train.task=contrastive``).

A group of the contrastive task's run config (:class:`ContrastiveConfig`, ``ContrastiveTask.config``). The loss kind itself is ``train.loss`` (``softmax`` = CLIP InfoNCE, ``sigmoid`` = SigLIP).
The default prompt is the CLIP paper's ("A photo of a {label}.", Radford et al. 2021, arXiv
2103.00020, section 3.1.4); a recipe sets its dataset's own (``configs/digits_clip.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from vitscale.config.ranges import at_least
from vitscale.config.schema import Config

from .distill_config import DistillConfig

DEFAULT_TEMPLATES = ("a photo of a {}.",)


@dataclass
class ClipConfig:
    """CLIP / SigLIP training and evaluation (NeMo ``model.local_loss`` / ``model.gather_with_grad``)."""

    RANGES: ClassVar[dict[str, tuple]] = {"context_length": (1, 8192), "lock_image_unlocked_groups": (0, 1 << 16), "lock_text_unlocked_layers": (0, 1 << 16)}
    """The bounds of its number fields, inclusive (``vitscale.config.ranges``: every number has a range)."""

    local_loss: bool = False
    """Score only the local rows against the global batch (B x W*B logits instead of W*B x W*B; NeMo
    ``local_loss``). The loss and gradients are the same."""
    gather_with_grad: bool = True
    """All-gather features with a backward path (NeMo ``gather_with_grad``); False under-weights the
    gradient by the world size, which NeMo warns may hurt convergence."""
    caption_templates: tuple[str, ...] = DEFAULT_TEMPLATES
    """Captions for datasets that only have labels (digits, imagefolder, synthetic): a template keyed
    by (seed, epoch, sample index), filled with the class name. Ignored when samples have captions."""
    class_names: tuple[str, ...] | None = None
    """Class names for captions and zero-shot prompts; None = the run's data's (digits' '0' … '9' as
    'zero' … 'nine', underscores as spaces)."""
    zeroshot_templates: tuple[str, ...] = DEFAULT_TEMPLATES
    """Prompt templates of the zero-shot classifier (averaged text embedding per class)."""
    zeroshot: bool = True
    """Evaluate zero-shot top-1 / top-5 on the val split (needs class labels), when the run sets no
    ``evals:`` (then a ``zeroshot`` entry there does it)."""
    retrieval: bool = True
    """Evaluate image<->text recall@1/5/10 on the val split (needs captions in the batches), when the
    run sets no ``evals:`` (then a ``retrieval`` entry there does it)."""
    context_length: int = 77
    """Tokens per caption (the text tower's ``encoder_seq_length``)."""
    lock_image: bool = False
    """Freeze the image tower and its projection (LiT, Zhai et al. 2022, arXiv 2111.07991; open_clip
    ``--lock-image``): its parameters get no gradient and leave the optimizer."""
    lock_image_unlocked_groups: int = 0
    """With ``lock_image``: leave the last N layer groups trainable (open_clip
    ``--lock-image-unlocked-groups``: groups are the embeddings, each block, the last block with the
    final norm, the projection)."""
    lock_text: bool = False
    """Freeze the text tower and its projection (open_clip ``--lock-text``)."""
    lock_text_unlocked_layers: int = 0
    """With ``lock_text``: leave the last N layer groups trainable (open_clip
    ``--lock-text-unlocked-layers``: the embeddings, each block, the last block with the final norm,
    the projection)."""

    def __post_init__(self):
        from vitscale.eval.zeroshot import check_templates

        check_templates("clip.caption_templates", self.caption_templates)
        check_templates("clip.zeroshot_templates", self.zeroshot_templates)
        at_least("clip.lock_image_unlocked_groups", self.lock_image_unlocked_groups, 0, "0 = the whole tower locked")
        at_least("clip.lock_text_unlocked_layers", self.lock_text_unlocked_layers, 0, "0 = the whole tower locked")

@dataclass
class ContrastiveConfig(Config):
    """A whole run of ``train.task=contrastive``: the common groups, ``clip`` and ``distill``."""

    clip: ClipConfig = field(default_factory=ClipConfig)
    """CLIP / SigLIP training and evaluation (the contrastive task)."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """Online distillation from a teacher (off unless ``distill.teacher`` is set)."""
