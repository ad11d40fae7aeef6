"""The DINO projection head: an MLP (``head_nlayers`` linear layers, GELU between, hidden width
``head_hidden_dim``) to a bottleneck of ``head_bottleneck_dim``, L2-normalised, then the prototypes, a
linear layer without bias. Three references, three forms of that last layer (``dino.head_last_layer``):

- ``weight_norm`` — DINOv2 (facebookresearch/dinov2 at b8931f7, ``dinov2/layers/dino_head.py`` lines
  27-28): weight-normalised (Salimans & Kingma 2016, arXiv 1602.07868: ``W = g * V / ||V||`` per
  prototype row), ``g`` filled with 1 and trained; DINO v1 with ``--norm_last_layer false``
  (facebookresearch/dino at 7c446df, ``vision_transformer.py`` lines 276-279).
- ``normalized`` — DINO v1's default (``main_dino.py`` lines 57-60, ``norm_last_layer=True``;
  ``vision_transformer.py`` line 279: ``weight_g.requires_grad = False``): the same with ``g`` held at
  1, so every prototype is a unit vector, ``W = V / ||V||``.
- ``linear`` — DINOv3 (facebookresearch/dinov3 at 6876159, ``dinov3/layers/dino_head.py`` line 32): a
  plain ``nn.Linear(bottleneck, prototypes, bias=False)``, no weight normalisation.

With ``use_bn`` (DINO v1's ``--use_bn_in_head``, ``main_dino.py`` line 64; ``vision_transformer.py``
lines 265-271) a ``BatchNorm1d`` follows each hidden linear layer, before its GELU.
Initialisation: the MLP's linear weights truncated-normal std 0.02, biases 0 (dinov2 lines 30-34, dino
lines 281-285); ``V`` of a weight-normalised layer as ``nn.Linear``'s default (both references wrap a
fresh ``nn.Linear`` after initialising the MLP, dino line 275-276); DINOv3's plain last layer
truncated-normal std 0.02 like the MLP (dinov3 lines 34-41 apply to every ``nn.Linear`` of the head).
Under tensor parallelism the prototypes' rows are split over the ranks and the logits gathered
(:mod:`vitscale.tasks.dino_layout`)."""

from __future__ import annotations

import math

import torch
from torch import nn

from vitscale.distributed.tensor_parallel import DTensor, Replicate

from .dino_config import LAST_LAYERS


class DinoHead(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, nlayers: int = 3, hidden_dim: int = 2048, bottleneck_dim: int = 256,
                 last_layer: str = "weight_norm", use_bn: bool = False):  # fmt: skip
        super().__init__()
        if last_layer not in LAST_LAYERS:
            raise ValueError(f"last_layer={last_layer!r}: choose one of {', '.join(LAST_LAYERS)}")
        self.last_layer, self.use_bn = last_layer, use_bn
        nlayers = max(nlayers, 1)
        if nlayers == 1:  # _build_mlp, dinov2 lines 44-58 (a one-layer head has no hidden layer to normalise)
            self.mlp = nn.Sequential(nn.Linear(in_dim, bottleneck_dim))
        else:
            layers: list[nn.Module] = []
            width = in_dim
            for _ in range(nlayers - 1):
                layers.append(nn.Linear(width, hidden_dim))
                if use_bn:
                    layers.append(nn.BatchNorm1d(hidden_dim))
                layers.append(nn.GELU())
                width = hidden_dim
            layers.append(nn.Linear(hidden_dim, bottleneck_dim))
            self.mlp = nn.Sequential(*layers)
        self.last_v = nn.Parameter(torch.empty(out_dim, bottleneck_dim))
        if last_layer != "linear":
            self.last_g = nn.Parameter(torch.ones(out_dim, 1), requires_grad=last_layer == "weight_norm")
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        if self.last_layer == "linear":
            nn.init.trunc_normal_(self.last_v, std=0.02)
        else:
            nn.init.kaiming_uniform_(self.last_v, a=math.sqrt(5))  # nn.Linear.reset_parameters
            self.last_g.fill_(1.0)

    @property
    def row_names(self) -> tuple[str, ...]:
        """The prototypes' parameters, split on their rows under tensor parallelism."""
        return ("last_v",) if self.last_layer == "linear" else ("last_v", "last_g")

    def last_layer_parameters(self) -> list[nn.Parameter]:
        """The prototypes' parameters (frozen for ``freeze_last_layer_epochs``; ``g`` of a ``normalized``
        layer never trains)."""
        return [getattr(self, n) for n in self.row_names]

    def weight(self) -> torch.Tensor:
        """The prototypes ``(K, bottleneck)`` as the layer applies them."""
        if self.last_layer == "linear":
            return self.last_v
        return self.last_g * self.last_v / torch.linalg.vector_norm(self.last_v, dim=1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mlp(x)
        eps = 1e-6 if x.dtype == torch.float16 else 1e-12  # dinov2 line 38
        x = nn.functional.normalize(x, dim=-1, p=2, eps=eps)
        w = self.weight()
        if isinstance(w, DTensor):  # prototypes split over the TP ranks (vitscale.tasks.dino_layout.split_heads)
            x = DTensor.from_local(x, w.device_mesh, [Replicate()], run_check=False)  # its gradient all-reduced
            return nn.functional.linear(x, w.to(x.dtype)).full_tensor()  # the logits gathered
        return nn.functional.linear(x, w.to(x.dtype))


__all__ = ["LAST_LAYERS", "DinoHead"]
