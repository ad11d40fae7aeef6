"""Attention masks for padded token sequences (NaFlex batches): which keys each query may read.

A NaFlex batch pads every image's patch sequence to the batch's length, and ``patch_valid`` ``(B, N)``
marks the real patches. Attention must never read a padding token, so every query attends to the
valid keys only (prefix tokens — class, registers — are always valid). Only the keys are masked, as
timm's ``use_key_only_attn_mask``: a padding token's own output is never read (pooling masks it too),
and no row of the mask is ever empty, so nothing turns into NaN. The real tokens' outputs are those of
the symmetric mask of timm's default and big_vision's ``naflex_vit.py`` (``sa_mask``).

Two forms, one per attention implementation (``attn_impl`` of the NaFlex config):

- ``"sdpa"``: a boolean ``(B, 1, 1, T)`` tensor (True = attend) for ``F.scaled_dot_product_attention``;
  PyTorch then runs the memory-efficient (CUDA) or the math / CPU-flash kernel, never flash on CUDA.
- ``"flex"``: a FlexAttention ``BlockMask`` (``torch.nn.attention.flex_attention``, torch >= 2.5):
  blocks of keys that are all padding are skipped, partly padded blocks read ``patch_valid`` inside the
  compiled kernel. ``flex_attention`` runs compiled (its eager form materialises the whole score matrix).

``benchmarks/naflex_attention.py`` times both on a device (``benchmarks/results/naflex_attention_*``).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import torch

AttnImpl = Literal["sdpa", "flex"]


def with_prefix(valid: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """``(B, N)`` patch validity -> ``(B, prefix + N)`` token validity (prefix tokens always valid)."""
    valid = valid.bool()
    if num_prefix_tokens == 0:
        return valid
    prefix = valid.new_ones(valid.shape[0], num_prefix_tokens)
    return torch.cat([prefix, valid], dim=1)


def key_padding_mask(valid: torch.Tensor, num_prefix_tokens: int = 0, impl: AttnImpl = "sdpa") -> Any:
    """The self-attention mask of a padded batch: every query reads the valid keys only.

    ``valid`` ``(B, N)``: True for a real patch; the ``num_prefix_tokens`` tokens in front are always
    valid. Returns a boolean ``(B, 1, 1, prefix + N)`` tensor (``impl="sdpa"``) or a FlexAttention
    ``BlockMask`` (``impl="flex"``); :func:`vitscale.models.common.attention.sdpa` takes either.
    """
    tokens = with_prefix(valid, num_prefix_tokens)  # (B, T)
    if impl == "sdpa":
        return tokens[:, None, None, :]  # (B, 1, 1, T): broadcast over heads and queries
    if impl == "flex":
        return _block_mask(tokens)
    raise ValueError(f"attention implementation must be sdpa or flex, got {impl!r}")


def _block_mask(tokens: torch.Tensor) -> Any:
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError as e:  # torch < 2.5
        raise RuntimeError(f"attn_impl=flex needs FlexAttention (torch >= 2.5; this is {torch.__version__}): use attn_impl=sdpa") from e
    B, T = tokens.shape

    def keys_valid(b, h, q_idx, kv_idx):
        return tokens[b, kv_idx]

    return create_block_mask(keys_valid, B, None, T, T, device=tokens.device)


@functools.cache
def _compiled_flex() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any, dropout_p: float = 0.0) -> torch.Tensor:
    """``flex_attention`` on ``(B, H, N, D)`` tensors with a ``BlockMask`` (compiled: inside a compiled
    region as it is, in eager code through one cached ``torch.compile`` of it)."""
    if dropout_p:
        raise ValueError("FlexAttention has no attention dropout: set attention_dropout=0 or attn_impl=sdpa")
    if torch.compiler.is_compiling():
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, block_mask=block_mask)
    return _compiled_flex()(q, k, v, block_mask=block_mask)


__all__ = ["AttnImpl", "flex_sdpa", "key_padding_mask", "with_prefix"]
