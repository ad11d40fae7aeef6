"""vitscale: train Vision Transformers at every scale on PyTorch's own distributed engine."""

from .models import create_model, get_model_config, list_models

__version__ = "0.1.0"


def create_tokenizer(model: str, context_length: int | None = None):
    """The text tokenizer of a registered model or family (``"clip_b32"``, ``"clip"``: open_clip's BPE,
    77 tokens per text unless ``context_length`` says otherwise); NotImplementedError for a family
    that reads no text."""
    from .models.registry import get_family

    return get_family(model).create_tokenizer(context_length)


__all__ = ["__version__", "create_model", "create_tokenizer", "get_model_config", "list_models"]
