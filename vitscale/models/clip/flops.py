"""Forward FLOPs of a CLIP from its config, without building or tracing it (``vitscale models`` traced
every CLIP through PyTorch's FlopCounterMode: most of its 15 s)."""

from __future__ import annotations

from ..vit.flops import vit_flops
from .configs import CLIPConfig


def text_flops(cfg) -> int:
    """One caption of ``encoder_seq_length`` tokens through the text tower (a :class:`CLIPTextConfig`):
    QKV, scores and attention x values over every position (as FlopCounterMode counts a causal
    attention), output projection, MLP; the embedding lookup is no matmul."""
    T, D, F = cfg.encoder_seq_length, cfg.hidden_size, cfg.ffn_hidden_size
    mlp = 3 if getattr(cfg.block_config(), "mlp_type", "mlp") == "swiglu" else 2
    per_block = 2 * T * D * 3 * D + 2 * 2 * T * T * D + 2 * T * D * D + 2 * mlp * T * D * F
    return int(cfg.num_layers * per_block)


def clip_flops(cfg: CLIPConfig, img_size=None, training: bool = False) -> int:
    """One image and one caption: the image tower (:func:`vit_flops`) and its projection, the text
    tower and its projection (of the pooled token). Equal to FlopCounterMode (``tests/unit/test_flops.py``)."""
    image = vit_flops(cfg.vision, img_size, training) + 2 * cfg.vision.hidden_size * cfg.output_dim
    return int(image + text_flops(cfg.text) + 2 * cfg.text.hidden_size * cfg.output_dim)


__all__ = ["clip_flops", "text_flops"]
