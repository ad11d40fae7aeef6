"""Multi-head self-attention through ``F.scaled_dot_product_attention``.

The fused QKV projection, ``qkv_per_head``, stores its output rows per head, ``(H, 3, D)`` — Megatron's layout — rather
than timm's ``(3, H, D)``. Splitting the rows into contiguous chunks (column-parallel tensor
parallelism) then hands every rank whole heads with their q, k and v; the converters in
``state_dict_adapter.py`` permute rows to and from the timm / open_clip layouts. Its name is not
timm's ``qkv``: a state dict's names alone say whose row order it holds (docs/finetuning.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .norms import make_norm
from .rope import apply_rope, init_mixed_freqs, mixed_rope_sin_cos


def sdpa(q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False):
    """Scaled dot-product attention on ``(B, H, N, D)`` tensors (flash / cuDNN / memory-efficient).

    ``attn_mask`` is a tensor for ``F.scaled_dot_product_attention`` (boolean: True = attend) or a
    FlexAttention ``BlockMask`` (:func:`vitscale.models.common.attention_mask.key_padding_mask`), which
    runs ``flex_attention`` instead. Without a mask the call is ``F.scaled_dot_product_attention``'s alone.
    """
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):  # a FlexAttention BlockMask
        from .attention_mask import flex_sdpa

        return flex_sdpa(q, k, v, attn_mask, dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)


class Attention(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        norm_bias: bool = True,
        norm_type: str = "layernorm",
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        key_bias: bool = True,
        rope_rotate_half: bool = False,
        rope_mixed: bool = False,
        rope_temperature: float = 10.0,
        inner_norm: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"hidden_size {dim} is not divisible by num_attention_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.attn_drop = attn_drop
        self.rope_rotate_half = rope_rotate_half
        self.qkv_per_head = nn.Linear(dim, 3 * dim, bias=qkv_bias and key_bias, device=device, dtype=dtype)
        # Biases on the queries and values only (timm's EVA ``q_bias`` / ``v_bias``, rows (H, Dh)).
        qv = qkv_bias and not key_bias
        self.q_bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype)) if qv else None
        self.v_bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype)) if qv else None
        self.q_norm = make_norm(self.head_dim, norm_eps, norm_bias, device, dtype, norm_type) if qk_norm else nn.Identity()
        self.k_norm = make_norm(self.head_dim, norm_eps, norm_bias, device, dtype, norm_type) if qk_norm else nn.Identity()
        # RoPE-Mixed's learned frequencies of this layer's heads (ViTConfig.rope_type='mixed', arXiv
        # 2403.13298) and EVA-02-CLIP's norm over the heads' outputs before the projection (attn_inner_norm)
        self.rope_temperature = rope_temperature
        self.rope_freqs = (
            nn.Parameter(torch.empty(num_heads, 2, self.head_dim // 2, device=device, dtype=dtype)) if rope_mixed else None
        )
        self.norm = make_norm(dim, norm_eps, norm_bias, device, dtype, norm_type) if inner_norm else None
        self.proj = nn.Linear(dim, dim, bias=proj_bias, device=device, dtype=dtype)
        self.proj_drop = nn.Dropout(proj_drop)

    def init_weights(self) -> None:
        for b in (self.q_bias, self.v_bias):
            if b is not None:
                nn.init.zeros_(b)
        if self.rope_freqs is not None:
            init_mixed_freqs(self.rope_freqs, self.rope_temperature)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None):  # fmt: skip
        """``rope``: ``(sin, cos)`` of the trailing patch tokens (:func:`vitscale.models.common.rope.apply_rope`),
        or with mixed RoPE their positions (:func:`~vitscale.models.common.rope.rope_positions`)."""
        B, N, _ = x.shape
        # -1 heads: under tensor parallelism this rank holds only its share of the heads.
        qkv = self.qkv_per_head(x).reshape(B, N, -1, 3, self.head_dim)  # (B, N, H, 3, D)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)  # 3 x (B, H, N, D)
        if self.q_bias is not None:
            q = q + self.q_bias.view(-1, 1, self.head_dim)  # (H, 1, D)
            v = v + self.v_bias.view(-1, 1, self.head_dim)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            if self.rope_freqs is not None:  # positions -> this layer's own angles
                rope = mixed_rope_sin_cos(rope, self.rope_freqs, self.rope_rotate_half)
            q, k = apply_rope(q, rope, self.rope_rotate_half), apply_rope(k, rope, self.rope_rotate_half)
        drop = self.attn_drop if self.training else 0.0
        x = sdpa(q, k, v, attn_mask=attn_mask, dropout_p=drop, is_causal=is_causal)  # (B, H, N, D)
        x = x.transpose(1, 2).reshape(B, N, -1)  # (B, N, H*D)
        if self.norm is not None:
            x = self.norm(x)
        return self.proj_drop(self.proj(x))
