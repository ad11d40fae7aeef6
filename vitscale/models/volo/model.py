"""VOLO: outlook attention on a fine token grid, then transformer and class-attention stages.

Written from the paper's description (Yuan et al. 2021, Sec. 3 and Algorithm 1). Pure single-device
PyTorch; parallelism is applied from outside by ``vitscale.models.volo.parallelize``.

Outlook attention, for each window centre on a grid pooled by ``stride``: a linear layer maps the
centre token to ``heads x K^2 x K^2`` weights (for each of the K^2 window positions, a softmax over
the K^2 values it gathers); the values of the K x K window are unfolded, combined with those weights,
and the K^2 results per window are folded (summed) back onto the tokens they came from. That
aggregation runs as a fused Triton op on CUDA or as unfold / fold (``outlook_kernel.py``).

Layouts: ``OutlookAttention.v`` / ``.attn`` rows are head-major ``(H, Dh)`` / ``(H, K^2, K^2)``; the
transformer blocks use the common :class:`Attention` (fused QKV rows per head ``(H, 3, Dh)``, ``attn.qkv_per_head``);
the class attention's ``kv_per_head`` rows are per head ``(H, 2, Dh)``. The timm converter permutes.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from ..common import Attention, DropPath, Mlp, resample_pos_embed
from ..common.attention import sdpa
from ..common.checkpointing import run_blocks
from ..common.init import trunc_normal_
from ..common.token_mix import TokenMix, apply_token_mix
from .configs import OUTLOOK_IMPLS, VOLOConfig
from .outlook_kernel import outlook_attention, outlook_reference, use_kernel


class OutlookAttention(nn.Module):
    """Outlook attention on a channels-last grid ``(B, H, W, C)``. ``impl`` (``auto`` | ``triton`` |
    ``eager``, see :attr:`VOLOConfig.outlook_impl`) picks the fused Triton op or the
    unfold / fold reference; the attribute can be changed on a built model."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        kernel: int = 3,
        padding: int = 1,
        stride: int = 1,
        qkv_bias: bool = False,
        attn_drop: float = 0.0,
        impl: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"outlook dim {dim} is not divisible by heads {num_heads}")
        if impl not in OUTLOOK_IMPLS:
            raise ValueError(f"outlook_impl must be one of {OUTLOOK_IMPLS}, got {impl!r}")
        if impl == "triton" and attn_drop > 0:
            raise ValueError("outlook_impl='triton' has no attention dropout: set attention_dropout=0 or use 'auto'")
        self.impl = impl
        self.head_dim = dim // num_heads
        self.kernel, self.padding, self.stride = kernel, padding, stride
        self.scale = self.head_dim**-0.5
        self.v = nn.Linear(dim, dim, bias=qkv_bias, device=device, dtype=dtype)
        self.attn = nn.Linear(dim, num_heads * kernel**4, device=device, dtype=dtype)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stride
        v = self.v(x)  # (B, H, W, C)
        centre = x if s == 1 else F.avg_pool2d(x.permute(0, 3, 1, 2), s, s, ceil_mode=True).permute(0, 2, 3, 1)
        a = self.attn(centre)  # (B, h, w, nH*K2*K2), h = ceil(H / s)
        if use_kernel(self.impl, v, self.training and self.attn_drop.p > 0):
            y = outlook_attention(v, a, self.kernel, self.padding, s, self.scale)
        else:
            y = outlook_reference(v, a, self.kernel, self.padding, s, self.scale, self.attn_drop)
        return self.proj(y)  # (B, H, W, C)


