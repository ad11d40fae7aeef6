"""DINOv2's projection head (facebookresearch/dinov2 at b8931f7, ``dinov2/layers/dino_head.py``): an
MLP (``head_nlayers`` linear layers, GELU between, hidden width ``head_hidden_dim``) to a bottleneck of
``head_bottleneck_dim``, L2-normalised, then the prototypes: a weight-normalised linear layer without
bias (Salimans & Kingma 2016, arXiv 1602.07868: ``W = g * V / ||V||`` per prototype row), ``g`` filled
with 1 (lines 27-28). Under tensor parallelism the prototypes' rows are split over the ranks and the
logits gathered (:mod:`vitscale.tasks.dino_layout`). Initialisation: the MLP's weights truncated-normal std 0.02, biases 0 (lines
30-34); ``V`` as ``nn.Linear``'s default (the reference wraps a fresh ``nn.Linear``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from vitscale.distributed.tensor_parallel import DTensor, Replicate


class DinoHead(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, nlayers: int = 3, hidden_dim: int = 2048, bottleneck_dim: int = 256):
        super().__init__()
        nlayers = max(nlayers, 1)
        if nlayers == 1:  # _build_mlp, lines 44-58 (no batch norm: use_bn=False)
            self.mlp = nn.Sequential(nn.Linear(in_dim, bottleneck_dim))
        else:
            layers: list[nn.Module] = [nn.Linear(in_dim, hidden_dim), nn.GELU()]
            for _ in range(nlayers - 2):
                layers += [nn.Linear(hidden_dim, hidden_dim), nn.GELU()]
            layers.append(nn.Linear(hidden_dim, bottleneck_dim))
            self.mlp = nn.Sequential(*layers)
        self.last_v = nn.Parameter(torch.empty(out_dim, bottleneck_dim))
        self.last_g = nn.Parameter(torch.ones(out_dim, 1))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        nn.init.kaiming_uniform_(self.last_v, a=math.sqrt(5))  # nn.Linear.reset_parameters
        self.last_g.fill_(1.0)

    def last_layer_parameters(self) -> list[nn.Parameter]:
        """The prototypes' parameters (frozen for ``freeze_last_layer_epochs``)."""
        return [self.last_v, self.last_g]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mlp(x)
        eps = 1e-6 if x.dtype == torch.float16 else 1e-12  # line 38
        x = nn.functional.normalize(x, dim=-1, p=2, eps=eps)
        w = self.last_g * self.last_v / torch.linalg.vector_norm(self.last_v, dim=1, keepdim=True)
        if isinstance(w, DTensor):  # prototypes split over the TP ranks (vitscale.tasks.dino_layout.split_heads)
            x = DTensor.from_local(x, w.device_mesh, [Replicate()], run_check=False)  # its gradient all-reduced
            return nn.functional.linear(x, w.to(x.dtype)).full_tensor()  # the logits gathered
        return nn.functional.linear(x, w.to(x.dtype))


__all__ = ["DinoHead"]
