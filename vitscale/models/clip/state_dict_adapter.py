"""open_clip <-> vitscale CLIP: configs, models and state dicts, both ways, exactly — the family's
open_clip adapter (``OPEN_CLIP``), which ``vitscale.interop.from_open_clip`` / ``to_open_clip`` ask.

Only open_clip's ViT ``CLIP`` class (``visual`` = its ``VisionTransformer``, built-in text tower) is
supported; CoCa, EVA, SigLIP-with-timm-towers and HF text towers are not. Reading an open_clip model
imports nothing from open_clip (:func:`create_open_clip_model` imports its ``CLIP`` class).

State dicts: one rename table (``_open_clip_table``), read both ways by ``common.renames.convert``, with
three layout changes:
- attention ``in_proj`` rows: open_clip's ``nn.MultiheadAttention`` stacks ``[q; k; v]`` = ``(3, H, Dh)``;
  vitscale's ``attn.qkv_per_head`` stores them per head ``(H, 3, Dh)`` (Megatron layout).
- ``visual.proj`` / ``text_projection`` are ``(width, output_dim)`` matrices applied as ``x @ P``;
  vitscale's ``image_proj`` / ``text_proj`` are bias-free ``nn.Linear`` whose weight is ``P.T``.
- class / position embeddings gain a leading batch dimension: ``(D,)`` -> ``(1, 1, D)``, ``(N, D)`` -> ``(1, N, D)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..common.renames import Rename, RenameTable, convert, per_head, transposed
from ..spec import StateDictAdapter, is_library_model, keys_have
from ..vit.configs import ViTConfig, eva_options
from .configs import OPENAI_MEAN, OPENAI_STD, CLIPConfig, CLIPTextConfig
from .model import CLIP

# open_clip block names -> vitscale block names (the same tensors)
_BLOCK_RENAMES = {
    "ln_1.**": "norm1.**",
    "ln_2.**": "norm2.**",
    "attn.out_proj.**": "attn.proj.**",
    "mlp.c_fc.**": "mlp.fc1.**",
    "mlp.c_proj.**": "mlp.fc2.**",
    "ls_1.gamma": "ls1.gamma",
    "ls_2.gamma": "ls2.gamma",
}


def _tower_blocks(ours: str, theirs: str, heads: int) -> list[Rename]:
    qkv = Rename(f"{ours}.*.attn.qkv_per_head.*", f"{theirs}.*.attn.in_proj_*", *per_head(3, heads))
    return [qkv] + [Rename(f"{ours}.*.{b}", f"{theirs}.*.{a}") for a, b in _BLOCK_RENAMES.items()]


def _with_batch(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(0)  # (N, D) -> (1, N, D)


def _without_batch(t: torch.Tensor) -> torch.Tensor:
    return t.squeeze(0)


def _open_clip_table(cfg: CLIPConfig) -> RenameTable:
    """vitscale <-> open_clip keys of a CLIP with ``cfg`` (its heads, and which norm ``ln_post`` is)."""
    post = "fc_norm" if cfg.vision.use_fc_norm else "norm"
    return RenameTable(
        library="open_clip",
        unsupported="only ViT CLIP models are supported",
        entries=(
            Rename(None, "attn_mask"),  # old checkpoints stored the causal mask
            Rename(None, "**.attn_mask"),
            *_tower_blocks("visual.blocks", "visual.transformer.resblocks", cfg.vision.num_attention_heads),
            *_tower_blocks("text.blocks", "transformer.resblocks", cfg.text.num_attention_heads),
            Rename("visual.patch_embed.proj.weight", "visual.conv1.weight"),
            Rename("visual.cls_token", "visual.class_embedding", lambda t: t.reshape(1, 1, -1), lambda t: t.reshape(-1)),
            Rename("visual.pos_embed", "visual.positional_embedding", _with_batch, _without_batch),
            Rename("visual.norm_pre.**", "visual.ln_pre.**"),
            Rename(f"visual.{post}.**", "visual.ln_post.**"),
            Rename("image_proj.weight", "visual.proj", transposed, transposed),  # (E, D) <-> (D, E)
            Rename("text.token_embedding.weight", "token_embedding.weight"),
            Rename("text.pos_embed", "positional_embedding", _with_batch, _without_batch),
            Rename("text.norm.**", "ln_final.**"),
            Rename("text_proj.weight", "text_projection", transposed, transposed),
            # vitscale keeps the logit scale and bias 1-D (FSDP2 shards no 0-dim parameters)
            Rename("logit_scale", "logit_scale", lambda t: t.reshape(1), lambda t: t.reshape(())),
            Rename("logit_bias", "logit_bias", lambda t: t.reshape(1), lambda t: t.reshape(())),
        ),
    )


def state_dict_from_open_clip(sd: dict[str, torch.Tensor], cfg: CLIPConfig) -> dict[str, torch.Tensor]:
    """An open_clip ``CLIP`` state dict -> a vitscale :class:`CLIP` state dict for ``cfg``."""
    return convert(sd, _open_clip_table(cfg), to="ours")


def state_dict_to_open_clip(sd: dict[str, torch.Tensor], cfg: CLIPConfig) -> dict[str, torch.Tensor]:
    """A vitscale :class:`CLIP` state dict -> an open_clip ``CLIP`` state dict (inverse of the above)."""
    if any(k.startswith("head.") for k in sd):
        raise ValueError("the model has a classifier head (reset_classifier): open_clip's CLIP has none")
    return convert(sd, _open_clip_table(cfg), to="theirs")


# ----------------------------------------------------------------------------- configs and models

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
    if eva_options(v):
        raise ValueError(f"open_clip's VisionTransformer lacks {', '.join(eva_options(v))}")
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


def create_open_clip_model(model: CLIP, load_weights: bool = True, **open_clip_overrides: Any) -> nn.Module:
    """The open_clip ``CLIP`` matching a vitscale CLIP (with its weights unless ``load_weights=False``;
    ``open_clip_overrides`` go to open_clip's ``CLIP``)."""
    from open_clip.model import CLIP as OpenCLIP

    oc = OpenCLIP(**{**open_clip_config(model), **open_clip_overrides})
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
    return state_dict_to_open_clip(model.state_dict(), model.cfg)


OPEN_CLIP = StateDictAdapter(
    library="open_clip",
    accepts=lambda m: is_library_model(m, "open_clip", "CLIP"),
    from_library=from_open_clip,
    to_library=to_open_clip,
    library_kwargs=open_clip_config,
    create=create_open_clip_model,
    names=OPEN_CLIP_NAMES,
    from_state_dict=state_dict_from_open_clip,
    recognizes=keys_have("visual.conv1.weight"),
)
"""The CLIP family's open_clip adapter (``FamilySpec.adapters``)."""

__all__ = [
    "OPEN_CLIP", "OPEN_CLIP_NAMES", "config_from_open_clip", "create_open_clip_model", "from_open_clip",
    "open_clip_config", "state_dict_from_open_clip", "state_dict_to_open_clip", "to_open_clip",
]  # fmt: skip
