"""vitscale: train Vision Transformers at every scale on PyTorch's own distributed engine."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .version import __version__

if TYPE_CHECKING:
    from torch import nn

    from .export.predict import LoadedRun
    from .models import get_model_config, list_models

# Loaded on first use (PEP 562 module __getattr__): `import vitscale` and the `vitscale` command line
# start without torch; `vitscale.create_model` loads the models (and only them, unless `pretrained`).
_FROM_MODELS = ("get_model_config", "list_models")


def __getattr__(name: str):
    if name in _FROM_MODELS:
        return getattr(importlib.import_module("vitscale.models"), name)
    raise AttributeError(f"module 'vitscale' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FROM_MODELS))


def create_model(name: str, *, pretrained: str | None = None, pretrained_format: str | None = None, **kwargs) -> nn.Module:
    """A registered model (``vitscale models`` lists them), e.g. ``create_model("vit_b16", num_classes=10)``;
    ``device``, ``dtype`` and ``init`` as :func:`vitscale.models.create_model`, other keywords change
    the variant's config.

    ``pretrained``: its weights from a path or ``hf-hub:org/name`` (the local Hugging Face cache only) —
    any source ``checkpoint.init_from`` takes (a vitscale run folder or ``.safetensors``, a timm or
    open_clip file or Hub snapshot), its format told from the file (``pretrained_format=timm|open_clip|
    vitscale`` where it cannot be), converted through the family's adapter, the architecture checked
    against the variant's; the model takes the weights' class count unless ``num_classes`` is given
    (another is re-initialised, with a warning), position embeddings are resampled to the configured
    image size. Returned in eval mode."""
    if pretrained is None:
        return importlib.import_module("vitscale.models").create_model(name, **kwargs)
    from .interop.pretrained import create_pretrained

    return create_pretrained(name, str(pretrained), pretrained_format, **kwargs)


def load_run(folder, *, ema: bool = False, allow_shell_from_config: bool = False) -> LoadedRun:
    """A trained run folder in Python: ``.model`` (eval mode, its final weights; ``ema``: the EMA
    weights), ``.transform`` (its evaluation preprocessing: an image path, PIL image or uint8 tensor ->
    the normalised tensor), ``.class_names``, ``.config``, and ``.predict(images, k)`` (top-k names and
    probabilities). docs/using.md, "In Python". A ``config.yaml`` whose ``pipe:`` data paths would run
    shell commands is refused unless ``allow_shell_from_config`` (docs/trust.md)."""
    from .export.predict import load_run as _load_run

    return _load_run(folder, ema=ema, allow_shell_from_config=allow_shell_from_config)


def create_tokenizer(model: str, context_length: int | None = None):
    """The text tokenizer of a registered model or family (``"clip_b32"``, ``"clip"``: open_clip's BPE,
    77 tokens per text unless ``context_length`` says otherwise); NotImplementedError for a family
    that reads no text."""
    from .models.registry import get_family

    return get_family(model).create_tokenizer(context_length)


__all__ = ["__version__", "create_model", "create_tokenizer", "get_model_config", "list_models", "load_run"]
