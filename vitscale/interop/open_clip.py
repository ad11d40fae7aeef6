"""open_clip <-> vitscale CLIP: configs, models and weights, both ways, exactly.

- ``from_open_clip(model)`` -> the equivalent vitscale :class:`~vitscale.models.clip.CLIP` with its weights.
- ``to_open_clip(model)`` -> a state dict that loads with ``strict=True`` into the open_clip model
  built by ``create_open_clip_model(model)`` (or ``open_clip.model.CLIP(**open_clip_config(model))``).
- ``load_open_clip_checkpoint(path, name)`` -> a vitscale CLIP from a local open_clip ``.safetensors``
  or ``.pt``/``.bin`` file (tensors only, ``weights_only``; no network). ``name`` is the open_clip
  architecture (``"ViT-B-32"``) or a vitscale variant (``"clip_b32"``).

Only open_clip's ViT ``CLIP`` class (``visual`` = its ``VisionTransformer``, built-in text tower) is
supported; CoCa, EVA, SigLIP-with-timm-towers and HF text towers are not.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..models.clip import CLIP, CLIPConfig, CLIPTextConfig
from ..models.clip.configs import OPENAI_MEAN, OPENAI_STD
from ..models.clip.state_dict_adapter import state_dict_from_open_clip, state_dict_to_open_clip
from ..models.vit.configs import ViTConfig

# vitscale variant -> the open_clip architecture with the same parameters
OPEN_CLIP_NAMES = {
    "clip_b32": "ViT-B-32",
    "clip_b16": "ViT-B-16",
    "clip_l14": "ViT-L-14",
    "clip_h14": "ViT-H-14",
    "clip_g14": "ViT-g-14",
    "clip_bigg14": "ViT-bigG-14",
    "clip_e14": "ViT-e-14",
}


def _activation(mod: nn.Module) -> str:
    name = type(mod).__name__
    if name == "QuickGELU":
        return "quick_gelu"
    if name == "GELU":
        return "gelu_tanh" if getattr(mod, "approximate", "none") == "tanh" else "gelu"
    raise ValueError(f"open_clip activation {name} is not supported")


def _tower_common(blocks: nn.ModuleList) -> dict[str, Any]:
    blk = blocks[0]
    if type(blk).__name__ != "ResidualAttentionBlock" or not isinstance(blk.attn, nn.MultiheadAttention):
        raise ValueError(
            f"only open_clip's standard ResidualAttentionBlock is supported, got {type(blk).__name__}"
        )
    if not isinstance(getattr(blk, "ln_attn", nn.Identity()), nn.Identity):
        raise ValueError("open_clip scale_attn (ln_attn) is not supported")
    if not isinstance(getattr(blk.mlp, "ln", nn.Identity()), nn.Identity):
        raise ValueError("open_clip scale_fc (mlp.ln) is not supported")
    ls = getattr(blk, "ls_1", None)
    return dict(
        num_layers=len(blocks),
        num_attention_heads=blk.attn.num_heads,
        ffn_hidden_size=blk.mlp.c_fc.out_features,
        activation=_activation(blk.mlp.gelu),
        norm_eps=blk.ln_1.eps,
        layer_scale_init=float(ls.gamma.flatten()[0]) if hasattr(ls, "gamma") else None,
    )


def config_from_open_clip(oc: nn.Module) -> CLIPConfig:
    """The :class:`CLIPConfig` equivalent to an open_clip ``CLIP`` instance."""
    if type(oc).__name__ != "CLIP" or not hasattr(oc, "token_embedding"):
        raise TypeError(
            f"only open_clip's CLIP (ViT + built-in text tower) is supported, not {type(oc).__name__}"
        )
    v = oc.visual
    if type(v).__name__ != "VisionTransformer":
        raise TypeError(f"only ViT image towers are supported, not {type(v).__name__}")
    if v.attn_pool is not None:
        raise ValueError("open_clip attentional pooling is not supported")
    if v.pool_type not in ("tok", "avg"):
        raise ValueError(f"open_clip vision pool_type {v.pool_type!r} is not supported")
    vc = _tower_common(v.transformer.resblocks)
    vls = vc.pop("layer_scale_init")
    patch = v.conv1.kernel_size[0]
    img_h, img_w = v.image_size
    pool = "token" if v.pool_type == "tok" else "avg"
    ln_after = bool(v.final_ln_after_pool)
    fc_norm = None if ln_after == (pool == "avg") else ln_after  # None = the ViTConfig default for the pool
    vision = ViTConfig(
        img_h=img_h, img_w=img_w, patch_dim=patch, num_channels=v.conv1.in_channels, hidden_size=v.conv1.out_channels,
        num_classes=0, class_token_length=1, pool=pool, fc_norm=fc_norm,
        pre_norm=not isinstance(v.ln_pre, nn.Identity), patch_bias=v.conv1.bias is not None,
        drop_patch_rate=float(getattr(v.patch_dropout, "prob", 0.0)), layer_scale_init=vls, **vc,
    )  # fmt: skip
    tc = _tower_common(oc.transformer.resblocks)
    tls = tc.pop("layer_scale_init")
    if tls is not None:
        raise ValueError("text-tower layer scale is not supported")
    pool_type = getattr(oc, "text_pool_type", "argmax")
    if pool_type not in ("argmax", "first", "last"):
        raise ValueError(f"open_clip text pool_type {pool_type!r} is not supported")
    if isinstance(oc.text_projection, nn.Linear) or oc.text_projection is None:
        raise ValueError("only open_clip's bias-free text_projection matrix is supported")
    text = CLIPTextConfig(
        encoder_seq_length=oc.positional_embedding.shape[0], vocab_size=oc.token_embedding.num_embeddings,
        hidden_size=oc.token_embedding.embedding_dim, causal=oc.attn_mask is not None, pool=pool_type, **tc,
    )  # fmt: skip
    bias = getattr(oc, "logit_bias", None)
    return CLIPConfig(
        vision=vision, text=text, output_dim=v.proj.shape[1],
        image_mean=tuple(getattr(v, "image_mean", None) or OPENAI_MEAN),
        image_std=tuple(getattr(v, "image_std", None) or OPENAI_STD),
        logit_bias_init=None if bias is None else (float(bias.flatten()[0]) if bias.device.type != "meta" else -10.0),
    )  # fmt: skip


def open_clip_config(model_or_cfg: Any) -> dict[str, Any]:
    """Keyword arguments for ``open_clip.model.CLIP`` that match a vitscale CLIP or its config."""
    cfg: CLIPConfig = getattr(model_or_cfg, "cfg", model_or_cfg)
    v, t = cfg.vision, cfg.text
    if v.class_token_length != 1 or not v.pos_embed_prefix:
        raise ValueError("open_clip's ViT has exactly one class token with a position embedding")
    if (
        v.patch_bias
        or v.parallel_block
        or v.qk_norm
        or not v.qkv_bias
        or not v.norm_bias
        or v.pool not in ("token", "avg")
    ):
        raise ValueError("this vision tower has options open_clip's VisionTransformer lacks")
    if v.img_h != v.img_w or v.norm_eps != 1e-5 or t.norm_eps != 1e-5:
        raise ValueError("open_clip needs square images and LayerNorm eps 1e-5")
    if v.activation != t.activation or v.activation not in ("gelu", "quick_gelu"):
        raise ValueError("open_clip uses one activation, gelu or quick_gelu, in both towers")
    vision_cfg = dict(
        image_size=v.img_h, patch_size=v.patch_dim, width=v.hidden_size, layers=v.num_layers,
        head_width=v.hidden_size // v.num_attention_heads,
        mlp_ratio=(v.ffn_hidden_size + 0.5) / v.hidden_size,  # open_clip takes int(width * ratio)
        patch_dropout=v.drop_patch_rate, no_ln_pre=not v.pre_norm,
        pool_type="tok" if v.pool == "token" else "avg", final_ln_after_pool=v.use_fc_norm,
        ls_init_value=v.layer_scale_init,
    )  # fmt: skip
    text_cfg = dict(
        context_length=t.encoder_seq_length, vocab_size=t.vocab_size, width=t.hidden_size,
        heads=t.num_attention_heads, layers=t.num_layers, mlp_ratio=(t.ffn_hidden_size + 0.5) / t.hidden_size,
        no_causal_mask=not t.causal, pool_type=t.pool,
    )  # fmt: skip
    kw: dict[str, Any] = dict(
        embed_dim=cfg.output_dim,
        vision_cfg=vision_cfg,
        text_cfg=text_cfg,
        quick_gelu=v.activation == "quick_gelu",
    )
    if cfg.logit_bias_init is not None:
        kw["init_logit_bias"] = cfg.logit_bias_init
    return kw


def create_open_clip_model(model: CLIP, load_weights: bool = True) -> nn.Module:
    """The open_clip ``CLIP`` matching a vitscale CLIP (with its weights unless ``load_weights=False``)."""
    from open_clip.model import CLIP as OpenCLIP

    oc = OpenCLIP(**open_clip_config(model))
    if load_weights:
        oc.load_state_dict(to_open_clip(model), strict=True)
    return oc


def from_open_clip(oc: nn.Module) -> CLIP:
    """The vitscale CLIP equivalent to an open_clip ``CLIP`` model, carrying its weights."""
    cfg = config_from_open_clip(oc)
    ref = next(oc.parameters())
    model = CLIP(cfg, device="meta")
    sd = state_dict_from_open_clip(oc.state_dict(), cfg)
    model.load_state_dict(sd, strict=True, assign=True)
    return model.to(device=ref.device)


def to_open_clip(model: CLIP) -> dict[str, torch.Tensor]:
    """A state dict that loads with ``strict=True`` into ``create_open_clip_model(model)``."""
    if not isinstance(model, CLIP):
        raise TypeError(f"to_open_clip supports vitscale CLIP models, not {type(model).__name__}")
    return state_dict_to_open_clip(model.state_dict(), model.cfg)


def load_open_clip_checkpoint(path: str | Path, name: str) -> CLIP:
    """A vitscale CLIP from an open_clip checkpoint file on disk (no network).

    The open_clip architecture ``name`` (or the vitscale variant, mapped through ``OPEN_CLIP_NAMES``)
    is built without pretrained weights, filled from ``path`` with ``strict=True`` and converted.
    """
    import open_clip
    from open_clip.model import CLIP as OpenCLIP

    from . import _read_tensors

    oc_name = OPEN_CLIP_NAMES.get(name, name)
    arch = open_clip.get_model_config(oc_name)
    if arch is None:
        raise KeyError(f"unknown open_clip architecture {oc_name!r}")
    arch = {
        k: v
        for k, v in arch.items()
        if k in ("embed_dim", "vision_cfg", "text_cfg", "quick_gelu", "init_logit_bias")
    }
    sd = {k: v for k, v in _read_tensors(path).items() if k != "attn_mask"}
    with torch.device("meta"):
        oc = OpenCLIP(**arch)
    oc.load_state_dict(sd, strict=True, assign=True)
    model = from_open_clip(oc)
    return model


def with_open_clip_heads(cfg: CLIPConfig, oc_name: str) -> CLIPConfig:
    """``cfg`` with the vision head count of open_clip's ``oc_name`` (its head_width), for loading
    its checkpoints into a NeMo-sized variant."""
    import open_clip

    vc = open_clip.get_model_config(oc_name)["vision_cfg"]
    heads = vc["width"] // vc.get("head_width", 64)
    return replace(cfg, vision=replace(cfg.vision, num_attention_heads=heads))


__all__ = [
    "OPEN_CLIP_NAMES",
    "config_from_open_clip",
    "create_open_clip_model",
    "from_open_clip",
    "load_open_clip_checkpoint",
    "open_clip_config",
    "to_open_clip",
    "with_open_clip_heads",
]
