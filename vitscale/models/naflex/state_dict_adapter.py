"""timm ``NaFlexVit`` <-> vitscale NaFlex ViT, both ways, exactly; and classic ViT weights -> NaFlex.

Names: timm keeps its embedding in ``embeds`` (``embeds.proj`` a Linear on ``(ph, pw, C)`` patches,
``embeds.cls_token`` / ``embeds.reg_token``, ``embeds.pos_embed (1, gh, gw, D)`` or
``embeds.pos_embed_y`` / ``_x``); vitscale has ``patch_embed`` (the same Linear), one ``cls_token (1, L,
D)`` and ``pos_embed`` / ``pos_embed_y`` / ``pos_embed_x``. The blocks, norms, MAP head and classifier
are the ViT's, converted by the ViT adapter (``vitscale/models/vit/state_dict_adapter.py``: per-head
QKV / KV rows, parallel blocks, prefix tokens).

A classic ViT state dict (vitscale's, or timm's after ``vitscale.interop``) loads into a NaFlex ViT
through :func:`state_dict_from_vit`, which the model runs on loading (its load hook): the strided
patch convolution becomes the Linear on flattened patches, the ``(1, [L +] N, D)`` position table the
``(1, gh, gw, D)`` grid (resampled if the grids differ), and the prefix tokens' own position
embeddings (a ViT with ``pos_embed_prefix``) are added to the tokens, which computes the same, as
timm's ``checkpoint_filter_fn`` does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..common.pos_embed import resample_pos_embed
from ..common.renames import PASS_THROUGH, Rename, RenameTable, convert
from ..vit import state_dict_adapter as vit_adapter
from ..vit.finetune import RECOGNIZES as VIT_RECOGNIZES
from ..vit.state_dict_adapter import _NORMS, _activation, _is
from .configs import NaFlexConfig

_EMBEDS = RenameTable(  # the prefix tokens go on through the ViT adapter's cls_token / reg_token
    library="timm",
    entries=(
        Rename("patch_embed.weight", "embeds.proj.weight"),
        Rename("patch_embed.bias", "embeds.proj.bias"),
        Rename("cls_token", "embeds.cls_token"),
        Rename("reg_token", "embeds.reg_token"),
        Rename("pos_embed", "embeds.pos_embed"),
        Rename("pos_embed_y", "embeds.pos_embed_y"),
        Rename("pos_embed_x", "embeds.pos_embed_x"),
        PASS_THROUGH,
    ),
)


# ----------------------------------------------------------------------------- configs


def unsupported_timm_options(tm: Any) -> list[str]:
    """What a timm ``NaFlexVit`` uses that vitscale's NaFlex ViT cannot express (empty: nothing)."""
    e = tm.embeds
    why: list[str] = []
    if not e.is_linear:
        why.append("a convolutional patch embedding (timm embed_proj_type='conv'): NaFlex batches need the Linear one")
    if e.norm_input is not None or not isinstance(e.norm, nn.Identity):
        why.append("a norm before or after the patch embedding (timm input_norm_layer / embed_norm_layer)")
    if e.patch_interpolator is not None:
        why.append("patch-size interpolation (timm enable_patch_interpolator)")
    if not getattr(e, "channels_last", True):
        why.append("(C, ph, pw) patch layout (timm patchify_channels_last=False)")
    if e.dynamic_img_pad:
        why.append("inputs padded to a multiple of the patch size (timm dynamic_img_pad)")
    if e.patch_size[0] != e.patch_size[1]:
        why.append(f"non-square patches {tuple(e.patch_size)}")
    if e.pos_embed_type not in ("learned", "factorized"):
        why.append(f"pos_embed={e.pos_embed_type!r}")
    if getattr(e, "pos_embed_use_grid_sample", False):
        why.append("grid_sample position-embedding resampling (timm pos_embed_use_grid_sample)")
    if e.pos_embed_type == "learned" and e.pos_embed_interp_mode not in ("bicubic", "bilinear"):
        why.append(f"pos_embed_interp_mode={e.pos_embed_interp_mode!r}")
    if not e.pos_embed_antialias:
        why.append("position-embedding resampling without antialias (timm pos_embed_antialias=False)")
    if e.pos_embed_align_corners:
        why.append("position-embedding resampling with align_corners (timm pos_embed_align_corners=True)")
    if tm.rope is not None:
        why.append("rotary position embeddings (timm rope_type)")
    if tm.patch_drop is not None:
        why.append("patch dropout (timm patch_drop_rate)")
    if tm.pool_include_prefix:
        why.append("pooling that includes the prefix tokens (timm pool_include_prefix)")
    if tm.global_pool not in ("avg", "map", "token", ""):
        why.append(f"global_pool={tm.global_pool!r}")
    kinds = {type(b).__name__ for b in tm.blocks}
    if kinds - {"Block", "ParallelScalingBlock"} or len(kinds) > 1:
        why.append(f"{'/'.join(sorted(kinds))} blocks")
    return why


