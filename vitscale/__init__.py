"""vitscale: train Vision Transformers at every scale on PyTorch's own distributed engine."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .models import create_model, get_model_config, list_models

# Loaded on first use (PEP 562 module __getattr__): `import vitscale` and the `vitscale` command line
# start without torch; `vitscale.create_model` loads the models (and only them).
_FROM_MODELS = ("create_model", "get_model_config", "list_models")


def __getattr__(name: str):
    if name in _FROM_MODELS:
        return getattr(importlib.import_module("vitscale.models"), name)
    raise AttributeError(f"module 'vitscale' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FROM_MODELS))


def create_tokenizer(model: str, context_length: int | None = None):
    """The text tokenizer of a registered model or family (``"clip_b32"``, ``"clip"``: open_clip's BPE,
    77 tokens per text unless ``context_length`` says otherwise); NotImplementedError for a family
    that reads no text."""
    from .models.registry import get_family

    return get_family(model).create_tokenizer(context_length)


__all__ = ["__version__", "create_model", "create_tokenizer", "get_model_config", "list_models"]
