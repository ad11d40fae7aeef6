"""Use the weights you already have: timm and open_clip models <-> vitscale, exactly.

- ``from_timm(timm_model)`` -> the equivalent vitscale model carrying its weights (timm's
  ``VisionTransformer``, ``NaFlexVit`` or ``VOLO``).
- ``to_timm(model)`` -> a state dict that loads with ``strict=True`` into the timm model built by
  ``create_timm_model(model)`` (or from ``timm_kwargs(model)``).
- ``unsupported_timm_vits()`` -> ``{name: reason}`` for the installed timm's registered ViTs that
  vitscale's ViT cannot express; every other one converts exactly (``vitscale/models/vit/timm_registry.py``).
- ``load_timm_checkpoint(path, name)`` -> a vitscale model from a local timm ``.safetensors`` or
  ``.pth``/``.bin`` file (tensors only: never unpickles arbitrary objects; no network).
- CLIP: ``from_open_clip``, ``to_open_clip``, ``load_open_clip_checkpoint`` (in ``open_clip.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..models.naflex import NaFlexConfig, NaFlexViT
from ..models.naflex import state_dict_adapter as naflex_adapter
from ..models.vit import VisionTransformer
from ..models.vit import state_dict_adapter as vit_adapter
from ..models.volo import VOLO, VOLOConfig
from ..models.volo import state_dict_adapter as volo_adapter


def _is_timm_vit(m: nn.Module) -> bool:
    return type(m).__name__ == "VisionTransformer" and type(m).__module__.startswith("timm.")


def _is_timm_naflex(m: nn.Module) -> bool:
    return type(m).__name__ == "NaFlexVit" and type(m).__module__.startswith("timm.")


def _is_timm_volo(m: nn.Module) -> bool:
    return type(m).__name__ == "VOLO" and type(m).__module__.startswith("timm.")


def from_timm(timm_model: nn.Module) -> nn.Module:
    """The vitscale model equivalent to a timm ``VisionTransformer`` (or ``VOLO``), with its weights."""
    if _is_timm_volo(timm_model):
        return volo_adapter.volo_from_timm(timm_model)
    if _is_timm_naflex(timm_model):
        return naflex_adapter.naflex_from_timm(timm_model)  # ValueError naming what vitscale cannot express
    if not _is_timm_vit(timm_model):
        raise TypeError(f"from_timm supports timm VisionTransformer, NaFlexVit and VOLO, not {type(timm_model).__name__}")
    from ..models.vit.timm_registry import vit_from_timm

    return vit_from_timm(timm_model)  # ValueError naming what vitscale cannot express


def to_timm(model: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict that loads with ``strict=True`` into ``create_timm_model(model)``."""
    if isinstance(model, VisionTransformer):
        return vit_adapter.state_dict_to_timm(model.state_dict(), model.cfg)
    if isinstance(model, NaFlexViT):
        return naflex_adapter.state_dict_to_timm(model.state_dict(), model.cfg)
    if isinstance(model, VOLO):
        return volo_adapter.volo_to_timm(model)
    raise TypeError(f"to_timm supports vitscale ViT, NaFlex ViT and VOLO models, not {type(model).__name__}")


def timm_kwargs(model_or_cfg: Any) -> dict[str, Any]:
    """Keyword arguments for the timm model (``VisionTransformer`` or ``VOLO``) that matches a vitscale
    ViT or VOLO or its config: the family's state-dict adapter's ``timm_kwargs``."""
    cfg = model_or_cfg.cfg if isinstance(model_or_cfg, nn.Module) else model_or_cfg
    if isinstance(cfg, VOLOConfig):
        return volo_adapter.timm_kwargs(cfg)
    if isinstance(cfg, NaFlexConfig):  # (a ViTConfig too: asked first)
        return naflex_adapter.timm_kwargs(cfg)
    return vit_adapter.timm_kwargs(cfg)


def create_timm_model(model: nn.Module, load_weights: bool = True, **timm_overrides: Any) -> nn.Module:
    """The timm model matching a vitscale model (with its weights unless ``load_weights=False``).

    ``timm_overrides`` go to timm's ``VisionTransformer``, e.g. ``dynamic_img_size=True`` to feed the
    timm model other image sizes, as the vitscale model accepts them.
    """
    if isinstance(model, VOLO):
        return volo_adapter.create_timm_volo(model, load_weights=load_weights)
    if isinstance(model, NaFlexViT):
        return naflex_adapter.create_timm_naflex(model, load_weights=load_weights, **timm_overrides)
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    tm = TimmViT(**{**timm_kwargs(model), **timm_overrides})
    if load_weights:
        tm.load_state_dict(to_timm(model), strict=True)
    return tm


def _read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    sd = torch.load(path, map_location="cpu", weights_only=True)  # tensors and containers only
    for key in ("state_dict", "model", "module", "state_dict_ema"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
            break
    return {k.removeprefix("module."): v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def load_timm_checkpoint(path: str | Path, name: str, **timm_overrides: Any) -> nn.Module:
    """A vitscale model from a timm checkpoint file on disk.

    ``name`` is the timm architecture (e.g. ``"vit_base_patch16_224"``); the timm model is built
    without pretrained weights (no network), filled from ``path`` (``strict=True``), converted.
    """
    import timm

    sd = _read_tensors(path)
    tm = timm.create_model(name, pretrained=False, **timm_overrides)
    tm.load_state_dict(sd, strict=True)
    return from_timm(tm)


def unsupported_timm_vits(names: list[str] | None = None) -> dict[str, str]:
    """``{name: reason}`` for the installed timm's ViTs that vitscale cannot express (seconds, no network).

    Every other registered timm ``VisionTransformer`` converts exactly both ways; ``names`` limits the
    check to those timm model names. ``docs/timm_vits.md`` lists them all for the timm it names.
    """
    from ..models.vit.timm_registry import unsupported_timm_vits as _f

    return _f(names)


def from_open_clip(model: nn.Module) -> nn.Module:
    from .open_clip import from_open_clip as _f

    return _f(model)


def to_open_clip(model: nn.Module) -> dict[str, torch.Tensor]:
    from .open_clip import to_open_clip as _f

    return _f(model)


def load_open_clip_checkpoint(path: str | Path, name: str) -> nn.Module:
    from .open_clip import load_open_clip_checkpoint as _f

    return _f(path, name)


__all__ = [
    "create_timm_model",
    "from_open_clip",
    "from_timm",
    "load_open_clip_checkpoint",
    "load_timm_checkpoint",
    "timm_kwargs",
    "to_open_clip",
    "to_timm",
    "unsupported_timm_vits",
]
