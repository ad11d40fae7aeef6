"""timm's registered ViTs against vitscale's ViT: which convert exactly, and why the others do not.

- ``timm_vit_names()``: every name in the installed timm whose model is timm's ``VisionTransformer``
  (or a subclass of it), found by building the candidates on the meta device (no weights, no network);
  ``timm_vit_models()`` yields each name with its meta-device model.
- ``unsupported_timm_vits()``: ``{name: reason}`` for the names vitscale's ViT cannot express.
- ``architecture_differences(timm_model, cfg)``: where the timm model rebuilt from ``cfg`` would
  differ from ``timm_model`` (module types, shapes, every scalar setting); ``vit_from_timm`` refuses
  a model with any, so a conversion is exact or an error, never a silently different network.

Run-time switches that are not architecture: timm's ``dynamic_img_size`` (a vitscale ViT always accepts
other image sizes, interpolating its position embeddings as timm does) and ``ParallelScalingBlock``'s
``fuse_out_proj`` (the same weights in one matrix; ``to_timm`` writes the separate projections).
The public entry points are in ``vitscale.interop`` (``python -m vitscale.interop.timm_vit`` writes
the table of every name, docs/timm_vits.md).
"""

from __future__ import annotations

import importlib
from functools import partial
from typing import Any

import torch
from torch import nn

from ..spec import StateDictAdapter, is_library_model
from .configs import ViTConfig
from .finetune import TIMM_RECOGNIZES
from .state_dict_adapter import (
    TIMM_NAMES,
    config_from_timm,
    create_timm_vit,
    state_dict_from_timm,
    timm_kwargs,
    to_timm,
)
from .timm_meta import build_meta, layout_differences


def create_timm_meta(name: str, **kwargs: Any) -> nn.Module:
    """``timm.create_model(name)`` on the meta device: no weights, no download."""
    import timm

    return build_meta(timm.create_model, model_name=name, pretrained=False, **kwargs)


def timm_vit_on_meta(**kwargs: Any) -> nn.Module:
    """timm's ``VisionTransformer(**kwargs)`` on the meta device, without its weight init."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    return build_meta(TimmViT, **kwargs)


def _runtime_kwargs(tm: nn.Module) -> dict[str, Any]:
    """The timm options of ``tm`` that vitscale treats as run-time switches (see the module docstring)."""
    kw: dict[str, Any] = {"dynamic_img_size": bool(getattr(tm, "dynamic_img_size", False))}
    blk = tm.blocks[0]
    if type(blk).__name__ == "ParallelScalingBlock" and getattr(blk, "out_proj", None) is not None:
        from timm.models.vision_transformer import ParallelScalingBlock

        kw["block_fn"] = partial(ParallelScalingBlock, fuse_out_proj=True)
    return kw


def architecture_differences(tm: nn.Module, cfg: ViTConfig, limit: int = 3) -> list[str]:
    """Where timm's ``VisionTransformer(**timm_kwargs(cfg))`` differs from ``tm`` (empty: nowhere)."""
    ref = timm_vit_on_meta(**{**timm_kwargs(cfg), **_runtime_kwargs(tm)})
    return layout_differences(tm, ref, limit)


def timm_vit_reason(tm: nn.Module) -> str | None:
    """None when vitscale's ViT expresses ``tm`` exactly, else why not (one line)."""
    try:
        cfg = config_from_timm(tm)
    except ValueError as e:
        return str(e)
    diffs = architecture_differences(tm, cfg)
    return "not reproduced: " + "; ".join(diffs) if diffs else None


def timm_vit_models():
    """(name, meta-device model) for every candidate name whose model is a timm VisionTransformer.

    Candidates are the names registered by the timm modules that use the ``VisionTransformer`` class
    (``vision_transformer``, ``deit``, ``vision_transformer_hybrid``, ``vitamin`` in timm 1.0); each is
    built on the meta device to read its class.
    """
    import timm
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    for module in timm.list_modules():
        try:
            mod = importlib.import_module(f"timm.models.{module}")
        except ImportError:
            continue
        if any(v is TimmViT for v in vars(mod).values()):
            for name in timm.list_models(module=module):
                model = create_timm_meta(name)
                if isinstance(model, TimmViT):
                    yield name, model


