"""The toy family's variant table: a frozen config dataclass per variant (here one, the debug size)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ToyConfig:
    """A patch embedding, ``num_layers`` residual MLP blocks on the tokens, mean pooling, a classifier."""

    img_h: int = 32
    """Image height."""
    img_w: int = 32
    """Image width."""
    num_channels: int = 3
    """Input channels."""
    patch_dim: int = 8
    """Patch side."""
    hidden_size: int = 32
    """Token width."""
    mlp_hidden_size: int = 64
    """Hidden width of each block's MLP."""
    num_layers: int = 2
    """Blocks."""
    num_classes: int = 1000
    """Classifier outputs (a run fills in its data's class count)."""

    def with_image_size(self, img_h: int, img_w: int | None = None) -> ToyConfig:
        return replace(self, img_h=img_h, img_w=img_w if img_w is not None else img_h)


VARIANTS = {"toy_debug": ToyConfig()}
