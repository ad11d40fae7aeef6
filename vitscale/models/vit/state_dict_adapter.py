"""timm <-> vitscale ViT: configs and state dicts, both ways, exactly.

Row layouts differ only in the fused projections:
- ``attn.qkv`` rows: timm ``(3, H, Dh)``; vitscale per head ``(H, 3, Dh)``.
- MAP ``attn_pool.kv`` rows: timm ``(2, H, Dh)``; vitscale ``(H, 2, Dh)``.
- ViT-22B parallel block ``in_proj`` rows: timm ``[mlp F | q | k | v]``; vitscale per head
  ``(H, 3*Dh + F/H)``. Output projection: timm has ``attn_out_proj`` + ``mlp_out_proj`` (or a fused
  ``out_proj`` over ``[attn D | mlp F]``); vitscale one ``out_proj`` over per-head ``(H, Dh + F/H)``
  columns, whose bias is the sum of timm's two biases.
This module imports nothing from timm; ``vitscale.interop`` builds the timm models.
"""

from __future__ import annotations

from typing import Any

import torch

from .configs import ViTConfig

# ----------------------------------------------------------------------------- row permutations


def _heads_first(t: torch.Tensor, parts: int, heads: int) -> torch.Tensor:
    """Rows ``(parts, H, Dh)`` -> ``(H, parts, Dh)`` (weights ``(rows, in)`` or biases ``(rows,)``)."""
    rest = t.shape[1:]
    return t.reshape(parts, heads, -1, *rest).transpose(0, 1).reshape(t.shape)


def _parts_first(t: torch.Tensor, parts: int, heads: int) -> torch.Tensor:
    """Rows ``(H, parts, Dh)`` -> ``(parts, H, Dh)``."""
    rest = t.shape[1:]
    return t.reshape(heads, parts, -1, *rest).transpose(0, 1).reshape(t.shape)


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


def config_from_timm(tm: Any) -> ViTConfig:
    """The ``ViTConfig`` equivalent to a timm ``VisionTransformer`` instance."""
    from torch import nn

    blk = tm.blocks[0]
    parallel = hasattr(blk, "in_proj")
    D = tm.embed_dim
    if getattr(tm, "pos_embed", None) is None:
        raise ValueError("timm models without learned position embeddings are not supported")
    if tm.global_pool not in ("token", "avg", "map", ""):
        raise ValueError(f"timm global_pool={tm.global_pool!r} has no vitscale equivalent")
    if tm.global_pool == "map" and type(tm.attn_pool).__name__ != "AttentionPoolLatent":
        raise ValueError("only timm's AttentionPoolLatent MAP head is supported")
    if getattr(tm, "pool_include_prefix", False):
        raise ValueError("timm pool_include_prefix=True is not supported")
    if parallel:
        heads = blk.num_heads
        ffn = blk.in_proj.out_features - 3 * D
        qkv_bias = blk.in_proj.bias is not None
        mlp_bias = qkv_bias or blk.mlp_bias is not None
        out = blk.out_proj if blk.out_proj is not None else blk.attn_out_proj
        proj_bias = out.bias is not None
        qk_norm = not isinstance(blk.q_norm, nn.Identity)
        act = blk.mlp_act
        norm = blk.in_norm
        ls = blk.ls
    else:
        heads = blk.attn.num_heads
        ffn = blk.mlp.fc1.out_features
        qkv_bias = blk.attn.qkv.bias is not None
        proj_bias = blk.attn.proj.bias is not None
        mlp_bias = blk.mlp.fc1.bias is not None
        qk_norm = not isinstance(blk.attn.q_norm, nn.Identity)
        act = blk.mlp.act
        norm = blk.norm1
        ls = blk.ls1
    act_name = {"GELU": "gelu", "GELUTanh": "gelu_tanh", "QuickGELU": "quick_gelu", "SiLU": "silu", "ReLU": "relu"}.get(
        type(act).__name__
    )
    if act_name == "gelu" and getattr(act, "approximate", "none") == "tanh":
        act_name = "gelu_tanh"
    if act_name is None:
        raise ValueError(f"unsupported timm activation {type(act).__name__}")
    grid = tm.patch_embed.grid_size
    patch = tm.patch_embed.patch_size[0]
    n_prefix = tm.num_prefix_tokens
    norm_bias = getattr(norm, "bias", None) is not None
    return ViTConfig(
        img_h=grid[0] * patch,
        img_w=grid[1] * patch,
        patch_dim=patch,
        num_channels=tm.patch_embed.proj.in_channels,
        num_layers=len(tm.blocks),
        hidden_size=D,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_classes=tm.num_classes,
        class_token_length=n_prefix,
        pool={"": "none"}.get(tm.global_pool, tm.global_pool),
        fc_norm=not isinstance(tm.fc_norm, nn.Identity),
        final_norm=not (isinstance(tm.norm, nn.Identity) and isinstance(tm.fc_norm, nn.Identity)),
        pre_norm=not isinstance(tm.norm_pre, nn.Identity),
        parallel_block=parallel,
        qk_norm=qk_norm,
        qkv_bias=qkv_bias,
        proj_bias=proj_bias,
        mlp_bias=mlp_bias,
        norm_bias=norm_bias,
        patch_bias=tm.patch_embed.proj.bias is not None,
        norm_eps=norm.eps,
        activation=act_name,
        layer_scale_init=None if isinstance(ls, nn.Identity) else 1e-5,
        pos_embed_prefix=not tm.no_embed_class,
    )