class Outlooker(nn.Module):
    """x + outlook_attn(norm1(x)); x + mlp(norm2(x)) on a channels-last grid."""

    def __init__(self, cfg: VOLOConfig, drop_path: float = 0.0, device=None, dtype=None):
        super().__init__()
        D, eps = cfg.outlook_dim, cfg.norm_eps
        self.norm1 = nn.LayerNorm(D, eps=eps, device=device, dtype=dtype)
        self.attn = OutlookAttention(
            D, cfg.outlook_heads, cfg.outlook_kernel, cfg.outlook_padding, cfg.outlook_stride, cfg.qkv_bias,
            cfg.attention_dropout, cfg.outlook_impl, device=device, dtype=dtype,
        )  # fmt: skip
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(D, eps=eps, device=device, dtype=dtype)
        self.mlp = Mlp(D, int(D * cfg.outlook_mlp_ratio), device=device, dtype=dtype)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class TransformerBlock(nn.Module):
    """Pre-norm self-attention block on a token sequence ``(B, N, D)``."""

    def __init__(self, cfg: VOLOConfig, drop_path: float = 0.0, device=None, dtype=None):
        super().__init__()
        D, eps = cfg.hidden_size, cfg.norm_eps
        self.norm1 = nn.LayerNorm(D, eps=eps, device=device, dtype=dtype)
        self.attn = Attention(
            D, cfg.num_heads, qkv_bias=cfg.qkv_bias, attn_drop=cfg.attention_dropout, device=device, dtype=dtype
        )
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(D, eps=eps, device=device, dtype=dtype)
        self.mlp = Mlp(D, int(D * cfg.mlp_ratio), device=device, dtype=dtype)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class ClassAttention(nn.Module):
    """The class token (first token) attends to all tokens; only it is updated (CaiT)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False, attn_drop: float = 0.0, device=None, dtype=None):
        super().__init__()
        self.head_dim = dim // num_heads
        self.attn_drop = attn_drop
        self.q = nn.Linear(dim, dim, bias=qkv_bias, device=device, dtype=dtype)
        self.kv_per_head = nn.Linear(dim, 2 * dim, bias=qkv_bias, device=device, dtype=dtype)  # rows (H, 2, Dh)
        self.proj = nn.Linear(dim, dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        q = self.q(x[:, :1]).reshape(B, 1, -1, self.head_dim).transpose(1, 2)  # (B, H, 1, Dh)
        k, v = self.kv_per_head(x).reshape(B, N, -1, 2, self.head_dim).permute(3, 0, 2, 1, 4).unbind(0)  # 2 x (B, H, N, Dh)
        y = sdpa(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)  # (B, H, 1, Dh)
        return self.proj(y.transpose(1, 2).reshape(B, 1, -1))  # (B, 1, D)


class ClassBlock(nn.Module):
    """cls + attn(norm1(all tokens)); cls + mlp(norm2(cls)); the patch tokens pass through."""

    def __init__(self, cfg: VOLOConfig, device=None, dtype=None):
        super().__init__()
        D, eps = cfg.hidden_size, cfg.norm_eps
        self.norm1 = nn.LayerNorm(D, eps=eps, device=device, dtype=dtype)
        self.attn = ClassAttention(D, cfg.num_heads, cfg.qkv_bias, cfg.attention_dropout, device=device, dtype=dtype)
        self.norm2 = nn.LayerNorm(D, eps=eps, device=device, dtype=dtype)
        self.mlp = Mlp(D, int(D * cfg.mlp_ratio), device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cls = x[:, :1] + self.attn(self.norm1(x))  # (B, 1, D)
        cls = cls + self.mlp(self.norm2(cls))
        return torch.cat([cls, x[:, 1:]], dim=1)


class ConvStem(nn.Module):
    """Three conv-BN-ReLU layers (the first with stride ``stem_stride``), then a patchifying conv.

    Computed in ``channels_last`` (NHWC) memory (``VOLOConfig.stem_fast``, the default): cuDNN's convolutions and BatchNorm run NHWC natively,
    so no NCHW <-> NHWC transposes go around each of them on a GPU, and the output — wanted
    channels-last, ``(B, H/p, W/p, D)`` — is then a free view instead of a copy. The parallelize tail
    compiles the stem on its own under ``train.compile`` (``PLAN.compile_units``: the blocks'
    per-block compile does not reach it), fusing the BatchNorms' statistics and ReLUs.
    """

    def __init__(self, cfg: VOLOConfig, device=None, dtype=None):
        super().__init__()
        Ch, kw = cfg.stem_hidden, dict(bias=False, device=device, dtype=dtype)
        self.conv = nn.Sequential(
            nn.Conv2d(cfg.num_channels, Ch, 7, stride=cfg.stem_stride, padding=3, **kw),
            nn.BatchNorm2d(Ch, device=device, dtype=dtype),
            nn.ReLU(inplace=True),
            nn.Conv2d(Ch, Ch, 3, padding=1, **kw),
            nn.BatchNorm2d(Ch, device=device, dtype=dtype),
            nn.ReLU(inplace=True),
            nn.Conv2d(Ch, Ch, 3, padding=1, **kw),
            nn.BatchNorm2d(Ch, device=device, dtype=dtype),
            nn.ReLU(inplace=True),
        )
        p = cfg.patch_dim // cfg.stem_stride
        self.proj = nn.Conv2d(Ch, cfg.outlook_dim, p, stride=p, device=device, dtype=dtype)
        self.channels_last = cfg.stem_fast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)  # 3 channels: a cheap copy, once
        return self.proj(self.conv(x)).permute(0, 2, 3, 1)  # (B, H/p, W/p, D), contiguous


class VOLO(nn.Module):
    """VOLO for classification, with the aux per-token head of token labeling. ``cfg``: :class:`VOLOConfig`.

    ``forward(x)`` gives class logits (plus ``aux_weight`` x the aux head's max over tokens, as the
    reference models at inference). ``forward(x, dense=True, mix=None)`` gives the training outputs of
    token labeling: ``(class logits (B, classes), token logits (B, gh, gw, classes))`` with optional
    MixToken applied to the tokens right after the stem.
    """

    supports_dense = True
    supports_tokens = False  # outlooker stem: no patch tokens to keep or mask (the contract's forward_tokens)
    supports_intermediates = False
    distill_head = False  # no distillation token: distillation losses use the class logits
    # One image size per run. The forward resamples the position embedding for evaluating at another
    # size, but VOLO trains at one size, then fine-tunes at a larger one as a second run (sail-sg/volo
    # README; set_image_size), and token labeling's dense targets come on one grid; its outlook
    # attention works on a 2D token grid, so a padded NaFlex sequence has no meaning for it.
    input_modes = ("fixed",)

    def __init__(self, cfg: VOLOConfig, device=None, dtype=None):
        super().__init__()
        self.cfg = cfg
        D = cfg.hidden_size
        self.num_features = D
        self.num_prefix_tokens = 1
        self.grad_checkpointing = False
        self.patch_embed = ConvStem(cfg, device, dtype)
        n_all = sum(cfg.layers)
        dpr = [cfg.drop_path_rate * i / max(n_all - 1, 1) for i in range(n_all)]
        self.outlookers = nn.ModuleList([Outlooker(cfg, 0.0, device, dtype) for _ in range(cfg.layers[0])])
        s = cfg.pooling_scale
        self.downsample = nn.Conv2d(cfg.outlook_dim, D, s, stride=s, device=device, dtype=dtype)
        self.pos_embed = nn.Parameter(torch.empty(1, *cfg.grid, D, device=device, dtype=dtype))
        self.pos_drop = nn.Dropout(cfg.pos_dropout)
        n0 = cfg.layers[0]
        self.blocks = nn.ModuleList(
            [TransformerBlock(cfg, dpr[n0 + i], device, dtype) for i in range(cfg.num_transformer_layers)]
        )
        self.cls_token = nn.Parameter(torch.empty(1, 1, D, device=device, dtype=dtype))
        self.class_blocks = nn.ModuleList([ClassBlock(cfg, device, dtype) for _ in range(cfg.num_class_layers)])
        self.norm = nn.LayerNorm(D, eps=cfg.norm_eps, device=device, dtype=dtype)
        self.head_drop = nn.Dropout(cfg.head_dropout)
        self.num_classes = cfg.num_classes
        self._build_heads(cfg.num_classes, device, dtype)
        self._register_load_state_dict_pre_hook(self._resample_pos_embed_on_load)

    def _build_heads(self, num_classes: int, device, dtype) -> None:
        D = self.num_features
        self.head = nn.Linear(D, num_classes, device=device, dtype=dtype) if num_classes > 0 else nn.Identity()
        use_aux = self.cfg.aux_head and num_classes > 0
        self.aux_head = nn.Linear(D, num_classes, device=device, dtype=dtype) if use_aux else None

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and buffer in place; works after ``to_empty()``."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d):
                m.reset_parameters()  # PyTorch's default (Kaiming-uniform), as the reference
            elif isinstance(m, nn.BatchNorm2d):
                m.reset_parameters()  # weight 1, bias 0, running stats reset
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        trunc_normal_(self.pos_embed, std=0.02)
        trunc_normal_(self.cls_token, std=0.02)

    # ------------------------------------------------------------------ API
    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token"}

    def head_parameter_names(self) -> set[str]:
        names = {f"head.{n}" for n, _ in self.head.named_parameters()}
        if self.aux_head is not None:
            names |= {f"aux_head.{n}" for n, _ in self.aux_head.named_parameters()}
        return names

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def reset_classifier(self, num_classes: int, pool: str | None = None) -> None:
        """New class and aux heads for ``num_classes`` (fine-tuning to a new label set)."""
        if pool is not None:
            self.cfg = replace(self.cfg, pool=pool)
        ref = self.pos_embed
        self.num_classes = num_classes
        self.cfg = replace(self.cfg, num_classes=num_classes)
        self._build_heads(num_classes, ref.device, ref.dtype)
        if ref.device.type != "meta":
            with torch.no_grad():
                for m in (self.head, self.aux_head):
                    if isinstance(m, nn.Linear):
                        trunc_normal_(m.weight, std=0.02)
                        nn.init.zeros_(m.bias)

    def set_image_size(self, img_h: int, img_w: int | None = None) -> None:
        """Resize the position embedding to a new image size (high-resolution fine-tuning)."""
        new = self.cfg.with_image_size(img_h, img_w)
        with torch.no_grad():
            pe = _resample_grid_pos(self.pos_embed.data, new.grid)
        self.pos_embed = nn.Parameter(pe)
        self.cfg = new

    # ------------------------------------------------------------------ forward
    def forward_stages(self, x: torch.Tensor, mix: TokenMix | None = None) -> torch.Tensor:
        """Images ``(B, C, H, W)`` -> coarse tokens ``(B, gh, gw, D)`` after the transformer stages."""
        x = self.patch_embed(x)  # (B, H/p, W/p, Do)
        x = apply_token_mix(x, mix, self.cfg.pooling_scale)
        x = run_blocks(self.outlookers, x, self.grad_checkpointing)
        x = self.downsample(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)  # (B, gh, gw, D)
        pos = self.pos_embed
        if pos.shape[1:3] != x.shape[1:3]:  # another image size at run time
            pos = _resample_grid_pos(pos, tuple(x.shape[1:3]))
        x = self.pos_drop(x + pos)
        B, gh, gw, D = x.shape
        x = x.reshape(B, gh * gw, D)  # (B, N, D)
        x = run_blocks(self.blocks, x, self.grad_checkpointing)
        return x.view(B, gh, gw, D)

    def forward_features(self, x: torch.Tensor, mix: TokenMix | None = None) -> torch.Tensor:
        """Images -> normalised tokens ``(B, 1 + gh*gw, D)`` (class token first)."""
        x = self.forward_stages(x, mix)
        B, gh, gw, D = x.shape
        x = torch.cat([self.cls_token.expand(B, -1, -1), x.reshape(B, gh * gw, D)], dim=1)  # (B, 1+N, D)
        x = run_blocks(self.class_blocks, x, self.grad_checkpointing)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        pooled = x[:, 0] if self.cfg.pool == "token" else x.mean(dim=1)
        pooled = self.head_drop(pooled)
        if pre_logits:
            return pooled
        out = self.head(pooled)
        if self.aux_head is not None:
            aux = self.aux_head(self.head_drop(x[:, 1:]))  # (B, N, classes)
            out = out + self.cfg.aux_weight * aux.amax(dim=1)
        return out

    def forward_dense(self, x: torch.Tensor, mix: TokenMix | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-labeling outputs: class logits ``(B, classes)``, token logits ``(B, gh, gw, classes)``."""
        if self.aux_head is None:
            raise RuntimeError("dense outputs need the aux head (cfg.aux_head=True and num_classes > 0)")
        feats = self.forward_features(x, mix)
        B, gh, gw = x.shape[0], x.shape[-2] // self.cfg.token_stride, x.shape[-1] // self.cfg.token_stride
        pooled = feats[:, 0] if self.cfg.pool == "token" else feats.mean(dim=1)
        cls = self.head(self.head_drop(pooled))
        tok = self.aux_head(self.head_drop(feats[:, 1:])).view(B, gh, gw, -1)  # (B, gh, gw, classes)
        return cls, tok

    def forward(self, x: torch.Tensor, dense: bool = False, mix: TokenMix | None = None, pre_logits: bool = False):
        if dense:  # through forward() so FSDP's hooks gather the parameters
            return self.forward_dense(x, mix)
        if pre_logits:  # the pooled features (probes), also through forward()
            return self.forward_head(self.forward_features(x), pre_logits=True)
        return self.forward_head(self.forward_features(x, mix))

    # ------------------------------------------------------------------ sizes
    def example_inputs(self, batch: int, device=None) -> tuple[torch.Tensor, ...]:
        c = self.cfg
        return (torch.randn(batch, c.num_channels, c.img_h, c.img_w, device=device),)

    def token_grid(self, img_hw: tuple[int, int]) -> tuple[int, int]:
        return img_hw[0] // self.cfg.token_stride, img_hw[1] // self.cfg.token_stride

    def forward_tokens(self, x, keep=None, mask=None):
        raise NotImplementedError(_NO_TOKENS)

    def forward_intermediates(self, x, blocks):
        raise NotImplementedError(_NO_TOKENS)

    # ------------------------------------------------------------------ loading
    def _resample_pos_embed_on_load(self, state_dict, prefix, *args) -> None:
        key = prefix + "pos_embed"
        pe = state_dict.get(key)
        if pe is not None and pe.ndim == 4 and pe.shape != self.pos_embed.shape and pe.shape[-1] == self.pos_embed.shape[-1]:
            state_dict[key] = _resample_grid_pos(pe, tuple(self.pos_embed.shape[1:3]))


def _resample_grid_pos(pos: torch.Tensor, new_grid: tuple[int, int]) -> torch.Tensor:
    """Bicubically resample a ``(1, gh, gw, D)`` position embedding to ``new_grid``."""
    _, gh, gw, D = pos.shape
    out = resample_pos_embed(pos.reshape(1, gh * gw, D), new_grid, (gh, gw), 0)  # (1, N', D)
    return out.reshape(1, new_grid[0], new_grid[1], D)


_NO_TOKENS = ("VOLO gives no token interface (tokens, keep, mask, intermediates: its convolutional stem and outlookers "
              "have no patch tokens to keep or mask); self-supervised tasks and token probes need a ViT")

__all__ = ["VOLO", "ClassAttention", "ClassBlock", "OutlookAttention", "Outlooker", "TokenMix", "TransformerBlock"]
