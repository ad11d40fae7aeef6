"""Config group ``clip`` of contrastive image-text training (``train.task=contrastive``).

Imported by ``vitscale.config.schema`` as a field of the root ``Config``. The loss kind itself is
``train.loss`` (``softmax`` = CLIP InfoNCE, ``sigmoid`` = SigLIP).
"""

from __future__ import annotations

from dataclasses import dataclass

from vitscale.data.digits import DIGIT_CAPTION_TEMPLATES, DIGIT_ZEROSHOT_TEMPLATES


@dataclass
class ClipConfig:
    """CLIP / SigLIP training and evaluation (NeMo ``model.local_loss`` / ``model.gather_with_grad``)."""

    local_loss: bool = False
    """Score only the local rows against the global batch (B x W*B logits instead of W*B x W*B; NeMo
    ``local_loss``). The loss and gradients are the same."""
    gather_with_grad: bool = True
    """All-gather features with a backward path (NeMo ``gather_with_grad``); False under-weights the
    gradient by the world size, which NeMo warns may hurt convergence."""
    caption_templates: tuple[str, ...] = DIGIT_CAPTION_TEMPLATES
    """Captions for datasets that only have labels (digits, imagefolder, synthetic): a template keyed
    by (seed, epoch, sample index), filled with the class name. Ignored when samples have captions.
    The default fits the default data, the digits."""
    class_names: tuple[str, ...] | None = None
    """Class names for captions and zero-shot prompts; None = the dataset's (digits: 'zero' … 'nine')."""
    zeroshot_templates: tuple[str, ...] = DIGIT_ZEROSHOT_TEMPLATES
    """Prompt templates of the zero-shot classifier (averaged text embedding per class)."""
    zeroshot: bool = True
    """Evaluate zero-shot top-1 / top-5 on the val split (needs class labels)."""
    retrieval: bool = True
    """Evaluate image<->text recall@1/5/10 on the val split (needs captions in the batches)."""
    context_length: int = 77
    """Tokens per caption (the text tower's ``encoder_seq_length``)."""
