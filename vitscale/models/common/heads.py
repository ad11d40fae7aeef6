"""Multihead attention pooling (MAP): one learned query attends over the tokens (ViT-22B, SigLIP)."""

from __future__ import annotations

import torch
from torch import nn

from .attention import sdpa
from .mlp import Mlp
from .norms import make_norm


class AttentionPoolHead(nn.Module):
    """A learned latent query attends to all tokens, then a residual MLP refines it.

    ``kv_per_head`` stores its rows per head, ``(H, 2, D)``, so column-parallel sharding keeps heads whole.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_hidden: int,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        norm_bias: bool = True,
        norm_type: str = "layernorm",
        activation: str = "gelu",
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.latent = nn.Parameter(torch.empty(1, 1, dim, device=device, dtype=dtype))
        self.q = nn.Linear(dim, dim, bias=qkv_bias, device=device, dtype=dtype)
        self.kv_per_head = nn.Linear(dim, 2 * dim, bias=qkv_bias, device=device, dtype=dtype)
        self.q_norm = make_norm(self.head_dim, norm_eps, norm_bias, device, dtype, norm_type) if qk_norm else nn.Identity()
        self.k_norm = make_norm(self.head_dim, norm_eps, norm_bias, device, dtype, norm_type) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, device=device, dtype=dtype)
        self.norm = make_norm(dim, norm_eps, norm_bias, device, dtype, norm_type)
        self.mlp = Mlp(dim, mlp_hidden, activation=activation, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens ``(B, N, D)`` -> pooled ``(B, D)``; ``attn_mask`` ``(B, 1, 1, N)`` (True = a real
        token) keeps padding tokens out of the pool (NaFlex batches)."""
        B, N, _ = x.shape
        q = self.q(self.latent.expand(B, -1, -1)).reshape(B, 1, -1, self.head_dim).transpose(1, 2)  # (B, H, 1, D)
        kv = self.kv_per_head(x).reshape(B, N, -1, 2, self.head_dim)  # (B, N, H, 2, D)
        k, v = kv.permute(3, 0, 2, 1, 4).unbind(0)  # 2 x (B, H, N, D)
        q, k = self.q_norm(q), self.k_norm(k)
        x = sdpa(q, k, v, attn_mask=attn_mask).transpose(1, 2).reshape(B, 1, -1)  # (B, 1, H*D)
        x = self.proj(x)
        x = x + self.mlp(self.norm(x))
        return x[:, 0]  # (B, dim)
