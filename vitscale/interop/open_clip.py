"""open_clip <-> vitscale: configs, models and weights, both ways, exactly.

Each function asks the model family's open_clip adapter (``FamilySpec.adapters["open_clip"]``; CLIP's
lives in ``vitscale/models/clip/state_dict_adapter.py``, with what it supports):

- ``from_open_clip(model)`` -> the equivalent vitscale model (a :class:`~vitscale.models.clip.CLIP`) with
  its weights.
- ``to_open_clip(model)`` -> a state dict that loads with ``strict=True`` into the open_clip model
  built by ``create_open_clip_model(model)`` (or ``open_clip.model.CLIP(**open_clip_config(model))``).
- ``load_open_clip_checkpoint(path, name)`` -> a vitscale model from a local open_clip ``.safetensors``
  or ``.pt``/``.bin`` file (tensors only, ``weights_only``; no network). ``name`` is the open_clip
  architecture (``"ViT-B-32"``) or a vitscale variant (``"clip_b32"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..models.registry import family_of, get_family, library_adapter, list_models


def open_clip_config(model_or_cfg: Any) -> dict[str, Any]:
    """Keyword arguments for ``open_clip.model.CLIP`` that match a vitscale model or its variant config."""
    cfg = model_or_cfg.cfg if isinstance(model_or_cfg, nn.Module) else model_or_cfg
    return family_of(cfg).adapter("open_clip").library_kwargs(cfg)


def create_open_clip_model(model: nn.Module, load_weights: bool = True) -> nn.Module:
    """The open_clip model matching a vitscale model (with its weights unless ``load_weights=False``)."""
    return family_of(model).adapter("open_clip").create(model, load_weights)


def from_open_clip(oc: nn.Module) -> nn.Module:
    """The vitscale model equivalent to an open_clip model, carrying its weights."""
    return library_adapter("open_clip", oc).from_library(oc)


def to_open_clip(model: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict that loads with ``strict=True`` into ``create_open_clip_model(model)``."""
    return family_of(model).adapter("open_clip").to_library(model)


def load_open_clip_checkpoint(path: str | Path, name: str) -> nn.Module:
    """A vitscale model from an open_clip checkpoint file on disk (no network).

    The open_clip architecture ``name`` (or a vitscale variant, mapped through its family's adapter's
    ``names``) is built on the meta device without pretrained weights, filled from ``path`` with
    ``strict=True`` and converted.
    """
    import open_clip
    from open_clip.model import CLIP as OpenCLIP

    from . import _read_tensors

    oc_name = get_family(name).adapter("open_clip").names.get(name, name) if name in list_models() else name
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
    return from_open_clip(oc)


__all__ = [
    "create_open_clip_model", "from_open_clip", "load_open_clip_checkpoint", "open_clip_config", "to_open_clip",
]  # fmt: skip
