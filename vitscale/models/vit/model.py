"""Vision Transformer: standard and ViT-22B parallel blocks, token / avg / MAP heads.

Pure single-device PyTorch. Parallelism (FSDP, tensor parallel, activation checkpointing wrappers)
is applied from outside by ``vitscale.models.vit.parallelize``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn

from ..common import (
    Attention,
    AttentionPoolHead,
    DropPath,
    LayerScale,
    Mlp,
    PatchDropout,
    PatchEmbed,
    SwiGLU,
    make_activation,
    make_norm,
    resample_pos_embed,
    sincos_2d,
)
from ..common.attention import sdpa
from ..common.checkpointing import run_block, run_blocks
from ..common.fused_mlp import fused_mlp
from ..common.init import init_vit_layers, trunc_normal_
from ..common.rope import apply_rope, gather_rope, rope_positions, rope_sin_cos
from ..common.token_mix import TokenMix, apply_token_mix
from ..contract import Tokens
from .configs import ViTConfig


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)); x + mlp(norm2(x)).

    Two switches, set by ``vitscale.distributed.epilogue`` (``precision.residual`` /
    ``precision.mlp_epilogue``), off by default: ``residual_dtype`` holds the residual stream in that
    dtype (the block's input cast to it, each branch's output cast before the add: bf16 under bf16
    autocast, as Megatron-core's ``fp32_residual_connection=False``); ``mlp_epilogue`` computes the MLP
    with GELU and the bias gradients in the cuBLASLt epilogues (:mod:`vitscale.models.common.fused_mlp`).
    """

    residual_dtype: torch.dtype | None = None
    mlp_epilogue: bool = False

    def __init__(self, cfg: ViTConfig, drop_path: float = 0.0, device=None, dtype=None):
        super().__init__()
        D, eps, nb, nt = cfg.hidden_size, cfg.norm_eps, cfg.norm_bias, cfg.norm_type
        self.norm1 = make_norm(D, eps, nb, device, dtype, nt)
        self.attn = Attention(
            D, cfg.num_attention_heads, qkv_bias=cfg.qkv_bias, proj_bias=cfg.proj_bias, qk_norm=cfg.qk_norm,
            norm_eps=eps, norm_bias=nb, norm_type=nt, attn_drop=cfg.attention_dropout, proj_drop=cfg.hidden_dropout,
            key_bias=cfg.key_bias, rope_rotate_half=cfg.rope_rotate_half,
            rope_mixed=cfg.learned_rope_freqs, rope_temperature=cfg.rope_temperature,
            inner_norm=cfg.attn_inner_norm, device=device, dtype=dtype,
        )  # fmt: skip
        ls = cfg.layer_scale_init
        self.ls1 = LayerScale(D, ls, device, dtype) if ls is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = make_norm(D, eps, nb, device, dtype, nt)
        if cfg.mlp_type == "swiglu":
            inner = make_norm(cfg.ffn_hidden_size, eps, nb, device, dtype, nt) if cfg.mlp_inner_norm else None  # EVA-02's sub-LN
            self.mlp = SwiGLU(D, cfg.ffn_hidden_size, bias=cfg.mlp_bias, dropout=cfg.hidden_dropout, device=device, dtype=dtype,
                              norm=inner)  # fmt: skip
        else:
            self.mlp = Mlp(
                D, cfg.ffn_hidden_size, bias=cfg.mlp_bias, activation=cfg.activation, dropout=cfg.hidden_dropout,
                device=device, dtype=dtype,
            )  # fmt: skip
        self.ls2 = LayerScale(D, ls, device, dtype) if ls is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, rope=None) -> torch.Tensor:
        """``attn_mask``: None, or which keys each query may attend to (NaFlex padding; see ``sdpa``);
        ``rope``: None, or the patch tokens' rotary ``(sin, cos)`` (``pos_embed='rope'``)."""
        rd = self.residual_dtype
        if rd is None:  # the stream in the dtype the adds promote it to (float32 under autocast)
            x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, rope=rope)))
            return x + self.drop_path2(self.ls2(self._mlp(self.norm2(x))))
        x = x.to(rd)  # the first block's input: promoted by the fp32 position embedding (_pos_embed)
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, rope=rope))).to(rd)
        return x + self.drop_path2(self.ls2(self._mlp(self.norm2(x)))).to(rd)  # LayerScale's fp32 gamma too

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.mlp_epilogue:
            return fused_mlp(self.mlp, x)
        return self.mlp(x)


