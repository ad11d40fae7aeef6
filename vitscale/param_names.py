"""Parameter names vitscale changed, and how weights written under the former names are read — one
leaf module that the checkpoints (resuming a run) and the models' loaders (``checkpoint.init_from``,
``vitscale eval``, export) both import.

vitscale's fused projections keep their rows per head (Megatron's layout, so that a tensor-parallel
shard of rows holds whole heads), where timm and open_clip stack them ``[q; k; v]``. They used to carry
timm's names (``attn.qkv``, ``attn_pool.kv``, ViT-22B ``in_proj`` / ``out_proj`` / ``mlp_bias``), so a
state dict's names did not say whose layout it held. Each now has a name of its own, ``*_per_head``
(:data:`RENAMED`), and a name no longer holds two layouts.

Weights written before (a run folder, checkpoint or ``.safetensors`` in vitscale's format) still load:
a tensor the model asks for under a new name, absent from the weights, is taken from its former name
when the weights have that one (:func:`with_current_names`; a training checkpoint's tensors, optimizer
states included: :func:`with_former_names`). Only names the model has are mapped, so a family with
its own ``qkv`` module (a plug-in's) is never touched.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

RENAMED = {
    "qkv_per_head": "qkv",  # Attention: rows (H, 3, Dh); timm's attn.qkv (3, H, Dh)
    "kv_per_head": "kv",  # MAP head / VOLO class attention: rows (H, 2, Dh); timm's (2, H, Dh)
    "in_proj_per_head": "in_proj",  # ViT-22B: rows (H, 3*Dh + F/H); timm's [mlp F | q | k | v]
    "out_proj_per_head": "out_proj",  # ViT-22B: columns (H, Dh + F/H); timm's [attn D | mlp F]
    "mlp_bias_per_head": "mlp_bias",  # ViT-22B: (H, F/H); timm's (F,)
}
"""Current name of a module or parameter (one part of a dotted name) -> the name it had before."""


def former_name(name: str) -> str:
    """``name`` (dotted, e.g. ``blocks.0.attn.qkv_per_head.weight``) as it was written before the
    rename (``blocks.0.attn.qkv.weight``); ``name`` itself when none of its parts was renamed."""
    return ".".join(RENAMED.get(part, part) for part in name.split("."))


def with_current_names(sd: Mapping[str, Any], wanted: Collection[str]) -> tuple[dict[str, Any], list[str]]:
    """``sd`` with each tensor stored under the former name of a ``wanted`` name renamed to it (when
    ``sd`` lacks the current name and ``wanted`` the former one), and the former names so mapped."""
    wanted = set(wanted)
    new_of = {}
    for name in wanted:
        old = former_name(name)
        if old != name and name not in sd and old in sd and old not in wanted:
            new_of[old] = name
    return {new_of.get(k, k): v for k, v in sd.items()}, sorted(new_of)


def _leaves(tree: Any, prefix: str) -> list[str]:
    if isinstance(tree, Mapping):
        return [n for k, v in tree.items() for n in _leaves(v, f"{prefix}.{k}")]
    return [prefix]


def with_former_names(tree: Mapping[str, Any], present: Collection[str], prefix: str = "") -> dict[str, Any]:
    """A nested state (``{"model": {...}, "optim": {"state": {name: {...}}}}``, flattened by
    torch.distributed.checkpoint into dotted names) whose keys are renamed back to their former names
    wherever the checkpoint's names ``present`` have the former name and not the current one: what
    loads a checkpoint written before the rename in place (the tensors are the same objects)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        old = former_name(key)
        if old != key:
            here, before = (_leaves(value, prefix + k) for k in (key, old))
            if not any(n in present for n in here) and all(n in present for n in before):
                key = old
        out[key] = with_former_names(value, present, f"{prefix}{key}.") if isinstance(value, Mapping) else value
    return out


__all__ = ["RENAMED", "former_name", "with_current_names", "with_former_names"]
