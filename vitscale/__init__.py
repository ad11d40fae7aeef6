"""vitscale: train Vision Transformers at every scale on PyTorch's own distributed engine."""

from .models import create_model, get_model_config, list_models

__version__ = "0.1.0"


def create_tokenizer(name: str = "clip", **kwargs):
    """A text tokenizer by name (``"clip"``: open_clip's BPE, context 77)."""
    from .models.clip.tokenizer import create_tokenizer as _create

    return _create(name, **kwargs)


__all__ = ["__version__", "create_model", "create_tokenizer", "get_model_config", "list_models"]
