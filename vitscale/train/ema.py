"""Exponential moving average of the weights (kept in fp32 next to the model)."""

from __future__ import annotations

import copy

import torch
from torch import nn


class EMA:
    """``ema = decay * ema + (1 - decay) * param`` after every optimizer step; buffers are copied.

    The EMA model is a deep copy of the (possibly parallelized) model, so its parameters are sharded
    exactly like the model's and checkpoint through the same state-dict path.
    """

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        ema_p = [p for p in self.module.parameters()]
        src_p = [p.detach() for p in model.parameters()]
        torch._foreach_lerp_(ema_p, src_p, 1.0 - self.decay)
        for b_ema, b in zip(self.module.buffers(), model.buffers()):
            b_ema.copy_(b)