def timm_vit_names() -> list[str]:
    """Every model name of the installed timm whose model is (a subclass of) timm's VisionTransformer."""
    return sorted({name for name, _ in timm_vit_models()})


def unsupported_timm_vits(names: list[str] | None = None) -> dict[str, str]:
    """``{name: reason}`` for the installed timm's ViTs (or ``names``) that vitscale cannot express.

    Every other name of :func:`timm_vit_names` converts exactly both ways with ``from_timm`` / ``to_timm``.
    Takes seconds: each model is built on the meta device (no weights, no download).
    """
    models = timm_vit_models() if names is None else ((n, create_timm_meta(n)) for n in names)
    out = {}
    for name, model in models:
        reason = timm_vit_reason(model)
        if reason:
            out[name] = reason
    return dict(sorted(out.items()))



def vit_from_timm(timm_model: nn.Module) -> nn.Module:
    """The vitscale ViT equivalent to a timm ``VisionTransformer``, with its weights; ValueError naming
    what vitscale cannot express (an option ``config_from_timm`` does not know included: refused
    rather than converted approximately)."""
    from .model import VisionTransformer

    cfg = config_from_timm(timm_model)
    diffs = architecture_differences(timm_model, cfg)
    if diffs:
        raise ValueError("vitscale's ViT does not reproduce this timm model: " + "; ".join(diffs))
    ref = next(timm_model.parameters())
    model = VisionTransformer(cfg, device="meta")
    model.load_state_dict(state_dict_from_timm(timm_model.state_dict(), cfg), strict=True, assign=True)
    return model.to(device=ref.device)



def _is_eva(m: Any) -> bool:
    return is_library_model(m, "timm", "Eva")


def _rope(cfg: ViTConfig) -> bool:
    """A RoPE ViT's timm counterpart is timm's ``Eva`` (``timm_eva.py``), any other ViT's its ``VisionTransformer``."""
    return cfg.pos_embed == "rope"


def _from_library(tm: nn.Module) -> nn.Module:
    from . import timm_eva

    return timm_eva.eva_from_timm(tm) if _is_eva(tm) else vit_from_timm(tm)


def _to_library(model: nn.Module) -> dict[str, torch.Tensor]:
    from . import timm_eva

    return timm_eva.to_eva(model) if _rope(model.cfg) else to_timm(model)


def _library_kwargs(cfg: ViTConfig) -> dict[str, Any]:
    from . import timm_eva

    return timm_eva.eva_kwargs(cfg) if _rope(cfg) else timm_kwargs(cfg)


def _create(model: nn.Module, load_weights: bool = True, **overrides: Any) -> nn.Module:
    from . import timm_eva

    return (timm_eva.create_eva if _rope(model.cfg) else create_timm_vit)(model, load_weights, **overrides)


def _from_state_dict(sd: dict[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    from . import timm_eva

    return (timm_eva.state_dict_from_eva if _rope(cfg) else state_dict_from_timm)(sd, cfg)


TIMM = StateDictAdapter(
    library="timm",
    accepts=lambda m: is_library_model(m, "timm", "VisionTransformer", "Eva"),
    from_library=_from_library,  # ValueError naming what vitscale cannot express
    to_library=_to_library,
    library_kwargs=_library_kwargs,
    create=_create,
    names=TIMM_NAMES,
    from_state_dict=_from_state_dict,
    recognizes=TIMM_RECOGNIZES,  # a patch convolution, the fused projections under timm's names
)

__all__ = [
    "TIMM", "architecture_differences", "build_meta", "create_timm_meta", "layout_differences", "timm_vit_models", "timm_vit_names", "timm_vit_on_meta",
    "timm_vit_reason", "unsupported_timm_vits", "vit_from_timm",
]  # fmt: skip
