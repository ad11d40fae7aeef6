"""The transformer MLPs: fc1 -> activation -> dropout -> fc2 -> dropout, and the gated SwiGLU."""

from __future__ import annotations

import torch
from torch import nn


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the activation of OpenAI's original CLIP weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def make_activation(name: str) -> nn.Module:
    """``gelu`` (exact erf), ``gelu_tanh``, ``quick_gelu``, ``relu`` or ``silu``."""
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "quick_gelu":
        return QuickGELU()
    if name == "relu":
        return nn.ReLU()
    if name == "silu":
        return nn.SiLU()
    raise ValueError(f"unknown activation {name!r}: use gelu, gelu_tanh, quick_gelu, relu or silu")


class Mlp(nn.Module):
    def __init__(
        self,
        dim: int,
        hidden: int,
        out_dim: int | None = None,
        bias: bool = True,
        activation: str = "gelu",
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        out_dim = out_dim or dim
        self.fc1 = nn.Linear(dim, hidden, bias=bias, device=device, dtype=dtype)
        self.act = make_activation(activation)
        self.drop1 = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden, out_dim, bias=bias, device=device, dtype=dtype)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class SwiGLU(nn.Module):
    """Gated MLP: ``fc2(silu(fc1_g(x)) * fc1_x(x))`` (Shazeer 2020, arXiv 2002.05202), with the gate and
    value projections as two layers — timm's ``SwiGLU`` layout (``fc1_g``, ``fc1_x``, ``fc2``), which
    DINOv3's larger models use. Three matmuls of width ``hidden`` instead of two.

    ``norm``: a norm module over the ``hidden`` gated units before ``fc2`` (EVA-02's sub-LN, Fang et al.
    2023, arXiv 2303.11331; timm's ``SwiGLU(norm_layer=...)``, ``scale_mlp=True`` in ``timm/models/eva.py``);
    None: none."""

    def __init__(self, dim: int, hidden: int, bias: bool = True, dropout: float = 0.0, device=None, dtype=None,
                 norm: nn.Module | None = None):  # fmt: skip
        super().__init__()
        self.fc1_g = nn.Linear(dim, hidden, bias=bias, device=device, dtype=dtype)
        self.fc1_x = nn.Linear(dim, hidden, bias=bias, device=device, dtype=dtype)
        self.act = nn.SiLU()
        self.drop1 = nn.Dropout(dropout)
        self.norm = norm
        self.fc2 = nn.Linear(hidden, dim, bias=bias, device=device, dtype=dtype)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop1(self.act(self.fc1_g(x)) * self.fc1_x(x))
        if self.norm is not None:
            h = self.norm(h)
        return self.drop2(self.fc2(h))
