"""The reference implementation of the same architecture: timm for ViT and VOLO, open_clip for CLIP.

The model family's state-dict adapter (``FamilySpec.adapters[library]``) builds the library's model
from our config — same widths, depth, heads, patch, pooling, norms, biases and dropouts, so the forward
FLOPs match — and loads our weights into it (debug sizes and overrides included; nothing downloaded).
A model the library cannot express is refused with the adapter's reason, never replaced by another
architecture.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def reference_model(adapter: Any, ours: nn.Module, variant: str, device=None) -> tuple[nn.Module, str]:
    """The library's model matching ``ours`` and a label naming it (``timm vit_small_patch16_224``, or
    the library's class and our variant for a size the library does not register)."""
    model = adapter.create(ours, load_weights=True)
    if device is not None:
        model = model.to(device)
    name = adapter.names.get(variant)
    return model, f"{adapter.library} {name or f'{type(model).__name__} ({variant} architecture)'}"


__all__ = ["reference_model"]
