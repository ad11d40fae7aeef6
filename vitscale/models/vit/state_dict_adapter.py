"""timm <-> vitscale ViT: configs and state dicts, both ways, exactly.

Layouts differ only in the fused projections, which vitscale names for what they hold (``*_per_head``),
so that no name of one naming holds the other's layout:
- timm ``attn.qkv`` rows ``(3, H, Dh)``; vitscale ``attn.qkv_per_head`` rows per head ``(H, 3, Dh)``.
- MAP: timm ``attn_pool.kv`` rows ``(2, H, Dh)``; vitscale ``attn_pool.kv_per_head`` ``(H, 2, Dh)``.
- ViT-22B parallel block: timm ``in_proj`` rows ``[mlp F | q | k | v]``; vitscale ``in_proj_per_head``
  rows per head ``(H, 3*Dh + F/H)``, and ``mlp_bias_per_head (H, F/H)`` for timm's ``mlp_bias (F,)``.
  Output projection: timm has ``attn_out_proj`` + ``mlp_out_proj`` (or a fused ``out_proj`` over
  ``[attn D | mlp F]``); vitscale one ``out_proj_per_head`` over per-head ``(H, Dh + F/H)`` columns,
  whose bias is the sum of timm's two biases. Its norm: timm ``in_norm``, vitscale ``norm``.
- Prefix tokens: timm ``cls_token (1, 1, D)`` and ``reg_token (1, R, D)``; vitscale one
  ``cls_token (1, L, D)`` (``class_token=False``: registers only).
Reading a timm model imports nothing from timm (``timm_kwargs`` imports timm's layer classes,
:func:`create_timm_vit` timm's model). ``timm_registry.TIMM`` bundles it all with
``vit_from_timm`` as the family's adapter (``FamilySpec.adapters``), which ``vitscale.interop`` asks.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..common.renames import PASS_THROUGH, Rename, RenameTable, convert, per_head
from .configs import ViTConfig, eva_options

# ----------------------------------------------------------------------------- row permutations


def _group_in_proj(mlp: torch.Tensor, qkv: torch.Tensor, heads: int) -> torch.Tensor:
    """timm-order pieces (mlp rows ``(F, ...)``, qkv rows ``(3, H, Dh, ...)``) -> ``(H, 3*Dh + F/H, ...)``."""
    rest = mlp.shape[1:]
    qkv = qkv.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(heads, -1, *rest)  # (H, 3*Dh, ...)
    mlp = mlp.reshape(heads, -1, *rest)  # (H, F/H, ...)
    return torch.cat([qkv, mlp], dim=1).reshape(-1, *rest)


def _ungroup_in_proj(t: torch.Tensor, heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(H, 3*Dh + F/H, ...)`` rows -> (mlp ``(F, ...)``, qkv ``(3*D, ...)`` in timm's (3, H, Dh) order)."""
    rest = t.shape[1:]
    g = t.reshape(heads, -1, *rest)
    qkv, mlp = g[:, : 3 * head_dim], g[:, 3 * head_dim :]
    qkv = qkv.reshape(heads, 3, head_dim, *rest).transpose(0, 1).reshape(-1, *rest)
    return mlp.reshape(-1, *rest), qkv


# ----------------------------------------------------------------------------- configs

_ACTIVATIONS = {"GELU": "gelu", "GELUTanh": "gelu_tanh", "QuickGELU": "quick_gelu", "SiLU": "silu", "ReLU": "relu"}
_NORMS = {"LayerNorm": "layernorm", "RmsNorm": "rmsnorm", "RMSNorm": "rmsnorm"}


def _is(m: Any, *names: str) -> bool:
    return type(m).__name__ in names


def _activation(act: Any) -> str | None:
    name = _ACTIVATIONS.get(type(act).__name__)
    if name == "gelu" and getattr(act, "approximate", "none") == "tanh":
        return "gelu_tanh"
    return name


def _side(hw: Any) -> Any:
    return hw[0] if hw[0] == hw[1] else tuple(hw)


def _norms(tm: Any) -> list[Any]:
    """Every norm layer of a timm ViT after the patch embedding (``norm*``, ``*_norm`` attributes)."""
    return [
        m for n, m in tm.named_modules()
        if "norm" in n.rsplit(".", 1)[-1] and not n.startswith("patch_embed") and not _is(m, "Identity")
    ]  # fmt: skip