def config_from_timm(tm: Any) -> NaFlexConfig:
    """The ``NaFlexConfig`` equivalent to a timm ``NaFlexVit`` instance; ValueError listing what vitscale
    cannot express. The image size is timm's ``pretrained_cfg`` input size, else the grid's."""
    why = unsupported_timm_options(tm)
    if why:
        raise ValueError("; ".join(why))
    e, blk = tm.embeds, tm.blocks[0]
    D = tm.embed_dim
    if _is(blk, "ParallelScalingBlock"):
        heads, ffn = blk.num_heads, blk.in_proj.out_features - 3 * D
        qkv_bias = blk.in_proj.bias is not None
        mlp_bias = qkv_bias or blk.mlp_bias is not None
        out = blk.out_proj if blk.out_proj is not None else blk.attn_out_proj
        proj_bias, qk_norm = out.bias is not None, not isinstance(blk.q_norm, nn.Identity)
        act, norm, ls = blk.mlp_act, blk.in_norm, blk.ls
        attn_drop, proj_drop = blk.attn_drop.p, blk.mlp_drop.p
    else:
        heads, ffn = blk.attn.num_heads, blk.mlp.fc1.out_features
        qkv_bias, proj_bias = blk.attn.qkv.bias is not None, blk.attn.proj.bias is not None
        mlp_bias, qk_norm = blk.mlp.fc1.bias is not None, not isinstance(blk.attn.q_norm, nn.Identity)
        act, norm, ls = blk.mlp.act, blk.norm1, blk.ls1
        attn_drop, proj_drop = blk.attn.attn_drop.p, blk.attn.proj_drop.p
    if e.pos_drop.p != proj_drop:
        raise ValueError(f"timm pos_drop_rate {e.pos_drop.p} != proj_drop_rate {proj_drop}: vitscale has one hidden_dropout")
    if _NORMS.get(type(norm).__name__) is None or _activation(act) is None:
        raise ValueError(f"the {type(norm).__name__} norm / {type(act).__name__} activation")
    learned = e.pos_embed_type == "learned"
    grid = tuple(e.pos_embed.shape[1:3]) if learned else (e.pos_embed_y.shape[1], e.pos_embed_x.shape[1])
    patch = e.patch_size[0]
    size = (getattr(tm, "pretrained_cfg", None) or {}).get("input_size")
    img_h, img_w = (size[1], size[2]) if size else (grid[0] * patch, grid[1] * patch)
    last = tm.blocks[-1]
    drop_path = getattr(getattr(last, "drop_path1", getattr(last, "drop_path", None)), "drop_prob", 0.0)
    return NaFlexConfig(
        img_h=img_h,
        img_w=img_w,
        patch_dim=patch,
        num_channels=e.in_chans,
        num_layers=len(tm.blocks),
        hidden_size=D,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        hidden_dropout=proj_drop,
        attention_dropout=attn_drop,
        num_classes=tm.num_classes,
        drop_path_rate=drop_path,
        class_token_length=tm.num_prefix_tokens,
        class_token=tm.has_class_token or tm.num_prefix_tokens == 0,
        pool={"": "none"}.get(tm.global_pool, tm.global_pool),
        fc_norm=not isinstance(tm.fc_norm, nn.Identity),
        final_norm=not (isinstance(tm.norm, nn.Identity) and isinstance(tm.fc_norm, nn.Identity)),
        pre_norm=not isinstance(tm.norm_pre, nn.Identity),
        head_dropout=tm.head_drop.p,
        parallel_block=_is(blk, "ParallelScalingBlock"),
        qk_norm=qk_norm,
        qkv_bias=qkv_bias,
        proj_bias=proj_bias,
        mlp_bias=mlp_bias,
        norm_type=_NORMS[type(norm).__name__],
        norm_bias=getattr(norm, "bias", None) is not None or _NORMS[type(norm).__name__] == "rmsnorm",
        patch_bias=e.proj.bias is not None,
        norm_eps=norm.eps,
        activation=_activation(act),
        layer_scale_init=None if isinstance(ls, nn.Identity) else ls.init_values,
        pos_embed_grid=grid,
        pos_embed_type=e.pos_embed_type,
        pos_embed_interp=e.pos_embed_interp_mode if learned else "bicubic",
        pos_embed_ar_preserving=e.pos_embed_ar_preserving,
    )


