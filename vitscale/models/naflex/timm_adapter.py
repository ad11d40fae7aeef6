"""The NaFlex family's timm adapter: timm's ``NaFlexVit`` <-> vitscale's NaFlex ViT, whole models
(the state-dict conversions are in ``state_dict_adapter.py``; this module joins them to the model
class, so that the model can import the conversions without a circle)."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..spec import StateDictAdapter, is_library_model
from ..vit.finetune import TIMM_RECOGNIZES
from ..vit.timm_registry import build_meta, layout_differences
from .model import NaFlexViT
from .state_dict_adapter import config_from_timm, state_dict_from_timm, state_dict_to_timm, timm_kwargs


def naflex_from_timm(timm_model: nn.Module) -> nn.Module:
    """The vitscale NaFlex ViT equivalent to a timm ``NaFlexVit``, with its weights; ValueError naming
    what vitscale cannot express (anything :func:`timm_kwargs` would not rebuild included)."""
    cfg = config_from_timm(timm_model)
    from timm.models.naflexvit import NaFlexVit

    ref = build_meta(NaFlexVit, **timm_kwargs(cfg), use_key_only_attn_mask=timm_model.use_key_only_attn_mask)
    diffs = layout_differences(timm_model, ref)
    if diffs:
        raise ValueError("vitscale's NaFlex ViT does not reproduce this timm model: " + "; ".join(diffs))
    dev = next(timm_model.parameters()).device
    model = NaFlexViT(cfg, device="meta")
    model.load_state_dict(state_dict_from_timm(timm_model.state_dict(), cfg), strict=True, assign=True)
    return model.to(device=dev)


def create_timm_naflex(model: nn.Module, load_weights: bool = True, **timm_overrides: Any) -> nn.Module:
    """The timm ``NaFlexVit`` matching a vitscale NaFlex ViT (with its weights unless ``load_weights=False``)."""
    from timm.models.naflexvit import NaFlexVit

    tm = NaFlexVit(**{**timm_kwargs(model.cfg), **timm_overrides})
    if load_weights:
        tm.load_state_dict(state_dict_to_timm(model.state_dict(), model.cfg), strict=True)
    return tm


TIMM = StateDictAdapter(
    library="timm",
    accepts=lambda m: is_library_model(m, "timm", "NaFlexVit"),
    from_library=naflex_from_timm,
    to_library=lambda model: state_dict_to_timm(model.state_dict(), model.cfg),
    library_kwargs=timm_kwargs,
    create=create_timm_naflex,
    from_state_dict=state_dict_from_timm,
    # timm's NaFlexVit, or a classic timm ViT (its patch convolution becomes the Linear on load)
    recognizes=lambda sd: "embeds.proj.weight" in sd or TIMM_RECOGNIZES(sd),
)


__all__ = ["TIMM", "create_timm_naflex", "naflex_from_timm"]