def unsupported_timm_options(tm: Any) -> list[str]:
    """What a timm ``VisionTransformer`` uses that vitscale's ViT cannot express (empty: nothing).

    Each entry is a short reason naming the timm option; :func:`config_from_timm` raises them.
    """
    from torch import nn

    name = type(tm).__name__
    if name != "VisionTransformer":
        return [f"{name}, a subclass of timm's VisionTransformer with its own tokens / heads"]
    why: list[str] = []
    pe = tm.patch_embed
    if not _is(pe, "PatchEmbed"):
        stem = getattr(pe, "backbone", None)
        what = f" with a {type(stem).__name__} backbone" if stem is not None else ""
        why.append(f"a convolutional stem ({type(pe).__name__}{what}) instead of a patch embedding")
    else:
        if not isinstance(pe.norm, nn.Identity):
            why.append("a norm after the patch embedding (timm embed_norm_layer)")
        if pe.patch_size[0] != pe.patch_size[1]:
            why.append(f"non-square patches {tuple(pe.patch_size)}")
        if getattr(pe, "dynamic_img_pad", False):
            why.append("inputs padded to a multiple of the patch size (timm dynamic_img_pad)")
        if pe.img_size is None:
            why.append("no fixed image size")
        elif pe.img_size[0] % pe.patch_size[0] or pe.img_size[1] % pe.patch_size[1]:
            fit = [s // p * p for s, p in zip(pe.img_size, pe.patch_size)]
            cut = _side([s - f for s, f in zip(pe.img_size, fit)])
            why.append(
                f"image size {_side(pe.img_size)} is no multiple of the patch size {_side(pe.patch_size)}: timm"
                f" never sees its last {cut} pixels; built with img_size={_side(fit)} it is the same network and converts"
            )
    if tm.pos_embed is None:
        why.append("no position embeddings (timm pos_embed='none')")
    if tm.global_pool not in ("token", "avg", "map", ""):
        why.append(f"global_pool={tm.global_pool!r}")
    elif tm.global_pool == "map":
        ap = tm.attn_pool
        if not _is(ap, "AttentionPoolLatent") or ap.latent_len != 1 or ap.pos_embed is not None or ap.mlp is None:
            why.append("a MAP head other than one latent query with projection, norm and MLP")
    if getattr(tm, "pool_include_prefix", False):
        why.append("pooling that includes the prefix tokens (timm pool_include_prefix)")
    kinds = {type(b).__name__ for b in tm.blocks}
    if kinds - {"Block", "ParallelScalingBlock"} or len(kinds) > 1:
        why.append(f"{'/'.join(sorted(kinds))} blocks")
    else:
        blk = tm.blocks[0]
        if _is(blk, "Block"):
            if not _is(blk.attn, "Attention"):
                why.append(f"{type(blk.attn).__name__} instead of standard attention")
            elif not isinstance(getattr(blk.attn, "norm", nn.Identity()), nn.Identity):
                why.append("a norm inside the attention (timm scale_attn_norm)")
            if not _is(blk.mlp, "Mlp"):
                kind = type(blk.mlp).__name__
                why.append(f"a gated MLP ({kind})" if "glu" in kind.lower() else f"a {kind} MLP")
            else:
                if not isinstance(blk.mlp.norm, nn.Identity):
                    why.append("a norm inside the MLP (timm scale_mlp_norm)")
                if not isinstance(blk.mlp.fc1, nn.Linear):
                    why.append("a convolutional MLP")
            act = getattr(blk.mlp, "act", None)
        else:
            act = blk.mlp_act
        if act is not None and _activation(act) is None:
            why.append(f"the {type(act).__name__} activation")
    norms = {type(m).__name__ for m in _norms(tm)}
    if norms - set(_NORMS):
        why.append(f"{'/'.join(sorted(norms - set(_NORMS)))} norm layers")
    elif len({_NORMS[n] for n in norms}) > 1:
        why.append(f"mixed norm layers ({', '.join(sorted(norms))})")
    return why


def _mlp_ratio(ffn: int, dim: int) -> float:
    """A ratio with ``int(dim * ratio) == ffn`` (timm's rule for the MLP width)."""
    r = ffn / dim
    while int(dim * r) < ffn:  # F / D may round down, e.g. 4304 / 1152 * 1152 = 4303.99...
        r = math.nextafter(r, math.inf)
    return r


def config_from_timm(tm: Any) -> ViTConfig:
    """The ``ViTConfig`` equivalent to a timm ``VisionTransformer`` instance.

    ValueError listing every option vitscale's ViT cannot express (:func:`unsupported_timm_options`).
    """
    from torch import nn

    why = unsupported_timm_options(tm)
    if why:
        raise ValueError("; ".join(why))
    blk = tm.blocks[0]
    parallel = _is(blk, "ParallelScalingBlock")
    D = tm.embed_dim
    if parallel:
        heads = blk.num_heads
        ffn = blk.in_proj.out_features - 3 * D
        qkv_bias = blk.in_proj.bias is not None
        mlp_bias = qkv_bias or blk.mlp_bias is not None
        out = blk.out_proj if blk.out_proj is not None else blk.attn_out_proj
        proj_bias = out.bias is not None
        qk_norm = not isinstance(blk.q_norm, nn.Identity)
        act, norm, ls = blk.mlp_act, blk.in_norm, blk.ls
        attn_drop, proj_drop = blk.attn_drop.p, blk.mlp_drop.p
    else:
        heads = blk.attn.num_heads
        ffn = blk.mlp.fc1.out_features
        qkv_bias = blk.attn.qkv.bias is not None
        proj_bias = blk.attn.proj.bias is not None
        mlp_bias = blk.mlp.fc1.bias is not None
        qk_norm = not isinstance(blk.attn.q_norm, nn.Identity)
        act, norm, ls = blk.mlp.act, blk.norm1, blk.ls1
        attn_drop, proj_drop = blk.attn.attn_drop.p, blk.attn.proj_drop.p
    if tm.pos_drop.p != proj_drop:
        raise ValueError(f"timm pos_drop_rate {tm.pos_drop.p} != proj_drop_rate {proj_drop}: vitscale has one hidden_dropout")
    last = tm.blocks[-1]
    drop_path = getattr(getattr(last, "drop_path1", getattr(last, "drop_path", None)), "drop_prob", 0.0)
    grid = tm.patch_embed.grid_size
    patch = tm.patch_embed.patch_size[0]
    return ViTConfig(
        img_h=grid[0] * patch,
        img_w=grid[1] * patch,
        patch_dim=patch,
        num_channels=tm.patch_embed.proj.in_channels,
        num_layers=len(tm.blocks),
        hidden_size=D,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        hidden_dropout=proj_drop,
        attention_dropout=attn_drop,
        num_classes=tm.num_classes,
        drop_path_rate=drop_path,
        drop_patch_rate=getattr(tm.patch_drop, "prob", 0.0),
        class_token_length=tm.num_prefix_tokens,
        class_token=tm.has_class_token or tm.num_prefix_tokens == 0,
        pool={"": "none"}.get(tm.global_pool, tm.global_pool),
        fc_norm=not isinstance(tm.fc_norm, nn.Identity),
        final_norm=not (isinstance(tm.norm, nn.Identity) and isinstance(tm.fc_norm, nn.Identity)),
        pre_norm=not isinstance(tm.norm_pre, nn.Identity),
        head_dropout=tm.head_drop.p,
        parallel_block=parallel,
        qk_norm=qk_norm,
        qkv_bias=qkv_bias,
        proj_bias=proj_bias,
        mlp_bias=mlp_bias,
        norm_type=_NORMS[type(norm).__name__],
        norm_bias=getattr(norm, "bias", None) is not None or _NORMS[type(norm).__name__] == "rmsnorm",
        patch_bias=tm.patch_embed.proj.bias is not None,
        norm_eps=norm.eps,
        activation=_activation(act),
        layer_scale_init=None if isinstance(ls, nn.Identity) else ls.init_values,
        pos_embed_prefix=not tm.no_embed_class,
    )


def timm_kwargs(cfg: ViTConfig) -> dict[str, Any]:
    """Keyword arguments for ``timm.models.vision_transformer.VisionTransformer`` matching ``cfg``."""
    if cfg.pre_logits:
        raise ValueError("timm has no pre-logits (tanh) layer: a model with pre_logits=True has no timm equivalent")
    eva = eva_options(cfg)
    if eva:  # pos_embed='rope' goes to timm's Eva (timm_eva.py); these, without RoPE, nowhere in timm
        raise ValueError(f"without RoPE, timm has no model with {', '.join(eva)} (timm's VisionTransformer lacks them)")
    if not cfg.parallel_block and cfg.proj_bias != cfg.mlp_bias:
        raise ValueError("timm ties the attention-projection and MLP biases (proj_bias); set them equal")
    if not cfg.norm_bias and cfg.norm_type == "layernorm":
        raise ValueError("timm's ViT LayerNorms always have a bias: norm_bias=False has no timm equivalent")
    if cfg.patch_bias == cfg.pre_norm:
        raise ValueError("timm gives the patch embedding a bias exactly when pre_norm is off")
    from functools import partial

    from torch import nn

    if cfg.norm_type == "rmsnorm":
        from timm.layers import RmsNorm

        norm_layer = partial(RmsNorm, eps=cfg.norm_eps)
    else:
        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps)
    acts = {"gelu": nn.GELU, "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu", "silu": nn.SiLU, "relu": nn.ReLU}
    class_token = cfg.class_token and cfg.class_token_length > 0
    kw: dict[str, Any] = dict(
        img_size=(cfg.img_h, cfg.img_w),
        patch_size=cfg.patch_dim,
        in_chans=cfg.num_channels,
        num_classes=cfg.num_classes,
        global_pool={"none": ""}.get(cfg.pool, cfg.pool),
        embed_dim=cfg.hidden_size,
        depth=cfg.num_layers,
        num_heads=cfg.num_attention_heads,
        mlp_ratio=_mlp_ratio(cfg.ffn_hidden_size, cfg.hidden_size),
        qkv_bias=cfg.qkv_bias,
        qk_norm=cfg.qk_norm,
        proj_bias=cfg.proj_bias or cfg.mlp_bias,
        init_values=cfg.layer_scale_init,
        class_token=class_token,
        reg_tokens=cfg.class_token_length - int(class_token),
        no_embed_class=not cfg.pos_embed_prefix,
        pre_norm=cfg.pre_norm,
        final_norm=cfg.final_norm,
        fc_norm=cfg.use_fc_norm,
        drop_rate=cfg.head_dropout,
        pos_drop_rate=cfg.hidden_dropout,
        proj_drop_rate=cfg.hidden_dropout,
        attn_drop_rate=cfg.attention_dropout,
        patch_drop_rate=cfg.drop_patch_rate,
        drop_path_rate=cfg.drop_path_rate,
        norm_layer=norm_layer,
        act_layer=acts[cfg.activation],
    )
    if cfg.parallel_block:
        from timm.models.vision_transformer import ParallelScalingBlock

        kw["block_fn"] = ParallelScalingBlock
    return kw