def timm_kwargs(cfg: NaFlexConfig) -> dict[str, Any]:
    """Keyword arguments for ``timm.models.naflexvit.NaFlexVit`` matching ``cfg`` (the ViT adapter's
    settings — and its refusals — plus the NaFlex embedding's)."""
    kw = vit_adapter.timm_kwargs(cfg)
    for vit_only in ("no_embed_class", "patch_drop_rate", "img_size"):
        kw.pop(vit_only)
    kw.update(
        pos_embed=cfg.pos_embed_type,
        pos_embed_grid_size=cfg.pos_grid,
        pos_embed_interp_mode=cfg.pos_embed_interp,
        pos_embed_ar_preserving=cfg.pos_embed_ar_preserving,
        embed_proj_type="linear",
    )
    return kw


# ----------------------------------------------------------------------------- state dicts


def state_dict_from_timm(sd: dict[str, torch.Tensor], cfg: NaFlexConfig) -> dict[str, torch.Tensor]:
    """A timm ``NaFlexVit`` state dict -> a vitscale NaFlex ViT state dict for ``cfg``."""
    return vit_adapter.state_dict_from_timm(convert(sd, _EMBEDS, to="ours"), cfg)


def state_dict_to_timm(sd: dict[str, torch.Tensor], cfg: NaFlexConfig) -> dict[str, torch.Tensor]:
    """A vitscale NaFlex ViT state dict -> the state dict of the timm ``NaFlexVit`` of :func:`timm_kwargs`."""
    return convert(vit_adapter.state_dict_to_timm(sd, cfg), _EMBEDS, to="theirs")


def conv_to_linear(w: torch.Tensor) -> torch.Tensor:
    """A strided patch convolution's weight ``(D, C, p, p)`` -> the Linear on ``(ph, pw, C)`` patches ``(D, p*p*C)``."""
    return w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)


def state_dict_from_vit(sd: dict[str, torch.Tensor], cfg: NaFlexConfig, prefix: str = "") -> None:
    """Convert, in place, the classic-ViT entries of a state dict under ``prefix`` to the NaFlex layout
    of ``cfg`` (see the module docstring); a NaFlex state dict passes unchanged, and so does what
    cannot be converted (the loader then names it)."""
    conv = sd.pop(prefix + "patch_embed.proj.weight", None)
    if conv is not None:
        sd[prefix + "patch_embed.weight"] = conv_to_linear(conv)
        if prefix + "patch_embed.proj.bias" in sd:
            sd[prefix + "patch_embed.bias"] = sd.pop(prefix + "patch_embed.proj.bias")
    key = prefix + "pos_embed"
    pe = sd.get(key)
    if pe is None or cfg.pos_embed_type != "learned":
        return
    gh, gw = cfg.pos_grid
    if 0 in pe.shape:
        return  # an empty grid: nothing to resample, the shape check names it
    if pe.ndim == 4:  # a NaFlex grid of another size
        if tuple(pe.shape[1:3]) != (gh, gw):
            old = tuple(pe.shape[1:3])
            sd[key] = resample_pos_embed(pe.reshape(1, -1, pe.shape[-1]), (gh, gw), old, 0).reshape(1, gh, gw, -1)
        return
    if pe.ndim != 3:
        return
    n = pe.shape[1]
    tokens = sd.get(prefix + "cls_token")
    L = 0 if tokens is None else tokens.shape[1]
    square = lambda k: k > 0 and math.isqrt(k) ** 2 == k  # noqa: E731
    if L and (n - L == gh * gw or (square(n - L) and not square(n))):  # prefix embeddings: fold them in
        sd[prefix + "cls_token"] = tokens + pe[:, :L]
        pe = pe[:, L:]
        n -= L
    if n <= 0:
        return  # no grid left once the prefix tokens are folded in: the shape check names it
    side = math.isqrt(n)
    if side * side == n:
        old = (side, side)
    elif n == gh * gw:
        old = (gh, gw)
    else:
        return  # an unknown non-square grid: the loader reports the shapes
    sd[key] = resample_pos_embed(pe, (gh, gw), old, 0).reshape(1, gh, gw, -1)


def RECOGNIZES(sd) -> bool:  # noqa: N802 - the FamilySpec slot's name
    """vitscale's NaFlex naming (a Linear patch embedding), or a classic ViT's in vitscale's naming
    (``FamilySpec.recognizes``)."""
    return "patch_embed.weight" in sd or VIT_RECOGNIZES(sd)


__all__ = [
    "RECOGNIZES", "config_from_timm", "conv_to_linear", "state_dict_from_timm",
    "state_dict_from_vit", "state_dict_to_timm", "timm_kwargs", "unsupported_timm_options",
]  # fmt: skip