def timm_kwargs(cfg: ViTConfig) -> dict[str, Any]:
    """Keyword arguments for ``timm.models.vision_transformer.VisionTransformer`` matching ``cfg``."""
    if cfg.pre_logits:
        raise ValueError("timm has no pre-logits (tanh) layer: a model with pre_logits=True has no timm equivalent")
    if not cfg.parallel_block and cfg.proj_bias != cfg.mlp_bias:
        raise ValueError("timm ties the attention-projection and MLP biases (proj_bias); set them equal")
    if not cfg.norm_bias:
        raise ValueError("timm's ViT LayerNorms always have a bias: norm_bias=False has no timm equivalent")
    if cfg.patch_bias == cfg.pre_norm:
        raise ValueError("timm gives the patch embedding a bias exactly when pre_norm is off")
    from functools import partial

    from torch import nn

    acts = {"gelu": nn.GELU, "gelu_tanh": partial(nn.GELU, approximate="tanh"), "silu": nn.SiLU, "relu": nn.ReLU}
    if cfg.activation == "quick_gelu":
        from timm.layers import QuickGELU

        act = QuickGELU
    else:
        act = acts[cfg.activation]
    kw: dict[str, Any] = dict(
        img_size=(cfg.img_h, cfg.img_w),
        patch_size=cfg.patch_dim,
        in_chans=cfg.num_channels,
        num_classes=cfg.num_classes,
        global_pool={"none": ""}.get(cfg.pool, cfg.pool),
        embed_dim=cfg.hidden_size,
        depth=cfg.num_layers,
        num_heads=cfg.num_attention_heads,
        mlp_ratio=cfg.ffn_hidden_size / cfg.hidden_size,
        qkv_bias=cfg.qkv_bias,
        qk_norm=cfg.qk_norm,
        proj_bias=cfg.proj_bias or cfg.mlp_bias,
        init_values=cfg.layer_scale_init,
        class_token=cfg.pool == "token" or cfg.class_token_length > 0,
        reg_tokens=max(cfg.class_token_length - 1, 0),
        no_embed_class=not cfg.pos_embed_prefix,
        pre_norm=cfg.pre_norm,
        final_norm=cfg.final_norm,
        fc_norm=cfg.use_fc_norm,
        norm_layer=partial(nn.LayerNorm, eps=cfg.norm_eps),
        act_layer=act,
    )
    if cfg.parallel_block:
        from timm.models.vision_transformer import ParallelScalingBlock

        kw["block_fn"] = ParallelScalingBlock
    return kw


# ----------------------------------------------------------------------------- state dicts


def _prefix_tokens(sd: dict[str, torch.Tensor]) -> torch.Tensor | None:
    toks = [sd[k] for k in ("cls_token", "reg_token") if k in sd]
    return torch.cat(toks, dim=1) if toks else None