# ----------------------------------------------------------------------------- state dicts


def _timm_table(cfg: ViTConfig) -> RenameTable:
    """vitscale <-> timm keys of a ViT with ``cfg``: the same names but for the fused projections
    (``*_per_head``, their rows permuted) and a ViT-22B block's norm (the prefix tokens and ViT-22B
    output projection: below)."""
    H = cfg.num_attention_heads
    if cfg.parallel_block:
        F, Dh = cfg.ffn_hidden_size, cfg.hidden_size // H
        blocks = (
            Rename(
                "blocks.*.in_proj_per_head.*", "blocks.*.in_proj.*",
                lambda t: _group_in_proj(t[:F], t[F:], H), lambda t: torch.cat(_ungroup_in_proj(t, H, Dh)),
            ),  # fmt: skip
            Rename("blocks.*.mlp_bias_per_head", "blocks.*.mlp_bias", lambda t: t.reshape(H, F // H), lambda t: t.reshape(F)),
            Rename("blocks.*.norm.*", "blocks.*.in_norm.*"),
        )
    else:
        blocks = (Rename("blocks.*.attn.qkv_per_head.*", "blocks.*.attn.qkv.*", *per_head(3, H)),)
    return RenameTable(
        library="timm",
        entries=(*blocks, Rename("attn_pool.kv_per_head.**", "attn_pool.kv.**", *per_head(2, H)), PASS_THROUGH),
    )


def drop_mask_token(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of ``sd`` without the mask token (``ViTConfig.mask_token``): timm's models have none, and
    timm drops DINOv2's on loading (huggingface/pytorch-image-models at aa4b585,
    ``timm/models/vision_transformer.py`` line 1620 in ``_convert_dinov2``; DINOv3's in
    ``timm/models/eva.py`` line 1222). Reading timm weights leaves a model's own at its init (the
    model's load hook)."""
    return {k: v for k, v in sd.items() if k != "mask_token"}


def _prefix_tokens_from_timm(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pops timm's ``cls_token (1, 1, D)`` and ``reg_token (1, R, D)``: vitscale's one ``cls_token (1, L, D)``."""
    toks = [sd.pop(k) for k in ("cls_token", "reg_token") if k in sd]
    return {"cls_token": torch.cat(toks, dim=1)} if toks else {}


def _prefix_tokens_to_timm(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """Pops vitscale's ``cls_token (1, L, D)`` (``[class token,] registers``): timm's two."""
    v, out = sd.pop("cls_token", None), {}
    if v is not None:
        n_cls = int(cfg.class_token)
        if n_cls:
            out["cls_token"] = v[:, :1]
        if cfg.class_token_length > n_cls:
            out["reg_token"] = v[:, n_cls:]
    return out


def _out_proj_from_timm(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """Pops each ViT-22B block's timm output projection(s): vitscale's one ``out_proj_per_head`` over per-head
    ``(H, Dh + F/H)`` columns, biased by the sum of timm's two biases."""
    H, D, F = cfg.num_attention_heads, cfg.hidden_size, cfg.ffn_hidden_size
    out = {}
    for i in range(cfg.num_layers):
        p = f"blocks.{i}."
        if p + "out_proj.weight" in sd:  # timm fuse_out_proj=True: columns [attn D | mlp F]
            w_out = sd.pop(p + "out_proj.weight")
            wa, wm = w_out[:, :D], w_out[:, D:]
            b_out = sd.pop(p + "out_proj.bias", None)
        else:
            wa, wm = sd.pop(p + "attn_out_proj.weight"), sd.pop(p + "mlp_out_proj.weight")
            ba, bm = sd.pop(p + "attn_out_proj.bias", None), sd.pop(p + "mlp_out_proj.bias", None)
            b_out = None if ba is None else ba + bm
        cols = torch.cat([wa.reshape(D, H, D // H), wm.reshape(D, H, F // H)], dim=2)  # (D, H, Dh + F/H)
        out[p + "out_proj_per_head.weight"] = cols.reshape(D, -1)
        if b_out is not None:
            out[p + "out_proj_per_head.bias"] = b_out
    return out


def _out_proj_to_timm(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """Pops each ViT-22B block's ``out_proj_per_head``: timm's ``attn_out_proj`` and ``mlp_out_proj`` (the bias on the latter)."""
    H, D, F = cfg.num_attention_heads, cfg.hidden_size, cfg.ffn_hidden_size
    Dh, out = D // H, {}
    for i in range(cfg.num_layers):
        p = f"blocks.{i}."
        cols = sd.pop(p + "out_proj_per_head.weight").reshape(D, H, Dh + F // H)
        out[p + "attn_out_proj.weight"] = cols[:, :, :Dh].reshape(D, D)
        out[p + "mlp_out_proj.weight"] = cols[:, :, Dh:].reshape(D, F)
        b = sd.pop(p + "out_proj_per_head.bias", None)
        if b is not None:
            out[p + "attn_out_proj.bias"] = torch.zeros_like(b)
            out[p + "mlp_out_proj.bias"] = b
    return out


def state_dict_from_timm(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """A timm ViT state dict -> a vitscale state dict for ``cfg`` (see :func:`config_from_timm`)."""
    sd = dict(sd)
    joined = _prefix_tokens_from_timm(sd)
    if cfg.parallel_block:
        joined.update(_out_proj_from_timm(sd, cfg))
    return {**joined, **convert(sd, _timm_table(cfg), to="ours")}


def state_dict_to_timm(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """A vitscale ViT state dict -> the state dict of the timm model built from :func:`timm_kwargs`
    (without the training-only mask token: timm's ViT has none, :func:`drop_mask_token`)."""
    sd = drop_mask_token(sd)
    split = _prefix_tokens_to_timm(sd, cfg)
    if cfg.parallel_block:
        split.update(_out_proj_to_timm(sd, cfg))
    out = {**split, **convert(sd, _timm_table(cfg), to="theirs")}
    if cfg.parallel_block and not cfg.qkv_bias:  # timm always has an mlp_bias without a QKV bias
        for i in range(cfg.num_layers):
            w = out[f"blocks.{i}.in_proj.weight"]
            out.setdefault(f"blocks.{i}.mlp_bias", w.new_zeros(cfg.ffn_hidden_size))
    return out


# ----------------------------------------------------------------------------- the family's timm adapter

# Our variant -> timm's registered model of the same architecture.
TIMM_NAMES = {
    "vit_ti16": "vit_tiny_patch16_224",
    "vit_s16": "vit_small_patch16_224",
    "vit_b32": "vit_base_patch32_224",
    "vit_b16": "vit_base_patch16_224",
    "vit_l16": "vit_large_patch16_224",
    "vit_h16": "vit_huge_patch16_224",
    "vit_h14": "vit_huge_patch14_224",
    "vit_g14": "vit_giant_patch14_224",
    "vit_bigg14": "vit_gigantic_patch14_224",
    "vit_s14_dinov2": "vit_small_patch14_dinov2",
    "vit_b14_dinov2": "vit_base_patch14_dinov2",
    "vit_l14_dinov2": "vit_large_patch14_dinov2",
    "vit_s14_reg4_dinov2": "vit_small_patch14_reg4_dinov2",
    "vit_b14_reg4_dinov2": "vit_base_patch14_reg4_dinov2",
    "vit_l14_reg4_dinov2": "vit_large_patch14_reg4_dinov2",
    # timm Eva (RoPE): timm_eva.py
    "vit_s16_dinov3": "vit_small_patch16_dinov3",
    "vit_b16_dinov3": "vit_base_patch16_dinov3",
    "vit_l16_dinov3": "vit_large_patch16_dinov3",
    "vit_splus16_dinov3": "vit_small_plus_patch16_dinov3",
    "vit_hplus16_dinov3": "vit_huge_plus_patch16_dinov3",
    "vit_7b16_dinov3": "vit_7b_patch16_dinov3",
    "vit_b16_rope_reg1_gap_256": "vit_base_patch16_rope_reg1_gap_256",
    "vit_ti14_eva02": "eva02_tiny_patch14_224",
    "vit_s14_eva02": "eva02_small_patch14_224",
    "vit_b14_eva02": "eva02_base_patch14_224",
    "vit_b16_eva02_clip": "eva02_base_patch16_clip_224",
    "vit_s16_rope": "vit_small_patch16_rope_224",
    "vit_b16_rope": "vit_base_patch16_rope_224",
    "vit_s16_rope_ape": "vit_small_patch16_rope_ape_224",
    "vit_b16_rope_ape": "vit_base_patch16_rope_ape_224",
    "vit_s16_rope_mixed": "vit_small_patch16_rope_mixed_224",
    "vit_b16_rope_mixed": "vit_base_patch16_rope_mixed_224",
    "vit_s16_rope_mixed_ape": "vit_small_patch16_rope_mixed_ape_224",
    "vit_b16_rope_mixed_ape": "vit_base_patch16_rope_mixed_ape_224",
}


def to_timm(model: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict that loads with ``strict=True`` into :func:`create_timm_vit` of ``model``."""
    return state_dict_to_timm(model.state_dict(), model.cfg)


def create_timm_vit(model: nn.Module, load_weights: bool = True, **timm_overrides: Any) -> nn.Module:
    """timm's ``VisionTransformer`` matching a vitscale ViT (with its weights unless ``load_weights=False``).

    ``timm_overrides`` go to timm's ``VisionTransformer``, e.g. ``dynamic_img_size=True`` to feed the
    timm model other image sizes, as the vitscale model accepts them."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    tm = TimmViT(**{**timm_kwargs(model.cfg), **timm_overrides})
    if load_weights:
        tm.load_state_dict(to_timm(model), strict=True)
    return tm
