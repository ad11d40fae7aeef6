"""The toy family's model: pure single-device PyTorch implementing vitscale's model contract."""

from __future__ import annotations

import torch
from torch import nn

from vitscale.models.common.checkpointing import run_blocks

from .configs import ToyConfig


class MlpBlock(nn.Module):
    """x + fc2(gelu(fc1(norm(x)))) on tokens ``(B, N, D)``."""

    def __init__(self, cfg: ToyConfig, device=None, dtype=None):
        super().__init__()
        D, F = cfg.hidden_size, cfg.mlp_hidden_size
        self.norm = nn.LayerNorm(D, device=device, dtype=dtype)
        self.fc1 = nn.Linear(D, F, device=device, dtype=dtype)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(F, D, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class ToyNet(nn.Module):
    supports_dense = False
    supports_tokens = False
    supports_intermediates = False
    distill_head = False
    input_modes = ("fixed", "multi")  # no position embedding: any multiple of the patch

    def __init__(self, cfg: ToyConfig, device=None, dtype=None):
        super().__init__()
        self.cfg = cfg
        self.num_classes = cfg.num_classes
        p, D = cfg.patch_dim, cfg.hidden_size
        self.patch_embed = nn.Linear(cfg.num_channels * p * p, D, device=device, dtype=dtype)
        self.blocks = nn.ModuleList([MlpBlock(cfg, device, dtype) for _ in range(cfg.num_layers)])
        self.norm = nn.LayerNorm(D, device=device, dtype=dtype)
        self.head = nn.Linear(D, cfg.num_classes, device=device, dtype=dtype)
        self.grad_checkpointing = False

    @torch.no_grad()
    def init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        p = self.cfg.patch_dim
        B, C, H, W = x.shape
        x = x.unfold(2, p, p).unfold(3, p, p)  # (B, C, H/p, W/p, p, p)
        x = x.permute(0, 2, 3, 1, 4, 5).reshape(B, (H // p) * (W // p), C * p * p)  # (B, N, C*p*p)
        x = self.patch_embed(x)  # (B, N, D)
        x = run_blocks(self.blocks, x, self.grad_checkpointing)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x.mean(dim=1)  # (B, D)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.forward_head(self.forward_features(x), pre_logits=pre_logits)

    def no_weight_decay(self) -> set[str]:
        return set()

    def head_parameter_names(self) -> set[str]:
        return {f"head.{n}" for n, _ in self.head.named_parameters()}

    def reset_classifier(self, num_classes: int) -> None:
        ref = self.head.weight
        self.num_classes = num_classes
        self.head = nn.Linear(self.cfg.hidden_size, num_classes, device=ref.device, dtype=ref.dtype)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def example_inputs(self, batch: int, device=None) -> tuple[torch.Tensor, ...]:
        c = self.cfg
        return (torch.randn(batch, c.num_channels, c.img_h, c.img_w, device=device),)

    def token_grid(self, img_hw):
        raise NotImplementedError("ToyNet gives no per-token class logits")

    def forward_dense(self, x, mix=None):
        raise NotImplementedError("ToyNet gives no per-token class logits")

    def forward_tokens(self, x, keep=None, mask=None):
        raise NotImplementedError("ToyNet gives no token interface")

    def forward_intermediates(self, x, blocks):
        raise NotImplementedError("ToyNet gives no token interface")
