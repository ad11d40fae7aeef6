"""NaFlex Vision Transformer: variable-length patch sequences at each image's native aspect ratio.

Pure single-device PyTorch. The same pre-norm (or ViT-22B parallel) blocks, heads and
initialisation as :class:`vitscale.models.vit.VisionTransformer`; what differs is the input side,
as in timm's ``NaFlexVit`` and big_vision's ``naflex_vit.py``:

- the patch embedding is a Linear on flattened ``(ph, pw, C)`` patches, so a batch may be a NaFlex
  dict (:mod:`vitscale.models.naflex.patches`) or plain images ``(B, C, H, W)`` of any size (patched
  here, no mask: the classic path, exactly a ViT's computation);
- the learned position-embedding grid is resampled to every image's own patch grid
  (:mod:`vitscale.models.naflex.pos_embed`); prefix tokens take none;
- attention reads only the valid tokens (a key mask; SDPA or FlexAttention, ``attn_impl``), and
  average / MAP pooling pool only them.

Parallelism is applied from outside (``vitscale/models/naflex/parallelize.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..common.attention_mask import key_padding_mask
from ..common.checkpointing import run_blocks
from ..common.init import init_vit_layers, trunc_normal_
from ..vit.model import build_trunk
from .configs import NaFlexConfig
from .patches import check_patch_batch, image_grids, is_patch_batch, patchify
from .pos_embed import factorized_table, gather_by_coord, learned_table
from .state_dict_adapter import state_dict_from_vit

_NO_DENSE = "NaFlexViT gives no per-token class logits (token labeling needs a ViT or VOLO model)"
_NO_TOKENS = "NaFlexViT gives no token interface (tokens, keep, mask, intermediates): self-supervised tasks and token probes need a ViT"


class NaFlexViT(nn.Module):
    """ViT over NaFlex batches or plain images. ``cfg`` is a :class:`NaFlexConfig`.

    Implements :class:`vitscale.models.contract.Model`; ``model(batch)`` takes a NaFlex dict
    (``patches``, ``patch_coord``, ``patch_valid``) or images.
    """

    supports_dense = False
    supports_tokens = False  # not yet: keep / mask of a padded NaFlex sequence (forward_tokens)
    supports_intermediates = False
    distill_head = False  # no distillation token: distillation losses use the class logits
    input_modes = ("fixed", "multi", "naflex")

    def __init__(self, cfg: NaFlexConfig, device=None, dtype=None):
        super().__init__()
        if cfg.pos_embed_grid is None:  # the grid of this image size, fixed from now on (a weight shape)
            cfg = replace(cfg, pos_embed_grid=cfg.grid)
        self.cfg = cfg
        D, L = cfg.hidden_size, cfg.class_token_length
        self.num_features = D
        self.num_prefix_tokens = L
        self.grad_checkpointing = False
        self.patch_embed = nn.Linear(cfg.patch_features, D, bias=cfg.patch_bias, device=device, dtype=dtype)
        self.cls_token = nn.Parameter(torch.empty(1, L, D, device=device, dtype=dtype)) if L > 0 else None
        gh, gw = cfg.pos_embed_grid
        if cfg.pos_embed_type == "learned":
            self.pos_embed = nn.Parameter(torch.empty(1, gh, gw, D, device=device, dtype=dtype))
            self.pos_embed_y = self.pos_embed_x = None
        else:
            self.pos_embed = None
            self.pos_embed_y = nn.Parameter(torch.empty(1, gh, D, device=device, dtype=dtype))
            self.pos_embed_x = nn.Parameter(torch.empty(1, gw, D, device=device, dtype=dtype))
        self.pos_drop = nn.Dropout(cfg.hidden_dropout)
        build_trunk(self, cfg, device, dtype)
        self._register_load_state_dict_pre_hook(self._convert_on_load)

    def _convert_on_load(self, state_dict, prefix, *args) -> None:
        """A classic ViT's weights (or another grid size) load as this model's (``state_dict_from_vit``);
        a ViT's training-only mask token (``ViTConfig.mask_token``) is dropped: a NaFlex ViT has none."""
        state_dict.pop(prefix + "mask_token", None)
        state_dict_from_vit(state_dict, self.cfg, prefix)

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter in place (the ViT's scheme); works after ``to_empty()`` and
        on sharded parameters."""
        init_vit_layers(self)
        for p in (self.pos_embed, self.pos_embed_y, self.pos_embed_x):
            if p is not None:
                trunc_normal_(p, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.attn_pool is not None:
            trunc_normal_(self.attn_pool.latent, std=self.num_features**-0.5)
        if isinstance(self.head, nn.Linear):
            nn.init.constant_(self.head.bias, self.cfg.head_bias_init)

    # ------------------------------------------------------------------ API
    def no_weight_decay(self) -> set[str]:
        names = {n for n in ("pos_embed", "pos_embed_y", "pos_embed_x") if getattr(self, n) is not None}
        if self.cls_token is not None:
            names.add("cls_token")
        if self.attn_pool is not None:
            names.add("attn_pool.latent")
        return names

    def head_parameter_names(self) -> set[str]:
        return {f"head.{n}" for n, _ in self.head.named_parameters()}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def reset_classifier(self, num_classes: int) -> None:
        """A new classifier with ``num_classes`` outputs (0 removes it)."""
        ref = self.patch_embed.weight
        self.num_classes = num_classes
        self.cfg = replace(self.cfg, num_classes=num_classes)
        if num_classes > 0:
            self.head = nn.Linear(self.num_features, num_classes, device=ref.device, dtype=ref.dtype)
            if ref.device.type != "meta":
                with torch.no_grad():
                    trunc_normal_(self.head.weight, std=0.02)
                    nn.init.constant_(self.head.bias, self.cfg.head_bias_init)
        else:
            self.head = nn.Identity()

    # ------------------------------------------------------------------ embeddings
    def pos_table(self, hw: tuple[int, int]) -> torch.Tensor:
        """The position embeddings of a ``(rows, columns)`` patch grid, ``(rows*cols, D)`` row-major."""
        c = self.cfg
        if self.pos_embed is not None:
            return learned_table(self.pos_embed, hw, c.pos_embed_interp, c.pos_embed_ar_preserving)
        return factorized_table(self.pos_embed_y, self.pos_embed_x, hw, c.pos_embed_ar_preserving)

    def _embed(self, x: torch.Tensor | Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Images or a NaFlex batch -> tokens ``(B, prefix + N, D)`` and the patch validity ``(B, N)``
        (None for images: every token is real)."""
        if is_patch_batch(x):
            check_patch_batch(x, self.cfg.patch_features)
            coord, valid = x["patch_coord"], x["patch_valid"].bool()
            tok = self.patch_embed(x["patches"])  # (B, N, D)
            grids = image_grids(coord, valid)
            tables = {g: self.pos_table(g) for g in dict.fromkeys(grids)}  # each distinct grid once
            tok = tok + gather_by_coord(tables, grids, coord, valid).to(tok.dtype)
        else:
            p = self.cfg.patch_dim
            grid = (x.shape[-2] // p, x.shape[-1] // p)
            tok = self.patch_embed(patchify(x, p))  # (B, N, D)
            tok = tok + self.pos_table(grid).to(tok.dtype)
            valid = None
        if self.cls_token is not None:
            tok = torch.cat([self.cls_token.expand(tok.shape[0], -1, -1), tok], dim=1)  # (B, L+N, D)
        return self.pos_drop(tok), valid

    # ------------------------------------------------------------------ forward
    def _features(self, x) -> tuple[torch.Tensor, torch.Tensor | None]:
        x, valid = self._embed(x)
        x = self.norm_pre(x)
        if valid is None:  # images: nothing to mask, SDPA's unmasked path
            x = run_blocks(self.blocks, x, self.grad_checkpointing)
        else:
            mask = key_padding_mask(valid, self.num_prefix_tokens, self.cfg.attn_impl)
            x = run_blocks(self.blocks, x, self.grad_checkpointing, attn_mask=mask)
        return self.norm(x), valid

    def forward_features(self, x: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Images ``(B, C, H, W)`` or a NaFlex batch -> normalised tokens ``(B, prefix + N, D)``
        (padding tokens included: pool them with ``forward_head(..., patch_valid=...)``)."""
        return self._features(x)[0]

    def pool(self, x: torch.Tensor, patch_valid: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens ``(B, T, D)`` -> pooled ``(B, D)`` over the valid patch tokens (all of them when
        ``patch_valid`` is None); pool ``none`` gives every token."""
        pool, L = self.cfg.pool, self.num_prefix_tokens
        if pool == "token":
            return x[:, 0]
        if pool == "none":
            return x
        patches = x[:, L:]
        if pool == "map":
            mask = None if patch_valid is None else key_padding_mask(patch_valid, 0, "sdpa")
            return self.attn_pool(patches, attn_mask=mask)
        if patch_valid is None:
            return patches.mean(dim=1)
        keep = patch_valid.to(patches.dtype)[..., None]  # (B, N, 1)
        return (patches * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1)  # (B, D)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, patch_valid: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens -> logits (or the pooled features with ``pre_logits``); ``patch_valid`` ``(B, N)``
        of a NaFlex batch keeps its padding out of the pool."""
        x = self.fc_norm(self.pool(x, patch_valid))
        x = self.pre_logits(self.head_drop(x))
        return x if pre_logits else self.head(x)

    def forward(self, x, dense: bool = False, mix: Any = None, pre_logits: bool = False) -> torch.Tensor:
        if dense:
            raise NotImplementedError(_NO_DENSE)
        feats, valid = self._features(x)
        return self.forward_head(feats, pre_logits=pre_logits, patch_valid=valid)

    def forward_dense(self, x, mix=None):
        raise NotImplementedError(_NO_DENSE)

    def token_grid(self, img_hw: tuple[int, int]) -> tuple[int, int]:
        raise NotImplementedError(_NO_DENSE)

    def forward_tokens(self, x, keep=None, mask=None):
        raise NotImplementedError(_NO_TOKENS)

    def forward_intermediates(self, x, blocks):
        raise NotImplementedError(_NO_TOKENS)

    # ------------------------------------------------------------------ sizes
    def example_inputs(self, batch: int, device=None) -> tuple[torch.Tensor, ...]:
        c = self.cfg
        return (torch.randn(batch, c.num_channels, c.img_h, c.img_w, device=device),)


__all__ = ["NaFlexViT"]