class ParallelBlock(nn.Module):
    """ViT-22B block: x + out_proj_per_head([attn(norm(x)), mlp_act(norm(x))]) with fused in/out projections.

    ``in_proj_per_head`` computes Q, K, V and the MLP's first layer in one matmul. Its output rows are grouped
    per head, ``(H, 3*Dh + F/H)`` — head h's q, k, v, then its 1/H share of the MLP hidden units —
    and ``out_proj_per_head`` reads its input in the matching ``(H, Dh + F/H)`` order, so contiguous row /
    column sharding (Megatron column / row parallel) gives every rank whole heads and an equal
    slice of the MLP. The MLP hidden units keep their natural order (unit j sits in group j // (F/H)).
    """

    def __init__(self, cfg: ViTConfig, drop_path: float = 0.0, device=None, dtype=None):
        super().__init__()
        D, H, F_ = cfg.hidden_size, cfg.num_attention_heads, cfg.ffn_hidden_size
        eps, nb, nt = cfg.norm_eps, cfg.norm_bias, cfg.norm_type
        self.num_heads = H
        self.head_dim = D // H
        self.mlp_per_head = F_ // H
        self.rope_rotate_half = cfg.rope_rotate_half
        self.attn_drop = cfg.attention_dropout
        self.norm = make_norm(D, eps, nb, device, dtype, nt)
        self.in_proj_per_head = nn.Linear(D, H * (3 * self.head_dim + self.mlp_per_head), bias=cfg.qkv_bias, device=device, dtype=dtype)
        # Without a QKV bias the MLP keeps its own bias, laid out per head like the in_proj_per_head rows.
        if cfg.mlp_bias and not cfg.qkv_bias:
            self.mlp_bias_per_head = nn.Parameter(torch.empty(H, self.mlp_per_head, device=device, dtype=dtype))
        else:
            self.register_parameter("mlp_bias_per_head", None)
        self.q_norm = make_norm(self.head_dim, eps, nb, device, dtype, nt) if cfg.qk_norm else nn.Identity()
        self.k_norm = make_norm(self.head_dim, eps, nb, device, dtype, nt) if cfg.qk_norm else nn.Identity()
        self.act = make_activation(cfg.activation)
        self.mlp_drop = nn.Dropout(cfg.hidden_dropout)
        self.out_proj_per_head = nn.Linear(
            H * (self.head_dim + self.mlp_per_head), D, bias=cfg.proj_bias or cfg.mlp_bias, device=device, dtype=dtype
        )
        self.out_drop = nn.Dropout(cfg.hidden_dropout)
        ls = cfg.layer_scale_init
        self.ls = LayerScale(D, ls, device, dtype) if ls is not None else nn.Identity()
        self.drop_path = DropPath(drop_path)

    residual_dtype: torch.dtype | None = None
    """As :attr:`Block.residual_dtype`."""

    def init_weights(self) -> None:
        if self.mlp_bias_per_head is not None:
            nn.init.zeros_(self.mlp_bias_per_head)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, rope=None) -> torch.Tensor:
        if self.residual_dtype is not None:
            x = x.to(self.residual_dtype)
        B, N, _ = x.shape
        Dh, Fh = self.head_dim, self.mlp_per_head
        y = self.in_proj_per_head(self.norm(x)).reshape(B, N, -1, 3 * Dh + Fh)  # (B, N, H, 3*Dh + F/H)
        # One split into q, k, v and the MLP part: its backward writes the four gradients straight into
        # in_proj_per_head's output gradient (one cat), where splitting off QKV and unbinding it stacked dq, dk,
        # dv first and copied the stack again.
        q, k, v, h = y.split([Dh, Dh, Dh, Fh], dim=-1)  # 3 x (B, N, H, Dh), (B, N, H, F/H)
        if self.mlp_bias_per_head is not None:
            h = h + self.mlp_bias_per_head
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # 3 x (B, H, N, Dh)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope, self.rope_rotate_half), apply_rope(k, rope, self.rope_rotate_half)
        a = sdpa(q, k, v, attn_mask=attn_mask, dropout_p=self.attn_drop if self.training else 0.0).transpose(1, 2)  # (B, N, H, Dh)
        h = self.mlp_drop(self.act(h))
        y = self.out_proj_per_head(torch.cat([a, h], dim=-1).reshape(B, N, -1))  # (B, N, D)
        y = self.drop_path(self.ls(self.out_drop(y)))
        return x + y if self.residual_dtype is None else x + y.to(self.residual_dtype)