def state_dict_from_timm(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """A timm ViT state dict -> a vitscale state dict for ``cfg`` (see :func:`config_from_timm`)."""
    H, D = cfg.num_attention_heads, cfg.hidden_size
    out: dict[str, torch.Tensor] = {}
    prefix = _prefix_tokens(sd)
    if prefix is not None:
        out["cls_token"] = prefix
    for k, v in sd.items():
        if k in ("cls_token", "reg_token"):
            continue
        if k.startswith("blocks.") and cfg.parallel_block:
            continue  # handled below
        if k.endswith("attn.qkv.weight") or k.endswith("attn.qkv.bias"):
            v = _heads_first(v, 3, H)
        elif k.startswith("attn_pool.kv."):
            v = _heads_first(v, 2, H)
        out[k] = v
    if cfg.parallel_block:
        Dh, F = D // H, cfg.ffn_hidden_size
        for i in range(cfg.num_layers):
            p = f"blocks.{i}."
            w = sd[p + "in_proj.weight"]
            out[p + "in_proj.weight"] = _group_in_proj(w[:F], w[F:], H)
            if p + "in_proj.bias" in sd:
                b = sd[p + "in_proj.bias"]
                out[p + "in_proj.bias"] = _group_in_proj(b[:F], b[F:], H)
            if sd.get(p + "mlp_bias") is not None:
                out[p + "mlp_bias"] = sd[p + "mlp_bias"].reshape(H, F // H)
            if p + "out_proj.weight" in sd:  # timm fuse_out_proj=True: columns [attn D | mlp F]
                w_out = sd[p + "out_proj.weight"]
                wa, wm = w_out[:, :D], w_out[:, D:]
                b_out = sd.get(p + "out_proj.bias")
            else:
                wa, wm = sd[p + "attn_out_proj.weight"], sd[p + "mlp_out_proj.weight"]
                ba, bm = sd.get(p + "attn_out_proj.bias"), sd.get(p + "mlp_out_proj.bias")
                b_out = None if ba is None else ba + bm
            cols = torch.cat([wa.reshape(D, H, Dh), wm.reshape(D, H, F // H)], dim=2)  # (D, H, Dh + F/H)
            out[p + "out_proj.weight"] = cols.reshape(D, -1)
            if b_out is not None:
                out[p + "out_proj.bias"] = b_out
            for name in ("in_norm.weight", "in_norm.bias"):
                if p + name in sd:
                    out[p + name.replace("in_norm", "norm")] = sd[p + name]
            for name in ("q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias", "ls.gamma"):
                if p + name in sd:
                    out[p + name] = sd[p + name]
    return out


def state_dict_to_timm(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """A vitscale ViT state dict -> the state dict of the timm model built from :func:`timm_kwargs`."""
    H, D = cfg.num_attention_heads, cfg.hidden_size
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k == "cls_token":
            if cfg.class_token_length >= 1:
                out["cls_token"] = v[:, :1]
            if cfg.class_token_length > 1:
                out["reg_token"] = v[:, 1:]
            continue
        if k.startswith("blocks.") and cfg.parallel_block:
            continue
        if k.endswith("attn.qkv.weight") or k.endswith("attn.qkv.bias"):
            v = _parts_first(v, 3, H)
        elif k.startswith("attn_pool.kv."):
            v = _parts_first(v, 2, H)
        out[k] = v
    if cfg.parallel_block:
        Dh, F = D // H, cfg.ffn_hidden_size
        for i in range(cfg.num_layers):
            p = f"blocks.{i}."
            mlp_w, qkv_w = _ungroup_in_proj(sd[p + "in_proj.weight"], H, Dh)
            out[p + "in_proj.weight"] = torch.cat([mlp_w, qkv_w])
            if p + "in_proj.bias" in sd:
                mlp_b, qkv_b = _ungroup_in_proj(sd[p + "in_proj.bias"], H, Dh)
                out[p + "in_proj.bias"] = torch.cat([mlp_b, qkv_b])
            if p + "mlp_bias" in sd:
                out[p + "mlp_bias"] = sd[p + "mlp_bias"].reshape(F)
            elif not cfg.qkv_bias:  # timm always has an mlp_bias without a QKV bias
                out[p + "mlp_bias"] = mlp_w.new_zeros(F)
            cols = sd[p + "out_proj.weight"].reshape(D, H, Dh + F // H)
            out[p + "attn_out_proj.weight"] = cols[:, :, :Dh].reshape(D, D)
            out[p + "mlp_out_proj.weight"] = cols[:, :, Dh:].reshape(D, F)
            if p + "out_proj.bias" in sd:
                b = sd[p + "out_proj.bias"]
                out[p + "attn_out_proj.bias"] = torch.zeros_like(b)
                out[p + "mlp_out_proj.bias"] = b
            for name in ("norm.weight", "norm.bias"):
                if p + name in sd:
                    out[p + "in_" + name] = sd[p + name]
            for name in ("q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias", "ls.gamma"):
                if p + name in sd:
                    out[p + name] = sd[p + name]
    return out
