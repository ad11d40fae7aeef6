"""Building blocks shared by every model family (pure single-device PyTorch)."""

from .attention import Attention
from .drop import DropPath, PatchDropout
from .heads import AttentionPoolHead
from .mlp import Mlp, SwiGLU, make_activation
from .norms import LayerScale, make_norm
from .patch_embed import PatchEmbed
from .pos_embed import resample_pos_embed, sincos_2d

__all__ = [
    "Attention",
    "AttentionPoolHead",
    "DropPath",
    "LayerScale",
    "Mlp",
    "PatchDropout",
    "PatchEmbed",
    "SwiGLU",
    "make_activation",
    "make_norm",
    "resample_pos_embed",
    "sincos_2d",
]