def build_trunk(model: nn.Module, cfg, device=None, dtype=None) -> None:
    """The part of a ViT after its tokens are embedded, registered on ``model`` in this order (the
    order of its parameters, and of the draws of ``init_weights``): ``norm_pre``, the ``blocks`` (plain
    or ViT-22B parallel, stochastic depth rising linearly to ``drop_path_rate``), the final ``norm`` or
    ``fc_norm``, the MAP ``attn_pool``, ``head_drop``, ``pre_logits`` and the classifier ``head``. One
    builder for the ViT and the NaFlex ViT, whose configs share these fields."""
    D, eps, nb, nt = cfg.hidden_size, cfg.norm_eps, cfg.norm_bias, cfg.norm_type
    model.norm_pre = make_norm(D, eps, nb, device, dtype, nt) if cfg.pre_norm else nn.Identity()
    block_cls = ParallelBlock if cfg.parallel_block else Block
    n = cfg.num_layers
    # linear stochastic-depth rule (timm), or one rate for every block (DeiT III)
    dpr = [cfg.drop_path_rate if cfg.drop_path_constant else cfg.drop_path_rate * i / max(n - 1, 1) for i in range(n)]
    model.blocks = nn.ModuleList([block_cls(cfg, dpr[i], device, dtype) for i in range(n)])
    use_fc_norm = cfg.use_fc_norm
    model.norm = make_norm(D, eps, nb, device, dtype, nt) if cfg.final_norm and not use_fc_norm else nn.Identity()
    model.attn_pool = (
        AttentionPoolHead(
            D, cfg.num_attention_heads, cfg.ffn_hidden_size, norm_eps=eps, norm_bias=nb, norm_type=nt,
            activation=cfg.activation, device=device, dtype=dtype,
        )
        if cfg.pool == "map"
        else None
    )  # fmt: skip
    model.fc_norm = make_norm(D, eps, nb, device, dtype, nt) if cfg.final_norm and use_fc_norm else nn.Identity()
    model.head_drop = nn.Dropout(cfg.head_dropout)
    model.pre_logits = (
        nn.Sequential(nn.Linear(D, D, device=device, dtype=dtype), nn.Tanh()) if cfg.pre_logits else nn.Identity()
    )
    model.num_classes = cfg.num_classes
    model.head = nn.Linear(D, cfg.num_classes, device=device, dtype=dtype) if cfg.num_classes > 0 else nn.Identity()


