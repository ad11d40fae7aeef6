"""Attention masks for padded token sequences (NaFlex batches): which keys each query may read.

A NaFlex batch pads every image's patch sequence to the batch's length, and ``patch_valid`` ``(B, N)``
marks the real patches. Attention must never read a padding token, so every query attends to the
valid keys only (prefix tokens — class, registers — are always valid). Only the keys are masked, as
timm's ``use_key_only_attn_mask``: a padding token's own output is never read (pooling masks it too),
and no row of the mask is ever empty, so nothing turns into NaN. The real tokens' outputs are those of
the symmetric mask of timm's default and big_vision's ``naflex_vit.py`` (``sa_mask``).

Two forms, one per attention implementation (``attn_impl`` of the NaFlex config):

- ``"sdpa"``: a boolean ``(B, 1, 1, T)`` tensor (True = attend) for ``F.scaled_dot_product_attention``;
  PyTorch then runs the memory-efficient or cuDNN kernel on CUDA (never flash: it takes no mask), the
  CPU-flash or math kernel on CPU.
- ``"flex"``: a FlexAttention ``BlockMask`` (``torch.nn.attention.flex_attention``, torch >= 2.5):
  blocks of keys that are all padding are skipped, partly padded blocks read ``patch_valid`` inside the
  compiled kernel. ``flex_attention`` runs compiled (its eager form materialises the whole score matrix);
  PyTorch has no FlexAttention backward on CPU, so there it serves inference only.

``benchmarks/naflex_attention.py`` times both on a device (``benchmarks/results/naflex_attention_*``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Literal

import torch
import torch.nn.functional as F

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


def _block_mask(tokens: torch.Tensor, block: int = 128) -> Any:
    """A FlexAttention ``BlockMask`` for key padding, built from per-block counts of valid keys (a few
    ``(B, T)`` reductions) rather than by evaluating the mask on every (query, key) pair as
    ``create_block_mask`` does (2.5 ms against 59 ms for a B/16 batch of 8 x 256 tokens on the shared
    2-core CPU of ``benchmarks/results/naflex_attention_cpu_infer_202611.json``). Every query row sees the same key
    blocks: all-valid blocks are "full" (no mask evaluated), partly valid ones "partial", empty ones skipped."""
    try:
        from torch.nn.attention.flex_attention import BlockMask, create_block_mask
    except ImportError as e:  # torch < 2.5
        raise RuntimeError(f"attn_impl=flex needs FlexAttention (torch >= 2.5; this is {torch.__version__}): use attn_impl=sdpa") from e
    B, T = tokens.shape
    n = -(-T // block)  # key (and query) blocks
    padded = F.pad(tokens, (0, n * block - T))  # (B, n*block): keys past T are never valid

    def keys_valid(b, h, q_idx, kv_idx):
        return padded[b, kv_idx]

    if "seq_lengths" not in inspect.signature(BlockMask.from_kv_blocks).parameters:  # an older torch
        return create_block_mask(keys_valid, B, None, T, T, device=tokens.device, BLOCK_SIZE=block)
    counts = padded.view(B, n, block).sum(-1)  # (B, n) valid keys per block
    # a block is full when all its keys are valid and inside the sequence (the last one may be short)
    full = (counts == block) & (torch.arange(n, device=tokens.device) < T // block)
    partial = (counts > 0) & ~full

    def pack(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num = sel.sum(-1, dtype=torch.int32)  # (B,) chosen blocks per sequence
        idx = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # chosen blocks first
        return num[:, None, None].expand(B, 1, n).contiguous(), idx[:, None, None, :].expand(B, 1, n, n).contiguous()

    num, idx = pack(partial)
    full_num, full_idx = pack(full)
    return BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=keys_valid, seq_lengths=(T, T))


@functools.cache
def _compiled_flex() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any, dropout_p: float = 0.0) -> torch.Tensor:
    """``flex_attention`` on ``(B, H, N, D)`` tensors with a ``BlockMask`` (compiled: inside a compiled
    region as it is, in eager code through one cached ``torch.compile`` of it)."""
    if dropout_p:
        raise ValueError("FlexAttention has no attention dropout: set attention_dropout=0 or attn_impl=sdpa")
    if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise ValueError("attn_impl=flex cannot train on CPU (PyTorch's FlexAttention has no CPU backward): use attn_impl=sdpa")
    if torch.compiler.is_compiling():
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, block_mask=block_mask)
    return _compiled_flex()(q, k, v, block_mask=block_mask)


__all__ = ["AttnImpl", "flex_sdpa", "key_padding_mask", "with_prefix"]
