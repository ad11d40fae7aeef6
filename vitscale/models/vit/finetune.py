"""What fine-tuning asks of the ViT family (its ``FamilySpec`` slots): whether a state dict's names
are a ViT's, which architecture a state dict shows, and the layers of layer-wise LR decay.

vitscale's naming of a ViT differs from timm's exactly where the layouts differ: the fused
projections, whose rows vitscale keeps per head, are named ``*_per_head`` (``state_dict_adapter.py``),
so a state dict's names say whose it is (:func:`vit_naming`); one without any fused projection reads
the same either way.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import nn

from ...param_names import RENAMED


def vit_naming(sd: Collection[str], prefix: str = "") -> str:
    """``vitscale`` or ``timm``: whose naming the ViT state dict ``sd`` (its names, or the dict itself)
    is in. vitscale's: a per-head projection (``attn.qkv_per_head``, ...); or, written before those
    names (:mod:`vitscale.param_names`), what timm never writes: a ViT-22B block's ``norm`` beside its
    ``in_proj`` (timm's is ``in_norm``), or ``cls_token`` holding registers too (timm's is one token,
    its registers ``reg_token``; read from the tensors' shapes when ``sd`` is a dict). Anything else,
    timm's — the one naming of a ViT without fused projections, which reads the same either way."""
    keys = [k[len(prefix) :] for k in sd if k.startswith(prefix)]
    if any(part in RENAMED for k in keys for part in k.split(".")):
        return "vitscale"
    names = set(keys)
    if any(k.endswith(".in_proj.weight") and k.replace(".in_proj.weight", ".norm.weight") in names for k in names):
        return "vitscale"
    cls = sd.get(prefix + "cls_token") if isinstance(sd, Mapping) else None
    if getattr(cls, "ndim", 0) == 3 and cls.shape[1] > 1 and "reg_token" not in names:
        return "vitscale"
    return "timm"


def RECOGNIZES(sd: Collection[str]) -> bool:  # noqa: N802 - the FamilySpec slot's name
    """vitscale's ViT naming: a strided patch convolution and :func:`vit_naming` ``vitscale``."""
    return "patch_embed.proj.weight" in sd and vit_naming(sd) == "vitscale"


def TIMM_RECOGNIZES(sd: Collection[str]) -> bool:  # noqa: N802
    """timm's ViT naming: a strided patch convolution and :func:`vit_naming` ``timm``."""
    return "patch_embed.proj.weight" in sd and vit_naming(sd) == "timm"


def _block_count(sd: Mapping[str, torch.Tensor], prefix: str) -> int | None:
    ids = {k[len(prefix) :].split(".", 1)[0] for k in sd if k.startswith(prefix)}
    ids = {int(i) for i in ids if i.isdigit()}
    return max(ids) + 1 if ids else None


def vit_architecture(sd: Mapping[str, torch.Tensor], prefix: str = "") -> dict[str, Any]:
    """The :class:`~vitscale.models.vit.configs.ViTConfig` fields a ViT state dict in vitscale's naming
    shows (under ``prefix``, e.g. ``visual.`` in a CLIP), in the order they are compared; the number
    of attention heads shows only through QK-norm weights, the image size is resampled, the class
    count re-initialised (both read, not compared)."""
    def get(k: str) -> torch.Tensor | None:
        return sd.get(prefix + k)

    out: dict[str, Any] = {}
    pe = get("patch_embed.proj.weight")
    if pe is not None and pe.ndim == 4:  # (D, C, p, p)
        out.update(hidden_size=int(pe.shape[0]), num_channels=int(pe.shape[1]), patch_dim=int(pe.shape[-1]))
    layers = _block_count(sd, prefix + "blocks.")
    if layers is not None:
        out["num_layers"] = layers
    parallel = get("blocks.0.in_proj_per_head.weight") is not None
    out["parallel_block"] = parallel
    fc1 = get("blocks.0.mlp.fc1.weight")
    if fc1 is not None:
        out["mlp_type"] = "mlp"
    elif get("blocks.0.mlp.fc1_x.weight") is not None:
        fc1, out["mlp_type"] = get("blocks.0.mlp.fc1_x.weight"), "swiglu"
    if fc1 is not None:
        out["ffn_hidden_size"] = int(fc1.shape[0])
    elif parallel and "hidden_size" in out:  # in_proj_per_head rows: per head (3 Dh + F / H)
        out["ffn_hidden_size"] = int(get("blocks.0.in_proj_per_head.weight").shape[0]) - 3 * out["hidden_size"]
    q_norm = get("blocks.0.attn.q_norm.weight")
    if q_norm is None:
        q_norm = get("blocks.0.q_norm.weight")
    out["qk_norm"] = q_norm is not None
    if q_norm is not None and "hidden_size" in out:  # (Dh,): the heads show
        out["num_attention_heads"] = out["hidden_size"] // int(q_norm.shape[0])
    if not parallel and layers:
        qv_only = get("blocks.0.attn.q_bias") is not None  # biases on queries and values only (key_bias=False)
        out["qkv_bias"] = get("blocks.0.attn.qkv_per_head.bias") is not None or qv_only
        if qv_only:
            out["key_bias"] = False
    if not parallel and layers:  # EVA-02's norms inside the attention and the SwiGLU
        out["attn_inner_norm"] = get("blocks.0.attn.norm.weight") is not None
        out["mlp_inner_norm"] = get("blocks.0.mlp.norm.weight") is not None
    if layers:  # RoPE-Mixed's learned frequencies, or none
        out["learned_rope_freqs"] = get("blocks.0.attn.rope_freqs") is not None
    # a learned table: pos_embed='learned', or RoPE with rope_ape (which the weights cannot tell
    # apart but for mixed RoPE); RoPE alone and no position embedding leave nothing to see
    out["learned_pos_table"] = get("pos_embed") is not None
    cls = get("cls_token")
    out["class_token_length"] = int(cls.shape[1]) if cls is not None else 0
    out["distill_token"] = get("dist_token") is not None
    if get("attn_pool.latent") is not None:
        out["pool"] = "map"
    out["pre_norm"] = get("norm_pre.weight") is not None
    head = get("head.weight")
    out["num_classes"] = int(head.shape[0]) if head is not None else 0
    return out


def architecture(sd: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """``FamilySpec.architecture`` of the ViT family."""
    return vit_architecture(sd)


def vit_layer_exponents(model: nn.Module, prefix: str = "") -> dict[str, int]:
    """BEiT's layer-wise LR decay of a ViT (timm ``param_groups_layer_decay`` with the ViT's
    ``group_matcher``): the embeddings (patch embedding, class / register / distillation / mask tokens,
    position embeddings, the pre-norm) ``L + 1`` times, block ``i`` ``L - i`` times, the rest (final
    norm, pooling head, classifier) not at all. ``prefix``: the tower's (``visual.``)."""
    L = len(model.blocks)
    stem = ("cls_token", "dist_token", "mask_token", "pos_embed", "patch_embed", "norm_pre")
    out = {prefix + name: L + 1 for name in stem}
    out.update({f"{prefix}blocks.{i}": L - i for i in range(L)})
    return out


def layer_decay(model: nn.Module) -> dict[str, int]:
    """``FamilySpec.layer_decay`` of the ViT family."""
    return vit_layer_exponents(model)


__all__ = ["RECOGNIZES", "TIMM_RECOGNIZES", "architecture", "layer_decay", "vit_architecture", "vit_layer_exponents", "vit_naming"]