@torch.no_grad()
def fill_sincos_pos_embed(pos_embed: torch.Tensor, cfg) -> None:
    """Write ``pos_embed_sincos``'s table into ``pos_embed`` ``(1, n_pos, D)``: a zero row for each
    prefix token that takes one (``pos_embed_prefix``; MAE's class token, ``util/pos_embed.py``
    ``cls_token=True``), then :func:`~vitscale.models.common.pos_embed.sincos_2d` of the patch grid
    (facebookresearch/mae ``models_mae.py`` lines 68-69). A DTensor gets its shard of it; a local
    shard of the (size-1) first dimension, all of it or none."""
    D = cfg.hidden_size
    grid = sincos_2d(D, *cfg.grid, device=pos_embed.device)
    prefix = cfg.num_prefix_tokens if cfg.pos_embed_prefix else 0
    table = torch.cat([grid.new_zeros(prefix, D), grid])[None].to(pos_embed.dtype)
    if hasattr(pos_embed, "device_mesh"):  # a DTensor (sharded init on several GPUs)
        from vitscale.distributed.tensor_parallel import distribute_tensor

        pos_embed.copy_(distribute_tensor(table, pos_embed.device_mesh, pos_embed.placements))
    else:
        pos_embed.copy_(table[: pos_embed.shape[0]])


