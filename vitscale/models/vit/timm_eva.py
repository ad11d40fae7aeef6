"""timm's ``Eva`` (``timm/models/eva.py``) with rotary position embeddings <-> vitscale's ViT, both ways.

The RoPE ViTs of timm — DINOv3 (``vit_*_patch16_dinov3``), the SBB ``vit_*_patch16_rope_*`` models —
are ``Eva`` instances: a pre-norm ViT whose position information is RoPE on the patch tokens' queries
and keys (``pos_embed='rope'`` here). What differs from timm's ``VisionTransformer`` layout:

- LayerScale: timm ``blocks.i.gamma_1`` / ``gamma_2``; vitscale ``blocks.i.ls1.gamma`` / ``ls2.gamma``.
- QKV bias: timm's EVA has none on the keys, ``attn.q_bias`` and ``attn.v_bias`` (the same names
  here, ``key_bias=False``); the fused QKV rows (timm ``attn.qkv``, vitscale ``attn.qkv_per_head``)
  are permuted per head as for the ViT.
- Prefix tokens: ``cls_token`` and ``reg_token``, joined as for the ViT.
- SwiGLU MLP (DINOv3 S+/H+/7B): timm's two-layer ``SwiGLU``, the same names (``fc1_g``, ``fc1_x``, ``fc2``);
  timm's packed ``GluMlp`` (EVA-02 Ti/S, ``swiglu_packed``): one ``fc1``, gate rows then value rows;
  EVA-02 B's norm inside the SwiGLU (``mlp_inner_norm``): ``mlp.norm``, the same name.
- Unfused projections (EVA-02 B, ``qkv_fused=False``): timm's ``attn.q_proj`` / ``k_proj`` / ``v_proj``
  stacked into one fused QKV (their biases: ``q_bias`` / ``v_bias``, or the fused bias with a key bias).
- RoPE: timm's ``RotaryEmbeddingCat`` (index grid) -> ``rope_type='axial'``, its
  ``RotaryEmbeddingDinoV3`` -> ``rope_type='dinov3'`` (neither stores anything in the state dict), its
  ``RotaryEmbeddingMixed`` -> ``rope_type='mixed'``: timm's ``rope.freqs`` ``(2, L, H, Dh/2)`` is each
  block's ``attn.rope_freqs`` ``(H, 2, Dh/2)``. A learned table beside RoPE (``rope_ape``):
  ``pos_embed``, the same name and layout as the ViT's.

A timm model is converted only when the ``Eva`` rebuilt from the derived config has the same module
tree, settings and shapes (``layout_differences``); anything else is refused in one line.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from ..common.renames import PASS_THROUGH, Rename, RenameTable, convert, per_head
from .configs import ViTConfig
from .state_dict_adapter import (
    _NORMS,
    _is,
    _mlp_ratio,
    _prefix_tokens_from_timm,
    _prefix_tokens_to_timm,
    drop_mask_token,
)
from .timm_meta import build_meta, layout_differences

_ROPES = {"RotaryEmbeddingCat": "axial", "RotaryEmbeddingDinoV3": "dinov3", "RotaryEmbeddingMixed": "mixed"}


def unsupported_eva_options(tm: Any) -> list[str]:
    """What a timm ``Eva`` uses that :func:`config_from_eva` does not read (empty: nothing)."""
    why: list[str] = []
    rope = getattr(tm, "rope", None)
    kind = _ROPES.get(type(rope).__name__)
    if rope is None:
        why.append("no rotary position embeddings (an Eva without RoPE)")
    elif kind is None:
        why.append(f"{type(rope).__name__} rotary embeddings (RotaryEmbeddingCat, RotaryEmbeddingDinoV3 and RotaryEmbeddingMixed convert)")
    elif kind == "mixed" and getattr(rope, "grid_indexing", "xy") != "xy":
        why.append("mixed RoPE on an 'ij' grid (RoPE-ViT's, as timm registers it, is on an 'xy' grid)")
    blk = tm.blocks[0]
    if not _is(blk, "EvaBlock"):
        why.append(f"{type(blk).__name__} blocks")
    elif _is(blk.attn, "AttentionRope"):  # timm's attn_type='rope' (vit_*_rope_*_224): q, k and v biased alike
        a = blk.attn
        if a.num_kv_heads != a.num_heads or a.gate is not None:
            why.append("RoPE attention with grouped or gated projections")
        elif a.rotate_half or kind == "dinov3":
            why.append("timm's AttentionRope (biased keys) with half-split or DINOv3 RoPE (vit_*_rope_*_224's: axial or mixed, neighbours)")
        elif kind == "axial" and getattr(rope, "grid_indexing", "ij") != "xy":
            why.append("timm's AttentionRope with axial RoPE on an 'ij' grid (vit_*_rope_224's: an 'xy' grid)")
    elif not _is(blk.attn, "EvaAttention") or blk.attn.gate is not None:
        why.append("attention other than EVA's (fused or unfused QKV, no gate)")
    if _is(blk, "EvaBlock"):
        if getattr(blk, "gamma_1", None) is not None and getattr(blk, "gamma_2", None) is None:
            why.append("LayerScale on the attention branch only (timm attn_only_layer_scale)")
        mlp = blk.mlp
        if _is(mlp, "GluMlp") and not (_is(mlp.act, "SiLU") and not mlp.gate_last and isinstance(mlp.norm, nn.Identity)):
            why.append("a GluMlp other than timm's packed SwiGLU (SiLU on the first half, no norm)")
        elif _is(mlp, "Mlp") and not isinstance(mlp.norm, nn.Identity):
            why.append("a norm inside a GELU MLP (timm scale_mlp without swiglu_mlp; vitscale's is inside a SwiGLU)")
        elif not _is(mlp, "Mlp", "SwiGLU", "GluMlp"):
            why.append(f"a {type(mlp).__name__} MLP")
    if tm.global_pool not in ("token", "avg", "map", ""):
        why.append(f"global_pool={tm.global_pool!r}")
    if tm.global_pool == "map" and tm.num_prefix_tokens:
        why.append("MAP pooling over the prefix tokens too (vitscale's MAP head pools the patch tokens)")
    if tm.patch_drop is not None:
        why.append("patch dropout with RoPE")
    norm = getattr(blk, "norm1", None)
    if norm is not None and type(norm).__name__ not in _NORMS:
        why.append(f"{type(norm).__name__} norm layers")
    return why


def config_from_eva(tm: Any) -> ViTConfig:
    """The ``ViTConfig`` of a timm ``Eva`` with RoPE (ValueError listing what cannot be expressed)."""
    why = unsupported_eva_options(tm)
    if why:
        raise ValueError("; ".join(why))
    blk, rope = tm.blocks[0], tm.rope
    attn, mlp = blk.attn, blk.mlp
    kind = _ROPES[type(rope).__name__]
    ref = getattr(rope, "ref_feat_shape", None)
    grid, patch = tm.patch_embed.grid_size, tm.patch_embed.patch_size[0]
    last = tm.blocks[-1]
    rope_attn = _is(attn, "AttentionRope")  # q, k and v biased, or none
    fused = attn.qkv is not None
    if fused:
        qkv_bias = (attn.qkv.bias is not None) if rope_attn else attn.q_bias is not None
    else:
        qkv_bias = attn.q_proj.bias is not None
    packed, swiglu = _is(mlp, "GluMlp"), _is(mlp, "SwiGLU", "GluMlp")
    ffn = mlp.fc1.out_features // 2 if packed else (mlp.fc1_x if swiglu else mlp.fc1).out_features
    return ViTConfig(
        img_h=grid[0] * patch,
        img_w=grid[1] * patch,
        patch_dim=patch,
        num_channels=tm.patch_embed.proj.in_channels,
        num_layers=len(tm.blocks),
        hidden_size=tm.embed_dim,
        ffn_hidden_size=ffn,
        num_attention_heads=attn.num_heads,
        hidden_dropout=attn.proj_drop.p,
        attention_dropout=attn.attn_drop.p,
        num_classes=tm.num_classes,
        drop_path_rate=getattr(last.drop_path1, "drop_prob", 0.0),
        class_token_length=tm.num_prefix_tokens,
        class_token=tm.cls_token is not None or tm.num_prefix_tokens == 0,
        pool={"": "none"}.get(tm.global_pool, tm.global_pool),
        fc_norm=not isinstance(tm.fc_norm, nn.Identity),
        final_norm=not (isinstance(tm.norm, nn.Identity) and isinstance(tm.fc_norm, nn.Identity)),
        pre_norm=not isinstance(tm.norm_pre, nn.Identity),
        head_dropout=tm.head_drop.p,
        qk_norm=not isinstance(attn.q_norm, nn.Identity),
        qkv_bias=qkv_bias,
        key_bias=rope_attn or not qkv_bias,  # EVA's keys never have a bias; without one at all, the default
        norm_type=_NORMS[type(blk.norm1).__name__],
        patch_bias=tm.patch_embed.proj.bias is not None,
        norm_eps=blk.norm1.eps,
        activation="gelu",
        mlp_type="swiglu" if swiglu else "mlp",
        layer_scale_init=blk.init_values,
        pos_embed_prefix=not tm.no_embed_class,
        pos_embed="rope",
        rope_type=kind,
        rope_temperature=float(rope.temperature),
        rope_rotate_half=bool(getattr(rope, "rotate_half", False)),
        rope_grid_offset=float(getattr(rope, "grid_offset", 0.0)),
        rope_ref_grid=tuple(ref) if ref is not None else None,
        rope_ape=tm.pos_embed is not None,
        attn_inner_norm=not isinstance(attn.norm, nn.Identity),
        mlp_inner_norm=_is(mlp, "SwiGLU") and not isinstance(mlp.norm, nn.Identity),
        qkv_fused=fused,
        swiglu_packed=packed,
    )


def eva_kwargs(cfg: ViTConfig) -> dict[str, Any]:
    """Keyword arguments of timm's ``Eva`` matching a RoPE ``cfg`` (ValueError for what timm's EVA lacks)."""
    why = []
    if cfg.pos_embed != "rope":
        why.append(f"pos_embed={cfg.pos_embed!r} (timm's EVA conversion is for pos_embed='rope')")
    xy, rope_attn, mixed = _xy(cfg), _rope_attention(cfg), cfg.rope_type == "mixed"
    if cfg.qkv_bias and cfg.key_bias and not rope_attn:
        why.append("a key bias (timm's EVA has q and v biases only; its AttentionRope, a key bias with axial or mixed "
                   "RoPE on pairs of neighbours)")  # fmt: skip
    if mixed and (cfg.rope_rotate_half or cfg.rope_grid_offset):
        why.append("mixed RoPE with half-split pairs or a grid offset (timm's RotaryEmbeddingMixed: neighbours, patch indices)")
    if cfg.swiglu_packed and cfg.mlp_inner_norm:
        why.append("a packed SwiGLU with a norm inside (timm's Eva packs it only without: GluMlp)")
    if cfg.activation != "gelu" or not (cfg.proj_bias and cfg.mlp_bias) or cfg.parallel_block or cfg.pre_logits:
        why.append("activation, biases or blocks other than EVA's (gelu, biased projections, standard blocks)")
    if cfg.pool == "map" and cfg.num_prefix_tokens:
        why.append("MAP pooling with prefix tokens (timm's Eva pools them too)")
    if cfg.distill_token:
        why.append("a distillation token")
    if cfg.norm_type == "layernorm" and not cfg.norm_bias:
        why.append("LayerNorms without bias")
    if cfg.patch_bias == cfg.pre_norm:
        why.append("timm gives the patch embedding a bias exactly when pre_norm is off")
    if why:
        raise ValueError("no timm Eva equivalent: " + "; ".join(why))
    from timm.layers import LayerNorm, RmsNorm

    norm = partial(RmsNorm if cfg.norm_type == "rmsnorm" else LayerNorm, eps=cfg.norm_eps)
    class_token = cfg.class_token and cfg.class_token_length > 0
    return dict(
        img_size=(cfg.img_h, cfg.img_w),
        patch_size=cfg.patch_dim,
        in_chans=cfg.num_channels,
        num_classes=cfg.num_classes,
        global_pool={"none": ""}.get(cfg.pool, cfg.pool),
        embed_dim=cfg.hidden_size,
        depth=cfg.num_layers,
        num_heads=cfg.num_attention_heads,
        qkv_bias=cfg.qkv_bias,
        qk_norm=cfg.qk_norm,
        mlp_ratio=_mlp_ratio(cfg.ffn_hidden_size, cfg.hidden_size),
        # SwiGLU: timm's two-layer SwiGLU is built only with an alignment (1: the width as it is)
        # timm's two-layer SwiGLU is built with an alignment or a norm inside (scale_mlp), its packed GluMlp without
        swiglu_mlp=cfg.mlp_type == "swiglu",
        swiglu_align_to=1 if cfg.mlp_type == "swiglu" and not cfg.swiglu_packed else 0,
        scale_mlp=cfg.mlp_inner_norm,
        scale_attn_inner=cfg.attn_inner_norm,
        qkv_fused=cfg.qkv_fused,
        drop_rate=cfg.head_dropout,
        pos_drop_rate=cfg.hidden_dropout,
        proj_drop_rate=cfg.hidden_dropout,
        attn_drop_rate=cfg.attention_dropout,
        drop_path_rate=cfg.drop_path_rate,
        norm_layer=norm,
        init_values=cfg.layer_scale_init,
        class_token=class_token,
        num_reg_tokens=cfg.class_token_length - int(class_token),
        no_embed_class=not cfg.pos_embed_prefix,
        use_abs_pos_emb=cfg.rope_ape,
        use_rot_pos_emb=True,
        rope_type={"axial": "cat", "dinov3": "dinov3", "mixed": "mixed"}[cfg.rope_type],
        rope_grid_offset=cfg.rope_grid_offset,
        rope_temperature=cfg.rope_temperature,
        rope_rotate_half=cfg.rope_rotate_half,
        use_pre_transformer_norm=cfg.pre_norm,
        use_post_transformer_norm=cfg.final_norm and not cfg.use_fc_norm,
        use_fc_norm=cfg.final_norm and cfg.use_fc_norm,
        ref_feat_shape=cfg.rope_ref_grid,
        **({"attn_type": "rope"} if rope_attn else {}),
        **({"rope_grid_indexing": "xy"} if xy or mixed else {}),
    )


def _xy(cfg: ViTConfig) -> bool:
    """A RoPE ViT whose timm counterpart is an ``Eva`` with ``attn_type='rope'`` (timm's ``AttentionRope``, as
    ``vit_*_patch16_rope_224``, naver-ai/rope-vit): q, k and v biased, axial RoPE on pairs of neighbours, on
    timm's ``rope_grid_indexing='xy'`` grid — the first half of each head's channels turned by the column,
    the second by the row, where vitscale's axial RoPE turns the first half by the row
    (``vitscale/models/common/rope.py``). The same network with each head's query and key channels'
    halves swapped: :func:`_swap_qk_halves`."""
    return cfg.qkv_bias and cfg.key_bias and cfg.rope_type == "axial" and not cfg.rope_rotate_half


def _rope_attention(cfg: ViTConfig) -> bool:
    """Whether ``cfg``'s timm counterpart uses timm's ``AttentionRope`` (``attn_type='rope'``): biased
    queries, keys and values with :func:`_xy`'s axial RoPE or with mixed RoPE on pairs of neighbours
    (RoPE-ViT, naver-ai/rope-vit, as timm registers ``vit_*_patch16_rope_mixed_224``)."""
    mixed = cfg.rope_type == "mixed" and cfg.qkv_bias and cfg.key_bias and not cfg.rope_rotate_half
    return _xy(cfg) or mixed


def _swap_qk_halves(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """timm's fused ``attn.qkv`` rows ``(3, H, Dh)``: each head's query and key channels ``[:Dh/2]`` and
    ``[Dh/2:]`` swapped (its own inverse). A query-key dot product is unchanged by one permutation of both's
    channels: this moves the row-turned channels where vitscale's RoPE turns by the row."""
    H = cfg.num_attention_heads
    Dh = cfg.hidden_size // H
    out = dict(sd)
    for key, t in sd.items():
        if key.startswith("blocks.") and key.endswith((".attn.qkv.weight", ".attn.qkv.bias")):
            r = t.reshape(3, H, 2, Dh // 2, *t.shape[1:])
            qk = r[:2].flip(2)
            out[key] = torch.cat([qk, r[2:]]).reshape(t.shape)
    return out


def _table(cfg: ViTConfig) -> RenameTable:
    H = cfg.num_attention_heads
    return RenameTable(
        library="timm",
        entries=(
            Rename("blocks.*.attn.qkv_per_head.*", "blocks.*.attn.qkv.*", *per_head(3, H)),
            Rename("blocks.*.ls1.gamma", "blocks.*.gamma_1"),
            Rename("blocks.*.ls2.gamma", "blocks.*.gamma_2"),
            Rename("attn_pool.kv_per_head.**", "attn_pool.kv.**", *per_head(2, H)),
            PASS_THROUGH,
        ),
    )


def _join_qkv(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> None:
    """In place: each block's unfused timm ``attn.q_proj`` / ``k_proj`` / ``v_proj`` (``qkv_fused=False``)
    -> the fused ``attn.qkv`` rows ``[q; k; v]`` timm's fused attention has; their biases -> ``attn.q_bias``
    / ``attn.v_bias`` (EvaAttention: the keys have none) or the fused ``attn.qkv.bias`` (AttentionRope)."""
    for i in range(cfg.num_layers):
        a = f"blocks.{i}.attn."
        if a + "q_proj.weight" not in sd:
            continue
        sd[a + "qkv.weight"] = torch.cat([sd.pop(a + f"{x}_proj.weight") for x in "qkv"])
        q, k, v = (sd.pop(a + f"{x}_proj.bias", None) for x in "qkv")
        if k is not None:
            sd[a + "qkv.bias"] = torch.cat([q, k, v])
        elif q is not None:
            sd[a + "q_bias"], sd[a + "v_bias"] = q, v


def _split_qkv(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> None:
    """In place, the inverse of :func:`_join_qkv` (for ``qkv_fused=False``)."""
    for i in range(cfg.num_layers):
        a = f"blocks.{i}.attn."
        for x, w in zip("qkv", sd.pop(a + "qkv.weight").chunk(3)):
            sd[a + f"{x}_proj.weight"] = w
        if a + "qkv.bias" in sd:
            for x, b in zip("qkv", sd.pop(a + "qkv.bias").chunk(3)):
                sd[a + f"{x}_proj.bias"] = b
        elif a + "q_bias" in sd:
            sd[a + "q_proj.bias"], sd[a + "v_proj.bias"] = sd.pop(a + "q_bias"), sd.pop(a + "v_bias")


def _unpack_swiglu(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> None:
    """In place: timm's packed ``mlp.fc1`` (``GluMlp``, ``gate_last=False``: the gate's rows first) ->
    ``mlp.fc1_g`` and ``mlp.fc1_x`` (``swiglu_packed``)."""
    if cfg.mlp_type != "swiglu":
        return
    for key in [k for k in sd if k.startswith("blocks.") and ".mlp.fc1." in k]:
        g, x = sd.pop(key).chunk(2)
        sd[key.replace(".fc1.", ".fc1_g.")], sd[key.replace(".fc1.", ".fc1_x.")] = g, x


def _pack_swiglu(sd: dict[str, torch.Tensor]) -> None:
    """In place, the inverse of :func:`_unpack_swiglu`."""
    for key in [k for k in sd if k.startswith("blocks.") and ".mlp.fc1_g." in k]:
        sd[key.replace(".fc1_g.", ".fc1.")] = torch.cat([sd.pop(key), sd.pop(key.replace(".fc1_g.", ".fc1_x."))])


def _mixed_freqs_from_timm(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> None:
    """In place: timm's ``rope.freqs`` ``(2, L, H, Dh/2)`` (``'xy'`` grid: [0] multiplies the column,
    [1] the row) -> each block's ``attn.rope_freqs`` ``(H, 2, Dh/2)``, the same order."""
    freqs = sd.pop("rope.freqs", None)
    if freqs is not None:
        for i in range(cfg.num_layers):
            sd[f"blocks.{i}.attn.rope_freqs"] = freqs[:, i].transpose(0, 1).contiguous()


def _mixed_freqs_to_timm(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> None:
    """In place, the inverse of :func:`_mixed_freqs_from_timm`."""
    if cfg.rope_type == "mixed":
        sd["rope.freqs"] = torch.stack([sd.pop(f"blocks.{i}.attn.rope_freqs").transpose(0, 1) for i in range(cfg.num_layers)], dim=1)


def state_dict_from_eva(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """A timm ``Eva`` state dict -> vitscale's, for the RoPE ``cfg`` of :func:`config_from_eva`. Unfused
    projections and a packed SwiGLU are read as they are found (whatever ``qkv_fused`` and
    ``swiglu_packed`` say: the same network)."""
    sd = dict(sd)
    _join_qkv(sd, cfg)
    _unpack_swiglu(sd, cfg)
    _mixed_freqs_from_timm(sd, cfg)
    sd = _swap_qk_halves(sd, cfg) if _xy(cfg) else sd
    joined = _prefix_tokens_from_timm(sd)
    return {**joined, **convert(sd, _table(cfg), to="ours")}


def state_dict_to_eva(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """vitscale's RoPE ViT state dict -> that of the timm ``Eva`` built from :func:`eva_kwargs` (without
    the training-only mask token, :func:`~vitscale.models.vit.state_dict_adapter.drop_mask_token`)."""
    sd = drop_mask_token(sd)
    _mixed_freqs_to_timm(sd, cfg)
    split = _prefix_tokens_to_timm(sd, cfg)
    out = {**split, **convert(sd, _table(cfg), to="theirs")}
    out = _swap_qk_halves(out, cfg) if _xy(cfg) else out
    if not cfg.qkv_fused:
        _split_qkv(out, cfg)
    if cfg.swiglu_packed:
        _pack_swiglu(out)
    return out


def to_eva(model: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict that loads with ``strict=True`` into :func:`create_eva` of ``model``."""
    return state_dict_to_eva(model.state_dict(), model.cfg)


def create_eva(model: nn.Module, load_weights: bool = True, **timm_overrides: Any) -> nn.Module:
    """timm's ``Eva`` matching a vitscale RoPE ViT (with its weights unless ``load_weights=False``);
    ``timm_overrides`` e.g. ``dynamic_img_size=True`` to feed it other image sizes."""
    from timm.models.eva import Eva

    tm = Eva(**{**eva_kwargs(model.cfg), **timm_overrides})
    if load_weights:
        tm.load_state_dict(to_eva(model), strict=True)
    return tm


def eva_from_timm(tm: nn.Module) -> nn.Module:
    """The vitscale ViT equivalent to a timm RoPE ``Eva``, with its weights (ValueError naming what
    differs when the rebuilt ``Eva`` would not be the same network)."""
    from timm.models.eva import Eva

    from .model import VisionTransformer

    cfg = config_from_eva(tm)
    ref = build_meta(Eva, **{**eva_kwargs(cfg), "dynamic_img_size": bool(tm.dynamic_img_size)})
    diffs = layout_differences(tm, ref)
    if diffs:
        raise ValueError("vitscale's ViT does not reproduce this timm Eva: " + "; ".join(diffs))
    device = next(tm.parameters()).device
    model = VisionTransformer(cfg, device="meta")
    model.load_state_dict(state_dict_from_eva(tm.state_dict(), cfg), strict=True, assign=True)
    return model.to(device=device)


__all__ = [
    "config_from_eva", "create_eva", "eva_from_timm", "eva_kwargs", "state_dict_from_eva", "state_dict_to_eva",
    "to_eva", "unsupported_eva_options",
]  # fmt: skip