class VisionTransformer(nn.Module):
    """ViT for classification and as the CLIP vision tower. ``cfg`` is a :class:`ViTConfig`.

    Implements :class:`vitscale.models.contract.Model`. Dense per-token logits (token labeling) are its
    own classifier applied to every patch token (pre-logits features -> head); its tokens
    (:meth:`forward_tokens`) and those of its last blocks (:meth:`forward_intermediates`) are asked
    through the call.
    """

    supports_dense = True
    supports_tokens = True
    supports_intermediates = True
    input_modes = ("fixed", "multi")  # another image size: position embeddings resampled in _pos_embed

    def __init__(self, cfg: ViTConfig, device=None, dtype=None):
        super().__init__()
        self.cfg = cfg
        D, L = cfg.hidden_size, cfg.class_token_length
        self.num_features = D
        self.num_prefix_tokens = P = cfg.num_prefix_tokens  # class token(s), registers, distillation token
        self.grad_checkpointing = False
        self.patch_embed = PatchEmbed(cfg.patch_dim, cfg.num_channels, D, bias=cfg.patch_bias, device=device, dtype=dtype)
        self.cls_token = nn.Parameter(torch.empty(1, L, D, device=device, dtype=dtype)) if L > 0 else None
        # DeiT's distillation token, after the class token(s) (timm's VisionTransformerDistilled order)
        self.dist_token = nn.Parameter(torch.empty(1, 1, D, device=device, dtype=dtype)) if cfg.distill_token else None
        # iBOT's mask token (cfg.mask_token; DINOv2's (1, D), vision_transformer.py line 169): no prefix token
        self.mask_token = nn.Parameter(torch.empty(1, D, device=device, dtype=dtype)) if cfg.mask_token else None
        n_pos = cfg.num_patches + (P if cfg.pos_embed_prefix else 0)
        learned = cfg.learned_pos_table  # pos_embed='learned', or RoPE with rope_ape; pos_embed_sincos: fixed, never trained
        self.pos_embed = (nn.Parameter(torch.empty(1, n_pos, D, device=device, dtype=dtype), requires_grad=not cfg.pos_embed_sincos)
                          if learned else None)  # fmt: skip
        self.pos_drop = nn.Dropout(cfg.hidden_dropout)
        self.patch_drop = PatchDropout(cfg.drop_patch_rate, P) if cfg.drop_patch_rate > 0 else nn.Identity()
        build_trunk(self, cfg, device, dtype)
        self.head_dist = self._new_head(cfg.num_classes, device, dtype) if cfg.distill_token else None
        self._register_load_state_dict_pre_hook(self._resample_pos_embed_on_load)
        self._register_load_state_dict_pre_hook(self._mask_token_on_load)

    @property
    def distill_head(self) -> bool:
        """Whether ``model(x, distill=True)`` gives the distillation token's own logits (DeiT)."""
        return self.dist_token is not None

    def _new_head(self, num_classes: int, device, dtype) -> nn.Module:
        return nn.Linear(self.num_features, num_classes, device=device, dtype=dtype) if num_classes > 0 else nn.Identity()

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter in place; works after ``to_empty()`` and on sharded params."""
        init_vit_layers(self)
        if self.cfg.patch_init == "fan_in":
            self.patch_embed.proj.reset_parameters()  # U(+-1/sqrt(fan_in)), weight and bias
        if self.pos_embed is not None and self.cfg.pos_embed_sincos:
            fill_sincos_pos_embed(self.pos_embed, self.cfg)
        elif self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.dist_token is not None:
            trunc_normal_(self.dist_token, std=0.02)  # as DeiT's (facebookresearch/deit, models.py)
        if self.mask_token is not None:
            nn.init.zeros_(self.mask_token)  # as DINOv2's (vision_transformer.py line 169)
        if self.attn_pool is not None:
            trunc_normal_(self.attn_pool.latent, std=self.num_features**-0.5)
        for head in (self.head, self.head_dist):
            if isinstance(head, nn.Linear):
                nn.init.constant_(head.bias, self.cfg.head_bias_init)

    # ------------------------------------------------------------------ API
    def no_weight_decay(self) -> set[str]:
        """Parameters that take no weight decay besides norms and biases (which the optimizer skips)."""
        names = {"pos_embed"} if self.pos_embed is not None else set()
        if self.cls_token is not None:
            names.add("cls_token")
        if self.dist_token is not None:
            names.add("dist_token")
        if self.mask_token is not None:
            names.add("mask_token")
        if self.attn_pool is not None:
            names.add("attn_pool.latent")
        # RoPE-Mixed's frequencies, as timm's RotaryEmbeddingMixed.no_weight_decay
        names |= {f"blocks.{i}.attn.rope_freqs" for i, b in enumerate(self.blocks)
                  if getattr(getattr(b, "attn", None), "rope_freqs", None) is not None}  # fmt: skip
        return names

    def head_parameter_names(self) -> set[str]:
        """The classifier's parameters (ViT-22B gives the head its own weight decay)."""
        names = {f"head.{n}" for n, _ in self.head.named_parameters()}
        if self.head_dist is not None:
            names |= {f"head_dist.{n}" for n, _ in self.head_dist.named_parameters()}
        return names

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def reset_classifier(self, num_classes: int, pool: str | None = None) -> None:
        """Replace the classifier (fine-tuning to a new label set); ``pool`` may switch token/avg."""
        if pool is not None and pool != self.cfg.pool:
            if pool == "map" or self.cfg.pool == "map":
                raise ValueError("switching to or from MAP pooling changes parameters: build a new model")
            self.cfg = replace(self.cfg, pool=pool)
        ref = self.patch_embed.proj.weight
        self.num_classes = num_classes
        self.cfg = replace(self.cfg, num_classes=num_classes)
        self.head = self._new_head(num_classes, ref.device, ref.dtype)
        if self.head_dist is not None:
            self.head_dist = self._new_head(num_classes, ref.device, ref.dtype)
        if num_classes > 0 and ref.device.type != "meta":
            with torch.no_grad():
                for head in (self.head, self.head_dist):
                    if head is not None:
                        trunc_normal_(head.weight, std=0.02)
                        nn.init.constant_(head.bias, self.cfg.head_bias_init)

    def set_image_size(self, img_h: int, img_w: int | None = None) -> None:
        """Resize the position embeddings to a new image size (high-resolution fine-tuning)."""
        new = self.cfg.with_image_size(img_h, img_w)
        if self.pos_embed is not None:
            with torch.no_grad():
                pe = resample_pos_embed(self.pos_embed.data, new.grid, self.cfg.grid, self._pos_prefix())
            self.pos_embed = nn.Parameter(pe, requires_grad=self.pos_embed.requires_grad)  # sincos: still fixed
        self.cfg = new  # RoPE: the angles follow the grid at every forward

    # ------------------------------------------------------------------ forward
    def _pos_prefix(self) -> int:
        return self.num_prefix_tokens if self.cfg.pos_embed_prefix else 0

    def rope(self, grid: tuple[int, int], device=None) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor | None:
        """The patch tokens' rotary ``(sin, cos)``, each ``(gh*gw, Dh)`` float32, for a token ``grid``
        (None without ``pos_embed='rope'``; ``rope_type='mixed'``: their ``(gh*gw, 2)`` positions, which
        each attention layer turns into its own angles); a caller that keeps only some patches gathers
        its rows (:func:`~vitscale.models.common.rope.gather_rope`)."""
        c = self.cfg
        if c.pos_embed != "rope":
            return None
        if c.rope_type == "mixed":
            return rope_positions(grid, c.rope_grid_offset, device=device)
        return rope_sin_cos(
            grid, c.hidden_size // c.num_attention_heads, c.rope_type, c.rope_temperature, c.rope_rotate_half,
            c.rope_grid_offset, c.rope_ref_grid, device=device,
        )  # fmt: skip

    def _pos_embed(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        pos = self.pos_embed
        if pos is not None and grid != self.cfg.grid:  # another image size at run time: interpolate on the fly
            pos = resample_pos_embed(pos, grid, self.cfg.grid, self._pos_prefix())
        B = x.shape[0]
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.dist_token) if t is not None]
        if pos is None:
            x = torch.cat([*prefix, x], dim=1)  # (B, P+N, D)
        elif not prefix:
            x = x + pos
        elif self.cfg.pos_embed_prefix:
            x = torch.cat([*prefix, x], dim=1) + pos  # (B, P+N, D)
        else:
            x = torch.cat([*prefix, x + pos], dim=1)  # (B, P+N, D)
        return self.pos_drop(x)

    def forward_features(self, x: torch.Tensor, keep: torch.Tensor | None = None,
                         mask: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Images ``(B, C, H, W)`` -> normalised tokens ``(B, prefix + patches, D)``.

        ``keep``: ``(B, K)`` indices of the patches (row-major in the patch grid) that go through the
        blocks, after their position embeddings (MAE's encoder on the visible patches, He et al. 2021,
        arXiv 2111.06377, section 3; facebookresearch/mae ``models_mae.py`` ``forward_encoder``): the
        tokens are then ``(B, prefix + K, D)``, the prefix tokens first, patch dropout not applied.
        ``mask``: ``(B, N)`` bool, the patches whose embeddings the mask token replaces (:meth:`_mask`)."""
        x, grid = self._embed(x, keep, mask)
        rope = self.rope(grid, x.device)
        if rope is not None and keep is not None:  # each image's kept patches' rows
            rope = gather_rope(rope, keep)
        x = run_blocks(self.blocks, x, self.grad_checkpointing, rope=rope)
        return self.norm(x)

    def forward_tokens(self, x: torch.Tensor, keep: torch.Tensor | None = None,
                       mask: torch.Tensor | None = None) -> Tokens:  # fmt: skip
        """Images -> :class:`~vitscale.models.contract.Tokens` (run it as ``model(x, tokens=True, keep=keep,
        mask=mask)``): ``sequence`` is :meth:`forward_features`, ``pooled`` :meth:`forward_head`'s
        pre-logits features of it, the prefix and patch tokens through ``fc_norm`` (the identity unless
        the model normalises after pooling, where ``norm`` is)."""
        grid = self.token_grid(tuple(x.shape[-2:]))
        seq = self.forward_features(x, keep, mask)
        P = self.num_prefix_tokens
        return Tokens(
            pooled=self.forward_head(seq, pre_logits=True), prefix=self.fc_norm(seq[:, :P]),
            patches=self.fc_norm(seq[:, P:]), sequence=seq, grid=grid, num_prefix=P,
        )  # fmt: skip

    def _mask(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Patch embeddings ``(B, N, D)`` with the mask token in place of the ``mask`` ``(B, N)`` ones,
        before the position embeddings are added: DINOv2's ``prepare_tokens_with_masks``
        (facebookresearch/dinov2 ``dinov2/models/vision_transformer.py`` line 218 masks, line 221 adds
        the position embeddings)."""
        if self.mask_token is None:
            raise ValueError(f"a mask needs the model's mask token: {type(self).__name__} was built without one "
                             "(build it with mask_token=True: model.mask_token=true)")  # fmt: skip
        if mask.dtype != torch.bool or tuple(mask.shape) != tuple(x.shape[:2]):
            raise ValueError(f"mask must be bool (batch, patches) = {tuple(x.shape[:2])}, got {mask.dtype} {tuple(mask.shape)}")
        return torch.where(mask[..., None], self.mask_token.to(x.dtype), x)

    def _embed(self, x: torch.Tensor, keep: torch.Tensor | None = None,
               mask: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[int, int]]:  # fmt: skip
        """Images -> the tokens the first block takes ``(B, prefix + patches, D)``, and the patch grid."""
        grid = (x.shape[-2] // self.cfg.patch_dim, x.shape[-1] // self.cfg.patch_dim)
        x = self.patch_embed(x)  # (B, N, D)
        if mask is not None:
            x = self._mask(x, mask)
        x = self._pos_embed(x, grid)
        if keep is not None:
            P = self.num_prefix_tokens
            kept = x[:, P:].gather(1, keep[..., None].expand(-1, -1, x.shape[-1]))  # (B, K, D)
            x = torch.cat([x[:, :P], kept], dim=1)
        else:
            x = self.patch_drop(x)
        return self.norm_pre(x), grid

    def forward_intermediates(self, x: torch.Tensor, blocks: int) -> list[torch.Tensor]:
        """Images -> the tokens ``(B, prefix + patches, D)`` after each of the last ``blocks`` blocks,
        oldest first, each through the final normalisation (``norm``, or ``fc_norm`` where the model
        normalises after pooling): DINOv2's ``get_intermediate_layers(x, n, norm=True)``
        (facebookresearch/dinov2, ``dinov2/models/vision_transformer.py`` lines 299-323)."""
        x, grid = self._embed(x)
        rope = self.rope(grid, x.device)
        first = len(self.blocks) - blocks
        out = []
        for i, block in enumerate(self.blocks):
            x = run_block(block, x, self.grad_checkpointing, rope=rope)
            if i >= first:
                out.append(self.fc_norm(self.norm(x)))
        return out

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``(B, T, D)`` -> pooled features ``(B, D)`` (``(B, T, D)`` for pool='none')."""
        pool = self.cfg.pool
        if pool == "map":
            return self.attn_pool(x[:, self.num_prefix_tokens :])
        if pool == "token":
            return x[:, 0]
        if pool == "avg":
            return x[:, self.num_prefix_tokens :].mean(dim=1)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, distill: bool = False):
        """Tokens -> logits (pooled features with ``pre_logits``). With a distillation token: the mean
        of the class and distillation heads, or both ``(class, distillation)`` with ``distill``
        (without one, ``distill`` gives the class logits twice: DeiT's distillation without a token)."""
        out = self._classify(self.pool(x), pre_logits)
        if self.dist_token is None:
            return (out, out) if distill else out
        d = self.head_drop(self.fc_norm(x[:, self.cfg.class_token_length]))  # the distillation token (B, D)
        d = self.pre_logits(d)
        if pre_logits:
            return (out + d) / 2
        d = self.head_dist(d)
        return (out, d) if distill else (out + d) / 2

    def _classify(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pooled features ``(B, D)`` (or every token, ``(B, T, D)``) -> logits."""
        x = self.fc_norm(x)
        x = self.head_drop(x)
        x = self.pre_logits(x)
        return x if pre_logits else self.head(x)

    def forward_dense(self, x: torch.Tensor, mix: TokenMix | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits ``(B, C)`` and the classifier on every patch token ``(B, gh, gw, C)``, from one
        pass: the class logits are the class token's (pool ``token``) or the pooled features' through
        the head, as a plain ``model(x)`` call gives them."""
        p = self.cfg.patch_dim
        B, gh, gw = x.shape[0], x.shape[-2] // p, x.shape[-1] // p
        if mix is not None:  # swap whole patches = swap patch tokens (ViT patches do not overlap)
            x = apply_token_mix(x.permute(0, 2, 3, 1), mix, p).permute(0, 3, 1, 2)
        feats = self.forward_features(x)
        every = self._classify(feats)  # (B, prefix + N, C)
        tok = every[:, self.num_prefix_tokens :].reshape(B, gh, gw, -1)  # (B, gh, gw, C)
        cls = every[:, 0] if self.cfg.pool == "token" and self.dist_token is None else self.forward_head(feats)
        return cls, tok

    def forward(self, x: torch.Tensor, dense: bool = False, mix: TokenMix | None = None, pre_logits: bool = False,
                distill: bool = False, keep: torch.Tensor | None = None, intermediates: int = 0,
                tokens: bool = False, mask: torch.Tensor | None = None):  # fmt: skip
        """Class logits; ``dense``: and per-token logits; ``pre_logits``: the pooled features;
        ``distill``: ``(class logits, distillation-token logits)`` (DeiT; see :meth:`forward_head`);
        ``tokens``: the :class:`~vitscale.models.contract.Tokens` of the kept (``keep``) patches, the
        ``mask`` ones replaced by the mask token (:meth:`forward_tokens`; DINO, MAE);
        ``keep`` alone: the normalised tokens of the kept patches only (:meth:`forward_features`);
        ``intermediates``: the normalised tokens of the last N blocks (:meth:`forward_intermediates`)."""
        if tokens:  # through forward() so FSDP's hooks gather the parameters
            return self.forward_tokens(x, keep, mask)
        if mask is not None:
            raise ValueError("a mask is asked with the tokens: model(x, tokens=True, mask=mask)")
        if keep is not None:  # through forward() so FSDP's hooks gather the parameters
            return self.forward_features(x, keep)
        if intermediates:  # through forward() so FSDP's hooks gather the parameters (probes)
            return self.forward_intermediates(x, intermediates)
        if dense:  # through forward() so FSDP's hooks gather the parameters
            return self.forward_dense(x, mix)
        if pre_logits:  # the pooled features (probes), also through forward()
            return self.forward_head(self.forward_features(x), pre_logits=True)
        return self.forward_head(self.forward_features(x), distill=distill)

    # ------------------------------------------------------------------ sizes
    def example_inputs(self, batch: int, device=None) -> tuple[torch.Tensor, ...]:
        c = self.cfg
        return (torch.randn(batch, c.num_channels, c.img_h, c.img_w, device=device),)

    def token_grid(self, img_hw: tuple[int, int]) -> tuple[int, int]:
        return img_hw[0] // self.cfg.patch_dim, img_hw[1] // self.cfg.patch_dim

    # ------------------------------------------------------------------ loading
    def _mask_token_on_load(self, state_dict, prefix, *args) -> None:
        """The mask token is training-only (``cfg.mask_token``): weights without one (timm's, a
        classifier's) leave it at its init, zeros; a model without one ignores one in its weights (a
        DINO run's, loaded to fine-tune), as timm's DINOv2 conversion drops DINOv2's."""
        key = prefix + "mask_token"
        ref = state_dict.get(prefix + "patch_embed.proj.weight")  # None: these weights are not this model's
        if self.mask_token is None:
            state_dict.pop(key, None)
        elif key not in state_dict and ref is not None:
            state_dict[key] = torch.zeros(1, self.num_features, dtype=ref.dtype)

    def _resample_pos_embed_on_load(self, state_dict, prefix, *args) -> None:
        key = prefix + "pos_embed"
        pe = state_dict.get(key)
        if pe is None or self.pos_embed is None or pe.shape == self.pos_embed.shape:
            return
        n_prefix = self._pos_prefix()
        n_old = pe.shape[1] - n_prefix if pe.dim() == 3 else -1
        side = math.isqrt(max(n_old, 0))
        if n_old <= 0 or side * side != n_old:
            return  # no grid, or not a square one: let load_state_dict report the shape mismatch
        state_dict[key] = resample_pos_embed(pe, self.cfg.grid, (side, side), n_prefix)


__all__ = ["Block", "ParallelBlock", "VisionTransformer", "fill_sincos_pos_embed"]
